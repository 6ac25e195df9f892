//! `sopa-traffic`: the testbed's traffic tool, run inside host namespaces.
//!
//! ```sh
//! sopa-traffic serve --listen 0.0.0.0:7000 [--mptcp]
//! sopa-traffic run --schedule flows.json [--mptcp] [--congestion cubic]
//! ```
//!
//! A schedule is a JSON list of flows: `{"to": "10.1.0.2:7000", "bytes": 1000000}` starts at
//! once, `"start_ms": 250` starts 250 ms after the run begins, `"after_previous": true` starts
//! when the flow before it in the list has finished. Every flow's data is hashed at both ends;
//! `run` prints one JSON line per flow as it completes (bytes, start, completion time,
//! throughput, whether the receiver's hash matched, and TCP_INFO: retransmits,
//! `tcpi_reord_seen`, `tcpi_reordering`, RTOs) and exits 1 if any flow failed.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::{Parser, Subcommand};
use serde::Deserialize;
use sopa_testbed::traffic::{SendOptions, send, serve};

#[derive(Parser)]
#[command(about = "SOPA testbed traffic: a hashing server and a scheduled client")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Accept transfers on ADDR:PORT until killed, any number at once.
    Serve {
        #[arg(long)]
        listen: SocketAddr,
        /// MPTCP sockets (IPPROTO_MPTCP).
        #[arg(long)]
        mptcp: bool,
    },
    /// Run a flow schedule and print a JSON line per flow.
    Run {
        /// The schedule (JSON); `-` reads standard input.
        #[arg(long)]
        schedule: PathBuf,
        #[arg(long)]
        mptcp: bool,
        /// TCP congestion control of every flow.
        #[arg(long, default_value = "cubic")]
        congestion: String,
        /// Give a flow up when no byte moves for this long.
        #[arg(long, default_value_t = 30)]
        stall_s: u64,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Flow {
    to: SocketAddr,
    bytes: u64,
    #[serde(default)]
    start_ms: Option<u64>,
    #[serde(default)]
    after_previous: bool,
}

fn load(path: &PathBuf) -> Result<Vec<Flow>, String> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("reading stdin: {e}"))?
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?
    };
    let flows: Vec<Flow> =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    for (i, f) in flows.iter().enumerate() {
        if f.after_previous && (i == 0 || f.start_ms.is_some()) {
            return Err(format!(
                "{}: flow {i}: after_previous needs a previous flow and no start_ms",
                path.display()
            ));
        }
    }
    Ok(flows)
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve { listen, mptcp } => {
            match serve(listen, mptcp, Duration::from_secs(60), || {
                eprintln!("sopa-traffic: serving on {listen}")
            }) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sopa-traffic: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Run {
            schedule,
            mptcp,
            congestion,
            stall_s,
        } => {
            let flows = match load(&schedule) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("sopa-traffic: bad schedule {e}");
                    return ExitCode::from(64);
                }
            };
            // `TCP_CONGESTION` wants a static name.
            let congestion: &'static str = Box::leak(congestion.into_boxed_str());
            let opts = SendOptions {
                congestion,
                stall_timeout: Duration::from_secs(stall_s),
                mptcp,
                ..SendOptions::default()
            };
            if run(&flows, &opts) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs the schedule: each chain (a flow and the flows after it) on its own thread.
fn run(flows: &[Flow], opts: &SendOptions) -> bool {
    let mut chains: Vec<(u64, Vec<usize>)> = Vec::new();
    for (i, f) in flows.iter().enumerate() {
        match chains.last_mut() {
            Some((_, chain)) if f.after_previous => chain.push(i),
            _ => chains.push((f.start_ms.unwrap_or(0), vec![i])),
        }
    }
    let begin = Instant::now();
    let out = std::sync::Mutex::new(());
    std::thread::scope(|s| {
        let handles: Vec<_> = chains
            .iter()
            .map(|(start_ms, chain)| {
                let out = &out;
                s.spawn(move || {
                    let mut ok = true;
                    let at = Duration::from_millis(*start_ms);
                    if let Some(wait) = at.checked_sub(begin.elapsed()) {
                        std::thread::sleep(wait);
                    }
                    for &i in chain {
                        let f = &flows[i];
                        let start_s = begin.elapsed().as_secs_f64();
                        let line = match send(f.to, f.bytes, opts) {
                            Ok(r) => {
                                let intact = r.sent_digest == r.echoed_digest;
                                ok &= intact;
                                serde_json::json!({
                                    "index": i, "to": f.to.to_string(), "bytes": f.bytes,
                                    "start_s": start_s, "fct_s": r.seconds,
                                    "mbit_per_s": f.bytes as f64 * 8.0 / r.seconds / 1e6,
                                    "intact": intact,
                                    "sent_digest": hex(&r.sent_digest),
                                    "received_digest": hex(&r.echoed_digest),
                                    "total_retrans": r.tcp.total_retrans,
                                    "reord_seen": r.tcp.reord_seen,
                                    "reordering": r.tcp.reordering,
                                    "rtos": r.tcp.rtos,
                                    "mptcp_subflows": r.tcp.mptcp_subflows,
                                    "mptcp_fallback": r.tcp.mptcp_fallback,
                                })
                            }
                            Err(e) => {
                                ok = false;
                                serde_json::json!({
                                    "index": i, "to": f.to.to_string(), "bytes": f.bytes,
                                    "start_s": start_s, "error": e.to_string(),
                                })
                            }
                        };
                        let _guard = out.lock().expect("stdout lock");
                        println!("{line}");
                    }
                    ok
                })
            })
            .collect();
        handles.into_iter().all(|h| h.join().unwrap_or(false))
    })
}
