//! The controller's side of Hedera: the scheduling rounds, their pins pushed to agents, and
//! its status.

use std::{sync::Arc, time::Instant};

use sopa_channel::proto::HederaStatusReply;

use super::Controller;

impl Controller {
    /// Runs Hedera's scheduling rounds forever: each round places the reported elephants and
    /// pushes every reporting agent its pins.
    pub async fn run_hedera(self: Arc<Self>) {
        let interval = self.hedera.lock().expect("hedera lock").config.interval;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // The round runs without the fabric's lock, which every hello and every change
            // takes: only the failures of this moment are copied under it.
            let (topology, failures) = {
                let f = self.fabric.lock().expect("fabric lock");
                (f.shared_topology(), f.failures())
            };
            let sets = self.hedera.lock().expect("hedera lock").round(
                &topology,
                &failures,
                Instant::now(),
            );
            if !sets.is_empty() {
                let _ = self.pins.send(Arc::new(sets));
            }
        }
    }

    pub fn hedera_status(&self) -> HederaStatusReply {
        self.hedera.lock().expect("hedera lock").status()
    }
}
