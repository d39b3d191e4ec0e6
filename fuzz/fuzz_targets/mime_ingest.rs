//! A received message as the MTA posts it: read by mail-parser within the ingest's bounds.
#![no_main]

use inbound_ingest::mime::{base_subject, Parsed};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &[u8]| {
    let parsed = Parsed::of(raw);
    assert!(parsed.attachments.len() <= 100, "attachments are capped");
    assert!(parsed.references.len() <= 100, "references are capped");
    let _ = base_subject(&String::from_utf8_lossy(raw));
});
