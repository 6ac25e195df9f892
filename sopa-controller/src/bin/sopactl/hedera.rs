//! `sopactl hedera status`: the Hedera scheduler's current elephants, their demands and where
//! Global First Fit placed them.

use anyhow::Result;
use clap::Subcommand;
use sopa_channel::proto::{FiveTuple, HederaStatusRequest};

use crate::fabric::{Connection, call, runtime};

#[derive(Subcommand)]
pub enum HederaCommand {
    /// Elephants, estimated demands, placements and per-agent report counters.
    Status {
        #[command(flatten)]
        conn: Connection,
        /// Print JSON instead of the report for people.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: HederaCommand) -> Result<()> {
    let HederaCommand::Status { conn, json } = cmd;
    runtime().block_on(async {
        let s = call(&conn, "hedera status", |mut control| async move {
            control.hedera_status(HederaStatusRequest {}).await
        })
        .await?;
        if json {
            let elephants: Vec<_> = s
                .elephants
                .iter()
                .map(|e| {
                    serde_json::json!({
                        "flow": e.flow.as_ref().map(FiveTuple::name), "src": e.src, "dst": e.dst,
                        "measured": e.measured, "demand": e.demand, "placed": e.placed,
                        "hops": [e.hop0, e.hop1], "path": e.path, "since_round": e.since_round,
                    })
                })
                .collect();
            let agents: Vec<_> = s
                .agents
                .iter()
                .map(|a| {
                    serde_json::json!({
                        "node": a.node, "reports": a.reports, "reports_refused": a.reports_refused,
                        "pins_refused": a.pins_refused, "last_error": a.last_error,
                    })
                })
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "round": s.round, "interval_ms": s.interval_ms,
                    "elephants": elephants, "agents": agents,
                }))?
            );
            return Ok(());
        }
        println!(
            "hedera: round {}, interval {} ms, {} elephants ({} placed)",
            s.round,
            s.interval_ms,
            s.elephants.len(),
            s.elephants.iter().filter(|e| e.placed).count()
        );
        println!(
            "{:<44} {:<10} {:<10} {:>8} {:>7}  placement",
            "flow", "src", "dst", "measured", "demand"
        );
        for e in &s.elephants {
            let placement = if e.placed {
                format!(
                    "[{}, {}] {} (since round {})",
                    e.hop0, e.hop1, e.path, e.since_round
                )
            } else {
                "unplaced: no path has room (hashed)".to_owned()
            };
            println!(
                "{:<44} {:<10} {:<10} {:>8.3} {:>7.3}  {}",
                e.flow.as_ref().map(FiveTuple::name).unwrap_or_default(),
                e.src,
                e.dst,
                e.measured,
                e.demand,
                placement
            );
        }
        for a in &s.agents {
            println!(
                "agent {}: {} reports, {} refused, {} pin sets refused{}",
                a.node,
                a.reports,
                a.reports_refused,
                a.pins_refused,
                if a.last_error.is_empty() {
                    String::new()
                } else {
                    format!("; last: {}", a.last_error)
                }
            );
        }
        Ok(())
    })
}
