//! Template filling: the template, then (after a NUL byte) its variables as JSON.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::templates(data));
