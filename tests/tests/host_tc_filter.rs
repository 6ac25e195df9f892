//! The host datapath attached the way kernels without TCX (Linux before 6.6) take it, forced
//! with `--attach tc` on this one: `tc_stamp` a cls_bpf filter in direct-action mode on a
//! clsact qdisc, at a priority and handle of its own. A - R - B carries the option and B's
//! stack never sees it; other tools' filters and TCX programs around ours see every packet; a
//! killed agent's filter keeps stamping and the next agent replaces its program in place, as a
//! takeover does, losing no probe packet; what the agent added (its filter, the qdisc where it
//! added one) goes when it stops or is detached, and nothing of anyone else's. Needs root.

use std::{
    net::UdpSocket,
    time::{Duration, Instant},
};

use aya::{
    Ebpf, EbpfLoader,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        tc::{NlOptions, TcAttachOptions, qdisc_add_clsact},
    },
};
use sopa_testbed::{
    NetNs,
    agent::Agent,
    arb::{A_PREFIX, Arb, B_PREFIX},
    capture::{Capture, has_ipv4_options},
    resilience::{DetachOnDrop, PATHS, Probe, from_a, pin_dir, prog_ids},
    traffic::{SendOptions, tcp_transfer},
};

/// The priority and handle of our filters (`tc_hook`): last in the chain.
const OUR_PRIORITY: u16 = 0xFFF0;
const OUR_HANDLE: &str = "0x50a";

/// The resilience tests measure loss at 10 kpps: one at a time, so no test's traffic is
/// another's load.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An agent attached with `--attach tc`: A's towards B's rack, B's towards A's.
fn start(arb: &Arb, a: bool, extra: &[&str]) -> Result<Agent, String> {
    let (ns, iface, table) = if a {
        (&arb.a, &arb.a_if, Arb::path_table(B_PREFIX, PATHS))
    } else {
        (&arb.b, &arb.b_if, Arb::path_table(A_PREFIX, PATHS))
    };
    let mut args = vec!["--attach", "tc", "--no-metrics"];
    args.extend_from_slice(extra);
    Agent::start(ns, ns.name(), iface, &table, &args).map_err(|e| e.to_string())
}

/// The egress filters on `dev`: (priority, handle, program id) of each that names a program.
fn egress_filters(ns: &NetNs, dev: &str) -> Vec<(u16, String, u32)> {
    ns.tc(&["filter", "show", "dev", dev, "egress"])
        .unwrap()
        .lines()
        .filter_map(|l| {
            let word = |key: &str| {
                let mut w = l.split_whitespace();
                w.find(|x| *x == key).and_then(|_| w.next())
            };
            Some((
                word("pref")?.parse().ok()?,
                word("handle")?.to_owned(),
                word("id")?.parse().ok()?,
            ))
        })
        .collect()
}

fn has_clsact(ns: &NetNs, dev: &str) -> bool {
    ns.tc(&["qdisc", "show", "dev", dev])
        .unwrap()
        .contains("clsact")
}

