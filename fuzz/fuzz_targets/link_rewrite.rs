//! UTM link rewriting of a message's HTML: one pass, and idempotent.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::link_rewrite(data));
