//! What an SMTP client sends after DATA and within AUTH: bounded, never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::smtp_input(data));
