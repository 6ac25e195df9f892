//! The controller channel's settings from either role's flags.

use std::time::Duration;

use sopa_agent::Error;
use sopa_channel::{client::ClientConfig, proto::Role};
use tracing::warn;

use crate::cli::ChannelFlags;

/// What the channel needs from either role's flags.
pub struct ChannelArgs<'a> {
    pub node: &'a str,
    /// The node's name in the controller's topology (`--host`), when given.
    pub topology_name: Option<&'a str>,
    pub role: Role,
    pub flags: &'a ChannelFlags,
}

/// The channel settings of `--controller URL[,URL...]` (replicas, tried in turn);
/// configuration errors before anything runs.
pub fn channel_config(args: &ChannelArgs, url: &str) -> Result<ClientConfig, Error> {
    let mut cfg = ClientConfig::new(url, args.node, args.role);
    cfg.topology_name = args.topology_name.map(str::to_owned);
    if args.flags.heartbeat.0 < Duration::from_millis(1) {
        return Err(Error::Config(format!(
            "--heartbeat {}: give at least 1ms",
            args.flags.heartbeat
        )));
    }
    cfg.heartbeat = args.flags.heartbeat.into();
    let list = sopa_channel::client::endpoints(url);
    if list.is_empty() {
        return Err(Error::Config(format!(
            "--controller {url:?} names no controller"
        )));
    }
    let kind = |e: &str| {
        if e.starts_with("unix:") {
            Some("unix".to_owned())
        } else {
            e.split_once("://").map(|(s, _)| s.to_owned())
        }
    };
    if list.iter().any(|e| kind(e) != kind(list[0])) {
        return Err(Error::Config(format!(
            "--controller {url}: the controllers of a list must all be https:// (or all http://, or all unix:) addresses"
        )));
    }
    let url = list[0];
    if url.starts_with("unix:") {
        // A local socket: who may connect is decided by the socket file's permissions.
        if args.flags.certs.is_some() {
            return Err(Error::Config(format!(
                "--certs does not apply to the local socket {url}"
            )));
        }
        return Ok(cfg);
    }
    match (
        url.split_once("://").map(|(s, _)| s),
        args.flags.certs.as_ref(),
        args.flags.insecure,
    ) {
        (Some("https"), Some(dir), false) => {
            cfg.tls = Some(
                sopa_channel::tls::client_config(dir, &args.flags.controller_name)
                    .map_err(|e| Error::Config(format!("--certs {}: {e}", dir.display())))?,
            );
            // Read again at every session: a renewed certificate is presented at the next.
            cfg.tls_files = Some((dir.clone(), args.flags.controller_name.clone()));
        }
        (Some("https"), None, _) => {
            return Err(Error::Config(format!(
                "--controller {url} needs --certs DIR: this node's own certificate folder (ca.pem, node.pem, node.key from `sopactl certs issue --role host|switch --node NAME`)"
            )));
        }
        (Some("http"), _, true) => warn!("--insecure: talking to the controller in plaintext"),
        (Some("http"), _, false) => {
            return Err(Error::Config(format!(
                "--controller {url} is plaintext; use https:// with --certs, or pass --insecure for tests"
            )));
        }
        _ => {
            return Err(Error::Config(format!(
                "--controller {url:?} is not an https://, http:// or unix: address"
            )));
        }
    }
    Ok(cfg)
}
