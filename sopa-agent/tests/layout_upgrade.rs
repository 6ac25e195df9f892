//! Upgrades across map layouts (needs root and bpffs): counters pinned by an agent of the
//! previous layout are accepted and carried over by name, and a map of a layout this agent does
//! not know is refused with its name.
//!
//! The previous layout's maps are made from this layout's own pins, renamed: a per-CPU array
//! of u64 under the old name, with values written by the old layout's indices. Its settings'
//! maps, of shapes no map of this layout has, are made with `bpftool`.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use aya::maps::{Map, MapData, PerCpuArray, PerCpuValues};
use sopa_agent::datapath::{Datapath, layout};
use sopa_common::maps::{
    FWD_STATS_MAP, HOST_INDEX_MAP, HOST_MAP, HostConfig, STAMP_STATS_MAP, STRIP_STATS_MAP,
    encoding, forward_reason, lookup, meter, stamp_reason, strip_reason, usid_repair,
};

/// A pin folder of its own, removed on drop.
struct Pins(PathBuf);

impl Pins {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        Self(PathBuf::from(format!(
            "/sys/fs/bpf/sopa-test-layout-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )))
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(pin: &Path) -> PerCpuArray<MapData, u64> {
    MapData::from_pin(pin)
        .and_then(Map::from_map_data)
        .unwrap()
        .try_into()
        .unwrap()
}

fn cpus() -> usize {
    aya::util::nr_cpus().unwrap()
}

/// Writes `value` on every CPU at `index`.
fn set(map: &mut PerCpuArray<MapData, u64>, index: u32, value: u64) {
    let values = PerCpuValues::try_from(vec![value; cpus()]).unwrap();
    map.set(index, values, 0).unwrap();
}

/// The counter `name` of `names`, summed over CPUs.
fn counter(map: &PerCpuArray<MapData, u64>, names: &[&str], name: &str) -> u64 {
    let i = names.iter().position(|n| *n == name).unwrap() as u32;
    map.get(&i, 0).unwrap().iter().sum()
}

/// Leaves in `pins` what an agent of the previous layout would: its maps, with its counters
/// at `value(old index)` on every CPU, under their old names.
fn previous_layout(pins: &Path, value: impl Fn(u32) -> u64) {
    drop(Datapath::load(pins).unwrap());
    // Maps retired since (the meter's counter maps of both colors) stand in under their old
    // names: maps of this layout renamed, made again by the second load, and then removed (the
    // previous layout had none of them).
    for (now, then) in [
        (meter::RECEIVED_MAPS[0], "SOPA_SENT_V1"),
        (meter::SENT_MAPS[0], "SOPA_SENT_V2"),
        (meter::RECEIVED_MAPS[1], "SOPA_RECV_V1"),
    ] {
        std::fs::rename(pins.join(now), pins.join(then)).unwrap();
    }
    // A switch's uSID configuration of V1 had no block (an array of one entry either way).
    std::fs::rename(
        pins.join(usid_repair::CONFIG_MAP),
        pins.join("SOPA_USIDC_V1"),
    )
    .unwrap();
    drop(Datapath::load(pins).unwrap());
    // The settings were in maps of their own: the encoding a one-entry hash, the lookup slots
    // and the meter's configuration arrays.
    for name in meter::SENT_MAPS
        .into_iter()
        .chain(meter::RECEIVED_MAPS)
        .chain([HOST_MAP, HOST_INDEX_MAP])
    {
        std::fs::remove_file(pins.join(name)).unwrap();
    }
    let s = previous_settings_written();
    let bytes = |v: &[u8]| v.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>();
    for (name, kind, value, entries) in [
        ("SOPA_ENCAP_V2", "hash", bytes(as_bytes(&s.encap)), 1),
        ("SOPA_METER_V1", "array", bytes(as_bytes(&s.meter)), 1),
    ] {
        bpftool_map(pins, name, kind, value.len(), entries, &[(0, value)]);
    }
    let slots: Vec<(u32, Vec<String>)> = (0..4)
        .map(|i| (i, bytes(&s.lookup[i as usize].to_ne_bytes())))
        .collect();
    bpftool_map(pins, "SOPA_LOOKUP_V1", "array", 4, 4, &slots);
    for p in &layout::PREDECESSORS {
        let old = pins.join(p.old);
        std::fs::rename(pins.join(p.new), &old).unwrap();
        let mut map = open(&old);
        for i in 0..32 {
            set(
                &mut map,
                i,
                if (i as usize) < p.old_names.len() {
                    value(i)
                } else {
                    0
                },
            );
        }
    }
}

/// The settings the previous layout's maps hold in these tests: SRv6 with this host's
/// addresses, prefixes of one length (/24) under a /16 cover, the meter every 250 ms by /24.
fn previous_settings_written() -> HostConfig {
    let mut s = HostConfig::default();
    s.encap.encoding = encoding::SRV6;
    s.encap.source = "fd00:5a::a01:2"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets();
    s.encap.receive = "fcbb:bb00:9:e102::"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets();
    s.lookup[lookup::PATHS as usize] = u32::MAX << 8;
    s.lookup[lookup::FABRIC as usize] = u32::from_be_bytes([10, 3, 0, 0]);
    s.lookup[lookup::FABRIC_MASK as usize] = u32::MAX << 16;
    s.meter.period_ns = 250_000_000;
    s.meter.rack_mask = u32::from_ne_bytes([255, 255, 255, 0]);
    s
}

/// The encoding and the lookups `status` reads from the datapath pinned in `pins` are the
/// previous layout's (its meter, counted in maps this layout retired, is not read from it).
fn settings_are_the_previous_layouts(pins: &Path, what: &str) {
    let maps = sopa_agent::datapath::MapSet::from_pins(pins).unwrap();
    let want = previous_settings_written();
    assert_eq!(maps.encap().unwrap(), want.encap, "the encoding {what}");
    assert_eq!(maps.exact_length().unwrap(), Some(24), "{what}");
    assert_eq!(
        maps.fabric_cover().unwrap(),
        Some("10.3.0.0/16".parse().unwrap()),
        "{what}"
    );
}

fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: the settings' parts are repr(C) structs of integers with explicit padding.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

/// Makes and pins map `name` of `kind` (u32 keys, `value_size`-byte values) with `values`.
fn bpftool_map(
    pins: &Path,
    name: &str,
    kind: &str,
    value_size: usize,
    entries: u32,
    values: &[(u32, Vec<String>)],
) {
    let pin = pins.join(name);
    let run = |args: &[String]| drop(sopa_testbed::bpftool::run(args));
    let s = |v: &str| v.to_owned();
    run(&[
        s("map"),
        s("create"),
        pin.display().to_string(),
        s("type"),
        s(kind),
        s("key"),
        s("4"),
        s("value"),
        value_size.to_string(),
        s("entries"),
        entries.to_string(),
        s("name"),
        s(name),
    ]);
    for (key, value) in values {
        let mut args = vec![
            s("map"),
            s("update"),
            s("pinned"),
            pin.display().to_string(),
        ];
        args.push(s("key"));
        args.push(s("hex"));
        args.extend(key.to_ne_bytes().iter().map(|b| format!("{b:02x}")));
        args.push(s("value"));
        args.push(s("hex"));
        args.extend(value.iter().cloned());
        run(&args);
    }
}

/// Adds `n` on every CPU to counter `name` of a map whose slots are `names`.
fn add(map: &mut PerCpuArray<MapData, u64>, names: &[&str], name: &str, n: u64) {
    let i = names.iter().position(|x| *x == name).unwrap() as u32;
    let values: Vec<u64> = map.get(&i, 0).unwrap().iter().map(|v| v + n).collect();
    map.set(i, PerCpuValues::try_from(values).unwrap(), 0)
        .unwrap();
}

#[test]
fn counters_of_the_previous_layout_are_carried_over_by_name() {
    let pins = Pins::new();
    // Old index i counted (i + 1) on each CPU.
    previous_layout(&pins.0, |i| u64::from(i) + 1);
    layout::check(&pins.0).expect("the previous layout is accepted");
    let n = cpus() as u64;
    let v1 = &layout::PREDECESSORS[0];
    // A new `status` reads a datapath the old agent left attached, by counter name.
    let old = sopa_agent::datapath::MapSet::from_pins(&pins.0)
        .unwrap()
        .stamp_counters()
        .unwrap();
    assert_eq!(old[stamp_reason::PINNED as usize], 13 * n, "V1 index 12");
    assert_eq!(old[stamp_reason::TOO_BIG as usize], 0, "not a V1 counter");
    // And its settings, from the maps it kept them in.
    settings_are_the_previous_layouts(&pins.0, "read from the older datapath");

    // Loaded, not attached yet: nothing counts into this layout's maps.
    let datapath = Datapath::load(&pins.0).unwrap();
    let carry = layout::Carry::start(&pins.0).unwrap();
    let mut stamp = open(&pins.0.join(STAMP_STATS_MAP));
    assert_eq!(counter(&stamp, &stamp_reason::NAMES, "pinned"), 13 * n);
    // The old programs count until ours replace them, ours from then on.
    let mut v1_stamp = open(&pins.0.join(v1.old));
    add(&mut v1_stamp, v1.old_names, "stamped", 5);
    add(&mut stamp, &stamp_reason::NAMES, "stamped", 7);
    add(&mut stamp, &stamp_reason::NAMES, "too_big", 3);
    drop(v1_stamp);

    // The settings are in this layout's snapshot before its programs run.
    settings_are_the_previous_layouts(&pins.0, "carried over");
    let meter = sopa_agent::datapath::MapSet::from_pins(&pins.0)
        .unwrap()
        .meter_config()
        .unwrap();
    assert_eq!(
        meter,
        previous_settings_written().meter,
        "the meter carried over"
    );

    let carried = carry.finish().unwrap();
    assert_eq!(carried, ["SOPA_STAMP_V1", "SOPA_STRIP_V1", "SOPA_FWDST_V1"]);
    for p in &layout::PREDECESSORS {
        assert!(!pins.0.join(p.old).exists(), "{} is unpinned", p.old);
    }
    for name in layout::RETIRED {
        assert!(!pins.0.join(name).exists(), "{name} is unpinned");
    }
    for name in meter::SENT_MAPS.into_iter().chain(meter::RECEIVED_MAPS) {
        assert!(pins.0.join(name).exists());
    }
    assert_eq!(
        counter(&stamp, &stamp_reason::NAMES, "stamped"),
        (1 + 5 + 7) * n,
        "the old count, what the old programs counted meanwhile, and ours"
    );
    assert_eq!(counter(&stamp, &stamp_reason::NAMES, "too_big"), 3 * n);
    // V1 indices: flow_table_full 10, adjust_failed 11, pinned 12, flows_created 14.
    for (name, old_index) in [
        ("flow_table_full", 10),
        ("adjust_failed", 11),
        ("pinned", 12),
        ("flows_created", 14),
    ] {
        assert_eq!(
            counter(&stamp, &stamp_reason::NAMES, name),
            (old_index + 1) * n,
            "{name}"
        );
    }
    for name in ["forged_dropped", "restamped"] {
        assert_eq!(counter(&stamp, &stamp_reason::NAMES, name), 0, "{name}");
    }
    let strip = open(&pins.0.join(STRIP_STATS_MAP));
    for (i, name) in layout::PREDECESSORS[1].old_names.iter().enumerate() {
        assert_eq!(
            counter(&strip, &strip_reason::NAMES, name),
            (i as u64 + 1) * n,
            "{name}"
        );
    }
    for name in ["decapsulated", "foreign_srv6"] {
        assert_eq!(counter(&strip, &strip_reason::NAMES, name), 0, "{name}");
    }
    // tc_forward's V1 counters keep their names; the rest (`untrusted`, the repair's
    // `detoured`, `detour_refused`, `unreachable`) are new.
    let forward = open(&pins.0.join(FWD_STATS_MAP));
    let v1 = layout::PREDECESSORS[2].old_names;
    for name in forward_reason::NAMES.iter() {
        let want = v1
            .iter()
            .position(|old| old == name)
            .map_or(0, |i| (i as u64 + 1) * n);
        assert_eq!(
            counter(&forward, &forward_reason::NAMES, name),
            want,
            "{name}"
        );
    }
    // Nothing left to carry the second time.
    assert!(
        layout::Carry::start(&pins.0)
            .unwrap()
            .finish()
            .unwrap()
            .is_empty()
    );
    drop(datapath);
}

#[test]
fn an_agent_that_died_while_carrying_over_never_doubles_a_counter() {
    let pins = Pins::new();
    previous_layout(&pins.0, |i| u64::from(i) + 1);
    let _datapath = Datapath::load(&pins.0).unwrap();
    // Started, then the agent died before finishing: the old maps are still pinned.
    drop(layout::Carry::start(&pins.0).unwrap());
    layout::Carry::start(&pins.0).unwrap().finish().unwrap();
    let stamp = open(&pins.0.join(STAMP_STATS_MAP));
    assert_eq!(
        counter(&stamp, &stamp_reason::NAMES, "stamped"),
        cpus() as u64,
        "set again, not added twice"
    );
}

#[test]
fn a_map_of_an_unknown_layout_is_refused_by_name() {
    let pins = Pins::new();
    drop(Datapath::load(&pins.0).unwrap());
    std::fs::rename(pins.0.join(STAMP_STATS_MAP), pins.0.join("SOPA_STAMP_V9")).unwrap();
    let err = layout::check(&pins.0).unwrap_err().to_string();
    assert!(err.contains("SOPA_STAMP_V9"), "{err}");
    assert!(
        err.contains("--reset"),
        "the message says what to do: {err}"
    );
}

#[test]
fn status_reads_a_datapath_the_previous_layout_left_attached() {
    let pins = Pins::new();
    previous_layout(&pins.0, |i| u64::from(i) + 1);
    // The previous layout had neither the trusted ports nor the first-path setting.
    for map in [sopa_common::maps::TRUST_MAP, sopa_common::maps::START_MAP] {
        std::fs::remove_file(pins.0.join(map)).unwrap();
    }
    let n = cpus() as u64;
    let forward = sopa_agent::datapath::maps::ForwardMaps::from_pins(&pins.0)
        .unwrap()
        .counters()
        .unwrap();
    // V1 index 8 is redirect_failed; `untrusted` is not a V1 counter.
    assert_eq!(forward[forward_reason::REDIRECT_FAILED as usize], 9 * n);
    assert_eq!(forward[forward_reason::UNTRUSTED as usize], 0);
    let maps = sopa_agent::datapath::MapSet::from_pins(&pins.0).unwrap();
    assert!(!maps.has_first_path());
    assert_eq!(
        maps.first_path().unwrap(),
        sopa_common::maps::first_path::HASH,
        "what the previous layout did"
    );
}
