//! `cargo xtask bench resilience [-- --rounds N]`: the resilience tests at full size, each beside
//! its baseline in one run on A - R - B, printed as a table.
//!
//! - restart: a steady 10 kpps UDP probe through N agent restarts, with `--keep-attached`
//!   (adopted, programs replaced in place) and `--takeover` (a new agent beside the running one)
//!   beside plain restarts (detach, then attach again): the share of probe packets stamped and
//!   the share delivered.
//! - switch restarts: the same probe across a Fat-Tree k=4 (h0 -> h4, half of it through
//!   aggregation switch a0 and all of it through edge switch e0) through N restarts of a0's
//!   and e0's agents, with `--keep-attached` (adopted, `tc_forward` replaced in place on
//!   every port) beside plain restarts (routes and programs removed, then installed again).
//! - kill: SIGKILL during a 200 MiB transfer paced to last about 3 s: the transfer intact, the
//!   packets stamped while no agent ran, the time the next agent takes to adopt.
//! - short flows: 100,000 two-packet UDP flows within a minute: packets lost, flow table
//!   evictions, agent memory before and after.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use sopa_testbed::{
    arb::Arb,
    capture::Capture,
    fabric::{Fabric, FabricOptions},
    resilience::{DetachOnDrop, Probe, from_a, probe, rss_kib, short_flows, start_a, start_b},
    traffic::{SendOptions, tcp_transfer},
};
use sopa_topology::topology::TopologySpec;

struct Args {
    rounds: u32,
    /// Toy size (20 MiB, 5,000 short flows), to check the benchmark runs.
    smoke: bool,
}

