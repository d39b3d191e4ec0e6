//! Quote stripping of received text and HTML: never panics, never longer than its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use webhook_dispatcher::content::quotes::{strip_html, strip_text};

fuzz_target!(|data: &[u8]| {
    let input = String::from_utf8_lossy(data);
    let (text, _) = strip_text(&input);
    assert!(text.len() <= input.len(), "stripped text grew");
    let _ = strip_html(&input);
});
