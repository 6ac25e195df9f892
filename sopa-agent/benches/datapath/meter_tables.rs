//! A k=48 host's path meter over many periods: the host sends to a new set of racks each period,
//! over every path of each (a flow per rack, a packet per path), until it has reached every
//! rack of the fabric over every path (several times over, with the default periods); after
//! each period the agent's reader reads that color's counters and empties them, as it runs.
//! Printed: whether every period was complete, the keys per period, and what reading one took,
//! beside the key-by-key walk (a get-next-key and a lookup per key) the reader used before.

use std::time::{Duration, Instant};

use aya::programs::{TestRun as _, TestRunOptions};
use sopa_agent::meter::{Clock, PeriodMeter};
use sopa_common::maps::{meter, stamp_reason};

use crate::{Args, loaded};

/// A k=48 Fat-Tree: 48 pods of 24 racks, 576 paths between racks of different pods.
const PODS: u32 = 48;
const RACKS_PER_POD: u32 = 24;
const RACKS: u32 = PODS * RACKS_PER_POD;
const PATHS: u32 = 576;
/// Racks reached in each period: 56 racks over every path, 32,256 (rack, path) keys, half a
/// table; and in the last period, 113 racks: 65,088 keys, the table all but full.
const RACKS_PER_PERIOD: u32 = 56;
const RACKS_LAST: u32 = 113;

/// A host of rack `r`.
fn host(r: u32) -> [u8; 4] {
    [10, (r / RACKS_PER_POD) as u8, (r % RACKS_PER_POD) as u8, 2]
}

fn frame(dst: [u8; 4]) -> Vec<u8> {
    let builder = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 101, 1, 2], dst, 64)
        .tcp(40000, 5201, 1, 65535)
        .ack(1);
    let mut out = Vec::new();
    builder.write(&mut out, &[0x5a; 64]).unwrap();
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The meter table.
pub fn table(args: &Args) {
    let paths: Vec<String> = (0..24)
        .flat_map(|a| (0..24).map(move |b| format!("[{a}, {b}]")))
        .collect();
    assert_eq!(paths.len() as u32, PATHS);
    let paths = paths.join(", ");
    let fabric: String = (0..RACKS)
        .map(|r| {
            let [_, pod, edge, _] = host(r);
            format!("[[destination]]\nprefix = \"10.{pod}.{edge}.0/24\"\npaths = [{paths}]\n")
        })
        .collect();
    let (mut dp, maps, pins) = loaded("meter-", &fabric);
    let clock = Clock::default();
    let mut color = maps.meter_color().unwrap().expect("a color to turn");
    let counters = maps
        .meter_counters()
        .unwrap()
        .expect("the meter's counters");
    let full = || maps.stamp_counters().unwrap()[stamp_reason::METER_FULL as usize];
    let frames: Vec<Vec<u8>> = (0..RACKS).map(|r| frame(host(r))).collect();
    let mut out = vec![0u8; 256];
    let mut reader = PeriodMeter::new(clock);
    let periods = args.meter_periods.max(3);
    let (mut first_rack, mut reached) = (0u32, 0u64);
    let mut keys = Vec::new();
    let (mut walks, mut takes) = (Vec::new(), Vec::new());
    let (mut reports, mut complete) = (0, 0);
    eprintln!(
        "meter: {periods} periods of a k=48 host ({RACKS} racks, {PATHS} paths each), \
         {RACKS_PER_PERIOD} racks over every path a period, {RACKS_LAST} in the last"
    );
    let started = Instant::now();
    for period in 0..=periods {
        if period < periods {
            color.set((period & 1) as u8).unwrap();
            let racks = if period + 1 == periods {
                RACKS_LAST
            } else {
                RACKS_PER_PERIOD
            };
            for i in 0..racks {
                let r = (first_rack + i) % RACKS;
                // A packet per path: the flow's round robin takes each once.
                for _ in 0..PATHS {
                    dp.stamp_program()
                        .test_run(TestRunOptions {
                            data_in: Some(&frames[r as usize]),
                            data_out: Some(&mut out),
                            ..Default::default()
                        })
                        .expect("test_run");
                }
            }
            first_rack = (first_rack + racks) % RACKS;
            reached += u64::from(racks * PATHS);
        }
        // Half a period into the next one, the reader takes the period before.
        let Some(closed) = period.checked_sub(1) else {
            continue;
        };
        let c = (closed & 1) as u8;
        let t = Instant::now();
        let walked = counters.peek(c).unwrap();
        walks.push(t.elapsed());
        let t = Instant::now();
        let counts = counters.take(c).unwrap();
        takes.push(t.elapsed());
        assert_eq!(walked.0.len(), counts.0.len());
        keys.push(counts.0.len());
        if let Some(r) = reader.sample(u64::from(closed), counts, full(), false, true) {
            reports += 1;
            let packets: u64 = r.sent.iter().flat_map(|p| &p.packets).sum();
            if !r.incomplete && packets == keys[keys.len() - 1] as u64 {
                complete += 1;
            }
        }
    }
    let took = started.elapsed();
    let median = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        v[v.len() / 2]
    };
    let max = |v: &[Duration]| v.iter().copied().max().unwrap_or_default();
    let n = takes.len();
    println!();
    println!(
        "a k=48 host's path meter over {periods} periods ({:.1} s): {reached} (rack, path) keys \
         sent to, every one of the fabric's {} {:.1} times over",
        took.as_secs_f64(),
        RACKS * PATHS,
        reached as f64 / f64::from(RACKS * PATHS)
    );
    println!(
        "periods complete: {complete} of {reports} reported (the first of each color is a \
         baseline); packets refused by a full table: {}",
        full()
    );
    println!(
        "{:<44} {:>10} {:>10} {:>10}",
        "reading one period's table", "median ms", "max ms", "last ms"
    );
    for (name, v) in [
        ("batched lookup-and-delete (the reader's)", &takes[..n - 1]),
        ("key-by-key walk (the reader's before)", &walks[..n - 1]),
    ] {
        println!(
            "{:<44} {:>10.2} {:>10.2} {:>10}",
            format!("{name}, {} keys", keys[0]),
            ms(median(v)),
            ms(max(v)),
            ""
        );
    }
    for (name, last) in [("batched", takes[n - 1]), ("key-by-key", walks[n - 1])] {
        println!(
            "{:<44} {:>10} {:>10} {:>10.2}",
            format!("{name}, the last period's {} keys", keys[n - 1]),
            "",
            "",
            ms(last)
        );
    }
    println!(
        "(per-CPU counters: a reading copies {} CPUs' values of each key; target: at most 10 ms \
         a period; a table holds {} keys a period)",
        aya::util::nr_cpus().unwrap_or(0),
        meter::CAPACITY
    );
    drop(dp);
    drop(pins);
}
