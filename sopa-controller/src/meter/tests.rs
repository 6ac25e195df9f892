//! The intake against hosts that lie or drift: each attack of the meter's trust model, and
//! the honest evidence that must still convict.

use std::{collections::BTreeSet, time::Duration};

use sopa_topology::{NodeKind, Topology};

use super::*;
use crate::tomography::tests::{fat_tree, reports};

const P: u64 = 250_000_000;

fn meter(topo: &Arc<Topology>) -> Meter {
    Meter::new(
        Arc::clone(topo),
        JudgeConfig::default(),
        MeterClock::new(Duration::from_millis(250), 0),
    )
}

/// The TAI time a report of period `p` comes at: half a period after it ended.
fn when(p: u64) -> u64 {
    (p + 1) * P + P / 2
}

/// Feeds every report at its time; returns the refusals, by host.
fn feed(m: &mut Meter, p: u64, reps: Vec<(String, PathReport)>) -> Vec<(String, Refused)> {
    let connected: BTreeSet<String> = reps.iter().map(|(h, _)| h.clone()).collect();
    let now = Instant::now();
    let mut refused = Vec::new();
    for (h, r) in reps {
        if let Err(e) = m.accept(Reporter::settled(&h), r, 0, when(p), now, &connected) {
            refused.push((h, e.why));
        }
    }
    refused
}

/// The hops of `host`'s paths to `rack` (by its prefix address) that cross `a` -> `b`.
fn through(topo: &Topology, host: &str, rack: u32, a: &str, b: &str) -> Vec<u32> {
    let g = topo.graph();
    let h = g.find(host).unwrap();
    let rack = topo
        .racks()
        .into_iter()
        .find(|r| u32::from(r.prefix.addr) == rack)
        .unwrap();
    let mut out = Vec::new();
    topo.paths_to_rack(h, &rack, |h0, h1, links| {
        let mut at = h;
        for &l in links {
            let next = g.links[l as usize].other(at);
            if g.name(at) == a && g.name(next) == b {
                out.push(u32::from(h0) | (u32::from(h1) << 8));
            }
            at = next;
        }
    });
    out
}

/// Adds `extra` to `host`'s sent counts on its paths through `a` -> `b`.
fn inflate(topo: &Topology, reps: &mut [(String, PathReport)], host: &str, extra: u64) {
    let (_, r) = reps.iter_mut().find(|(h, _)| h == host).unwrap();
    for peer in &mut r.sent {
        let hops = through(topo, host, peer.rack, "a0", "c0");
        for (i, h) in peer.hops.iter().enumerate() {
            if hops.contains(h) {
                peer.packets[i] += extra;
            }
        }
    }
}

/// The links the evidence convicts now, by their ends' names.
fn verdicts(m: &mut Meter) -> Vec<(String, String)> {
    let v = m.tomography.judge(|_| false);
    v.iter().map(|v| m.tomography.names(v.link)).collect()
}

fn named(m: &Meter, host: &str) -> Option<MeterHost> {
    m.named(Instant::now()).into_iter().find(|h| h.host == host)
}

#[test]
fn a_host_inflating_its_sent_counts_is_flagged_and_convicts_nothing() {
    let topo = fat_tree();
    let mut m = meter(&topo);
    for p in 0..4 {
        let mut reps = reports(&topo, p, 200, None, 0, 16);
        inflate(&topo, &mut reps, "h0", 10_000);
        assert_eq!(feed(&mut m, p, reps), vec![]);
    }
    assert_eq!(m.tomography.last_period(), Some(3));
    assert_eq!(verdicts(&mut m), vec![]);
    let h0 = named(&m, "h0").expect("h0 named");
    assert_eq!(h0.reason, INCONSISTENT);
    assert!(
        h0.detail.contains("it says it sent 10200 packets on path"),
        "{}",
        h0.detail
    );
    assert_eq!(h0.reports, 4);
    assert_eq!(m.inconsistent, 4);
    assert_eq!(m.named(Instant::now()).len(), 1, "only h0");

    // Two honest racks (pod 0's four hosts) seeing 2% loss on the same link convict it.
    let mut m = meter(&topo);
    for p in 0..4 {
        feed(
            &mut m,
            p,
            reports(&topo, p, 200, Some(("a0", "c0", 0.02)), 0, 4),
        );
    }
    assert_eq!(verdicts(&mut m), vec![("a0".into(), "c0".into())]);
    assert!(m.named(Instant::now()).is_empty());
}

