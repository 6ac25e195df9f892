//! Destination prefix lookups: none for a destination outside the prefix that covers the
//! fabric's, one exact match where the agent says every prefix of a table has one length
//! (`LOOKUP`), the trie's longest match otherwise. The exact match is one hash
//! of four bytes; the trie walks a node per bit that tells its prefixes apart (about 100 ns
//! more a packet among the 1,152 rack prefixes of a k=48 Fat-Tree, `cargo xtask bench
//! datapath`).

use aya_ebpf::maps::{HashMap, lpm_trie::Key};

use sopa_common::maps::{PathSet, Srv6Dest, lookup};

use crate::LOOKUP;

/// Whether `daddr` is inside the prefix covering every destination of the path table. A mask
/// of 0 covers everything, whatever the network slot says: a fresh datapath, and the agent
/// while it changes the cover (mask 0, the network, the new mask; the two slots cannot change
/// at once). The mask is read before and after the network: read between two of the agent's
/// writes, the network and a mask would be of two covers; through one change, the same nonzero
/// mask both times means the network read between them is that mask's (a network written after
/// the first read was followed by its own mask before the second), and two different masks mean
/// the cover changed meanwhile, which is taken as covering everything too. Two changes within
/// one run of the program (it stalled through a whole table's writes), or a CPU that reorders
/// loads (arm64: no barrier here), could still pair two covers: one packet left unstamped,
/// never dropped.
#[inline(always)]
pub fn in_fabric(daddr: [u8; 4]) -> bool {
    let mask = || {
        LOOKUP
            .get_ptr(lookup::FABRIC_MASK)
            // SAFETY: a pointer from a successful lookup of an array, valid for this run.
            .map(|m| unsafe { core::ptr::read_volatile(m) })
    };
    let before = mask();
    let network = LOOKUP
        .get_ptr(lookup::FABRIC)
        // SAFETY: as above.
        .map(|n| unsafe { core::ptr::read_volatile(n) });
    match (before, network, mask()) {
        (Some(m), Some(network), Some(after)) if m == after => {
            m == 0 || u32::from_be_bytes(daddr) & m == network
        }
        _ => true,
    }
}

/// The value of the prefix holding `daddr`: from `exact` while the mask in `slot` is set, from
/// `trie` otherwise, and where `exact` lacks the prefix (the agent takes an entry out while it
/// changes, and puts it back after a grace period: the trie holds it meanwhile). The trie's lookup is a function of its own (a BPF subprogram): were both
/// lookups in one body, LLVM would share one call instruction between the two maps, and the
/// verifier, seeing two maps at one call, would neither inline the hash lookup nor call either
/// map's lookup directly (every lookup then goes through the generic helper's indirect call).
#[inline(always)]
pub fn find<V>(
    slot: u32,
    exact: &'static HashMap<[u8; 4], V>,
    trie: impl FnOnce([u8; 4]) -> Option<&'static V>,
    daddr: [u8; 4],
) -> Option<&'static V> {
    match LOOKUP.get(slot) {
        Some(&mask) if mask != 0 => {
            let network = (u32::from_be_bytes(daddr) & mask).to_be_bytes();
            // SAFETY: a value the agent never writes in place, and frees only after a grace
            // period (so never while this program holds it).
            match unsafe { exact.get(&network) } {
                Some(v) => Some(v),
                None => trie(daddr),
            }
        }
        _ => trie(daddr),
    }
}

/// The path set of the longest prefix holding `daddr`.
#[inline(never)]
pub fn paths_trie(daddr: [u8; 4]) -> Option<&'static PathSet> {
    crate::PATHS.get(Key::new(32, daddr))
}

/// The SRv6 destination of the longest prefix holding `daddr`.
#[inline(never)]
pub fn srv6_dests_trie(daddr: [u8; 4]) -> Option<&'static Srv6Dest> {
    crate::SRV6_DESTS.get(Key::new(32, daddr))
}
