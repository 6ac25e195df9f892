//! The agent as a guest on a host's interface (needs root): other tools' TC programs, one
//! attached by TCX after ours and one as a legacy clsact filter, still run for every packet
//! ours handled; `--tcx-order` puts ours first or last in the chain; stopping the agent
//! removes only its own link.
//!
//! The other tools' programs are the object's `tc_pass` baseline (hands every packet on with
//! TCX_NEXT), loaded apart from the agent's maps; each one's own kernel run count (BPF stats,
//! enabled while the test holds them) says what it saw.

use std::{
    net::UdpSocket,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        tc::{NlOptions, TcAttachOptions, qdisc_add_clsact},
    },
};
use sopa_agent::datapath::OBJECT;
use sopa_testbed::{
    agent::Agent,
    arb::{Arb, B_PREFIX},
};

const DATAGRAMS: u64 = 2000;

/// A pin folder for one neighbour's maps, removed on drop.
struct Pins(PathBuf);

impl Pins {
    fn new(tag: &str) -> Self {
        let p = PathBuf::from(format!(
            "/sys/fs/bpf/sopa-coexist-{}-{tag}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Another tool's program: `tc_pass` loaded with maps of its own.
fn neighbour(pins: &Path) -> Ebpf {
    let mut ebpf = EbpfLoader::new()
        .default_map_pin_directory(pins)
        .load(OBJECT)
        .expect("load the object");
    program(&mut ebpf).load().expect("load tc_pass");
    ebpf
}

fn program(ebpf: &mut Ebpf) -> &mut SchedClassifier {
    ebpf.program_mut("tc_pass").unwrap().try_into().unwrap()
}

fn id(ebpf: &mut Ebpf) -> u32 {
    program(ebpf).info().unwrap().id()
}

fn attach(ebpf: &mut Ebpf, iface: &str, how: TcAttachOptions) {
    program(ebpf)
        .attach_with_options(iface, TcAttachType::Egress, how)
        .expect("attach the neighbour");
}

/// The kernel's run count of each program, read until two reads agree (no packet was between
/// two programs of the chain while reading).
fn run_counts(ids: &[u32]) -> Vec<u64> {
    let read = || -> Vec<u64> {
        let all: Vec<_> = aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .collect();
        ids.iter()
            .map(|id| {
                all.iter()
                    .find(|p| p.id() == *id)
                    .unwrap_or_else(|| panic!("program {id} is loaded"))
                    .run_count()
            })
            .collect()
    };
    let mut last = read();
    for _ in 0..1000 {
        let now = read();
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("run counts never settled: {last:?}");
}

/// The programs on `iface`'s TCX egress chain, first to last.
fn tcx_chain(iface: &str) -> Vec<u32> {
    SchedClassifier::query_tcx(iface, TcAttachType::Egress)
        .unwrap()
        .1
        .iter()
        .map(|p| p.id())
        .collect()
}

fn stamp_id(agent: &Agent) -> u32 {
    let st = agent.status().unwrap();
    u32::try_from(st["programs"]["stamp"].as_u64().expect("tc_stamp's id")).unwrap()
}

fn stats() -> OwnedFd {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("BPF run-time statistics")
}

#[test]
fn programs_after_ours_and_legacy_filters_see_every_packet() {
    let arb = Arb::new("co").expect("build A - R - B");
    let (tcx_pins, legacy_pins) = (Pins::new("tcx"), Pins::new("legacy"));
    arb.a
        .run(|| {
            let agent = Agent::start(
                &arb.a,
                arb.a.name(),
                &arb.a_if,
                &Arb::path_table(B_PREFIX, 3),
                &["--no-metrics"],
            )
            .expect("agent on A");
            let _stats = stats();
            let mut tcx = neighbour(&tcx_pins.0);
            attach(
                &mut tcx,
                &arb.a_if,
                TcAttachOptions::TcxOrder(LinkOrder::last()),
            );
            let mut legacy = neighbour(&legacy_pins.0);
            match qdisc_add_clsact(&arb.a_if) {
                Ok(()) => {}
                Err(e) if e.to_string().contains("exists") => {}
                Err(e) => panic!("clsact on A: {e}"),
            }
            attach(
                &mut legacy,
                &arb.a_if,
                TcAttachOptions::Netlink(NlOptions::default()),
            );
            let stamp = stamp_id(&agent);
            assert_eq!(
                tcx_chain(&arb.a_if),
                vec![stamp, id(&mut tcx)],
                "ours first, the neighbour attached after it"
            );
            let ids = [stamp, id(&mut tcx), id(&mut legacy)];
            let before = run_counts(&ids);
            let stamped_before = agent.status().unwrap()["stamp"]["stamped"]
                .as_u64()
                .unwrap();
            let socket = UdpSocket::bind("10.101.1.2:0").unwrap();
            for i in 0..DATAGRAMS {
                socket
                    .send_to(&i.to_be_bytes(), (arb.b_addr, 9))
                    .expect("a datagram to B");
            }
            let after = run_counts(&ids);
            let seen: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
            let stamped = agent.status().unwrap()["stamp"]["stamped"]
                .as_u64()
                .unwrap()
                - stamped_before;
            assert!(
                stamped >= DATAGRAMS,
                "tc_stamp stamped {stamped} of {DATAGRAMS}"
            );
            assert!(seen[0] >= DATAGRAMS, "tc_stamp ran {} times", seen[0]);
            assert_eq!(
                seen[1], seen[0],
                "the TCX program after ours ran {} times, ours {}: our verdict ended the chain",
                seen[1], seen[0]
            );
            assert_eq!(
                seen[2], seen[0],
                "the legacy clsact filter ran {} times, ours {}: our verdict ended the chain",
                seen[2], seen[0]
            );

            // Stopping the agent takes only its own link away.
            assert_eq!(agent.stop(), Some(0));
            assert_eq!(tcx_chain(&arb.a_if), vec![id(&mut tcx)]);
            let before = run_counts(&ids[1..]);
            socket.send_to(b"after", (arb.b_addr, 9)).unwrap();
            let after = run_counts(&ids[1..]);
            assert!(
                after[0] > before[0] && after[1] > before[1],
                "the neighbours still run once the agent is gone: {before:?} -> {after:?}"
            );
        })
        .unwrap();
}

#[test]
fn tcx_order_puts_ours_first_or_last() {
    let arb = Arb::new("cq").expect("build A - R - B");
    let pins = Pins::new("order");
    arb.a
        .run(|| {
            let mut other = neighbour(&pins.0);
            attach(
                &mut other,
                &arb.a_if,
                TcAttachOptions::TcxOrder(LinkOrder::last()),
            );
            let other = id(&mut other);
            for (flag, ours_first) in [(Some("first"), true), (Some("last"), false), (None, false)]
            {
                let mut args = vec!["--no-metrics"];
                if let Some(order) = flag {
                    args.extend(["--tcx-order", order]);
                }
                let agent = Agent::start(
                    &arb.a,
                    arb.a.name(),
                    &arb.a_if,
                    &Arb::path_table(B_PREFIX, 3),
                    &args,
                )
                .expect("agent on A");
                let stamp = stamp_id(&agent);
                let want = if ours_first {
                    vec![stamp, other]
                } else {
                    vec![other, stamp]
                };
                assert_eq!(tcx_chain(&arb.a_if), want, "--tcx-order {flag:?}");
                assert_eq!(agent.stop(), Some(0));
                assert_eq!(tcx_chain(&arb.a_if), vec![other], "only our link removed");
            }
        })
        .unwrap();
}
