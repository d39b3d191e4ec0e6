//! A webhook URL a customer registers: parsed and checked before any lookup; an address it
//! admits is public.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::webhook_url(data));
