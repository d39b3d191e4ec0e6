//! An audience's include and exclude conditions, as a request gives them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sender::audience::audiences::{Audience, AudienceBody};

fuzz_target!(|data: &[u8]| {
    if let Ok(body) = serde_json::from_slice::<AudienceBody>(data) {
        let _ = Audience::parse(&body, false);
        let _ = Audience::parse(&body, true);
    }
});
