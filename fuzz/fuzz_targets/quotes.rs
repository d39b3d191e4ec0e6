//! Quote stripping of received text and HTML: never panics, never longer than its input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::quotes(data));
