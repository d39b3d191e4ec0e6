//! A contact import, as CSV and as a JSON array: rows read up to the cap, each validated.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::contact_import(data));
