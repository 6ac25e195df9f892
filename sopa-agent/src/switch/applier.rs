//! The switch role's side of the push channel: snapshots and deltas applied to the switch,
//! the live hosts' ports trusted, port and LLDP reports started once a plan is installed.

use super::*;

/// The switch role's side of the push channel.
pub struct SwitchApplier<'a> {
    pub switch: &'a mut Switch,
    pub node: String,
    pub endpoint: String,
    view: Option<FabricView>,
    state: ControllerState,
    reports: Option<tokio::sync::mpsc::Sender<sopa_channel::proto::agent_message::Kind>>,
    /// Where LLDP's tables go (the same stream).
    cabling_reports: tokio::sync::mpsc::Sender<sopa_channel::proto::agent_message::Kind>,
    /// Asks the port watcher to report every port again (a new session).
    resend: std::sync::Arc<tokio::sync::Notify>,
}

impl<'a> SwitchApplier<'a> {
    /// `reports` receives the link-state reports once the first plan is installed.
    pub fn new(
        switch: &'a mut Switch,
        node: &str,
        endpoint: &str,
        reports: tokio::sync::mpsc::Sender<sopa_channel::proto::agent_message::Kind>,
    ) -> Self {
        Self {
            cabling_reports: reports.clone(),
            reports: Some(reports),
            resend: std::sync::Arc::default(),
            switch,
            node: node.to_owned(),
            endpoint: endpoint.to_owned(),
            view: None,
            state: ControllerState {
                endpoint: endpoint.to_owned(),
                ..ControllerState::default()
            },
        }
    }
}

impl Applier for SwitchApplier<'_> {
    async fn snapshot(&mut self, s: &Snapshot) -> std::result::Result<(), String> {
        let view = FabricView::from_snapshot(s).map_err(|e| e.to_string())?;
        self.switch
            .apply(&view.topology, &self.node, &view.failures, view.encoding)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(tx) = self.reports.take() {
            self.switch
                .watch_ports(tx, std::sync::Arc::clone(&self.resend))
                .map_err(|e| e.to_string())?;
        }
        self.switch
            .start_cabling(&self.node, &self.cabling_reports)
            .map_err(|e| e.to_string())?;
        // A snapshot opens every session: this controller hears the table too.
        self.switch.resend_cabling();
        self.state.epoch = s.epoch;
        self.state.version = s.version;
        self.state.untrusted_hosts = self.switch.untrusted_hosts();
        self.view = Some(view);
        self.switch.set_controller_state(self.state.clone());
        Ok(())
    }

    async fn delta(&mut self, d: &Delta) -> std::result::Result<(), (String, bool)> {
        // Hosts steer source-routed packets around failures; the kernel routes (packets
        // without the option, the ecmp baseline) follow the live shortest paths.
        let view = self
            .view
            .as_mut()
            .ok_or(("a delta before any snapshot".to_owned(), true))?;
        view.apply_delta(d)
            .map_err(|e| (e.to_string(), e.needs_resync()))?;
        if let Err(e) = self
            .switch
            .update_routes(&view.topology, &self.node, &view.failures)
            .await
        {
            // The view moved on but the routes may not have: start over from a snapshot.
            self.view = None;
            return Err((format!("updating the routes: {e}"), true));
        }
        self.state.version = d.version;
        self.switch.set_controller_state(self.state.clone());
        Ok(())
    }

    fn position(&self) -> (u64, u64) {
        self.view.as_ref().map_or((0, 0), |v| (v.epoch, v.version))
    }

    fn peers(&mut self, peers: &PeerAgents) {
        match self.switch.set_live_hosts(&peers.live) {
            Ok(untrusted) => {
                if untrusted != self.state.untrusted_hosts {
                    if untrusted.is_empty() {
                        info!("every host behind this switch has a live agent: all ports trusted");
                    } else {
                        warn!(hosts = ?untrusted, "hosts without a live agent: the option from their ports is neutralized");
                    }
                    self.state.untrusted_hosts = untrusted;
                    self.switch.set_controller_state(self.state.clone());
                }
            }
            // The map keeps what it had until the next change of the hosts' states or the next
            // snapshot writes it again.
            Err(err) => warn!(%err, "could not write the trusted ports"),
        }
    }

    fn connected(&mut self, up: bool) {
        if up && self.reports.is_none() {
            // The watcher runs: every port again, for this session's controller.
            self.resend.notify_one();
        }
        self.state.connected = up;
        self.state.endpoint = self.endpoint.clone();
        self.switch.set_controller_state(self.state.clone());
    }
}