/// The command line (`cargo xtask bench resilience -- --help`).
#[derive(clap::Parser)]
#[command(
    name = "bench resilience",
    about = "The agent's restarts, upgrades and takeovers under traffic, its memory, and short flows"
)]
struct Cli {
    /// Restarts of each kind.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Toy size (20 MiB, 5,000 short flows), to check the benchmark runs.
    #[arg(long)]
    smoke: bool,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn args() -> Args {
    let cli = <Cli as clap::Parser>::parse();
    Args {
        rounds: cli.rounds,
        smoke: cli.smoke,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Restart {
    /// SIGTERM to an agent run with --keep-attached, then a new agent adopts.
    KeepAttached,
    /// A new agent with --takeover beside the running one.
    Takeover,
    /// SIGTERM (detach and restore), then a new agent attaches.
    Plain,
}

/// (sent, delivered, UDP at R, stamped at R, each restart's duration in ms)
fn restarts(kind: Restart, rounds: u32) -> (u64, u64, usize, usize, Vec<f64>) {
    let tag = match kind {
        Restart::KeepAttached => "rk",
        Restart::Takeover => "rt",
        Restart::Plain => "rp",
    };
    let arb = Arb::new(tag).expect("A - R - B");
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let _b = start_b(&arb);
    let flags: &[&str] = match kind {
        Restart::KeepAttached => &["--no-metrics", "--keep-attached"],
        Restart::Takeover => &["--no-metrics", "--takeover"],
        Restart::Plain => &["--no-metrics"],
    };
    let mut agent = Some(start_a(&arb, flags));
    let capture = Capture::start(&arb.r, &arb.r_a_if).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut gaps = Vec::new();
    let (sent, received) = std::thread::scope(|s| {
        let p = s.spawn(|| probe(&arb, 10_000, Arc::clone(&stop), 5501));
        for _ in 0..rounds {
            std::thread::sleep(Duration::from_millis(500));
            let t = Instant::now();
            if kind == Restart::Takeover {
                let old = agent.take().unwrap();
                agent = Some(start_a(&arb, flags));
                // The old one has exited by itself; its guard only reaps it.
                drop(old);
            } else {
                agent.take().unwrap().stop();
                agent = Some(start_a(&arb, flags));
            }
            gaps.push(t.elapsed().as_secs_f64() * 1e3);
        }
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        p.join().unwrap()
    });
    let frames = capture.finish().unwrap().frames;
    let (udp, stamped) = from_a(&frames, arb.a_addr, 17);
    drop(agent);
    (sent, received, udp, stamped, gaps)
}

/// Removes what the switch agents of a fabric left attached once the fabric is gone.
struct DetachSwitches(Vec<String>);

impl Drop for DetachSwitches {
    fn drop(&mut self) {
        for node in &self.0 {
            let _ = std::process::Command::new(sopa_testbed::bins::sopa_agent())
                .args(["detach", "--node", node])
                .output();
        }
    }
}

/// (sent, delivered, each restart's duration in ms): a 10 kpps probe h0 -> h4 across the
/// Fat-Tree k=4 `f` while the agents of a0 and e0 restart `rounds` times each. Both kinds run
/// on one fabric, one after the other: each run starts a0's and e0's agents with its flags and
/// ends with them stopped, everything they changed restored.
fn switch_restarts(f: &mut Fabric, keep_attached: bool, rounds: u32) -> (u64, u64, Vec<f64>) {
    let flags: &[&str] = if keep_attached {
        &["--keep-attached"]
    } else {
        &[]
    };
    for sw in ["a0", "e0"] {
        f.stop_switch(sw);
        f.start_switch_with(sw, flags).expect("a switch agent");
        f.wait_switch_synced(sw, Duration::from_secs(60))
            .expect("a switch agent up");
    }
    let probe = Probe::between(
        f.ns("h0"),
        f.ns("h4"),
        "10.1.0.2".parse().unwrap(),
        10_000,
        if keep_attached { 5701 } else { 5702 },
    );
    probe.wait_received(2_000);
    let mut gaps = Vec::new();
    for _ in 0..rounds {
        for sw in ["a0", "e0"] {
            let t = Instant::now();
            f.stop_switch(sw);
            f.start_switch_with(sw, flags).expect("a switch agent");
            f.wait_switch_synced(sw, Duration::from_secs(60))
                .expect("a switch agent up");
            gaps.push(t.elapsed().as_secs_f64() * 1e3);
            probe.wait_received(2_000);
        }
    }
    let r = probe.finish();
    // The last agents stop for good (restoring what they and their predecessors changed).
    for sw in ["a0", "e0"] {
        f.stop_switch(sw);
        f.start_switch(sw).expect("a switch agent");
        f.wait_switch_synced(sw, Duration::from_secs(60))
            .expect("a switch agent up");
        f.stop_switch(sw);
    }
    (r.sent, r.received.len() as u64, gaps)
}

/// Runs `f`, printing how long it took under `what`: the phases' times say where a run's time
/// goes.
fn phase<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    println!("==> {what}: {:.1} s", t.elapsed().as_secs_f64());
    r
}

fn main() {
    let a = args();
    println!("resilience on A - R - B, {} restarts per row", a.rounds);

    let keep = phase("agent restarts, --keep-attached", || {
        restarts(Restart::KeepAttached, a.rounds)
    });
    let takeover = phase("agent restarts, --takeover", || {
        restarts(Restart::Takeover, a.rounds)
    });
    let plain = phase("agent restarts, plain", || {
        restarts(Restart::Plain, a.rounds)
    });
    let opts = FabricOptions {
        rate_mbit: None,
        ..FabricOptions::default()
    };
    let mut cleanup = DetachSwitches(Vec::new());
    let mut f = phase("Fat-Tree k=4 built, its agents ready", || {
        let mut f = Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).expect("the fabric");
        cleanup.0 = vec![f.switch_node("a0"), f.switch_node("e0")];
        f.start(&opts).expect("the agents");
        f.wait_ready(Duration::from_secs(60)).expect("ready");
        f
    });
    let switch_keep = phase("switch agent restarts, --keep-attached", || {
        switch_restarts(&mut f, true, a.rounds)
    });
    let switch_plain = phase("switch agent restarts, plain", || {
        switch_restarts(&mut f, false, a.rounds)
    });
    drop(f);
    drop(cleanup);

    let (transfer_bytes, short_flow_count) = if a.smoke {
        (20u64 << 20, 5_000)
    } else {
        (200 << 20, 100_000)
    };
    // SIGKILL during 200 MiB.
    let t = Instant::now();
    let arb = Arb::new("rx").expect("A - R - B");
    let cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let _b = start_b(&arb);
    let victim = start_a(&arb, &["--no-metrics"]);
    let (transfer, tcp, stamped_tcp, adopt_ms, adopted) = std::thread::scope(|s| {
        let t = s.spawn(|| {
            // Paced to last about 3 s: unshaped, 200 MiB took 0.3 s here, over before the
            // kill, and the half second without an agent measured nothing.
            let opts = SendOptions {
                stall_timeout: Duration::from_secs(20),
                pacing_bytes_per_s: Some(transfer_bytes / 3),
                ..SendOptions::default()
            };
            tcp_transfer(&arb.a, &arb.b, arb.b_addr, 5601, transfer_bytes, &opts)
        });
        // Killed once the transfer runs: the agent has stamped a thousand of its packets.
        let stamped = || {
            victim
                .status()
                .map_or(0, |st| st["stamp"]["stamped"].as_u64().unwrap_or(0))
        };
        let waiting = Instant::now();
        while stamped() < 1_000 {
            assert!(
                waiting.elapsed() < Duration::from_secs(20),
                "the transfer never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        victim.kill();
        let capture = Capture::start(&arb.r, &arb.r_a_if).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let frames = capture.finish().unwrap().frames;
        let (tcp, stamped) = from_a(&frames, arb.a_addr, 6);
        let start = Instant::now();
        let next = start_a(&arb, &["--no-metrics"]);
        let adopt_ms = start.elapsed().as_secs_f64() * 1e3;
        let adopted = next.status().unwrap()["adopted"]["how"] == "crashed";
        let transfer = t.join().unwrap().expect("the transfer survives the kill");
        drop(next);
        (transfer, tcp, stamped, adopt_ms, adopted)
    });
    drop(cleanup);
    drop(arb);
    println!(
        "==> SIGKILL during {} MiB: {:.1} s",
        transfer_bytes >> 20,
        t.elapsed().as_secs_f64()
    );

    // 100,000 short flows.
    let t = Instant::now();
    let arb2 = Arb::new("rf").expect("A - R - B");
    let cleanup2 = DetachOnDrop {
        ns: &arb2.a,
        node: arb2.a.name().to_owned(),
    };
    let b2 = start_b(&arb2);
    let a2 = start_a(&arb2, &["--no-metrics"]);
    let pid = a2.status().unwrap()["pid"].as_u64().unwrap();
    let rss_before = rss_kib(pid);
    let stripped = |st: &serde_json::Value| st["strip"]["stripped"].as_u64().unwrap();
    let before = stripped(&b2.status().unwrap());
    let start = Instant::now();
    let sent = short_flows(&arb2, short_flow_count, 2, 25_000);
    let flows_s = start.elapsed().as_secs_f64();
    let mut delivered = 0;
    for _ in 0..50 {
        delivered = stripped(&b2.status().unwrap()) - before;
        if delivered >= sent {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = a2.status().unwrap();
    let rss_after = rss_kib(pid);
    drop((a2, b2, cleanup2));
    drop(arb2);
    println!(
        "==> {short_flow_count} short flows: {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let pct = |n: usize, d: usize| 100.0 * n as f64 / d.max(1) as f64;
    let pct64 = |n: u64, d: u64| 100.0 * n as f64 / d.max(1) as f64;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!();
    println!(
        "restarts under a 10 kpps UDP probe ({} restarts each)",
        a.rounds
    );
    println!(
        "{:<28} {:>8} {:>10} {:>10} {:>16}",
        "agent restart", "sent", "delivered", "stamped", "restart ms (mean)"
    );
    for (name, (sent, received, udp, stamped, gaps)) in [
        ("--keep-attached, then adopt", &keep),
        ("--takeover beside the old", &takeover),
        ("plain (detach, attach)", &plain),
    ] {
        println!(
            "{:<28} {:>8} {:>9.3}% {:>9.3}% {:>16.0}",
            name,
            sent,
            pct64(*received, *sent),
            pct(*stamped, *udp),
            mean(gaps)
        );
    }
    println!();
    println!(
        "switch agents restarted under a 10 kpps UDP probe h0 -> h4 across Fat-Tree k=4 ({} restarts of a0's and of e0's agent each)",
        a.rounds
    );
    println!(
        "{:<28} {:>8} {:>10} {:>8} {:>16}",
        "switch agent restart", "sent", "delivered", "lost", "restart ms (mean)"
    );
    for (name, (sent, received, gaps)) in [
        ("--keep-attached, then adopt", &switch_keep),
        ("plain (restore, install)", &switch_plain),
    ] {
        println!(
            "{:<28} {:>8} {:>9.3}% {:>8} {:>16.0}",
            name,
            sent,
            pct64(*received, *sent),
            sent - received,
            mean(gaps)
        );
    }
    let unstamped = |r: &(u64, u64, usize, usize, Vec<f64>)| r.2 - r.3;
    println!(
        "packets leaving unstamped during restarts: keep-attached {}, takeover {}, plain {}",
        unstamped(&keep),
        unstamped(&takeover),
        unstamped(&plain)
    );
    println!();
    println!(
        "SIGKILL during {} MiB: intact {}, {:.0} Mbit/s, {} retransmitted segments; while no agent ran {stamped_tcp} of {tcp} TCP packets stamped ({:.2}%); next agent adopted ({}) in {adopt_ms:.0} ms",
        transfer_bytes >> 20,
        transfer.intact(),
        transfer.mbit_per_s(),
        transfer.tcp.total_retrans,
        pct(stamped_tcp, tcp),
        if adopted { "crashed" } else { "NOT ADOPTED" },
    );
    println!(
        "{short_flow_count} two-packet flows in {flows_s:.1} s: {sent} sent, {delivered} delivered ({:.3}%), flow table {}, agent RSS {} -> {} KiB",
        pct64(delivered, sent),
        st["flow_table"],
        rss_before,
        rss_after
    );
}
