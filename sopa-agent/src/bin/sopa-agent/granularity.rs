//! `sopa-agent granularity`: records a node's new unit of spraying and asks its running agent
//! to apply it (SIGHUP), then waits for the agent's record to say it is in force.

use std::time::{Duration, Instant};

use sopa_agent::{
    Error,
    changes::{Journal, signal_agent},
    granularity::{Granularity, RuntimeGranularity},
};

/// How long the agent has to apply it (one netlink request and a journal write).
const APPLIED_WITHIN: Duration = Duration::from_secs(10);

pub fn granularity(node: &str, g: Granularity) -> Result<(), Error> {
    let (run_dir, record) = crate::live_agent(node)?;
    let not_running = || Error::NotRunning {
        node: node.to_owned(),
        dir: run_dir.clone(),
    };
    if record.granularity == sopa_agent::switch::GRANULARITY {
        // The switch role has no unit of spraying (and no SIGHUP handler).
        return Err(Error::Config(format!(
            "node {node} runs the switch role: the granularity is a host agent's setting"
        )));
    }
    if !record.reloads_on_sighup {
        // An older agent (or one whose control could not start) would die of SIGHUP.
        return Err(Error::Config(format!(
            "the agent of node {node} (pid {}) does not take run-time granularity changes; restart it with `--granularity {g}` (or `run --takeover --granularity {g}`)",
            record.pid
        )));
    }
    let previous = RuntimeGranularity::load(&run_dir)?;
    RuntimeGranularity::new(g).save(&run_dir)?;
    // Whatever goes wrong from here, the file says again what it said before.
    let put_back = |why: Error| -> Error {
        let restored = match &previous {
            Some(p) => p.save(&run_dir),
            None => RuntimeGranularity::clear(&run_dir),
        };
        if let Err(err) = restored {
            eprintln!("sopa-agent: putting the run-time granularity back: {err}");
        }
        why
    };
    signal_agent(&record, libc::SIGHUP).map_err(|e| {
        put_back(Error::io(
            format!("signalling agent {} of node {node}", record.pid),
            e,
        ))
    })?;
    let start = Instant::now();
    let wanted = g.to_string();
    loop {
        let now = Journal::read(&run_dir)?.ok_or_else(not_running)?;
        if now.granularity == wanted {
            let segs = g
                .segs()
                .map_or("the interface's own".to_owned(), |n| n.to_string());
            println!(
                "node {node}: granularity {g} (gso_max_segs {segs} on {}; kept across restarts; `run --granularity` or SOPA_GRANULARITY replaces it)",
                now.iface
            );
            return Ok(());
        }
        // The agent puts the file back to what it runs when it cannot apply the new one.
        let kept = RuntimeGranularity::load(&run_dir)?.map(|k| k.granularity);
        if kept != Some(g) {
            return Err(Error::Config(format!(
                "node {node}: the agent could not set granularity {g} and keeps {}; its log says why",
                now.granularity
            )));
        }
        if !now.is_live() || start.elapsed() > APPLIED_WITHIN {
            return Err(put_back(Error::Config(format!(
                "node {node}: the agent (pid {}) did not apply granularity {g} within {} s; it keeps {}",
                now.pid,
                APPLIED_WITHIN.as_secs(),
                now.granularity
            ))));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
