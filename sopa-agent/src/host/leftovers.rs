//! What a previous agent of the node left: adopted, restored, or handed over by a live agent
//! (--takeover).

use std::path::Path;

use tracing::{info, warn};

use crate::{
    changes::{Change, Journal, Record},
    datapath::Datapath,
    error::{Error, Result},
    netlink::{self, Netlink},
};

use super::{HostOptions, forget, pin_dir};

/// Refuses to start beside a live agent of the same node. What a previous agent left (after a
/// crash, or attached on purpose) is adopted when it is this interface's datapath of this
/// layout, and restored otherwise (or with `--reset`). Returns the record to adopt and, with
/// --takeover, this agent's datapath, loaded before the running agent was asked to hand over.
pub(super) async fn leftovers(
    opts: &HostOptions,
    run_dir: &Path,
    link: &netlink::Link,
    netlink: &Netlink,
) -> Result<(Option<Record>, Option<Datapath>)> {
    let pins = pin_dir(&opts.node);
    if !opts.reset {
        crate::datapath::layout::check(&pins)?;
    }
    let Some(record) = Journal::read(run_dir)? else {
        if opts.reset && pins.exists() {
            warn!(dir = %pins.display(), "--reset: removing the pins left without an agent record");
            std::fs::remove_dir_all(&pins)
                .map_err(|e| Error::io(format!("removing {}", pins.display()), e))?;
            return Ok((None, None));
        }
        if pins.join(crate::datapath::STAMP_LINK_PIN).exists() {
            // Pins without a journal: nothing says what the host looked like before.
            warn!(dir = %pins.display(), "pins without an agent record; removing them");
            std::fs::remove_dir_all(&pins)
                .map_err(|e| Error::io(format!("removing {}", pins.display()), e))?;
        }
        return Ok((None, None));
    };
    if record.namespace(opts.netns.as_deref())? == crate::changes::RecordNamespace::Gone {
        warn!(
            pid = record.pid,
            netns = ?record.netns,
            "the previous agent's network namespace is gone, and with it what it changed; removing its pins and record"
        );
        forget(&pins, run_dir)?;
        return Ok((None, None));
    }
    let (record, mut preloaded) = if record.pid != std::process::id() && record.is_live() {
        if !opts.takeover {
            return Err(Error::AlreadyRunning {
                node: opts.node.clone(),
                pid: record.pid,
            });
        }
        // Everything that can fail without touching the running agent first: the programs
        // through the verifier, the pinned maps reused by name.
        let loaded = preload(&pins, record.pid)?;
        (hand_over(&opts.node, run_dir, &record).await?, Some(loaded))
    } else {
        (record, None)
    };
    // tc_stamp behind its pinned TCX link, or as our filter (the kernel still lists it).
    let stamp_attached = if pins.join(crate::datapath::STAMP_LINK_PIN).exists() {
        true
    } else if let Some(f) = record.changes.iter().find_map(|c| match c {
        Change::TcFilter { filter } if filter.index == link.index && !filter.ingress => {
            Some(filter)
        }
        _ => None,
    }) {
        pins.join(crate::datapath::STAMP_PROG_PIN).exists()
            && netlink
                .tc_filters(link.index)
                .await?
                .iter()
                .any(|k| !k.ingress && k.priority == f.priority && k.handle == f.handle)
    } else {
        false
    };
    let attached = stamp_attached && pins.join(crate::datapath::STRIP_LINK_PIN).exists();
    let same_iface = record.iface == opts.iface && record.ifindex == link.index;
    if attached && same_iface && !opts.reset {
        return Ok((Some(record), preloaded));
    }
    // Restored instead of adopted: its pins go, and this agent loads anew.
    preloaded.take();
    let why = if opts.reset {
        "--reset"
    } else if !attached {
        "its programs are no longer attached"
    } else {
        "it ran on another interface"
    };
    warn!(
        pid = record.pid,
        changes = record.changes.len(),
        reason = why,
        "the previous agent of this node left state behind; restoring what it changed"
    );
    let errors = Journal::resume(run_dir, record).undo(netlink).await;
    match errors.into_iter().next() {
        Some(err) => Err(err),
        None => Ok(()),
    }?;
    if opts.reset && pins.exists() {
        // Whatever is left there (maps of another layout included) goes too.
        std::fs::remove_dir_all(&pins)
            .map_err(|e| Error::io(format!("removing {}", pins.display()), e))?;
    }
    Ok((None, None))
}

/// Loads this agent's datapath beside the running agent `pid`'s, attaching nothing and writing
/// no map: a failure leaves that agent running as it was (the pins this load created, maps of
/// a newer layout, are removed again).
fn preload(pins: &Path, pid: u32) -> Result<Datapath> {
    let before = pin_names(pins);
    Datapath::load(pins).map_err(|err| {
        for name in pin_names(pins).difference(&before) {
            let _ = std::fs::remove_file(pins.join(name));
        }
        Error::TakeoverRefused {
            pid,
            source: Box::new(err),
        }
    })
}

fn pin_names(dir: &Path) -> std::collections::BTreeSet<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .collect()
        })
        .unwrap_or_default()
}

/// Asks the live agent `pid` to exit leaving its datapath attached (SIGUSR1), waits for it,
/// and returns the record it left.
async fn hand_over(node: &str, run_dir: &Path, live: &Record) -> Result<Record> {
    let pid = live.pid;
    info!(
        pid,
        "--takeover: asking the running agent to hand its datapath over"
    );
    crate::changes::signal_agent(live, libc::SIGUSR1)
        .map_err(|e| Error::io(format!("signalling agent {pid} of node {node}"), e))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        // Liveness first, then the record: a record read after the agent was seen gone is the
        // one it left. (Judged the other way round, an agent that marked its record and exited
        // between the read and the check looked as if it had crashed.)
        let running = live.is_live();
        let record = Journal::read(run_dir)?;
        match record {
            Some(r) if r.pid == pid && running => {}
            Some(r) if r.kept_attached => return Ok(r),
            Some(r) if r.pid == pid => {
                // It ended some other way (its teardown failed, or it was killed): what it
                // left is adopted or restored as after a crash, as any start would.
                warn!(
                    pid,
                    "the running agent exited without marking its datapath handed over; taking what it left as after a crash"
                );
                return Ok(r);
            }
            Some(r) => {
                return Err(Error::Config(format!(
                    "agent {pid} of node {node} exited and agent {} now holds the node; stop it first or start with --takeover again",
                    r.pid
                )));
            }
            None => {
                return Err(Error::Config(format!(
                    "agent {pid} of node {node} detached its datapath instead of handing it over"
                )));
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::Config(format!(
                "agent {pid} of node {node} did not hand over within 20 s"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
