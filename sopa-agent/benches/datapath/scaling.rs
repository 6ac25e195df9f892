//! The datapath on every CPU at once: each program run by a thread pinned to each CPU this
//! process may use, all started together, against the same program on one CPU alone; one
//! flow's packets on every CPU (they share the flow's entry), and a flow per CPU. The empty
//! programs' rows are the machine's own ceiling (vCPUs that share a core, a busy host).

use aya::{
    TestRunResult,
    programs::{ProgramError, TestRun as _, TestRunOptions},
};
use sopa_agent::datapath::Datapath;

use crate::{Args, loaded};

/// Four paths to the benchmark's rack, as in the one-CPU table.
const TABLE: &str = "[[destination]]\nprefix = \"10.3.1.0/24\"\n\
                     paths = [[0, 0], [0, 1], [1, 0], [1, 1]]\n";

/// A 1514-byte TCP frame to the benchmark's rack from source port `sport`.
fn frame(sport: u16) -> Vec<u8> {
    let builder = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 101, 1, 2], [10, 3, 1, 2], 64)
        .tcp(sport, 5201, 1, 65535)
        .ack(1);
    let mut out = Vec::new();
    builder.write(&mut out, &[0x5a; 1448]).unwrap();
    out
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t filled by the kernel for this process.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set),
            0,
            "sched_getaffinity"
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Pins the calling thread to `cpu` (BPF_PROG_TEST_RUN runs the program on the caller's CPU).
fn pin_to(cpu: usize) {
    // SAFETY: a cpu_set_t with one CPU, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0,
            "sched_setaffinity to CPU {cpu}"
        );
    }
}

/// One kernel-timed run of a program on an input, into an output buffer: its ns.
type Run<'a> = &'a (dyn Fn(&[u8], &mut [u8]) -> u128 + Sync);

/// The options of one run of `input` into `out`.
fn once<'a>(input: &'a [u8], out: &'a mut [u8]) -> TestRunOptions<'a> {
    TestRunOptions {
        data_in: Some(input),
        data_out: Some(out),
        ..Default::default()
    }
}

/// The kernel's time of a run.
fn ns(r: Result<TestRunResult, ProgramError>) -> u128 {
    r.expect("test_run").duration.as_nanos()
}

/// Mean kernel-timed ns per run on `input`, `runs` single runs.
fn mean_ns(run: Run<'_>, input: &[u8], runs: u32) -> f64 {
    let mut out = vec![0u8; input.len() + 128];
    let mut total = 0u128;
    for _ in 0..runs {
        total += run(input, &mut out);
    }
    total as f64 / f64::from(runs)
}

