//! Prometheus metrics in text format, read from the datapath's counters at every scrape.
//!
//! A scrape costs little and never touches the control path: the collector reads the pinned
//! maps through handles of its own (never the lock the controller's updates take), on a
//! blocking thread (never the runtime that runs the channel and its heartbeats), one scrape at
//! a time; and what takes a walk of a map (the flow table's entries, the path table's size) is
//! refreshed at most every [`SLOW_REFRESH`] or when the controller's version changes, not per
//! scrape.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use sopa_common::{
    maps::{mode, stamp_reason, strip_reason},
    wire::HOP_NONE,
};
use sopa_ops::http::Access;
use tokio::net::TcpListener;
use tracing::warn;

use crate::{
    datapath::MapSet,
    error::{Error, Result},
    meter::{MeterStats, Outcome},
    status::mode_name,
};

/// How old the figures that take a walk of a map may get.
pub const SLOW_REFRESH: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct DatapathCollector {
    maps: Mutex<MapSet>,
    gauges: AgentGauges,
    slow: Mutex<Option<Slow>>,
}

/// What takes a walk of a map, as of `at` (and controller version `version`).
#[derive(Clone, Copy, Debug)]
struct Slow {
    at: Instant,
    version: u64,
    flow_entries: u64,
    prefixes: usize,
    paths: usize,
}

/// What the metrics show beyond the maps: the push channel's state (-1 without a controller, 0
/// disconnected, forwarding with the last good paths, 1 connected), the applied version, the
/// peers down, and the path meter's readings and late turns.
#[derive(Clone, Debug)]
pub struct AgentGauges {
    pub state: Arc<std::sync::atomic::AtomicI64>,
    pub version: Arc<std::sync::atomic::AtomicU64>,
    /// Hosts whose agent the controller reports lost: packets to them arrive unstripped.
    pub peers_down: Arc<Mutex<Vec<String>>>,
    /// The path meter's readings by outcome, and its color's late turns.
    pub meter: Arc<MeterStats>,
}

impl Default for AgentGauges {
    fn default() -> Self {
        Self {
            state: Arc::new(std::sync::atomic::AtomicI64::new(-1)),
            version: Arc::default(),
            peers_down: Arc::default(),
            meter: Arc::default(),
        }
    }
}

impl std::fmt::Debug for MapSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MapSet")
    }
}

