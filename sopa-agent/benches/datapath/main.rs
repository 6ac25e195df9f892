//! `cargo xtask bench datapath`: the cost of the datapath, measured side by side in one run.
//!
//! 1. `cost`: ns per packet of `tc_stamp` and `xdp_strip` on one CPU against programs that do
//!    nothing, through BPF_PROG_TEST_RUN, runs interleaved so both see the same machine: the
//!    IPv4 option and the SRv6 encoding (a second datapath, encapsulating) side by side;
//!    `xdp_strip` as agents run it (reordering not measured) and measuring reordering; and
//!    the floors, the kernel helper that makes or removes the encoding's room alone
//!    (`tc_room`, `tc_room6`, `xdp_head`), which no encoding that inserts bytes can go below.
//! 2. `scaling`: the same programs on one CPU and on every CPU at once (a thread pinned per
//!    CPU), one flow's packets and a flow per CPU: what contention costs.
//! 3. `meter_tables`: a k=48 host's path meter over many periods of traffic to every rack
//!    over every path: whether every period is complete, and what reading one takes.
//! 4. `throughput`: single-stream TCP throughput A -> R -> B (iperf3, cubic) without agents
//!    and with agents at both granularities, rounds interleaved; medians and ratios.

mod cost;
mod meter_tables;
mod scaling;
mod throughput;

use sopa_agent::{
    datapath::{Datapath, MapSet},
    path_table::PathTable,
};
use sopa_common::maps::{Config, mode};

const USAGE: &str = "Usage: cargo xtask bench datapath [-- OPTIONS]

  --runs N            one-CPU test runs of each program (default 1000000)
  --scaling-runs N    test runs of each program per CPU in the scaling table (default 200000;
                      0: no scaling table)
  --meter-periods N   periods of a k=48 host's meter (default 40; 0: no meter table)
  --rounds R          iperf3 rounds (default 3; 0: no throughput table)
  --iperf-seconds S   seconds of each iperf3 run (default 5)
  -h, --help          this text";

pub struct Args {
    runs: u32,
    scaling_runs: u32,
    meter_periods: u32,
    iperf_seconds: u32,
    rounds: u32,
}

fn parse_args() -> Args {
    let mut args = Args {
        runs: 1_000_000,
        scaling_runs: 200_000,
        meter_periods: 40,
        iperf_seconds: 5,
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> u32 {
            match it.next().map(|v| v.parse()) {
                Some(Ok(v)) => v,
                _ => {
                    eprintln!("{name} takes a number\n\n{USAGE}");
                    std::process::exit(2);
                }
            }
        };
        match a.as_str() {
            "--runs" => args.runs = value("--runs"),
            "--scaling-runs" => args.scaling_runs = value("--scaling-runs"),
            "--meter-periods" => args.meter_periods = value("--meter-periods"),
            "--iperf-seconds" => args.iperf_seconds = value("--iperf-seconds"),
            "--rounds" => args.rounds = value("--rounds"),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            // What `cargo bench` passes to every bench target.
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other:?}\n\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    args
}

fn main() {
    let args = parse_args();
    cost::table(&args);
    if args.scaling_runs > 0 {
        scaling::table(&args);
    }
    if args.meter_periods > 0 {
        meter_tables::table(&args);
    }
    if args.rounds > 0 {
        throughput::table(&args);
    }
}

/// A TCP frame from 10.101.1.2:40000 to `dst`:5201 with `payload` bytes.
pub fn frame(dst: [u8; 4], payload: usize) -> Vec<u8> {
    let builder = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 101, 1, 2], dst, 64)
        .tcp(40000, 5201, 1, 65535)
        .ack(1);
    let mut out = Vec::new();
    builder.write(&mut out, &vec![0x5a; payload]).unwrap();
    out
}

/// The path meter's period as agents run it by default (`--meter-period-ms 250`).
pub const METER_PERIOD_NS: u64 = 250_000_000;

/// What a TC program makes of `input` (one test run).
pub fn output(prog: &aya::programs::SchedClassifier, input: &[u8]) -> Vec<u8> {
    use aya::programs::TestRun as _;
    let mut out = vec![0u8; input.len() + 128];
    let r = prog
        .test_run(aya::programs::TestRunOptions {
            data_in: Some(input),
            data_out: Some(&mut out),
            ..Default::default()
        })
        .expect("test_run");
    out.truncate(r.data_size_out as usize);
    out
}

/// A datapath of its own (pins under `sopa-bench-{tag}PID`) in `sopa` mode, given `table`.
/// A pin folder of the bench's own, removed when dropped, a panic's unwinding included: the
/// maps pinned there (preallocated, per CPU) must not outlive the bench.
pub struct Pins(std::path::PathBuf);

impl Pins {
    pub fn new(tag: &str) -> Self {
        let dir = std::path::PathBuf::from(format!(
            "/sys/fs/bpf/sopa-bench-{tag}{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a pin folder on bpffs");
        Self(dir)
    }
}

impl AsRef<std::path::Path> for Pins {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn loaded(tag: &str, table: &str) -> (Datapath, MapSet, Pins) {
    let pins = Pins::new(tag);
    let mut dp = Datapath::load(pins.as_ref()).expect("load the datapath");
    let mut maps = dp.take_maps().unwrap();
    maps.set_config(Config {
        mode: mode::SOPA,
        hash_seed: 1,
    })
    .unwrap();
    let table = PathTable::parse(table).unwrap();
    maps.apply_paths(&table).unwrap();
    maps.apply_srv6(table.srv6.as_ref()).unwrap();
    maps.set_meter_period(METER_PERIOD_NS).unwrap();
    (dp, maps, pins)
}

pub fn prog_ref<'a, P>(ebpf: &'a mut aya::Ebpf, name: &str) -> &'a mut P
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program>,
    <&'a mut P as TryFrom<&'a mut aya::programs::Program>>::Error: std::fmt::Debug,
{
    ebpf.program_mut(name).unwrap().try_into().unwrap()
}
