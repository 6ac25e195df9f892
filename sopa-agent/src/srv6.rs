//! The SRv6 encoding on a host: per destination prefix, the uSIDs of the switches each path
//! chooses and the uSIDs after them, as a path table file or the controller's topology gives
//! them, checked and compiled into the datapath's two maps (`sopa_common::srv6` has the wire
//! format).
//!
//! Compiling groups the destinations: those whose paths name the same switches for the same hop
//! pairs share one set of (group, hops) entries, so every destination of a Fat-Tree needs one
//! group and the segment map grows with one source's paths, not with destinations times paths.
//!
//! A table replacing another is renumbered against it before it is written: a group whose
//! segments changed takes an id the old table does not use, so a destination named by either
//! table always meets its own group's segments while the maps change one entry at a time.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv6Addr,
};

use sopa_common::{
    maps::{MAX_CHOSEN, MAX_TAIL, SegKey, Segments, Srv6Dest},
    srv6::{MAX_GLOBAL_USID, MAX_HOST_OFFSET, USID_SLOTS},
};

use sopa_topology::srv6::host_mask;

use crate::path_table::{Hops, Prefix};

/// This host's SRv6 addresses and every destination's uSIDs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Srv6Table {
    /// The outer source address: this host's IPv6 address.
    pub source: Ipv6Addr,
    /// The outer destination this host receives on: the block and its local uSID.
    pub receive: Ipv6Addr,
    /// The /96 of the fabric's IPv6 host addresses (each embeds its host's IPv4 address):
    /// IPv6 to it takes the embedded IPv4 destination's paths. `None`: IPv6 is not
    /// encapsulated.
    pub fabric6: Option<Ipv6Addr>,
    pub destinations: BTreeMap<Prefix, Srv6Paths>,
}

/// One destination prefix's uSIDs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Srv6Paths {
    /// Per path (its hop pair), the uSIDs of the switches it chooses, in order.
    pub chosen: BTreeMap<Hops, Vec<u16>>,
    /// The uSIDs after them, up to the destination's rack switch.
    pub tail: Vec<u16>,
}

/// The map entries of a table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compiled {
    pub dests: BTreeMap<Prefix, Srv6Dest>,
    pub segs: BTreeMap<SegKey, Segments>,
}

/// The groups a segment map holds: each group's segments by hop pair.
pub type Groups = BTreeMap<u16, BTreeMap<[u8; 2], Segments>>;

impl Compiled {
    /// The groups of this table.
    pub fn groups(&self) -> Groups {
        let mut groups = Groups::new();
        for (k, v) in &self.segs {
            groups.entry(k.group).or_default().insert(k.hops, *v);
        }
        groups
    }

    /// This table renumbered to replace `old` in a map of `capacity` entries: a group whose
    /// segments `old` holds as they are keeps that group's id; any other takes an id `old` does
    /// not use. Where the new groups' entries would not fit beside the old ones, the ids stay as
    /// compiled (the replaced groups change in place, as they did before renumbering).
    pub fn renumbered(self, old: &Groups, capacity: usize) -> Self {
        let mut new = self.groups();
        // A group no path names a switch of (every destination in it chooses none) has no
        // entries: a fresh id, where it finds none either.
        for d in self.dests.values() {
            new.entry(d.group).or_default();
        }
        let mut ids: BTreeMap<u16, u16> = BTreeMap::new();
        let mut taken: BTreeSet<u16> = BTreeSet::new();
        for (id, segs) in &new {
            if let Some((&same, _)) = old.iter().find(|(o, s)| *s == segs && !taken.contains(*o)) {
                ids.insert(*id, same);
                taken.insert(same);
            }
        }
        let mut fresh = (0..=u16::MAX).filter(|i| !old.contains_key(i) && !taken.contains(i));
        let mut added = 0;
        for (id, segs) in &new {
            if ids.contains_key(id) {
                continue;
            }
            let Some(f) = fresh.next() else {
                return self;
            };
            ids.insert(*id, f);
            added += segs.len();
        }
        let held: usize = old.values().map(BTreeMap::len).sum();
        if held + added > capacity {
            return self;
        }
        Self {
            dests: self
                .dests
                .into_iter()
                .map(|(p, d)| {
                    let group = ids[&d.group];
                    (p, Srv6Dest { group, ..d })
                })
                .collect(),
            segs: self
                .segs
                .into_iter()
                .map(|(k, v)| {
                    let group = ids[&k.group];
                    (SegKey { group, ..k }, v)
                })
                .collect(),
        }
    }
}