#[test]
fn a_lie_within_the_spraying_slack_convicts_nothing_for_want_of_a_second_rack() {
    let topo = fat_tree();
    // h0 claims 40 more of 200 on its paths through a0 -> c0: balanced enough to pass, 20%
    // lost to any judge that believed one rack.
    let run = |corroborate: bool| {
        let mut m = Meter::new(
            Arc::clone(&topo),
            JudgeConfig {
                corroborate,
                ..JudgeConfig::default()
            },
            MeterClock::new(Duration::from_millis(250), 0),
        );
        for p in 0..4 {
            let mut reps = reports(&topo, p, 200, None, 0, 16);
            inflate(&topo, &mut reps, "h0", 40);
            feed(&mut m, p, reps);
        }
        assert!(named(&m, "h0").is_none(), "within the slack");
        verdicts(&mut m)
    };
    assert_eq!(run(true), vec![]);
    assert_eq!(run(false), vec![("a0".into(), "c0".into())]);
}

#[test]
fn a_host_receiving_less_than_it_did_convicts_nothing() {
    let topo = fat_tree();
    let mut m = meter(&topo);
    for p in 0..4 {
        let mut reps = reports(&topo, p, 200, None, 0, 16);
        // h4 (rack e2) says it got a fifth less on every path through c0 from pod 0.
        let (_, r) = reps.iter_mut().find(|(h, _)| h == "h4").unwrap();
        let hosts: Vec<String> = topo
            .graph()
            .nodes_of(NodeKind::Host)
            .map(|h| topo.graph().name(h).to_owned())
            .collect();
        for peer in &mut r.received {
            let sender = hosts
                .iter()
                .find(|h| {
                    let n = topo.graph().find(h).unwrap();
                    u32::from(topo.rack_of(n).unwrap().prefix.addr) == peer.rack
                })
                .unwrap();
            let e2 = u32::from(
                topo.rack_of(topo.graph().find("h4").unwrap())
                    .unwrap()
                    .prefix
                    .addr,
            );
            let hops = through(&topo, sender, e2, "a0", "c0");
            for (i, h) in peer.hops.iter().enumerate() {
                if hops.contains(h) {
                    peer.packets[i] -= 40;
                }
            }
        }
        feed(&mut m, p, reps);
    }
    assert_eq!(verdicts(&mut m), vec![]);
}

#[test]
fn a_host_off_the_controllers_clock_is_refused_and_named_and_the_rest_convict() {
    let topo = fat_tree();
    let mut m = meter(&topo);
    for p in 0..6 {
        let mut reps = reports(&topo, p, 200, Some(("a0", "c0", 0.02)), 0, 16);
        let (_, odd) = reps.iter_mut().find(|(h, _)| h == "h15").unwrap();
        odd.period += 3;
        let refused = feed(&mut m, p, reps);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].0, "h15");
        assert_eq!(refused[0].1.reason(), "clock");
    }
    assert_eq!(verdicts(&mut m), vec![("a0".into(), "c0".into())]);
    let h15 = named(&m, "h15").expect("h15 named");
    assert_eq!(h15.reason, "clock");
    assert!(h15.detail.contains("3 periods ahead of"), "{}", h15.detail);
    assert_eq!(
        m.refused().iter().find(|(r, _)| *r == "clock").unwrap().1,
        6
    );
    // Its period did not wait for it: each closed when the 15 others were in.
    assert_eq!(m.tomography.periods_judged, 6);
}

#[test]
fn counts_of_u64_max_twice_are_refused_without_a_panic() {
    let topo = fat_tree();
    let mut m = meter(&topo);
    let mut reps = reports(&topo, 0, 200, None, 0, 16);
    let (_, r) = reps.iter_mut().find(|(h, _)| h == "h0").unwrap();
    r.sent.truncate(1);
    r.sent[0].hops.truncate(1);
    r.sent[0].packets = vec![u64::MAX];
    r.sent[0].bytes.clear();
    r.sent.push(r.sent[0].clone());
    let refused = feed(&mut m, 0, reps.clone());
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].1.reason(), "malformed");
    // Once each, on two racks: past what links carry.
    let (_, r) = reps.iter_mut().find(|(h, _)| h == "h0").unwrap();
    r.sent[1].rack = reps_rack(&topo, "h8");
    let mut m = meter(&topo);
    let refused = feed(&mut m, 0, reps);
    assert_eq!(refused[0].1.reason(), "implausible", "{refused:?}");
    // The period closed without h0 (its rack left out): nothing of its report counted.
    assert_eq!(m.tomography.last_period(), Some(0));
    assert_eq!(m.tomography.periods_partial, 1);
    assert!(m.tomography.link_loss(4).iter().all(|l| l.lost == 0));
}