#[test]
fn the_transfer_runs_through_our_filters_and_a_stop_removes_them_and_our_qdisc() {
    let _serial = one_at_a_time();
    let arb = Arb::new("tf").expect("build A - R - B");
    let routes_before = arb.a.ip(&["route"]).unwrap();
    let b = start(&arb, false, &[]).expect("agent on B");
    let a = start(&arb, true, &[]).expect("agent on A");
    let st = a.status().unwrap();
    assert_eq!(st["attach"], "tc", "{st:#}");
    let (stamp, _) = prog_ids(&a);
    assert_eq!(
        egress_filters(&arb.a, &arb.a_if),
        vec![(OUR_PRIORITY, OUR_HANDLE.to_owned(), stamp as u32)],
        "one filter of ours, last, with the agent's tc_stamp"
    );
    assert!(has_clsact(&arb.a, &arb.a_if));

    let at_r = Capture::start(&arb.r, &arb.r_a_if).unwrap();
    let at_b = Capture::start(&arb.b, &arb.b_if).unwrap();
    let t = tcp_transfer(
        &arb.a,
        &arb.b,
        arb.b_addr,
        5001,
        8 << 20,
        &SendOptions::default(),
    )
    .expect("8 MiB from A to B");
    assert!(t.intact());
    let (tcp, stamped) = from_a(&at_r.finish().unwrap().frames, arb.a_addr, 6);
    assert!(
        tcp > 1000 && stamped == tcp,
        "{stamped} of {tcp} TCP packets from A carried the option at R"
    );
    let at_b = at_b.finish().unwrap().frames;
    let plain = at_b.iter().filter(|f| has_ipv4_options(f)).count();
    assert_eq!(plain, 0, "B's stack saw the option");

    // A stop removes our filter and the qdisc the agent added, and restores the host.
    assert_eq!(a.stop(), Some(0));
    assert!(egress_filters(&arb.a, &arb.a_if).is_empty());
    assert!(!has_clsact(&arb.a, &arb.a_if), "the agent's clsact stayed");
    assert_eq!(arb.a.ip(&["route"]).unwrap(), routes_before);
    assert!(!pin_dir(arb.a.name()).exists(), "pins removed");
    assert_eq!(b.stop(), Some(0));
}

/// Another tool's program: the object's `tc_pass` (hands every packet on), with maps of its
/// own pinned in `pins`.
fn neighbour(pins: &std::path::Path) -> Ebpf {
    let mut ebpf = EbpfLoader::new()
        .default_map_pin_directory(pins)
        .load(sopa_agent::datapath::OBJECT)
        .expect("load the object");
    program(&mut ebpf).load().expect("load tc_pass");
    ebpf
}

fn program(ebpf: &mut Ebpf) -> &mut SchedClassifier {
    ebpf.program_mut("tc_pass").unwrap().try_into().unwrap()
}

/// The kernel's run count of each program, read until two reads agree.
fn run_counts(ids: &[u32]) -> Vec<u64> {
    let read = || -> Vec<u64> {
        let all: Vec<_> = aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .collect();
        ids.iter()
            .map(|id| {
                all.iter()
                    .find(|p| p.id() == *id)
                    .map_or(0, |p| p.run_count())
            })
            .collect()
    };
    let mut last = read();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = read();
        if now == last {
            return now;
        }
        last = now;
    }
}

