//! The one-CPU table: `tc_stamp` and `xdp_strip` against empty programs and their floors.

use aya::{
    EbpfLoader,
    programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp},
};
use sopa_agent::datapath;
use sopa_common::maps::lookup;

use crate::{Args, METER_PERIOD_NS, frame, loaded, output, prog_ref};

/// The bench's datapaths.
#[derive(Clone, Copy)]
enum Dp {
    /// The option, every rack prefix one length (the exact match).
    Main,
    /// The option, a prefix of another length more (the trie's longest match).
    Trie,
    /// SRv6, exact matches.
    Six,
    /// SRv6, the tries.
    SixTrie,
}

/// The floors' rows.
const OPTION_FLOOR: &str = "tc: adjust_room +4 alone (option floor)";
const SRV6_FLOOR: &str = "tc: adjust_room +48 alone (SRv6 floor)";
const STRIP_FLOOR: &str = "xdp: adjust_head +4 alone (floor)";

/// What a row runs.
#[derive(Clone, Copy)]
enum Prog {
    TcPass,
    XdpPass,
    /// A floor in the baselines' object, by program name.
    Baseline(&'static str),
    Stamp(Dp),
    Strip(Dp),
}

impl Prog {
    /// An XDP program (against `XDP_PASS`), or a TC one (against the empty classifier).
    fn is_xdp(self) -> bool {
        match self {
            Prog::XdpPass | Prog::Strip(_) => true,
            Prog::Baseline(name) => name.starts_with("xdp_"),
            Prog::TcPass | Prog::Stamp(_) => false,
        }
    }
}

/// One program on one input, timed by the kernel and summed over single runs.
struct Row<'a> {
    name: &'static str,
    prog: Prog,
    input: &'a [u8],
    meter: bool,
    reordering: bool,
}

impl<'a> Row<'a> {
    fn new(name: &'static str, prog: Prog, input: &'a [u8]) -> Self {
        Self {
            name,
            prog,
            input,
            meter: true,
            reordering: false,
        }
    }

    fn meter_off(self) -> Self {
        Self {
            meter: false,
            ..self
        }
    }

    /// The floor of the work the row's program does on its input: the helper that makes or
    /// removes the room alone (`None`: a row that passes its packet on unchanged).
    fn floor(&self) -> Option<&'static str> {
        match self.prog {
            Prog::Stamp(Dp::Main | Dp::Trie) if self.name.contains("stamped") => Some(OPTION_FLOOR),
            Prog::Stamp(Dp::Six | Dp::SixTrie) => Some(SRV6_FLOOR),
            Prog::Strip(_) if !self.name.contains("passed") => Some(STRIP_FLOOR),
            _ => None,
        }
    }

    fn reordering(self) -> Self {
        Self {
            reordering: true,
            ..self
        }
    }
}

