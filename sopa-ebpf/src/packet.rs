//! Bounds-checked packet access and the header fields both programs read.

use core::mem::size_of;

use aya_ebpf::maps::PerCpuArray;
use sopa_common::maps::FlowKey;

/// A pointer to a `T` at `offset` of the packet `[start, end)`, or `None` past the end.
/// The one bounds check of the datapath: the verifier sees it right before every access.
#[inline(always)]
pub fn ptr_at<T>(start: usize, end: usize, offset: usize) -> Option<*mut T> {
    if start + offset + size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// Adds `n` to counter `index` of a per-CPU array (no atomics needed: the slot is this CPU's).
#[inline(always)]
pub fn count(stats: &PerCpuArray<u64>, index: u32, n: u64) {
    if let Some(slot) = stats.get_ptr_mut(index) {
        // SAFETY: the pointer comes from a successful lookup of this CPU's slot.
        unsafe { *slot += n };
    }
}

/// The fields of an IPv4 base header that the programs use, read from raw bytes.
pub struct Ipv4 {
    pub version: u8,
    pub ihl: u8,
    /// DSCP and ECN.
    pub tos: u8,
    pub tot_len: u16,
    /// Flags and fragment offset, host order.
    pub frag: u16,
    pub proto: u8,
    pub saddr: [u8; 4],
    pub daddr: [u8; 4],
}

impl Ipv4 {
    #[inline(always)]
    pub fn parse(h: &[u8; 20]) -> Self {
        Self {
            version: h[0] >> 4,
            ihl: h[0] & 0x0F,
            tos: h[1],
            tot_len: u16::from_be_bytes([h[2], h[3]]),
            frag: u16::from_be_bytes([h[6], h[7]]),
            proto: h[9],
            saddr: [h[12], h[13], h[14], h[15]],
            daddr: [h[16], h[17], h[18], h[19]],
        }
    }

    /// More-fragments set or a non-zero offset.
    #[inline(always)]
    pub fn is_fragment(&self) -> bool {
        self.frag & 0x3FFF != 0
    }

    #[inline(always)]
    pub fn flow_key(&self, ports: &[u8; 4]) -> FlowKey {
        FlowKey {
            saddr: u32::from_ne_bytes(self.saddr),
            daddr: u32::from_ne_bytes(self.daddr),
            sport: u16::from_ne_bytes([ports[0], ports[1]]),
            dport: u16::from_ne_bytes([ports[2], ports[3]]),
            proto: self.proto,
            _pad: [0; 3],
        }
    }
}

/// The fields of an IPv6 fixed header the programs use.
pub struct Ipv6 {
    pub version: u8,
    pub tclass: u8,
    pub payload_len: u16,
    pub next: u8,
}

impl Ipv6 {
    #[inline(always)]
    pub fn parse(h: &[u8; 40]) -> Self {
        Self {
            version: h[0] >> 4,
            tclass: (h[0] << 4) | (h[1] >> 4),
            payload_len: u16::from_be_bytes([h[4], h[5]]),
            next: h[6],
        }
    }
}

pub use sopa_common::hash::flow_hash;