impl Collector for DatapathCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        // The agent's own counts first: they are shown even when the maps cannot be read.
        let mut family = encoder.encode_descriptor(
            "sopa_meter_readings",
            "The path meter's readings of its periods for the controller, by outcome: reported \
             (exact, sent), late (the color turned, or the period was read, too late or not at \
             all: no report), baseline (a color's reading after none, a late or an unread one: \
             no report), unsent (the channel's queue was full), unread (the counters could not \
             be read)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for outcome in Outcome::ALL {
            let labels = [("outcome", outcome.name())];
            ConstCounter::new(self.gauges.meter.readings(outcome))
                .encode(family.encode_family(&labels)?)?;
        }
        let counter = ConstCounter::new(self.gauges.meter.late_turns());
        counter.encode(encoder.encode_descriptor(
            "sopa_meter_late_turns",
            "Turns of the path meter's color later than an eighth of a period, or failed, \
             after the first at the agent's start: each makes the period it ends late",
            None,
            counter.metric_type(),
        )?)?;
        let maps = self.maps.lock().expect("metrics maps lock");
        let (Ok(stamp), Ok(strip), Ok(hops), Ok(config), Ok(encap), Ok(reordering)) = (
            maps.stamp_counters(),
            maps.strip_counters(),
            maps.hop_counters(),
            maps.config(),
            maps.encap(),
            maps.reordering_measured(),
        ) else {
            warn!("reading the datapath's maps for metrics failed");
            return Ok(());
        };
        let version = self
            .gauges
            .version
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut slow = self.slow.lock().expect("metrics cache lock");
        let fresh = match *slow {
            Some(s) if s.at.elapsed() < SLOW_REFRESH && s.version == version => s,
            _ => {
                let Ok(paths) = maps.paths() else {
                    warn!("reading the datapath's path table for metrics failed");
                    return Ok(());
                };
                let s = Slow {
                    at: Instant::now(),
                    version,
                    flow_entries: maps.flow_entries() as u64,
                    prefixes: paths.len(),
                    paths: paths.destinations.values().map(Vec::len).sum(),
                };
                *slow = Some(s);
                s
            }
        };
        drop(slow);
        drop(maps);
        let entries = fresh.flow_entries;

        let mut family = encoder.encode_descriptor(
            "sopa_stamp_packets",
            "Packets seen by tc_stamp, by verdict; a GSO super-packet (a flowcell) counts once, \
             its segments are in sopa_hop_packets",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (i, name) in stamp_reason::NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| stamp_reason::is_verdict(*i as u32))
        {
            let labels = [("reason", *name)];
            ConstCounter::new(stamp[i]).encode(family.encode_family(&labels)?)?;
        }
        let counter = ConstCounter::new(stamp[stamp_reason::PINNED as usize]);
        counter.encode(encoder.encode_descriptor(
            "sopa_stamp_pinned_packets",
            "Stamped packets of pinned mode that took a live Hedera pin",
            None,
            counter.metric_type(),
        )?)?;
        let counter = ConstCounter::new(stamp[stamp_reason::PIN_EXPIRED as usize]);
        counter.encode(encoder.encode_descriptor(
            "sopa_stamp_pin_expired_packets",
            "Packets whose Hedera pin had expired (they took the hash)",
            None,
            counter.metric_type(),
        )?)?;
        let counter = ConstCounter::new(stamp[stamp_reason::RESTAMPED as usize]);
        counter.encode(encoder.encode_descriptor(
            "sopa_stamp_restamped_packets",
            "Stamped packets that already carried the fabric's option, set by their sender; \
             its hop bytes were replaced with the datapath's choice",
            None,
            counter.metric_type(),
        )?)?;
        let counter = ConstCounter::new(stamp[stamp_reason::FLOW_TABLE_FULL as usize]);
        counter.encode(encoder.encode_descriptor(
            "sopa_stamp_stateless_packets",
            "Stamped packets whose flow could not be entered into the flow table (path by hash)",
            None,
            counter.metric_type(),
        )?)?;

        let counter = ConstCounter::new(
            stamp[stamp_reason::METER_FULL as usize] + strip[strip_reason::METER_FULL as usize],
        );
        counter.encode(encoder.encode_descriptor(
            "sopa_meter_full_packets",
            "Packets the path meter could not count (its table was full): the periods they fell \
             in are not judged",
            None,
            counter.metric_type(),
        )?)?;

        let counter = ConstCounter::new(strip[strip_reason::METER_FOREIGN as usize]);
        counter.encode(encoder.encode_descriptor(
            "sopa_meter_foreign_packets",
            "Marks the path meter did not count: from an address no rack of the fabric holds, on \
             a path no rack's paths here take, or of the encoding this fabric does not run",
            None,
            counter.metric_type(),
        )?)?;

        // Flow table pressure: the LRU keeps the most recent flows; a new flow always gets a
        // path (a full table falls back to the stateless hash).
        let created = stamp[stamp_reason::FLOWS_CREATED as usize];
        let gauge = ConstGauge::new(entries as i64);
        gauge.encode(encoder.encode_descriptor(
            "sopa_flow_table_entries",
            "Flows in the sender's flow table",
            None,
            gauge.metric_type(),
        )?)?;
        let gauge = ConstGauge::new(i64::from(sopa_common::maps::FLOWS_CAPACITY));
        gauge.encode(encoder.encode_descriptor(
            "sopa_flow_table_capacity",
            "Capacity of the sender's flow table",
            None,
            gauge.metric_type(),
        )?)?;
        let counter = ConstCounter::new(created);
        counter.encode(encoder.encode_descriptor(
            "sopa_flow_table_created",
            "Flows entered into the flow table",
            None,
            counter.metric_type(),
        )?)?;
        let counter = ConstCounter::new(created.saturating_sub(entries));
        counter.encode(encoder.encode_descriptor(
            "sopa_flow_table_evictions",
            "Flows the full flow table evicted (least recently used first): created minus entries",
            None,
            counter.metric_type(),
        )?)?;
        let counter = ConstCounter::new(stamp[stamp_reason::SOCKET_FLOWS_CREATED as usize]);
        counter.encode(encoder.encode_descriptor(
            "sopa_socket_flows_created",
            "TCP connections of this host's sockets whose round robin the socket holds, not the \
             flow table",
            None,
            counter.metric_type(),
        )?)?;

        let mut family = encoder.encode_descriptor(
            "sopa_strip_packets",
            "Packets seen by xdp_strip, by verdict",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (i, name) in strip_reason::NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| strip_reason::is_verdict(*i as u32))
        {
            let labels = [("reason", *name)];
            ConstCounter::new(strip[i]).encode(family.encode_family(&labels)?)?;
        }

        let counter = ConstCounter::new(strip[strip_reason::TCP_DATA as usize]);
        counter.encode(encoder.encode_descriptor(
            "sopa_tcp_data_packets",
            "TCP data packets received on the fabric interface",
            None,
            counter.metric_type(),
        )?)?;
        let counter = ConstCounter::new(strip[strip_reason::TCP_REORDERED as usize]);
        counter.encode(encoder.encode_descriptor(
            "sopa_tcp_reordered_packets",
            "TCP data packets that arrived below the highest sequence seen in their flow",
            None,
            counter.metric_type(),
        )?)?;
        let gauge = ConstGauge::new(i64::from(reordering));
        gauge.encode(encoder.encode_descriptor(
            "sopa_reordering_measured",
            "1 while xdp_strip measures reordering (the two counters above grow only then)",
            None,
            gauge.metric_type(),
        )?)?;

        let mut family = encoder.encode_descriptor(
            "sopa_hop_packets",
            "Packets (GSO segments) stamped, by option byte and hop value",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (i, &n) in hops.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let (byte, value) = if i < 256 {
                ("hop0", i)
            } else {
                ("hop1", i - 256)
            };
            let value = if value == usize::from(HOP_NONE) {
                "none".to_owned()
            } else {
                value.to_string()
            };
            let labels = [("byte", byte.to_owned()), ("value", value)];
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }

        let gauge = ConstGauge::new(fresh.prefixes as i64);
        gauge.encode(encoder.encode_descriptor(
            "sopa_path_table_prefixes",
            "Destination prefixes in the datapath's path table",
            None,
            gauge.metric_type(),
        )?)?;
        let gauge = ConstGauge::new(fresh.paths as i64);
        gauge.encode(encoder.encode_descriptor(
            "sopa_path_table_paths",
            "Candidate paths over all prefixes of the path table",
            None,
            gauge.metric_type(),
        )?)?;

        let gauge = ConstGauge::new(self.gauges.state.load(std::sync::atomic::Ordering::Relaxed));
        gauge.encode(encoder.encode_descriptor(
            "sopa_controller_connected",
            "1 connected to the controller, 0 disconnected (forwarding with the last good paths), -1 no controller",
            None,
            gauge.metric_type(),
        )?)?;
        let gauge = ConstGauge::new(
            self.gauges
                .version
                .load(std::sync::atomic::Ordering::Relaxed) as i64,
        );
        gauge.encode(encoder.encode_descriptor(
            "sopa_controller_applied_version",
            "The controller version this agent's datapath holds",
            None,
            gauge.metric_type(),
        )?)?;

        let down = self.gauges.peers_down.lock().expect("peers lock").clone();
        let gauge = ConstGauge::new(down.len() as i64);
        gauge.encode(encoder.encode_descriptor(
            "sopa_peer_agents_down",
            "Fabric hosts whose agent the controller reports lost: they receive this host's packets with the option on (delivered, not stripped, reordering unmeasured). Alarm when above 0",
            None,
            gauge.metric_type(),
        )?)?;
        if !down.is_empty() {
            let mut family = encoder.encode_descriptor(
                "sopa_peer_agent_down",
                "1 for each fabric host whose agent the controller reports lost",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for host in &down {
                let labels = [("host", host.as_str())];
                ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
            }
        }

        let mut family = encoder.encode_descriptor(
            "sopa_mode",
            "The datapath's path-selection mode (1 for the active one)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for m in 0..mode::COUNT {
            let labels = [("mode", mode_name(m))];
            ConstGauge::new(i64::from(m == config.mode)).encode(family.encode_family(&labels)?)?;
        }

        let mut family = encoder.encode_descriptor(
            "sopa_encoding",
            "How the datapath carries the chosen path (1 for the active encoding)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (e, name) in sopa_common::maps::encoding::NAMES.iter().enumerate() {
            let labels = [("encoding", *name)];
            ConstGauge::new(i64::from(e as u32 == encap.encoding))
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The registry with the datapath's collector, which reads the maps pinned under `pins`
/// through handles of its own, and `sopa_build_info` for `node`.
pub fn registry(
    pins: &Path,
    gauges: AgentGauges,
    node: &str,
    certificate: Option<&Path>,
) -> Result<Registry> {
    let maps = MapSet::from_pins(pins)?;
    let mut registry = Registry::default();
    sopa_ops::build_info::register(&mut registry, "agent", node);
    if let Some(cert) = certificate {
        register_cert_expiry(&mut registry, "agent", cert);
    }
    registry.register_collector(Box::new(DatapathCollector {
        maps: Mutex::new(maps),
        gauges,
        slow: Mutex::new(None),
    }));
    Ok(registry)
}

/// `sopa_certificate_expiry_timestamp_seconds{role}` of the certificate at `cert`.
pub fn register_cert_expiry(registry: &mut Registry, role: &'static str, cert: &Path) {
    sopa_ops::cert_expiry::register(
        registry,
        role,
        cert.to_owned(),
        Arc::new(sopa_channel::identity::not_after),
    );
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("writing to a String");
    out
}

/// Binds the metrics address: done before the agent changes anything, so an address in use
/// (or one off loopback without an allow-list) fails a start, or an upgrade, with nothing to
/// undo.
pub async fn bind(addr: SocketAddr, access: &Access) -> Result<TcpListener> {
    sopa_ops::http::bind(addr, access)
        .await
        .map_err(|err| match err {
            sopa_ops::http::BindError::Io { addr, source } => {
                Error::io(format!("binding the metrics address {addr}"), source)
            }
            refused => Error::Config(refused.to_string()),
        })
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` to the clients `access` lets in,
/// each scrape rendered on a blocking thread, one at a time.
pub fn serve(
    listener: TcpListener,
    registry: Registry,
    ready: sopa_ops::http::Readiness,
    access: Access,
) -> tokio::task::JoinHandle<()> {
    let registry = Arc::new(registry);
    sopa_ops::http::serve(
        listener,
        sopa_ops::http::Endpoints {
            render: Arc::new(move || render(&registry)),
            ready,
            access,
        },
    )
}
