//! The 5-tuple hash of `ecmp` and `pinned` modes and of the stateless fallback, shared so that
//! userspace (tests, the Hedera collision experiment) can predict the datapath's choice.

use crate::maps::FlowKey;

/// murmur3's 32-bit finalizer: a cheap, well-mixed hash step.
#[inline(always)]
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// A seeded hash of the 5-tuple: the same flow always gets the same value.
#[inline(always)]
pub fn flow_hash(key: &FlowKey, seed: u32) -> u32 {
    let mut h = fmix32(seed ^ key.saddr);
    h = fmix32(h ^ key.daddr);
    h = fmix32(h ^ ((key.sport as u32) << 16 | key.dport as u32));
    fmix32(h ^ key.proto as u32)
}
