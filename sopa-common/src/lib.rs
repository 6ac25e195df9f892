//! Types shared by the SOPA eBPF programs and userspace: the wire formats of the two path
//! encodings (the IPv4 option, SRv6) and the layout of every map. `#![no_std]`; the `user` feature adds `aya::Pod` impls.
#![no_std]

pub mod hash;
pub mod maps;
pub mod srv6;
pub mod wire;
