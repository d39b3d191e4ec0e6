//! Received HTML rendered for an inbox webhook: as text, HTML or markdown, quotes stripped
//! or not (the first byte chooses), through the dispatcher's bounded rewrite.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| postmesh_fuzz_bodies::html_render(data));
