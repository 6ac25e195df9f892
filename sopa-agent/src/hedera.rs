//! The host agent's half of the Hedera baseline: measure each flow's rate from the datapath's
//! per-flow byte counts, report the elephants (at least 10% of the NIC rate) every interval, and
//! install the controller's pins after checking each one names a live candidate path.

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::Duration,
};

use sopa_channel::proto::{FiveTuple, FlowReport, FlowSample, PinSet, agent_message::Kind};
use sopa_common::maps::{FlowKey, FlowState, Pin, mode};
use sopa_topology::paths::{Hops, PathTable as Candidates};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::datapath::MapSet;

/// The elephant threshold as a fraction of the NIC rate (Hedera's 10%).
pub const THRESHOLD: f64 = 0.1;

/// A datapath flow key as the channel carries it.
pub fn tuple_of(k: &FlowKey) -> FiveTuple {
    FiveTuple {
        saddr: u32::from(Ipv4Addr::from(k.saddr.to_ne_bytes())),
        daddr: u32::from(Ipv4Addr::from(k.daddr.to_ne_bytes())),
        sport: u32::from(u16::from_be_bytes(k.sport.to_ne_bytes())),
        dport: u32::from(u16::from_be_bytes(k.dport.to_ne_bytes())),
        proto: u32::from(k.proto),
    }
}

/// The datapath flow key of a 5-tuple; `None` when a field does not fit.
pub fn key_of(t: &FiveTuple) -> Option<FlowKey> {
    Some(FlowKey {
        saddr: u32::from_ne_bytes(Ipv4Addr::from(t.saddr).octets()),
        daddr: u32::from_ne_bytes(Ipv4Addr::from(t.daddr).octets()),
        sport: u16::from_ne_bytes(u16::try_from(t.sport).ok()?.to_be_bytes()),
        dport: u16::from_ne_bytes(u16::try_from(t.dport).ok()?.to_be_bytes()),
        proto: u8::try_from(t.proto).ok()?,
        _pad: [0; 3],
    })
}

/// Rates from successive byte counts.
#[derive(Debug, Default)]
pub struct ElephantMeter {
    last: HashMap<FlowKey, u64>,
}

impl ElephantMeter {
    /// The report for one interval: every flow that sent at least `THRESHOLD` of `nic_bps`
    /// since the previous sample. A flow seen for the first time counts from zero.
    pub fn sample(
        &mut self,
        flows: &[(FlowKey, FlowState)],
        interval: Duration,
        nic_bps: u64,
    ) -> FlowReport {
        let secs = interval.as_secs_f64().max(1e-3);
        let mut next = HashMap::with_capacity(flows.len());
        let mut out = Vec::new();
        for (k, state) in flows {
            let before = self.last.get(k).copied().unwrap_or(0);
            let sent = state.bytes.saturating_sub(before);
            let rate_bps = (sent as f64 * 8.0 / secs) as u64;
            if rate_bps as f64 >= THRESHOLD * nic_bps as f64 {
                out.push(FlowSample {
                    flow: Some(tuple_of(k)),
                    rate_bps,
                    bytes: state.bytes,
                });
            }
            next.insert(*k, state.bytes);
        }
        self.last = next;
        out.truncate(sopa_channel::proto::MAX_FLOWS);
        FlowReport {
            interval_ms: interval.as_millis().clamp(1, u32::MAX as u128) as u32,
            nic_bps,
            flows: out,
        }
    }
}

/// Reports elephants every `interval` while the datapath is in `pinned` mode (the mode can be
/// switched at run time, so it is read every time).
pub async fn report_loop(
    maps: Arc<Mutex<MapSet>>,
    reports: mpsc::Sender<Kind>,
    interval: Duration,
    nic_bps: u64,
) {
    let mut meter = ElephantMeter::default();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let flows = {
            let maps = maps.lock().expect("maps lock");
            match maps.config() {
                Ok(c) if c.mode == mode::PINNED => maps.flows(),
                Ok(_) => continue,
                Err(e) => Err(e),
            }
        };
        let flows = match flows {
            Ok(f) => f,
            Err(err) => {
                warn!(%err, "reading the flow table for Hedera");
                continue;
            }
        };
        let report = meter.sample(&flows, interval, nic_bps);
        debug!(elephants = report.flows.len(), "flow report");
        // A full queue (controller away) drops this interval's report: the next one replaces it.
        let _ = reports.try_send(Kind::Flows(report));
    }
}