/// Runs `program` on each CPU of `cpus` at once, CPU i on `inputs[i]`: the mean ns per run on
/// each.
fn all_at_once(run: Run<'_>, cpus: &[usize], inputs: &[Vec<u8>], runs: u32) -> Vec<f64> {
    let start = std::sync::Barrier::new(cpus.len());
    std::thread::scope(|s| {
        let threads: Vec<_> = cpus
            .iter()
            .zip(inputs)
            .map(|(&cpu, input)| {
                let start = &start;
                s.spawn(move || {
                    pin_to(cpu);
                    start.wait();
                    mean_ns(run, input, runs)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// What a row runs.
#[derive(Clone, Copy)]
enum Prog {
    /// A TC program of the baselines' object, by name.
    Baseline(&'static str),
    Stamp,
    /// An XDP program of the baselines' object, by name.
    XdpBaseline(&'static str),
    Strip,
    /// `xdp_strip` with the path meter off.
    StripOff,
}

struct Measured {
    name: &'static str,
    /// ns per packet on one CPU alone.
    alone: f64,
    /// ns per packet on each CPU, all at once.
    together: Vec<f64>,
}

impl Measured {
    /// Packets per second of every CPU at once over those of one CPU alone.
    fn scaling(&self) -> f64 {
        self.together.iter().map(|ns| 1.0 / ns).sum::<f64>() * self.alone
    }
}

/// The scaling table.
pub fn table(args: &Args) {
    let cpus = allowed_cpus();
    let n = cpus.len();
    let (mut dp, mut maps, pins) = loaded("scale-", TABLE);
    let one_flow: Vec<Vec<u8>> = vec![frame(40000); n];
    let a_flow_each: Vec<Vec<u8>> = (0..n).map(|i| frame(40000 + i as u16)).collect();
    // The same packets as they arrive at the destination, stamped.
    let stamp = |dp: &mut Datapath, input: &[u8]| {
        let out = crate::output(dp.stamp_program(), input);
        assert_eq!(out.len(), input.len() + 4, "the packet is stamped");
        out
    };
    let one_flow_stamped: Vec<Vec<u8>> = one_flow.iter().map(|p| stamp(&mut dp, p)).collect();
    let a_flow_each_stamped: Vec<Vec<u8>> = a_flow_each.iter().map(|p| stamp(&mut dp, p)).collect();
    let mut baseline = aya::EbpfLoader::new()
        .default_map_pin_directory(&pins)
        .load(sopa_agent::datapath::OBJECT)
        .expect("load the baselines");
    for name in ["tc_pass", "tc_room"] {
        crate::prog_ref::<aya::programs::SchedClassifier>(&mut baseline, name)
            .load()
            .unwrap();
    }
    for name in ["xdp_pass", "xdp_head"] {
        crate::prog_ref::<aya::programs::Xdp>(&mut baseline, name)
            .load()
            .unwrap();
    }
    let runs = args.scaling_runs;
    eprintln!("scaling: {runs} test runs per CPU of each program, on 1 and on {n} CPUs {cpus:?}");
    let mut rows = Vec::new();
    for (name, prog, inputs) in [
        ("tc: empty program", Prog::Baseline("tc_pass"), &a_flow_each),
        (
            "tc: adjust_room +4 alone",
            Prog::Baseline("tc_room"),
            &a_flow_each,
        ),
        ("tc_stamp, one flow on every CPU", Prog::Stamp, &one_flow),
        ("tc_stamp, a flow per CPU", Prog::Stamp, &a_flow_each),
        (
            "xdp: XDP_PASS",
            Prog::XdpBaseline("xdp_pass"),
            &a_flow_each_stamped,
        ),
        (
            "xdp: adjust_head +4 alone",
            Prog::XdpBaseline("xdp_head"),
            &a_flow_each_stamped,
        ),
        (
            "xdp_strip, one flow on every CPU",
            Prog::Strip,
            &one_flow_stamped,
        ),
        (
            "xdp_strip, a flow per CPU",
            Prog::Strip,
            &a_flow_each_stamped,
        ),
        ("xdp_strip, plain TCP (passed)", Prog::Strip, &a_flow_each),
        (
            "xdp_strip, a flow per CPU, meter off",
            Prog::StripOff,
            &a_flow_each_stamped,
        ),
    ] {
        pin_to(cpus[0]);
        let tc = |p: &aya::programs::SchedClassifier| {
            let run = |input: &[u8], out: &mut [u8]| ns(p.test_run(once(input, out)));
            (
                mean_ns(&run, &inputs[0], runs),
                all_at_once(&run, &cpus, inputs, runs),
            )
        };
        let xdp = |p: &aya::programs::Xdp| {
            let run = |input: &[u8], out: &mut [u8]| ns(p.test_run(once(input, out)));
            (
                mean_ns(&run, &inputs[0], runs),
                all_at_once(&run, &cpus, inputs, runs),
            )
        };
        let (alone, together) = match prog {
            Prog::Baseline(name) => tc(crate::prog_ref(&mut baseline, name)),
            Prog::Stamp => tc(dp.stamp_program()),
            Prog::XdpBaseline(name) => xdp(crate::prog_ref(&mut baseline, name)),
            Prog::Strip => xdp(dp.strip_program()),
            Prog::StripOff => {
                maps.set_meter_period(0).unwrap();
                let measured = xdp(dp.strip_program());
                maps.set_meter_period(crate::METER_PERIOD_NS).unwrap();
                measured
            }
        };
        rows.push(Measured {
            name,
            alone,
            together,
        });
    }
    // Back on every CPU for what follows.
    // SAFETY: a cpu_set_t of the CPUs allowed at the start, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in &cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
    println!();
    println!(
        "the datapath on {n} CPUs at once (BPF_PROG_TEST_RUN on a thread pinned per CPU, \
         kernel-timed, path meter on)"
    );
    println!(
        "{:<36} {:>12} {:>28} {:>9}",
        "program", "1 CPU ns", "each CPU ns, all at once", "scaling"
    );
    for r in &rows {
        let each: Vec<String> = r.together.iter().map(|ns| format!("{ns:.1}")).collect();
        println!(
            "{:<36} {:>12.1} {:>28} {:>8.2}x",
            r.name,
            r.alone,
            each.join(" / "),
            r.scaling()
        );
    }
    println!(
        "(scaling: packets per second of all {n} CPUs over one CPU's alone; {n}.00x is perfect, \
         the target 1.8x from 1 to 2 CPUs)"
    );
    drop(baseline);
    drop(dp);
    drop(pins);
}
