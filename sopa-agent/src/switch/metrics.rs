//! The switch role's metrics: `tc_forward`'s verdicts (forwarded, detoured, repaired, dropped
//! and why), the packets redirected per uplink, and the push channel's state, read at every
//! scrape through handles of their own.

use std::{
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use sopa_common::maps::forward_reason;

use crate::{datapath::maps::ForwardMaps, error::Result};

/// What the switch's metrics show beyond its maps.
#[derive(Clone, Debug)]
pub struct SwitchGauges {
    /// 1 connected to the controller, 0 disconnected (forwarding by the last topology).
    pub connected: Arc<AtomicI64>,
    /// The controller's version this switch's forwarding holds (0: none yet).
    pub version: Arc<AtomicU64>,
    /// Ports of the plan without carrier now.
    pub dead_ports: Arc<AtomicU64>,
}

impl Default for SwitchGauges {
    fn default() -> Self {
        Self {
            connected: Arc::new(AtomicI64::new(0)),
            version: Arc::default(),
            dead_ports: Arc::default(),
        }
    }
}

impl SwitchGauges {
    /// `/readyz`: ready once the forwarding holds the controller's topology.
    pub fn readiness(&self) -> sopa_ops::http::Readiness {
        let version = Arc::clone(&self.version);
        Arc::new(move || {
            if version.load(Ordering::Relaxed) == 0 {
                Err("waiting for the controller's first topology (`sopa-agent status` shows the channel)".into())
            } else {
                Ok(())
            }
        })
    }
}

struct SwitchCollector {
    maps: Mutex<ForwardMaps>,
    gauges: SwitchGauges,
}

impl std::fmt::Debug for SwitchCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchCollector").finish_non_exhaustive()
    }
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for SwitchCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (verdicts, uplinks) = {
            let maps = self.maps.lock().expect("forward maps lock");
            (
                maps.counters().unwrap_or_default(),
                maps.uplink_counters().unwrap_or_default(),
            )
        };
        let probe = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "sopa_switch_forward_packets",
            "tc_forward's verdicts by reason: redirected by the path, detoured or repaired around a dead port, handed to the kernel, dropped",
            None,
            probe.metric_type(),
        )?;
        for (v, reason) in verdicts.iter().zip(forward_reason::NAMES) {
            ConstCounter::new(*v).encode(family.encode_family(&[("reason", reason)])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "sopa_switch_uplink_packets",
            "Packets tc_forward redirected, per uplink index of the switch's plan",
            None,
            probe.metric_type(),
        )?;
        for (i, v) in uplinks.iter().enumerate() {
            ConstCounter::new(*v).encode(family.encode_family(&[("uplink", i.to_string())])?)?;
        }
        gauge(
            &mut encoder,
            "sopa_controller_connected",
            "1 connected to the controller, 0 disconnected (forwarding by the last topology)",
            self.gauges.connected.load(Ordering::Relaxed),
        )?;
        gauge(
            &mut encoder,
            "sopa_controller_applied_version",
            "The controller version this switch's forwarding holds",
            self.gauges.version.load(Ordering::Relaxed) as i64,
        )?;
        gauge(
            &mut encoder,
            "sopa_switch_dead_ports",
            "Ports of the switch's plan without carrier now (repaired around)",
            self.gauges.dead_ports.load(Ordering::Relaxed) as i64,
        )
    }
}

/// The switch's registry: its collector on the maps pinned under `pins`, and
/// `sopa_build_info` for `node`.
pub fn registry(pins: &Path, gauges: SwitchGauges, node: &str) -> Result<Registry> {
    let maps = ForwardMaps::from_pins(pins)?;
    let mut registry = Registry::default();
    sopa_ops::build_info::register(&mut registry, "switch", node);
    registry.register_collector(Box::new(SwitchCollector {
        maps: Mutex::new(maps),
        gauges,
    }));
    Ok(registry)
}