/// Monotonic nanoseconds, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Nanoseconds of `clock`, as the eBPF helpers read the kernel's clocks.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Whether `hops` is a live candidate path from this host to `daddr`.
fn live_path(candidates: &Candidates, daddr: Ipv4Addr, hops: Hops) -> Result<(), String> {
    let dest = candidates
        .destinations
        .iter()
        .find(|d| d.prefix().contains_addr(daddr))
        .ok_or_else(|| format!("{daddr} is not behind another rack of the fabric"))?;
    if dest.alive_hops().any(|h| h == hops) {
        Ok(())
    } else {
        Err(format!(
            "path {hops} is not a live candidate path to {} ({})",
            dest.prefix(),
            dest.alive_hops()
                .map(|h| h.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ))
    }
}

/// The datapath entries of a pin set, or why the set is refused (whole): a pin that is not
/// this host's flow, names a path that is not a live candidate, or a malformed field.
pub fn check_pins(
    set: &PinSet,
    own: Ipv4Addr,
    candidates: &Candidates,
    now_ns: u64,
) -> Result<Vec<(FlowKey, Pin)>, String> {
    if set.lifetime_ms == 0 {
        return Err(format!("round {}: a pin lifetime of 0", set.round));
    }
    if set.pins.len() > sopa_common::maps::PINS_CAPACITY as usize {
        return Err(format!(
            "round {}: {} pins, more than the datapath's {}",
            set.round,
            set.pins.len(),
            sopa_common::maps::PINS_CAPACITY
        ));
    }
    let expires_ns = now_ns + u64::from(set.lifetime_ms) * 1_000_000;
    let mut out = Vec::with_capacity(set.pins.len());
    for (i, p) in set.pins.iter().enumerate() {
        let t = p.flow.ok_or_else(|| format!("pin {i}: no 5-tuple"))?;
        let name = t.name();
        let key = key_of(&t).ok_or_else(|| format!("pin {i} ({name}): a field out of range"))?;
        if Ipv4Addr::from(t.saddr) != own {
            return Err(format!("pin {i} ({name}): not a flow of this host ({own})"));
        }
        let (Ok(hop0), Ok(hop1)) = (u8::try_from(p.hop0), u8::try_from(p.hop1)) else {
            return Err(format!("pin {i} ({name}): hop values above 255"));
        };
        live_path(candidates, Ipv4Addr::from(t.daddr), Hops { hop0, hop1 })
            .map_err(|e| format!("pin {i} ({name}): {e}"))?;
        out.push((
            key,
            Pin {
                hops: [hop0, hop1],
                _pad: [0; 6],
                expires_ns,
            },
        ));
    }
    Ok(out)
}

/// The pins still valid after the candidate paths changed (a failure can kill a pinned path).
pub fn still_live(
    pins: Vec<(FlowKey, Pin)>,
    candidates: &Candidates,
) -> (Vec<(FlowKey, Pin)>, usize) {
    let before = pins.len();
    let kept: Vec<_> = pins
        .into_iter()
        .filter(|(k, p)| {
            let t = tuple_of(k);
            live_path(
                candidates,
                Ipv4Addr::from(t.daddr),
                Hops {
                    hop0: p.hops[0],
                    hop1: p.hops[1],
                },
            )
            .is_ok()
        })
        .collect();
    let dropped = before - kept.len();
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use sopa_channel::proto::FlowPin;
    use sopa_topology::{Topology, paths::Failures, topology::TopologySpec};

    use super::*;

    fn setup() -> (Topology, Candidates, Ipv4Addr) {
        let t = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
        let h0 = t.graph().find("h0").unwrap();
        let c = Candidates::compute(&t, h0, &Failures::none(t.graph())).unwrap();
        let own = t.graph().node(h0).addr.unwrap();
        (t, c, own)
    }

    fn tuple(src: Ipv4Addr, dst: Ipv4Addr) -> FiveTuple {
        FiveTuple {
            saddr: u32::from(src),
            daddr: u32::from(dst),
            sport: 40000,
            dport: 5001,
            proto: 6,
        }
    }

    #[test]
    fn keys_and_tuples_round_trip() {
        let t = tuple(Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 1, 0, 3));
        let k = key_of(&t).unwrap();
        assert_eq!(tuple_of(&k), t);
        // The datapath's key holds the packet's bytes: port 40000 is 0x9c40 on the wire.
        assert_eq!(k.sport.to_ne_bytes(), [0x9c, 0x40]);
        assert_eq!(k.saddr.to_ne_bytes(), [10, 0, 0, 2]);
    }

    #[test]
    fn the_meter_reports_flows_above_a_tenth_of_the_nic() {
        let mut m = ElephantMeter::default();
        let key = |p: u16| FlowKey {
            sport: p.to_be(),
            ..FlowKey::default()
        };
        let state = |bytes| FlowState {
            bytes,
            ..FlowState::default()
        };
        let nic = 100_000_000; // 100 Mbit/s: elephants send 1.25 MB/s or more.
        let r = m.sample(
            &[(key(1), state(2_000_000)), (key(2), state(100_000))],
            Duration::from_secs(1),
            nic,
        );
        assert_eq!(r.flows.len(), 1);
        assert_eq!(r.flows[0].rate_bps, 16_000_000);
        // The next interval counts only the new bytes: flow 1 went quiet, flow 2 got big.
        let r = m.sample(
            &[(key(1), state(2_100_000)), (key(2), state(5_000_000))],
            Duration::from_secs(1),
            nic,
        );
        assert_eq!(r.flows.len(), 1);
        assert_eq!(r.flows[0].flow.unwrap().sport, 2);
        assert_eq!((r.interval_ms, r.nic_bps), (1000, nic));
    }

    #[test]
    fn pins_on_live_paths_are_taken_with_their_lifetime() {
        let (_, c, own) = setup();
        let set = PinSet {
            round: 3,
            lifetime_ms: 5000,
            pins: vec![FlowPin {
                flow: Some(tuple(own, Ipv4Addr::new(10, 1, 0, 2))),
                hop0: 1,
                hop1: 0,
            }],
        };
        let pins = check_pins(&set, own, &c, 1_000).unwrap();
        assert_eq!(pins.len(), 1);
        assert_eq!(pins[0].1.hops, [1, 0]);
        assert_eq!(pins[0].1.expires_ns, 1_000 + 5_000_000_000);
    }

    #[test]
    fn a_bad_pin_refuses_the_whole_set() {
        let (t, c, own) = setup();
        let good = FlowPin {
            flow: Some(tuple(own, Ipv4Addr::new(10, 1, 0, 2))),
            hop0: 0,
            hop1: 1,
        };
        let h1 = t.graph().node(t.graph().find("h1").unwrap()).addr.unwrap();
        let cases = [
            (
                FlowPin {
                    hop0: 2,
                    ..good.clone()
                },
                "not a live candidate path",
            ),
            (
                FlowPin {
                    flow: Some(tuple(h1, Ipv4Addr::new(10, 1, 0, 2))),
                    ..good.clone()
                },
                "not a flow of this host",
            ),
            (
                FlowPin {
                    flow: Some(tuple(own, Ipv4Addr::new(192, 0, 2, 1))),
                    ..good.clone()
                },
                "not behind another rack",
            ),
            (
                FlowPin {
                    hop1: 300,
                    ..good.clone()
                },
                "above 255",
            ),
            (
                FlowPin {
                    flow: None,
                    ..good.clone()
                },
                "no 5-tuple",
            ),
        ];
        for (bad, needle) in cases {
            let set = PinSet {
                round: 1,
                lifetime_ms: 1000,
                pins: vec![good.clone(), bad],
            };
            let e = check_pins(&set, own, &c, 0).unwrap_err();
            assert!(e.contains(needle) && e.contains("pin 1"), "{e}");
        }
    }

    #[test]
    fn a_failure_drops_the_pins_of_dead_paths() {
        let (t, mut c, own) = setup();
        let set = PinSet {
            round: 1,
            lifetime_ms: 1000,
            pins: vec![
                FlowPin {
                    flow: Some(tuple(own, Ipv4Addr::new(10, 1, 0, 2))),
                    hop0: 0,
                    hop1: 0,
                },
                FlowPin {
                    flow: Some(tuple(own, Ipv4Addr::new(10, 1, 0, 3))),
                    hop0: 1,
                    hop1: 1,
                },
            ],
        };
        let pins = check_pins(&set, own, &c, 0).unwrap();
        let mut f = Failures::none(t.graph());
        let changed = f.set_link(t.resolve_link("a0:c0").unwrap(), true);
        c.update(t.graph(), &f, &changed);
        let (kept, dropped) = still_live(pins, &c);
        assert_eq!((kept.len(), dropped), (1, 1));
        assert_eq!(kept[0].1.hops, [1, 1]);
    }
}
