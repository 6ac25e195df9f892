//! The controller's Prometheus metrics: the fabric's version and down links, the agents, and
//! the path meter (each directed link's packets and losses over the shortest window, the
//! suspect links, convictions, reports). Read from the controller's state at every scrape.

use std::sync::Arc;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use sopa_channel::proto::LinkLoss;

use crate::server::{Controller, Replica};

#[derive(Debug)]
struct ControllerCollector(Arc<Controller>);

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Controller")
    }
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A link's name in every metric's `link` label: its ends in the controller's canonical order
/// (`a0:c0`, as `sopactl` prints it), whichever direction a series measures.
fn link_label(a: &str, b: &str) -> String {
    let (a, b) = crate::suspicion::key(a, b);
    format!("{a}:{b}")
}

/// A gauge per directed link of `loss`, labelled with the link and its direction (`from`, `to`).
fn link_gauges<N: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    loss: &[LinkLoss],
    value: impl Fn(&LinkLoss) -> N,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for l in loss {
        let link = l.link.clone().unwrap_or_default();
        let name = link_label(&link.a, &link.b);
        let labels = [
            ("link", name.as_str()),
            ("from", link.a.as_str()),
            ("to", link.b.as_str()),
        ];
        ConstGauge::new(value(l)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
}

impl Collector for ControllerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let c = &self.0;
        let status = c.status();
        gauge(
            &mut encoder,
            "sopa_fabric_version",
            "The fabric's version (each change adds one)",
            status.version as i64,
        )?;
        gauge(
            &mut encoder,
            "sopa_fabric_down_links",
            "Links down for the agents: drained, reported down or suspect",
            status.down_links.len() as i64,
        )?;
        let mut family = encoder.encode_descriptor(
            "sopa_port_miscabled",
            "1 for each port whose LLDP neighbour is not the one the inventory cables to it",
            None,
            MetricType::Gauge,
        )?;
        for m in &status.miscabled {
            let labels = [
                ("at", m.at.as_str()),
                ("seen", m.seen.as_str()),
                ("expected", m.expected.as_str()),
            ];
            ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        }
        gauge(
            &mut encoder,
            "sopa_agents_connected",
            "Agents connected now",
            status.agents.iter().filter(|a| a.connected).count() as i64,
        )?;

        let loss = c.meter.all_link_loss();
        link_gauges(
            &mut encoder,
            "sopa_link_sent_packets",
            "Metered packets sent over each fabric link (direction from -> to) in the shortest judged window",
            &loss,
            |l| l.sent as i64,
        )?;
        link_gauges(
            &mut encoder,
            "sopa_link_lost_packets",
            "Metered packets lost on paths through each fabric link (direction from -> to) in the shortest judged window",
            &loss,
            |l| l.lost as i64,
        )?;
        link_gauges(
            &mut encoder,
            "sopa_link_load_ratio",
            "Share of each fabric link's rate (direction from -> to) its metered bytes took in the shortest judged window; above the controller's --max-load the path meter does not judge it",
            &loss,
            |l| l.load,
        )?;
        let mut family = encoder.encode_descriptor(
            "sopa_link_suspect",
            "1 while the path meter holds a link suspect (drained)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for s in &status.suspect_links {
            let link = s.link.clone().unwrap_or_default();
            let name = link_label(&link.a, &link.b);
            ConstGauge::new(1i64).encode(family.encode_family(&[("link", name.as_str())])?)?;
        }
        let convictions = c
            .meter
            .suspicions
            .lock()
            .expect("suspicions lock")
            .convictions
            .clone();
        let mut family = encoder.encode_descriptor(
            "sopa_link_convictions",
            "Times the path meter found a link losing packets and drained it",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ((a, b), n) in &convictions {
            let name = link_label(a, b);
            ConstCounter::new(*n).encode(family.encode_family(&[("link", name.as_str())])?)?;
        }
        gauge(
            &mut encoder,
            "sopa_links_trusted",
            "Links an operator trusts (never drained on the meter's evidence)",
            status.trusted_links.len() as i64,
        )?;
        let m = c.meter.counts();
        counter(
            &mut encoder,
            "sopa_meter_periods_judged",
            "Periods of the path meter judged",
            m.judged,
        )?;
        counter(
            &mut encoder,
            "sopa_meter_periods_partial",
            "Judged periods some host's report was missing from (its rack's paths left out)",
            m.partial,
        )?;
        counter(
            &mut encoder,
            "sopa_meter_reports",
            "Path reports taken from host agents",
            m.reports,
        )?;
        counter(
            &mut encoder,
            "sopa_meter_report_bytes",
            "Encoded bytes of the path reports taken",
            m.report_bytes,
        )?;
        let mut family = encoder.encode_descriptor(
            "sopa_meter_reports_refused",
            "Path reports refused, by reason: malformed, implausible (more than links carry), period (another length than the controller's), epoch, clock (far from the controller's), topology (racks or paths it lacks), rate",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (reason, n) in &m.refused {
            ConstCounter::new(*n).encode(family.encode_family(&[("reason", *reason)])?)?;
        }
        counter(
            &mut encoder,
            "sopa_meter_reports_inconsistent",
            "Path reports set aside because their sent counts contradict the host's own spraying",
            m.inconsistent,
        )?;
        let named = c.meter.named_hosts();
        gauge(
            &mut encoder,
            "sopa_meter_inconsistent_hosts",
            "Hosts whose path reports were set aside as inconsistent within the last minute",
            named
                .iter()
                .filter(|h| h.reason == crate::meter::INCONSISTENT)
                .count() as i64,
        )?;
        gauge(
            &mut encoder,
            "sopa_meter_refused_hosts",
            "Hosts whose path reports were refused within the last minute (sopactl status names them)",
            named
                .iter()
                .filter(|h| h.reason != crate::meter::INCONSISTENT)
                .count() as i64,
        )?;
        Ok(())
    }
}

/// The controller's registry.
pub fn registry(controller: Arc<Controller>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ControllerCollector(controller)));
    registry
}

/// `sopa_controller_leader`, and the controller's metrics once this replica leads.
#[derive(Debug)]
struct ReplicaCollector(Replica);

impl Collector for ReplicaCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let leading = self.0.get();
        gauge(
            &mut encoder,
            "sopa_controller_leader",
            "1 on the replica that leads and serves the agents, 0 on a standby",
            i64::from(leading.is_some()),
        )?;
        match leading {
            Some(c) => ControllerCollector(Arc::clone(c)).encode(encoder),
            None => Ok(()),
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` for `replica` on `listener` from the moment it
/// starts, standby included: ready once it leads.
pub fn serve_replica(
    listener: tokio::net::TcpListener,
    replica: Replica,
    node: &str,
    certificate: Option<std::path::PathBuf>,
    access: sopa_ops::http::Access,
) -> tokio::task::JoinHandle<()> {
    let mut registry = Registry::default();
    sopa_ops::build_info::register(&mut registry, "controller", node);
    if let Some(cert) = certificate {
        sopa_ops::cert_expiry::register(
            &mut registry,
            "controller",
            cert,
            Arc::new(sopa_channel::identity::not_after),
        );
    }
    registry.register_collector(Box::new(ReplicaCollector(Arc::clone(&replica))));
    let registry = Arc::new(registry);
    sopa_ops::http::serve(
        listener,
        sopa_ops::http::Endpoints {
            render: Arc::new(move || render(&registry)),
            ready: Arc::new(move || match replica.get() {
                Some(_) => Ok(()),
                None => Err("standby: waiting for the leadership".into()),
            }),
            access,
        },
    )
}

/// The OpenMetrics text of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}
