//! UTM link rewriting of a message's HTML: one pass, and idempotent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sender::sending::render::add_utm;

fuzz_target!(|data: &[u8]| {
    let html = String::from_utf8_lossy(data);
    let params = vec![
        ("utm_source".to_owned(), "postmesh".to_owned()),
        ("utm_campaign".to_owned(), "fuzz & more".to_owned()),
    ];
    let once = add_utm(&html, &params);
    let twice = add_utm(&once, &params);
    assert_eq!(once, twice, "rewriting twice changed the document");
});
