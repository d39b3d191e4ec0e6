//! A webhook URL a customer registers: parsed and checked before any lookup; an address it
//! admits is public.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use webhook_dispatcher::target::{admit, is_public};

fuzz_target!(|data: &[u8]| {
    let raw = String::from_utf8_lossy(data);
    if let Ok(url) = admit(&raw, false) {
        assert_eq!(url.scheme(), "https");
        let host = url.host_str().unwrap_or_default();
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            assert!(is_public(ip), "admitted {ip}");
        }
    }
    if let Ok(v6) = <[u8; 16]>::try_from(data) {
        let _ = is_public(IpAddr::from(v6));
    }
});
