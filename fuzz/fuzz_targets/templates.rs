//! Template filling: the template, then (after a NUL byte) its variables as JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sender::sending::render::fill;

fuzz_target!(|data: &[u8]| {
    let (template, vars) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b"{}"[..]),
    };
    let template = String::from_utf8_lossy(template);
    let vars = serde_json::from_slice(vars).unwrap_or_default();
    let _ = fill(&template, &vars, true);
    let _ = fill(&template, &vars, false);
});