#[test]
fn other_tools_filters_and_tcx_programs_around_ours_see_every_packet() {
    const DATAGRAMS: u64 = 2000;
    let _serial = one_at_a_time();
    let arb = Arb::new("tn").expect("build A - R - B");
    // bpffs pins for the neighbours' maps: their own folders, removed at the end.
    let bpf_pins = std::path::PathBuf::from("/sys/fs/bpf").join(sopa_testbed::run_name("tcn"));
    let _unpin = scopeguard(bpf_pins.clone());
    arb.a
        .run(|| {
            // The neighbours were there first: a legacy filter (its own clsact) and a TCX
            // program.
            std::fs::create_dir_all(bpf_pins.join("l")).unwrap();
            std::fs::create_dir_all(bpf_pins.join("t")).unwrap();
            let mut legacy = neighbour(&bpf_pins.join("l"));
            qdisc_add_clsact(&arb.a_if).expect("the neighbour's clsact");
            program(&mut legacy)
                .attach_with_options(
                    &arb.a_if,
                    TcAttachType::Egress,
                    TcAttachOptions::Netlink(NlOptions::default()),
                )
                .expect("the neighbour's filter");
            let mut tcx = neighbour(&bpf_pins.join("t"));
            program(&mut tcx)
                .attach_with_options(
                    &arb.a_if,
                    TcAttachType::Egress,
                    TcAttachOptions::TcxOrder(LinkOrder::last()),
                )
                .expect("the neighbour's TCX program");
            let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).unwrap();
            let a = start(&arb, true, &[]).expect("agent on A");
            let (stamp, _) = prog_ids(&a);
            let filters = egress_filters(&arb.a, &arb.a_if);
            assert_eq!(filters.len(), 2, "{filters:?}");
            assert_eq!(
                filters.last().map(|f| (f.0, f.2)),
                Some((OUR_PRIORITY, stamp as u32)),
                "ours last, after the neighbour's: {filters:?}"
            );
            let ids = [
                program(&mut tcx).info().unwrap().id(),
                program(&mut legacy).info().unwrap().id(),
                stamp as u32,
            ];
            let before = run_counts(&ids);
            let socket = UdpSocket::bind("10.101.1.2:0").unwrap();
            for i in 0..DATAGRAMS {
                socket.send_to(&i.to_be_bytes(), (arb.b_addr, 9)).unwrap();
            }
            let seen: Vec<u64> = run_counts(&ids)
                .iter()
                .zip(&before)
                .map(|(a, b)| a - b)
                .collect();
            assert!(seen[2] >= DATAGRAMS, "tc_stamp ran {} times", seen[2]);
            assert_eq!(
                seen,
                vec![seen[2]; 3],
                "TCX, the neighbour's filter and ours each saw every packet"
            );
            // A stop takes our filter away, and neither the neighbours nor their qdisc.
            assert_eq!(a.stop(), Some(0));
            let left = egress_filters(&arb.a, &arb.a_if);
            assert_eq!(left.len(), 1, "{left:?}");
            assert_ne!(left[0].0, OUR_PRIORITY);
            assert!(has_clsact(&arb.a, &arb.a_if), "the neighbour's clsact went");
            assert_eq!(
                SchedClassifier::query_tcx(&arb.a_if, TcAttachType::Egress)
                    .unwrap()
                    .1
                    .len(),
                1,
                "the TCX neighbour stays"
            );
        })
        .unwrap();
}

