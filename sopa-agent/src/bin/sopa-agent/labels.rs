//! `sopa-agent labels`: asks a running agent in the entropy encoding to take its labels from
//! another source (SIGHUP), then waits until its labels from that source are all in place.

use std::time::{Duration, Instant};

use sopa_agent::{
    Error,
    changes::{Journal, signal_agent},
    entropy::{
        runner::{SUMMARY_FILE, Summary},
        source::{self, LabelSource},
    },
};

/// How long the agent has to put every label in place: a discovery of every destination host
/// (about 0.1 s each at k=4; a baseline draws them at once).
const APPLIED_WITHIN: Duration = Duration::from_secs(120);

fn summary(run_dir: &std::path::Path) -> Option<Summary> {
    let text = std::fs::read_to_string(run_dir.join(SUMMARY_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

pub fn labels(node: &str, wanted: LabelSource) -> Result<(), Error> {
    let (run_dir, record) = crate::live_agent(node)?;
    let not_running = || Error::NotRunning {
        node: node.to_owned(),
        dir: run_dir.clone(),
    };
    let maps = crate::running_maps(node)?;
    if maps.encap()?.encoding != sopa_common::maps::encoding::ENTROPY {
        return Err(Error::Config(format!(
            "node {node} does not carry paths in the entropy encoding: labels are that encoding's"
        )));
    }
    if !record.reloads_on_sighup {
        // An older agent (or one whose control could not start) would die of SIGHUP.
        return Err(Error::Config(format!(
            "the agent of node {node} (pid {}) does not take run-time changes; restart it with `--labels {wanted}`",
            record.pid
        )));
    }
    let before = summary(&run_dir).map_or(0, |s| s.generation);
    source::request(&run_dir, wanted)?;
    signal_agent(&record, libc::SIGHUP)
        .map_err(|e| Error::io(format!("signalling agent {} of node {node}", record.pid), e))?;
    let start = Instant::now();
    loop {
        if let Some(s) = summary(&run_dir)
            && s.generation > before
            && s.source == wanted
            && s.done
        {
            println!(
                "node {node}: labels {wanted} for {} destination hosts (until the agent's next start, which takes `run --labels`)",
                s.destinations.len()
            );
            return Ok(());
        }
        let live = Journal::read(&run_dir)?.is_some_and(|r| r.is_live());
        if !live {
            return Err(not_running());
        }
        if start.elapsed() > APPLIED_WITHIN {
            return Err(Error::Config(format!(
                "node {node}: labels {wanted} not in place after {APPLIED_WITHIN:?}; the agent's log says why"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
