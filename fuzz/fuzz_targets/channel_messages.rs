//! The push channel's decoder on both ends: any bytes decoded as an agent message (what the
//! controller reads) and as a controller message (what an agent reads), and whatever decodes
//! applied the way the receiving side applies it. Refusals are fine; panics are not, and a
//! refused delta must leave the view as it was.
#![no_main]

#[path = "../checks/channel_messages.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
