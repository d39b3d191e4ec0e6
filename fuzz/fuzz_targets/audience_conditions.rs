//! An audience's include and exclude conditions, as a request gives them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::audience_conditions(data));