fn reps_rack(topo: &Topology, host: &str) -> u32 {
    let h = topo.graph().find(host).unwrap();
    u32::from(topo.rack_of(h).unwrap().prefix.addr)
}

#[test]
fn racks_and_paths_the_topology_lacks_are_refused() {
    let topo = fat_tree();
    let mut reps = reports(&topo, 0, 200, None, 0, 16);
    let (_, r) = reps.iter_mut().find(|(h, _)| h == "h0").unwrap();
    r.sent[0].hops[0] = 0x3f3f;
    let mut m = meter(&topo);
    let refused = feed(&mut m, 0, reps.clone());
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].1.to_string().contains("path 63.63 to rack"),
        "{}",
        refused[0].1
    );
    let (_, r) = reps.iter_mut().find(|(h, _)| h == "h0").unwrap();
    r.sent[0].hops[0] = 0;
    r.sent[0].rack = u32::from(std::net::Ipv4Addr::new(192, 0, 2, 0));
    let refused = feed(&mut meter(&topo), 0, reps.clone());
    assert!(
        refused[0].1.to_string().contains("192.0.2.0 is not a rack"),
        "{}",
        refused[0].1
    );
    r_own(&topo, &mut reps);
    let refused = feed(&mut meter(&topo), 0, reps);
    assert!(refused[0].1.to_string().contains("own"), "{}", refused[0].1);
}

fn r_own(topo: &Topology, reps: &mut [(String, PathReport)]) {
    let own = reps_rack(topo, "h0");
    let (_, r) = reps.iter_mut().find(|(h, _)| h == "h0").unwrap();
    r.sent[0].rack = own;
}

#[test]
fn a_host_reporting_faster_than_its_periods_is_held_to_its_rate() {
    let topo = fat_tree();
    let mut m = meter(&topo);
    let reps = reports(&topo, 0, 200, None, 0, 16);
    let (h, r) = reps[0].clone();
    let connected: BTreeSet<String> = [h.clone()].into();
    let now = Instant::now();
    let refused = (0..100)
        .filter(|_| {
            m.accept(
                Reporter::settled(&h),
                r.clone(),
                0,
                when(0),
                now,
                &connected,
            )
            .is_err_and(|e| e.why == Refused::Rate)
        })
        .count();
    assert_eq!(refused, 100 - hosts::REPORT_BURST as usize);
}

#[test]
fn reports_kept_while_the_controller_was_away_are_refused_naming_no_one() {
    let topo = fat_tree();
    let mut m = meter(&topo);
    let reps = reports(&topo, 0, 200, None, 0, 16);
    let (h, r) = reps[0].clone();
    let connected: BTreeSet<String> = [h.clone()].into();
    let now = Instant::now();
    // Period 0's report, 40 periods later: behind.
    let late = when(40);
    let fresh = Reporter {
        host: &h,
        session_age: Duration::from_millis(100),
    };
    let why = m
        .accept(fresh, r.clone(), 0, late, now, &connected)
        .unwrap_err();
    assert_eq!(why.why.reason(), "clock");
    assert!(!why.news);
    assert!(
        named(&m, &h).is_none(),
        "kept while away: not the host's fault"
    );
    // Ahead of the clock in a new session, or behind it in a settled one: the host's clock.
    let mut ahead = r.clone();
    ahead.period = 45;
    assert!(
        m.accept(fresh, ahead, 0, late, now, &connected)
            .is_err_and(|e| e.news)
    );
    assert_eq!(named(&m, &h).unwrap().reason, "clock");
    let mut m = meter(&topo);
    assert!(
        m.accept(Reporter::settled(&h), r, 0, late, now, &connected)
            .is_err_and(|e| e.news)
    );
    assert!(named(&m, &h).unwrap().detail.contains("behind"));
    assert_eq!(
        m.refused().iter().find(|(r, _)| *r == "clock").unwrap().1,
        1
    );
}
