//! Types shared by the SOPA eBPF programs and userspace: the wire formats of the three path
//! encodings (the IPv4 option, SRv6, entropy) and the layout of every map. `#![no_std]`; the `user` feature adds `aya::Pod` impls.
#![no_std]

pub mod entropy;
pub mod hash;
pub mod maps;
pub mod srv6;
pub mod wire;
