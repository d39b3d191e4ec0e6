//! Received HTML rendered for an inbox webhook: as text, HTML or markdown, quotes stripped
//! or not (the first byte chooses), through the dispatcher's bounded rewrite.
#![no_main]

use libfuzzer_sys::fuzz_target;
use webhook_dispatcher::content::quotes::BodyFormat;
use webhook_dispatcher::content::quotes::render;

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let format = match choice % 3 {
        0 => BodyFormat::Text,
        1 => BodyFormat::Html,
        _ => BodyFormat::Markdown,
    };
    let strip = choice & 4 != 0;
    let input = String::from_utf8_lossy(rest);
    let _ = render(None, Some(&input), format, strip);
    let _ = render(Some(&input), None, format, strip);
});
