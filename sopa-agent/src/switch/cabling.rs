//! The switch's part of the cabling check: LLDP on every port of its plan (an inventory's
//! fabric, or `--lldp on`), its neighbour table sent to the controller whenever it changes and
//! again at every session.

use std::{sync::Arc, time::Duration};

use sopa_channel::proto::{NeighbourReport, PortNeighbour, agent_message::Kind};
use tokio::sync::{Notify, mpsc};

use crate::{
    error::Result,
    lldp::{Neighbour, Speaker, SpeakerOptions},
};

/// When a switch speaks LLDP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LldpMode {
    /// On an inventory's fabric (whose ports have names to check), off on a generated one.
    #[default]
    Auto,
    On,
    Off,
}

/// LLDP running for this agent, its table forwarded to `reports`.
pub struct Cabling {
    speaker: Speaker,
    resend: Arc<Notify>,
}

pub fn report(table: &[Neighbour], addresses: &[String]) -> NeighbourReport {
    NeighbourReport {
        ports: table
            .iter()
            .map(|n| PortNeighbour {
                port: n.port.clone(),
                chassis: n.chassis.clone(),
                remote_port: n.remote_port.clone(),
            })
            .collect(),
        addresses: addresses.to_vec(),
    }
}

impl Cabling {
    /// Speaks as `node` on `ports` (interface names) every `interval` (`send`: a switch; a
    /// host only listens) and sends the table, with `addresses`, to `reports`.
    pub fn start(
        node: &str,
        send: bool,
        ports: Vec<String>,
        addresses: Vec<String>,
        interval: Duration,
        reports: mpsc::Sender<Kind>,
    ) -> Result<Self> {
        let (tx, mut rx) = mpsc::channel::<Vec<Neighbour>>(8);
        let speaker = Speaker::start(
            SpeakerOptions {
                node: node.to_owned(),
                send,
                interval,
            },
            ports,
            tx,
        )?;
        let resend = Arc::new(Notify::new());
        let again = Arc::clone(&resend);
        tokio::spawn(async move {
            let mut last: Option<Vec<Neighbour>> = None;
            loop {
                tokio::select! {
                    table = rx.recv() => {
                        let Some(table) = table else { return };
                        last = Some(table);
                    }
                    _ = again.notified() => {}
                }
                if let Some(t) = &last
                    && reports
                        .send(Kind::Neighbours(report(t, &addresses)))
                        .await
                        .is_err()
                {
                    return;
                }
            }
        });
        Ok(Self { speaker, resend })
    }

    /// The ports of a new plan.
    pub fn set_ports(&self, ports: Vec<String>) {
        self.speaker.set_ports(ports);
    }

    /// Sends the table again (a new session's controller).
    pub fn resend(&self) {
        self.resend.notify_one();
    }

    /// What [`Cabling::resend`] notifies, for whoever sees sessions begin.
    pub fn resender(&self) -> Arc<Notify> {
        Arc::clone(&self.resend)
    }
}