impl Srv6Table {
    /// The /96 as the datapath holds it.
    pub fn fabric6_bytes(&self) -> [u8; 12] {
        let mut out = [0; 12];
        if let Some(p) = self.fabric6 {
            out.copy_from_slice(&p.octets()[..12]);
        }
        out
    }

    /// Checks every list against what one address can carry; the error names the prefix.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(p) = self.fabric6
            && p.octets()[12..] != [0; 4]
        {
            return Err(format!(
                "fabric6 {p}/96 has host bits set: the last 32 bits are each host's IPv4 address"
            ));
        }
        for (prefix, paths) in &self.destinations {
            if host_mask(prefix.len) > MAX_HOST_OFFSET {
                return Err(format!(
                    "prefix {prefix}: hosts of a prefix shorter than /19 have offsets past the \
                     local uSIDs (0xE000 + up to 0x1FFF); split it into /19 or longer prefixes"
                ));
            }
            if paths.tail.len() > MAX_TAIL {
                return Err(format!(
                    "prefix {prefix}: {} tail uSIDs, more than the datapath's {MAX_TAIL}",
                    paths.tail.len()
                ));
            }
            for (hops, usids) in &paths.chosen {
                if usids.len() > MAX_CHOSEN {
                    return Err(format!(
                        "prefix {prefix}, path {hops}: {} chosen switches, more than the \
                         datapath's {MAX_CHOSEN}",
                        usids.len()
                    ));
                }
                if usids.len() + paths.tail.len() + 1 > USID_SLOTS {
                    return Err(format!(
                        "prefix {prefix}, path {hops}: {} uSIDs with the tail and the host's, \
                         more than the {USID_SLOTS} one address holds (a segment routing header \
                         is not built)",
                        usids.len() + paths.tail.len() + 1
                    ));
                }
            }
            for u in paths.chosen.values().flatten().chain(&paths.tail) {
                if *u == 0 || *u > MAX_GLOBAL_USID {
                    return Err(format!(
                        "prefix {prefix}: uSID {u:#06x} is not a switch's (1 to {MAX_GLOBAL_USID:#06x}; \
                         0 ends a list, 0xE000 and up are local)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The map entries, destinations grouped.
    pub fn compile(&self) -> Compiled {
        let mut groups: Vec<BTreeMap<Hops, Vec<u16>>> = Vec::new();
        let mut out = Compiled::default();
        for (prefix, paths) in &self.destinations {
            let fits = |g: &BTreeMap<Hops, Vec<u16>>| {
                paths
                    .chosen
                    .iter()
                    .all(|(h, u)| g.get(h).is_none_or(|v| v == u))
            };
            let group = match groups.iter().position(fits) {
                Some(i) => i,
                None => {
                    groups.push(BTreeMap::new());
                    groups.len() - 1
                }
            };
            for (h, u) in &paths.chosen {
                groups[group].insert(*h, u.clone());
            }
            let mut tail = [0u16; MAX_TAIL];
            for (slot, u) in tail.iter_mut().zip(&paths.tail) {
                *slot = *u;
            }
            out.dests.insert(
                *prefix,
                Srv6Dest {
                    group: group as u16,
                    tail_len: paths.tail.len() as u16,
                    tail,
                    host_mask: host_mask(prefix.len),
                },
            );
        }
        for (i, g) in groups.iter().enumerate() {
            for (h, u) in g {
                let mut usids = [0u16; MAX_CHOSEN];
                for (slot, v) in usids.iter_mut().zip(u) {
                    *slot = *v;
                }
                out.segs.insert(
                    SegKey {
                        group: i as u16,
                        hops: [h.hop0, h.hop1],
                    },
                    Segments {
                        len: u.len() as u16,
                        usids,
                    },
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use sopa_common::wire::HOP_NONE;

    use super::*;

    fn hops(hop0: u8, hop1: u8) -> Hops {
        Hops { hop0, hop1 }
    }

    /// (prefix, per hop pair its chosen uSIDs, tail)
    type Dest<'a> = (&'a str, &'a [((u8, u8), &'a [u16])], &'a [u16]);

    fn table(dests: &[Dest]) -> Srv6Table {
        Srv6Table {
            source: "fd00::1".parse().unwrap(),
            receive: "fcbb:bb00:e002::".parse().unwrap(),
            fabric6: None,
            destinations: dests
                .iter()
                .map(|(p, chosen, tail)| {
                    (
                        p.parse().unwrap(),
                        Srv6Paths {
                            chosen: chosen
                                .iter()
                                .map(|((a, b), u)| (hops(*a, *b), u.to_vec()))
                                .collect(),
                            tail: tail.to_vec(),
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn destinations_that_agree_share_a_group_and_those_that_conflict_do_not() {
        let t = table(&[
            (
                "10.1.0.0/24",
                &[((0, HOP_NONE), &[10]), ((1, HOP_NONE), &[11])],
                &[20],
            ),
            (
                "10.2.0.0/24",
                &[((0, 0), &[10, 30]), ((1, 0), &[11, 31])],
                &[40, 21],
            ),
            ("10.3.0.0/24", &[((0, HOP_NONE), &[12])], &[22]),
        ]);
        t.validate().unwrap();
        let c = t.compile();
        let group = |p: &str| c.dests[&p.parse::<Prefix>().unwrap()].group;
        assert_eq!(group("10.1.0.0/24"), 0);
        assert_eq!(group("10.2.0.0/24"), 0, "no hop pair in common: one group");
        assert_eq!(group("10.3.0.0/24"), 1, "(0, none) names another switch");
        assert_eq!(c.segs.len(), 5);
        let s = c.segs[&SegKey {
            group: 0,
            hops: [1, 0],
        }];
        assert_eq!((s.len, s.usids), (2, [11, 31, 0]));
        let d = c.dests[&"10.2.0.0/24".parse::<Prefix>().unwrap()];
        assert_eq!((d.tail_len, d.tail, d.host_mask), (2, [40, 21], 0xFF));
    }

    #[test]
    fn a_replacing_table_keeps_unchanged_groups_and_numbers_changed_ones_afresh() {
        let a = (
            "10.1.0.0/24",
            &[((0, HOP_NONE), &[10][..]), ((1, HOP_NONE), &[11][..])][..],
            &[20][..],
        );
        let b = ("10.3.0.0/24", &[((0, HOP_NONE), &[12][..])][..], &[22][..]);
        let old = table(&[a, b]).compile();
        assert_eq!(old.groups().len(), 2);
        // The same table again: every id kept.
        assert_eq!(
            table(&[a, b]).compile().renumbered(&old.groups(), 1000),
            old
        );
        // The first destination gone: the second's group, 1 before, compiles as 0, the id of
        // the group it replaces. Renumbered, it keeps 1.
        let c = table(&[b]).compile();
        assert_eq!(c.dests.values().next().unwrap().group, 0);
        let r = c.clone().renumbered(&old.groups(), 1000);
        assert_eq!(r.dests.values().next().unwrap().group, 1);
        assert_eq!(r.groups()[&1], old.groups()[&1]);
        // A group whose segments changed takes an id the old table does not use.
        let a2 = (
            "10.1.0.0/24",
            &[((0, HOP_NONE), &[10][..]), ((1, HOP_NONE), &[13][..])][..],
            &[20][..],
        );
        let r = table(&[a2, b]).compile().renumbered(&old.groups(), 1000);
        let group = |c: &Compiled, p: &str| c.dests[&p.parse::<Prefix>().unwrap()].group;
        assert_eq!(group(&r, "10.3.0.0/24"), 1, "unchanged: kept");
        assert_eq!(group(&r, "10.1.0.0/24"), 2, "changed: a fresh id");
        assert_eq!(r.segs.len(), 3);
        // A destination choosing no switch names a group without entries: a fresh id too.
        let bare = table(&[("10.4.0.0/24", &[][..], &[22][..])]).compile();
        assert!(bare.segs.is_empty());
        let r = bare.renumbered(&old.groups(), 1000);
        assert_eq!(group(&r, "10.4.0.0/24"), 2);
        // With no room for the fresh group beside the old ones, the ids stay as compiled.
        let compiled = table(&[a2, b]).compile();
        assert_eq!(compiled.clone().renumbered(&old.groups(), 4), compiled);
    }

    #[test]
    fn lists_one_address_cannot_hold_and_bad_usids_are_refused_by_name() {
        let full = table(&[("10.1.0.0/24", &[((0, 0), &[1, 2, 3])], &[4, 5])]);
        full.validate().expect("six uSIDs fill one address");
        let long = table(&[("10.1.0.0/24", &[((0, 0), &[1, 2, 3, 4])], &[])]);
        let e = long.validate().unwrap_err();
        assert!(e.contains("10.1.0.0/24") && e.contains("4 chosen"), "{e}");
        let tail = table(&[("10.1.0.0/24", &[((0, 0), &[1])], &[4, 5, 6])]);
        assert!(tail.validate().unwrap_err().contains("3 tail uSIDs"));
        let local = table(&[("10.1.0.0/24", &[((0, 0), &[0xE001])], &[])]);
        assert!(local.validate().unwrap_err().contains("0xe001"));
        let wide = table(&[("10.0.0.0/16", &[((0, 0), &[1])], &[])]);
        assert!(wide.validate().unwrap_err().contains("/19"));
    }
}
