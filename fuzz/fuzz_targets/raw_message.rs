//! A message an SMTP client sends, as /send-raw reads it: its private fields go, once.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::raw_message(data));
