//! Readers under a rewrite: `tc_stamp` runs on every CPU (BPF_PROG_TEST_RUN) while a thread
//! rewrites the tables it reads. A hash map's replaced or removed element is reused by the
//! map's next insert without waiting for the programs that still hold it, so a writer that
//! replaces entries in place hands a reader one key's value under another key. Each test counts
//! the hops that went out (`SOPA_HOPS_V1`): a hop only another key holds is a mix. The writer
//! now waits out a grace period before reusing what it freed (`sopa_agent::datapath::grace`),
//! so its rewrites are fewer per second than they were.

mod common;

use std::sync::{
    Barrier,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use aya::programs::SchedClassifier;
use aya::programs::{TestRun as _, TestRunOptions};
use sopa_agent::{datapath::MapSet, path_table::PathTable};
use sopa_common::maps::{FlowKey, Pin, mode};

use common::{Fixture, TC_ACT_UNSPEC, allowed_cpus, run_on_cpu};

/// Runs per CPU: with the table written in place, 1-2 of 40 million runs on two CPUs took the
/// other prefix's path against about 6,000 rewrites, and 2-3 the other flow's pin against
/// 120,000-160,000 (three runs each).
const RUNS: u32 = 20_000_000;

/// A TCP packet from 10.1.0.2 to `dst`.
fn tcp(dst: [u8; 4], sport: u16) -> Vec<u8> {
    let mut p = Vec::new();
    etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4([10, 1, 0, 2], dst, 64)
        .tcp(sport, 80, 1, 1000)
        .write(&mut p, b"data")
        .unwrap();
    p
}

/// Runs `tc_stamp` on `packet` on each allowed CPU, in batches, while `write` is called over and
/// over on this thread until `enough(writes, runs)` (`runs`: the fewest any CPU has made);
/// returns the writes and the runs of all CPUs. Batches, not one long run: a writer that waits
/// out RCU grace periods waits for every CPU to leave its test run.
fn race(
    f: &mut Fixture,
    packet: &[u8],
    enough: impl Fn(u64, u64) -> bool,
    mut write: impl FnMut(&mut MapSet, u64) + Send,
) -> (u64, u64) {
    const BATCH: u32 = 100_000;
    let cpus = allowed_cpus();
    assert!(
        cpus.len() >= 2,
        "this test needs two CPUs to race a writer against; allowed: {cpus:?}"
    );
    let start = Barrier::new(cpus.len() + 1);
    let done = AtomicBool::new(false);
    let counts: Vec<AtomicU64> = cpus.iter().map(|_| AtomicU64::new(0)).collect();
    let Fixture { datapath, maps, .. } = f;
    let program: &SchedClassifier = datapath.stamp_program();
    let writes = std::thread::scope(|s| {
        let mut readers = Vec::new();
        for (&cpu, count) in cpus.iter().zip(&counts) {
            let (program, start, done) = (&program, &start, &done);
            readers.push(s.spawn(move || {
                run_on_cpu(cpu);
                let mut out = vec![0u8; packet.len() + 64];
                start.wait();
                while !done.load(Ordering::Relaxed) {
                    let r = program
                        .test_run(TestRunOptions {
                            data_in: Some(packet),
                            data_out: Some(&mut out),
                            repeat: BATCH,
                            ..Default::default()
                        })
                        .unwrap();
                    assert_eq!(r.return_value, TC_ACT_UNSPEC);
                    count.fetch_add(u64::from(BATCH), Ordering::Relaxed);
                }
            }));
        }
        start.wait();
        let fewest = || counts.iter().map(|c| c.load(Ordering::Relaxed)).min();
        let mut writes = 0;
        // A reader ends early only by failing: the scope then reports its panic.
        while !enough(writes, fewest().unwrap_or(0)) && !readers.iter().any(|r| r.is_finished()) {
            write(maps, writes);
            writes += 1;
        }
        done.store(true, Ordering::Relaxed);
        writes
    });
    // The scope joined every reader: their counts are final.
    let runs = counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    (writes, runs)
}

/// The table of round `n`: P (10.3.1.0/24) on paths (1, i), Q (10.3.2.0/24) on (2, i), each with
/// one path more or less in every other round so that each round changes both.
fn table(n: u64) -> PathTable {
    PathTable::parse(&table_toml(n)).unwrap()
}

fn table_toml(n: u64) -> String {
    let (p, q) = if n.is_multiple_of(2) { (3, 4) } else { (4, 3) };
    let paths = |hop: u8, times: u8| {
        (0..times)
            .map(|i| format!("[{hop}, {i}]"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "[[destination]]\nprefix = \"10.3.1.0/24\"\npaths = [{}]\n\
         [[destination]]\nprefix = \"10.3.2.0/24\"\npaths = [{}]\n",
        paths(1, p),
        paths(2, q)
    )
}

#[test]
fn a_packet_to_one_prefix_never_takes_anothers_path_while_the_table_is_rewritten() {
    let mut f = Fixture::new(&table_toml(0), mode::SOPA);
    assert_eq!(
        f.maps.exact_length().unwrap(),
        Some(24),
        "matched in the exact table"
    );
    let packet = tcp([10, 3, 1, 2], 41000);
    let (writes, runs) = race(
        &mut f,
        &packet,
        |_, runs| runs >= u64::from(RUNS),
        |maps, n| maps.apply_paths(&table(n + 1)).unwrap(),
    );
    let hops = f.maps.hop_counters().unwrap();
    assert_eq!(
        hops[2], 0,
        "packets to 10.3.1.0/24 that left on one of 10.3.2.0/24's paths (2, _), in {runs} runs \
         against {writes} table writes"
    );
    assert_eq!(hops[1], runs, "every run stamped");
    assert!(writes > 10, "the table was rewritten {writes} times only");
}

#[test]
fn a_pinned_flow_never_takes_another_flows_pin_while_pins_are_rewritten() {
    let mut f = Fixture::new(&table_toml(0), mode::PINNED);
    let key = |sport: u16, dst: [u8; 4]| FlowKey {
        saddr: u32::from_ne_bytes([10, 1, 0, 2]),
        daddr: u32::from_ne_bytes(dst),
        sport: sport.to_be(),
        dport: 80u16.to_be(),
        proto: 6,
        _pad: [0; 3],
    };
    let (mine, other) = (key(41000, [10, 3, 1, 2]), key(42000, [10, 3, 2, 2]));
    let pin = |hop: u8, n: u64| Pin {
        hops: [hop, hop],
        _pad: [0; 6],
        expires_ns: u64::MAX - n,
    };
    f.maps
        .replace_pins(&[(mine, pin(1, 0)), (other, pin(2, 0))])
        .unwrap();
    let packet = tcp([10, 3, 1, 2], 41000);
    let (writes, runs) = race(
        &mut f,
        &packet,
        |_, runs| runs >= u64::from(RUNS),
        |maps, n| {
            // Both pins change every round (their expiry).
            maps.replace_pins(&[(mine, pin(1, n + 1)), (other, pin(2, n + 1))])
                .unwrap();
        },
    );
    let hops = f.maps.hop_counters().unwrap();
    assert_eq!(
        (hops[2], hops[256 + 2]),
        (0, 0),
        "packets of the flow pinned to (1, 1) that left on another flow's pin (2, 2), in {runs} \
         runs against {writes} pin writes"
    );
    assert!(writes > 10, "the pins were rewritten {writes} times only");
}

/// A packet reads the agent's settings from one snapshot (`sopa_agent::datapath::host_config`):
/// while the table alternates between a /24 and the /16 around it, the prefix that covers the
/// table (a network and a mask, written together) narrows and widens under the packets, and a
/// packet that paired one table's network with the other's mask would leave unstamped (outside
/// the cover), where either table stamps it.
#[test]
fn a_packet_never_reads_half_of_a_settings_change() {
    let toml = |n: u64| {
        if n.is_multiple_of(2) {
            "[[destination]]\nprefix = \"10.3.1.0/24\"\npaths = [[1, 0]]\n"
        } else {
            "[[destination]]\nprefix = \"10.3.0.0/16\"\npaths = [[2, 0]]\n"
        }
    };
    let mut f = Fixture::new(toml(0), mode::SOPA);
    let packet = tcp([10, 3, 1, 2], 41000);
    // However long a change waits for its grace periods: 40 table writes, each several
    // changes of the settings (the cover, the lookup slot, the meter's rack mask).
    let (writes, runs) = race(
        &mut f,
        &packet,
        |writes, _| writes >= 40,
        |maps, n| {
            maps.apply_paths(&PathTable::parse(toml(n + 1)).unwrap())
                .unwrap();
        },
    );
    let hops = f.maps.hop_counters().unwrap();
    assert_eq!(
        hops[1] + hops[2],
        runs,
        "runs stamped on either table's path ({} and {}) of {runs}, against {writes} table writes",
        hops[1],
        hops[2]
    );
    assert!(
        hops[1] > 0 && hops[2] > 0,
        "both tables were read: {} and {}",
        hops[1],
        hops[2]
    );
}
