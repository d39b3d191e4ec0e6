//! A received message as the MTA posts it: read by mail-parser within the ingest's bounds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::mime_ingest(data));