/// The one-CPU table: each program's ns per packet against the empty program of its hook and
/// against its floor.
pub fn table(args: &Args) {
    // A rack prefix per edge switch of a k=48 Fat-Tree (1,152 /24s), the benchmark's
    // destination among them: the trie's walk is as deep as in such a fabric.
    let racks: String = (0..48u32)
        .flat_map(|pod| (0..24u32).map(move |edge| (pod, edge)))
        .map(|(pod, edge)| {
            format!(
                "[[destination]]\nprefix = \"10.{pod}.{edge}.0/24\"\n\
                 paths = [[0, 0], [0, 1], [1, 0], [1, 1]]\n"
            )
        })
        .collect();
    // The same racks in the SRv6 encoding, each with its switches' uSIDs.
    let srv6 = "encoding = \"srv6\"\n[srv6]\nsource = \"fd00:5a::a65:102\"\n\
                receive = \"fcbb:bb00:9:e102::\"\n";
    let racks6: String = racks.replace(
        "paths = [[0, 0], [0, 1], [1, 0], [1, 1]]\n",
        "paths = [[0, 0], [0, 1], [1, 0], [1, 1]]\n\
         segments = [[1, 3], [1, 4], [2, 5], [2, 6]]\ntail = [9]\n",
    );
    // One prefix of another length more: the tries' longest match, as every datapath looked
    // destinations up before the exact match.
    let other_length = "[[destination]]\nprefix = \"10.200.0.0/19\"\npaths = [[0, 0]]\n";
    let (mut dp, mut maps, pins) = loaded("", &racks);
    let (mut dp_trie, maps_trie, pins_trie) = loaded("trie-", &format!("{racks}{other_length}"));
    let (mut dp6, maps6, pins6) = loaded("6-", &format!("{srv6}{racks6}"));
    let (mut dp6_trie, maps6_trie, pins6_trie) = loaded(
        "6-trie-",
        &format!("{srv6}{racks6}{other_length}segments = [[1, 3]]\ntail = [9]\n"),
    );
    for (m, want) in [
        (&maps, Some(24)),
        (&maps_trie, None),
        (&maps6, Some(24)),
        (&maps6_trie, None),
    ] {
        assert_eq!(m.exact_length_of(lookup::PATHS).unwrap(), want);
    }
    assert_eq!(maps6.exact_length_of(lookup::SRV6_DESTS).unwrap(), Some(24));
    assert_eq!(
        maps6_trie.exact_length_of(lookup::SRV6_DESTS).unwrap(),
        None
    );
    let mut baseline = EbpfLoader::new()
        .default_map_pin_directory(&pins)
        .load(datapath::OBJECT)
        .expect("load the baselines");
    let tc_pass: &mut SchedClassifier =
        baseline.program_mut("tc_pass").unwrap().try_into().unwrap();
    tc_pass.load().unwrap();
    let xdp_pass: &mut Xdp = baseline
        .program_mut("xdp_pass")
        .unwrap()
        .try_into()
        .unwrap();
    xdp_pass.load().unwrap();
    for floor in ["tc_room", "tc_room6"]
        .into_iter()
        .chain(PARTS.map(|(_, p)| p))
    {
        prog_ref::<SchedClassifier>(&mut baseline, floor)
            .load()
            .unwrap();
    }
    let xdp_head: &mut Xdp = baseline
        .program_mut("xdp_head")
        .unwrap()
        .try_into()
        .unwrap();
    xdp_head.load().unwrap();

    let fabric = frame([10, 3, 1, 2], 1448);
    let outside = frame([192, 168, 9, 9], 1448);
    // Inside the prefix that covers the racks (10.0.0.0/10), in none of them: looked up, missed.
    let inside = frame([10, 63, 0, 1], 1448);
    let mut out = vec![0u8; 2048];
    let run_once = |prog: &mut dyn FnMut(TestRunOptions) -> u128, input: &[u8], out: &mut [u8]| {
        prog(TestRunOptions {
            data_in: Some(input),
            data_out: Some(out),
            ..Default::default()
        })
    };
    let stamped = output(dp.stamp_program(), &fabric);
    assert_eq!(
        stamped.len(),
        fabric.len() + 4,
        "the benchmark packet is stamped"
    );

    // The tries' datapaths do the same work on it.
    assert_eq!(output(dp_trie.stamp_program(), &fabric), stamped);
    assert_eq!(
        output(dp6_trie.stamp_program(), &fabric),
        output(dp6.stamp_program(), &fabric)
    );

    assert_eq!(
        output(dp.stamp_program(), &inside),
        inside,
        "no prefix: passed"
    );
    assert_eq!(output(dp_trie.stamp_program(), &inside), inside);

    // The floors do their work on this packet too (a helper that failed would cost less).
    assert_eq!(
        output(prog_ref(&mut baseline, "tc_room"), &fabric).len(),
        fabric.len() + 4,
        "tc_room makes the option's room"
    );
    assert_eq!(
        output(prog_ref(&mut baseline, "tc_room6"), &fabric).len(),
        fabric.len() + 48,
        "tc_room6 makes an outer header's and a mark's room"
    );
    let mut head_out = vec![0u8; 2048];
    let head = prog_ref::<Xdp>(&mut baseline, "xdp_head")
        .test_run(TestRunOptions {
            data_in: Some(&fabric),
            data_out: Some(&mut head_out),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        head.data_size_out as usize,
        fabric.len() - 4,
        "xdp_head removes 4 bytes"
    );
    let encapsulated = {
        let mut p = output(dp6.stamp_program(), &fabric);
        assert_eq!(
            p.len(),
            fabric.len() + 48,
            "the benchmark packet is encapsulated, with the path meter's mark"
        );
        // As it arrives: the list consumed down to the destination's own address.
        p[14 + 24..14 + 40].copy_from_slice(
            &"fcbb:bb00:9:e102::"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        p
    };
    let mut dps = [dp, dp_trie, dp6, dp6_trie];
    // Each row: what runs, on which input, against which empty program; the path meter on
    // (the agents' default, every 250 ms) unless the row says otherwise.
    let rows = [
        Row::new("tc: empty program (baseline)", Prog::TcPass, &fabric),
        Row::new(
            "tc_stamp, fabric TCP (stamped)",
            Prog::Stamp(Dp::Main),
            &fabric,
        ),
        Row::new(
            "tc_stamp, other destination (passed)",
            Prog::Stamp(Dp::Main),
            &outside,
        ),
        Row::new(
            "tc_stamp, no prefix (exact match)",
            Prog::Stamp(Dp::Main),
            &inside,
        ),
        Row::new(
            "tc_stamp, stamped, meter off",
            Prog::Stamp(Dp::Main),
            &fabric,
        )
        .meter_off(),
        Row::new(
            "tc_stamp, stamped, two lengths (trie)",
            Prog::Stamp(Dp::Trie),
            &fabric,
        ),
        Row::new(
            "tc_stamp, no prefix, two lengths (trie)",
            Prog::Stamp(Dp::Trie),
            &inside,
        ),
        Row::new(
            "tc_stamp, fabric TCP (SRv6 encapsulated)",
            Prog::Stamp(Dp::Six),
            &fabric,
        ),
        Row::new(
            "tc_stamp, SRv6, two lengths (tries)",
            Prog::Stamp(Dp::SixTrie),
            &fabric,
        ),
        Row::new(OPTION_FLOOR, Prog::Baseline("tc_room"), &fabric),
        Row::new(SRV6_FLOOR, Prog::Baseline("tc_room6"), &fabric),
        Row::new("xdp: XDP_PASS (baseline)", Prog::XdpPass, &fabric),
        Row::new(
            "xdp_strip, stamped TCP (stripped)",
            Prog::Strip(Dp::Main),
            &stamped,
        ),
        Row::new(
            "xdp_strip, plain TCP (passed)",
            Prog::Strip(Dp::Main),
            &fabric,
        ),
        Row::new(
            "xdp_strip, stripped, meter off",
            Prog::Strip(Dp::Main),
            &stamped,
        )
        .meter_off(),
        Row::new(
            "xdp_strip, stamped, reordering measured",
            Prog::Strip(Dp::Main),
            &stamped,
        )
        .reordering(),
        Row::new(
            "xdp_strip, SRv6 (decapsulated)",
            Prog::Strip(Dp::Six),
            &encapsulated,
        ),
        Row::new(STRIP_FLOOR, Prog::Baseline("xdp_head"), &fabric),
    ]
    .into_iter()
    .chain(PARTS.map(|(name, prog)| Row::new(name, Prog::Baseline(prog), &fabric)))
    .collect::<Vec<_>>();
    let mut totals = vec![(0u128, 0u64); rows.len()];
    let batch = 10_000u32.min(args.runs);
    let batches = args.runs.div_ceil(batch);
    eprintln!(
        "test_run: {} runs of each of {} programs, interleaved in batches of {batch}",
        batches * batch,
        rows.len()
    );
    // The meter and reordering switches are the option's exact-match datapath's: a row of
    // another datapath must not claim them.
    for row in &rows {
        let main = matches!(row.prog, Prog::Stamp(Dp::Main) | Prog::Strip(Dp::Main));
        assert!(main || (row.meter && !row.reordering), "{}", row.name);
    }
    for _ in 0..batches {
        for (row, total) in rows.iter().zip(&mut totals) {
            maps.set_reordering_measured(row.reordering).unwrap();
            maps.set_meter_period(if row.meter { METER_PERIOD_NS } else { 0 })
                .unwrap();
            for _ in 0..batch {
                let mut f = |opts: TestRunOptions| -> u128 {
                    let r = match row.prog {
                        Prog::TcPass => tc_pass_ref(&mut baseline).test_run(opts),
                        Prog::XdpPass => xdp_pass_ref(&mut baseline).test_run(opts),
                        Prog::Baseline(name) if row.prog.is_xdp() => {
                            prog_ref::<Xdp>(&mut baseline, name).test_run(opts)
                        }
                        Prog::Baseline(name) => {
                            prog_ref::<SchedClassifier>(&mut baseline, name).test_run(opts)
                        }
                        Prog::Stamp(dp) => dps[dp as usize].stamp_program().test_run(opts),
                        Prog::Strip(dp) => dps[dp as usize].strip_program().test_run(opts),
                    }
                    .expect("test_run");
                    r.duration.as_nanos()
                };
                total.0 += run_once(&mut f, row.input, &mut out);
                total.1 += 1;
            }
        }
    }
    let mean = |name: &str| {
        let i = rows
            .iter()
            .position(|r| r.name == name)
            .unwrap_or_else(|| panic!("no row {name}"));
        totals[i].0 as f64 / totals[i].1 as f64
    };
    println!();
    println!(
        "datapath cost per packet (BPF_PROG_TEST_RUN, kernel-timed, 1514-byte TCP frame; \
         path meter on, as agents run by default, unless a row says off)"
    );
    println!(
        "{:<42} {:>10} {:>14} {:>8} {:>10}",
        "program", "ns/packet", "over baseline", "ratio", "vs floor"
    );
    for row in rows.iter().filter(|r| !is_part(r.prog)) {
        let ns = mean(row.name);
        // Each program against the empty program of its hook, and against the floor of the
        // work it does, where it does some.
        let base = mean(if row.prog.is_xdp() {
            "xdp: XDP_PASS (baseline)"
        } else {
            "tc: empty program (baseline)"
        });
        let floor = row
            .floor()
            .map(|f| format!("{:.2}", ns / mean(f)))
            .unwrap_or_default();
        println!(
            "{:<42} {:>10.1} {:>+14.1} {:>8.2} {floor:>10}",
            row.name,
            ns,
            ns - base,
            ns / base
        );
    }
    let over = |a: &str, b: &str| mean(a) - mean(b);
    let (tc, xdp) = ("tc: empty program (baseline)", "xdp: XDP_PASS (baseline)");
    let (stamped_row, stripped_row) = (
        "tc_stamp, fabric TCP (stamped)",
        "xdp_strip, stamped TCP (stripped)",
    );
    let (six, six_strip) = (
        "tc_stamp, fabric TCP (SRv6 encapsulated)",
        "xdp_strip, SRv6 (decapsulated)",
    );
    println!(
        "SRv6 over the option: encapsulating {:+.1} ns/packet ({:.2}x the option's cost), \
         decapsulating {:+.1} ns/packet ({:.2}x)",
        over(six, stamped_row),
        over(six, tc) / over(stamped_row, tc),
        over(six_strip, stripped_row),
        over(six_strip, xdp) / over(stripped_row, xdp)
    );
    println!(
        "one exact match over the trie's longest match (1,152 rack prefixes): stamped {:+.1} \
         ns/packet, no prefix {:+.1}, SRv6 {:+.1}",
        over(stamped_row, "tc_stamp, stamped, two lengths (trie)"),
        over(
            "tc_stamp, no prefix (exact match)",
            "tc_stamp, no prefix, two lengths (trie)"
        ),
        over(six, "tc_stamp, SRv6, two lengths (tries)")
    );
    println!(
        "targets: tc_stamp (option, meter on) {:.2}x its floor (at most 1.3), SRv6 encapsulated \
         {:.2}x its floor (at most 1.3), xdp_strip {:.2}x its floor (at most 1.2)",
        mean(stamped_row) / mean(OPTION_FLOOR),
        mean(six) / mean(SRV6_FLOOR),
        mean(stripped_row) / mean(STRIP_FLOOR)
    );
    println!(
        "the path meter: stamped {:+.1} ns/packet, stripped {:+.1}",
        over(stamped_row, "tc_stamp, stamped, meter off"),
        over(stripped_row, "xdp_strip, stripped, meter off")
    );
    parts(&mean);
    drop(baseline);
    drop(dps);
    drop((pins, pins6, pins_trie, pins6_trie));
}

/// `tc_stamp`'s work in parts (`sopa-ebpf/src/parts.rs`), each on the option's exact-match
/// datapath's maps after the work all of them build on (`part_base`): (row, program).
const PARTS: [(&str, &str); 10] = [
    ("part: base (headers parsed, settings read)", "part_base"),
    ("part: + the mode and seed", "part_config"),
    ("part: + the path set, exact match", "part_paths"),
    ("part: + round robin in the flow table", "part_flow_lru"),
    ("part: + the socket's checks", "part_flow_sk_checks"),
    ("part: + socket storage created", "part_flow_sk"),
    (
        "part: + socket storage created, found 8x",
        "part_flow_sk_found",
    ),
    ("part: + the path meter (color, count)", "part_meter"),
    ("part: + bpf_check_mtu", "part_mtu"),
    ("part: + counters (reason, two hops)", "part_counts"),
];

/// Lookups of an existing socket storage in `part_flow_sk_found` (`parts::FOUND`).
const SK_FOUND: f64 = 8.0;

fn is_part(prog: Prog) -> bool {
    matches!(prog, Prog::Baseline(name) if name.starts_with("part_"))
}

/// Where `tc_stamp`'s time over the empty program goes: the base every part builds on, each
/// part's cost over that base, their sum beside what `tc_stamp` adds, and the flow's round
/// robin in the socket's storage against the flow table.
fn parts(mean: &dyn Fn(&str) -> f64) {
    let tc = mean("tc: empty program (baseline)");
    let row = |prog: &str| PARTS.iter().find(|p| p.1 == prog).expect("a part").0;
    let base = mean(row("part_base"));
    // Each part over the base: its own work only.
    let part = |prog: &str| mean(row(prog)) - base;
    // The socket's storage exists for every packet of a connection but its first: one more
    // lookup's share of several is what each later packet pays.
    let found = (mean(row("part_flow_sk_found")) - mean(row("part_flow_sk"))) / SK_FOUND;
    let checks = part("part_flow_sk_checks");
    let created = part("part_flow_sk") - checks;
    println!();
    println!(
        "where tc_stamp's time goes (option, stamped, the flow table's round robin): ns a packet"
    );
    let rows = [
        (
            "base: headers parsed, the agent's settings read (over the empty program)",
            base - tc,
        ),
        ("the mode and seed (CONFIG)", part("part_config")),
        ("the path set, exact match", part("part_paths")),
        (
            "the round robin, flow table (key, LRU lookup, position)",
            part("part_flow_lru"),
        ),
        ("the path meter (color, count)", part("part_meter")),
        ("bpf_check_mtu", part("part_mtu")),
        ("counters (reason, two hops)", part("part_counts")),
        ("the socket's checks (not a TCP connection's here)", checks),
    ];
    let mut sum = 0.0;
    for (name, ns) in rows {
        sum += ns;
        println!("  {name:<72} {ns:>+7.1}");
    }
    let stamp = mean("tc_stamp, fabric TCP (stamped)") - tc;
    let floor = mean(OPTION_FLOOR) - tc;
    println!(
        "  {:<72} {floor:>+7.1}",
        "the floor's helper (adjust_room +4, over the empty program)"
    );
    println!(
        "the parts and the floor sum to {:+.1} ns of tc_stamp's {stamp:+.1} over the empty \
         program; the rest ({:+.1}) is its branches and writing the option's bytes",
        sum + floor,
        stamp - sum - floor
    );
    let lru = part("part_flow_lru");
    println!(
        "a TCP connection's round robin in its socket's storage: found {found:.1} ns against the \
         flow table's {lru:.1} ({:+.1} a packet); created on its first packet, {created:+.1}",
        found - lru
    );
    // A test run's socket is a new one of no kind each run, so the stamped row takes the flow
    // table after the socket's checks, as forwarded packets, UDP and raw sockets do; a TCP
    // connection of the host's own takes its socket's storage after the same checks.
    let own = mean("tc_stamp, fabric TCP (stamped)") - lru + found;
    println!(
        "tc_stamp for a TCP connection of this host's own (computed: the stamped row with the \
         socket's storage for the flow table): {own:.1} ns/packet, {:.2}x its floor",
        own / mean(OPTION_FLOOR)
    );
}

fn tc_pass_ref(ebpf: &mut aya::Ebpf) -> &mut SchedClassifier {
    ebpf.program_mut("tc_pass").unwrap().try_into().unwrap()
}

fn xdp_pass_ref(ebpf: &mut aya::Ebpf) -> &mut Xdp {
    ebpf.program_mut("xdp_pass").unwrap().try_into().unwrap()
}
