//! Destination prefix lookups: none for a destination outside the prefix that covers the
//! fabric's, one exact match where the agent says every prefix of a table has one length
//! (`HostConfig::lookup`), the trie's longest match otherwise. The exact match is one hash
//! of four bytes; the trie walks a node per bit that tells its prefixes apart (about 100 ns
//! more a packet among the 1,152 rack prefixes of a k=48 Fat-Tree, `cargo xtask bench
//! datapath`).

use aya_ebpf::maps::{HashMap, lpm_trie::Key};

use sopa_common::maps::{HostConfig, PathSet, Srv6Dest, lookup};

/// Whether `daddr` is inside the prefix covering every destination of the path table. A mask
/// of 0 covers everything, whatever the network: a fresh datapath. The network and the mask
/// are of one snapshot of the settings (`crate::host_config`), so always of one cover.
#[inline(always)]
pub fn in_fabric(host: &HostConfig, daddr: [u8; 4]) -> bool {
    let mask = host.lookup[lookup::FABRIC_MASK as usize];
    mask == 0 || u32::from_be_bytes(daddr) & mask == host.lookup[lookup::FABRIC as usize]
}

/// The value of the prefix holding `daddr`: from `exact` while `mask` (the table's lookup
/// slot) is set, from `trie` otherwise, and where `exact` lacks the prefix (the agent takes an entry out while it
/// changes, and puts it back after a grace period: the trie holds it meanwhile). The trie's lookup is a function of its own (a BPF subprogram): were both
/// lookups in one body, LLVM would share one call instruction between the two maps, and the
/// verifier, seeing two maps at one call, would neither inline the hash lookup nor call either
/// map's lookup directly (every lookup then goes through the generic helper's indirect call).
#[inline(always)]
pub fn find<V>(
    mask: u32,
    exact: &'static HashMap<[u8; 4], V>,
    trie: impl FnOnce([u8; 4]) -> Option<&'static V>,
    daddr: [u8; 4],
) -> Option<&'static V> {
    if mask == 0 {
        return trie(daddr);
    }
    let network = (u32::from_be_bytes(daddr) & mask).to_be_bytes();
    // SAFETY: a value the agent never writes in place, and frees only after a grace period (so
    // never while this program holds it).
    match unsafe { exact.get(&network) } {
        Some(v) => Some(v),
        None => trie(daddr),
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
