//! The path meter's tables over a host's life (BPF_PROG_TEST_RUN): each color's counters are
//! read and emptied by the agent after its period, so a host that reaches more (rack, path)
//! pairs over time than a table holds still counts every packet of every period.

mod common;

use common::Fixture;
use etherparse::PacketBuilder;
use sopa_agent::meter::{Clock, PeriodMeter};
use sopa_common::maps::{meter, mode, stamp_reason};

/// Every /24 of 10.0.0.0/8 a rack of its own (the longest prefix sets the rack mask), each
/// reached over two paths.
const WIDE: &str = r#"
[[destination]]
prefix = "10.0.0.0/8"
paths = [[0], [1]]
[[destination]]
prefix = "10.255.255.0/24"
paths = [[0], [1]]
"#;

fn tcp(dst: [u8; 4], sport: u16, seq: u32) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 1, 0, 2], dst, 64)
        .tcp(sport, 5001, seq, 65535)
        .ack(1);
    let mut out = Vec::new();
    builder.write(&mut out, b"meter").unwrap();
    out
}

/// Rack `i` (below 65,536) of [`WIDE`]: a host in 10.(i / 256).(i % 256).0/24.
fn rack(i: u32) -> [u8; 4] {
    [10, (i >> 8) as u8, i as u8, 9]
}

#[test]
fn a_host_reaching_more_racks_than_the_table_holds_counts_every_period_in_full() {
    // Four periods, each to 16,000 racks of its own over both paths: 32,000 (rack, path)
    // pairs a period, half the table; 128,000 over the four, twice what it holds. Read and
    // emptied after each period as the agent's reader does, no period finds it full; a table
    // that kept its keys (the layout before) was full in the third.
    const RACKS: u32 = 16_000;
    const PERIODS: u32 = 4;
    const { assert!(RACKS * PERIODS <= 65_536) };
    const { assert!(2 * RACKS < meter::CAPACITY && 2 * RACKS * PERIODS > meter::CAPACITY) };
    let mut f = Fixture::new(WIDE, mode::SOPA);
    let clock = Clock::default();
    f.maps.set_meter_period(clock.period_ns).unwrap();
    let mut color = f.maps.meter_color().unwrap().expect("a color to turn");
    let counters = f
        .maps
        .meter_counters()
        .unwrap()
        .expect("the meter's counters");
    let mut reader = PeriodMeter::new(clock);
    let full = |f: &Fixture| f.maps.stamp_counters().unwrap()[stamp_reason::METER_FULL as usize];
    let mut reports = Vec::new();
    for period in 0..=PERIODS {
        // The period's packets: two of one flow to each of its racks (the round robin takes
        // both paths).
        if period < PERIODS {
            color.set((period & 1) as u8).unwrap();
            for i in period * RACKS..(period + 1) * RACKS {
                for seq in 0..2 {
                    f.stamp(&tcp(rack(i), 7000, seq));
                }
            }
        }
        // Half a period into it, the period before is read: its color's maps, emptied.
        let Some(closed) = period.checked_sub(1) else {
            continue;
        };
        let counts = counters.take((closed & 1) as u8).unwrap();
        let (sent, received) = (&counts.0, &counts.1);
        assert_eq!(
            (sent.len(), full(&f)),
            (2 * RACKS as usize, 0),
            "period {closed}: a key for each rack and path, none refused"
        );
        assert!(
            sent.iter()
                .all(|(k, v)| v.packets == 1 && k.color == (closed & 1) as u8)
        );
        assert!(received.is_empty());
        assert!(
            counters.peek((closed & 1) as u8).unwrap().0.is_empty(),
            "period {closed}: its maps emptied"
        );
        if let Some(r) = reader.sample(u64::from(closed), counts, full(&f), false, true) {
            reports.push(r);
        }
    }
    // The first reading of each color holds what came before it; every one after is a report,
    // complete, of every packet of its period.
    assert_eq!(reports.len(), PERIODS as usize - 2);
    for r in &reports {
        assert!(!r.incomplete, "period {}", r.period);
        assert_eq!(r.sent.len(), RACKS as usize, "period {}", r.period);
        let packets: u64 = r.sent.iter().flat_map(|p| &p.packets).sum();
        assert_eq!(packets, 2 * u64::from(RACKS), "period {}", r.period);
    }
}

#[test]
fn reading_a_color_empties_its_maps_at_both_ends_and_leaves_the_other_color_counting() {
    let mut f = Fixture::new(common::TABLE, mode::SOPA);
    f.maps.set_meter_period(Clock::default().period_ns).unwrap();
    let mut color = f.maps.meter_color().unwrap().unwrap();
    let counters = f.maps.meter_counters().unwrap().unwrap();
    color.set(0).unwrap();
    let even: Vec<Vec<u8>> = (0..5)
        .map(|s| f.stamp(&tcp([10, 2, 0, 2], 8000, s)))
        .collect();
    color.set(1).unwrap();
    let odd: Vec<Vec<u8>> = (0..3)
        .map(|s| f.stamp(&tcp([10, 2, 0, 2], 8000, 5 + s)))
        .collect();
    // The same packets arriving here count at the receiving end, in the color each carries
    // (from 10.1.0.0/24, a rack of the table: its paths' hop limits let every mark count).
    f.maps
        .set_meter_peers(&[(
            "10.1.0.0/24".parse().unwrap(),
            sopa_common::maps::MeterPeer {
                hop_limits: [3, 0],
                hop1_none: 1,
                _pad: 0,
            },
        )])
        .unwrap();
    for p in even.iter().chain(&odd) {
        f.strip(p);
    }
    let total = |c: &sopa_agent::datapath::meter_maps::MeterCounts| {
        (
            c.0.iter().map(|(_, v)| v.packets).sum::<u64>(),
            c.1.iter().map(|(_, v)| *v).sum::<u64>(),
        )
    };
    assert_eq!(total(&counters.take(0).unwrap()), (5, 5));
    assert_eq!(total(&counters.take(0).unwrap()), (0, 0), "emptied");
    assert_eq!(
        total(&counters.peek(1).unwrap()),
        (3, 3),
        "color 1 untouched"
    );
    assert_eq!(total(&counters.take(1).unwrap()), (3, 3));
    assert_eq!(total(&counters.peek(1).unwrap()), (0, 0));
}