/// Removes a bpffs folder when dropped.
fn scopeguard(dir: std::path::PathBuf) -> impl Drop {
    struct Unpin(std::path::PathBuf);
    impl Drop for Unpin {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    Unpin(dir)
}

#[test]
fn a_killed_agents_filter_stamps_on_and_the_next_agent_replaces_its_program_in_place() {
    let _serial = one_at_a_time();
    let arb = Arb::new("tk").expect("build A - R - B");
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let b = start(&arb, false, &[]).expect("agent on B");
    let a = start(&arb, true, &[]).expect("agent on A");
    let (stamp_before, _) = prog_ids(&a);
    let capture = Capture::start(&arb.r, &arb.r_a_if).unwrap();
    let probe = Probe::start(&arb, 10_000, 5301);
    probe.wait_received(2_000);
    let window_start = probe.mark();
    a.kill();
    probe.wait_received(2_000);
    let new = start(&arb, true, &[]).expect("the next agent");
    probe.wait_received(2_000);
    let window_end = probe.mark();
    let r = probe.finish();
    let (udp, stamped) = from_a(&capture.finish().unwrap().frames, arb.a_addr, 17);
    let lost = r.lost_in(window_start..window_end);
    eprintln!(
        "probe: {} in the window of the kill and the adoption, {lost} lost; at R {udp} UDP, \
         {stamped} stamped",
        window_end - window_start
    );
    assert_eq!(
        lost, 0,
        "probe packets lost across the kill and the adoption"
    );
    assert_eq!(stamped, udp, "stamped all along, with and without an agent");
    let st = new.status().unwrap();
    assert_eq!(st["adopted"]["how"], "crashed", "{st:#}");
    assert_eq!(st["adopted"]["stamp_prog_replaced"], stamp_before);
    let (stamp_now, _) = prog_ids(&new);
    assert_ne!(stamp_now, stamp_before);
    assert_eq!(
        egress_filters(&arb.a, &arb.a_if),
        vec![(OUR_PRIORITY, OUR_HANDLE.to_owned(), stamp_now as u32)],
        "the one filter, its program replaced in place"
    );
    assert_eq!(new.stop(), Some(0));
    assert!(egress_filters(&arb.a, &arb.a_if).is_empty());
    assert!(!has_clsact(&arb.a, &arb.a_if));
    assert_eq!(b.stop(), Some(0));
}

#[test]
fn a_takeover_replaces_the_filters_program_without_losing_a_probe_packet() {
    let _serial = one_at_a_time();
    let arb = Arb::new("tt").expect("build A - R - B");
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let b = start(&arb, false, &[]).expect("agent on B");
    let mut old = start(&arb, true, &[]).expect("agent on A");
    let (stamp_before, _) = prog_ids(&old);
    let probe = Probe::start(&arb, 10_000, 5351);
    probe.wait_received(2_000);
    let window_start = probe.mark();
    let new = start(&arb, true, &["--takeover"]).expect("the new agent");
    let deadline = Instant::now() + Duration::from_secs(30);
    let exited = loop {
        if let Some(st) = old.process.try_wait() {
            break st;
        }
        assert!(Instant::now() < deadline, "the old agent did not hand over");
        std::thread::sleep(Duration::from_millis(10));
    };
    probe.wait_received(2_000);
    let window_end = probe.mark();
    let lost = probe.finish().lost_in(window_start..window_end);
    assert!(exited.success(), "{}", old.process.log_text());
    assert_eq!(lost, 0, "probe packets lost across the takeover");
    let st = new.status().unwrap();
    assert_eq!(st["adopted"]["stamp_prog_replaced"], stamp_before, "{st:#}");
    let (stamp_now, _) = prog_ids(&new);
    assert_eq!(
        egress_filters(&arb.a, &arb.a_if),
        vec![(OUR_PRIORITY, OUR_HANDLE.to_owned(), stamp_now as u32)]
    );
    assert_eq!(new.stop(), Some(0));
    assert_eq!(b.stop(), Some(0));
}

#[test]
fn a_datapath_kept_as_filters_is_not_attached_twice_and_detach_removes_it() {
    let _serial = one_at_a_time();
    let arb = Arb::new("td").expect("build A - R - B");
    let cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let a = start(&arb, true, &["--keep-attached"]).expect("agent on A");
    let (stamp, _) = prog_ids(&a);
    assert_eq!(a.stop(), Some(0));
    let kept = vec![(OUR_PRIORITY, OUR_HANDLE.to_owned(), stamp as u32)];
    assert_eq!(egress_filters(&arb.a, &arb.a_if), kept, "left attached");
    // An agent that would attach with TCX refuses the datapath left as a filter, changing
    // nothing.
    let refused = Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::path_table(B_PREFIX, PATHS),
        &["--attach", "tcx", "--no-metrics"],
    )
    .map(|_| ())
    .expect_err("a second attachment");
    assert!(refused.to_string().contains("--attach tc"), "{refused}");
    assert_eq!(egress_filters(&arb.a, &arb.a_if), kept);
    assert!(
        tcx_egress(&arb.a, &arb.a_if).is_empty(),
        "nothing attached with TCX"
    );
    // `detach` removes what the agent left: the filter and its qdisc.
    let out = cleanup.detach();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(egress_filters(&arb.a, &arb.a_if).is_empty());
    assert!(!has_clsact(&arb.a, &arb.a_if));
}

/// The programs on `dev`'s TCX egress chain in `ns`.
fn tcx_egress(ns: &NetNs, dev: &str) -> Vec<u32> {
    let dev = dev.to_owned();
    ns.run(move || {
        SchedClassifier::query_tcx(&dev, TcAttachType::Egress)
            .map(|(_, p)| p.iter().map(|p| p.id()).collect())
            .unwrap_or_default()
    })
    .unwrap()
}
