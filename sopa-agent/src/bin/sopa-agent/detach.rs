//! `sopa-agent detach`: remove a datapath left attached and restore the host.

use sopa_agent::{Error, host};

/// `sopa-agent detach`: undo what a stopped agent left attached.
pub async fn detach(node: &str, netns: Option<&str>) -> Result<(), Error> {
    host::validate_node(node)?;
    let run_dir = host::run_dir(node);
    let Some(record) = sopa_agent::changes::Journal::read(&run_dir)? else {
        let pins = host::pin_dir(node);
        if pins.exists() {
            std::fs::remove_dir_all(&pins)
                .map_err(|e| Error::io(format!("removing {}", pins.display()), e))?;
            println!("node {node}: removed {} (no agent record)", pins.display());
            return Ok(());
        }
        return Err(Error::NotRunning {
            node: node.to_owned(),
            dir: pins,
        });
    };
    if record.is_live() {
        return Err(Error::Config(format!(
            "node {node}: agent {} is running; stop it (SIGTERM) instead",
            record.pid
        )));
    }
    if let Some(ns) = &record.netns
        && netns.is_none()
        && !std::path::Path::new("/run/netns").join(ns).exists()
    {
        // The namespace is gone, and with it the interface, its routes and settings: only
        // the pins and the record are left.
        let pins = host::pin_dir(node);
        for (what, result) in [
            ("pins", std::fs::remove_dir_all(&pins)),
            ("record", std::fs::remove_dir_all(&run_dir)),
        ] {
            if let Err(e) = result
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(Error::io(format!("removing the {what} of {node}"), e));
            }
        }
        println!("node {node}: network namespace {ns:?} is gone; removed its pins and record");
        return Ok(());
    }
    if let Some(ns) = &record.netns
        && netns != Some(ns.as_str())
    {
        return Err(Error::Config(format!(
            "node {node} ran in network namespace {ns:?}: run `sopa-agent --netns {ns} detach --node {node}`"
        )));
    }
    host::check_undo_privileges()?;
    let netlink = sopa_agent::netlink::Netlink::connect()?;
    let changes = record.changes.len();
    let errors = sopa_agent::changes::Journal::resume(&run_dir, record)
        .undo(&netlink)
        .await;
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => {
            println!("node {node}: detached, {changes} changes restored");
            Ok(())
        }
    }
}
