//! Tracked links and the pixel in a message's HTML, and tokens as the gateway reads them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::tracking(data));
