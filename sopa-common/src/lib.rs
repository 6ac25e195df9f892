//! Types shared by the SOPA eBPF programs and userspace: the wire format of the source-route
//! option and the layout of every map. `#![no_std]`; the `user` feature adds `aya::Pod` impls.
#![no_std]

pub mod hash;
pub mod maps;
pub mod wire;
