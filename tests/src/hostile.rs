//! The hostile corpus (`tests/fixtures/hostile/`): inputs strangers may send, each the size
//! the limits accept, made here so the large ones need not be stored.

/// A stored input of the corpus (`deep.html`, `deep.json`).
pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/fixtures/hostile/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(path).expect("a hostile fixture")
}

/// HTML nested `depth` elements deep, with `deep` as its innermost text.
pub fn deep_html(depth: usize) -> String {
    format!("{}deep{}", "<div>".repeat(depth), "</div>".repeat(depth))
}

/// HTML of `count` links.
pub fn links_html(count: usize) -> String {
    "<a href=\"https://example.com/p\">x</a> ".repeat(count)
}

/// A MIME message to `to` whose HTML part is `html`.
pub fn html_message(to: &str, html: &str) -> Vec<u8> {
    format!(
        "From: Mallory <mallory@attacker.example>\r\nTo: {to}\r\nSubject: Hostile\r\n\
         MIME-Version: 1.0\r\nContent-Type: text/html; charset=utf-8\r\n\r\n{html}\r\n"
    )
    .into_bytes()
}

/// A MIME message to `to` of `count` attachment parts.
pub fn many_parts(to: &str, count: usize) -> Vec<u8> {
    let mut raw = format!(
        "From: mallory@attacker.example\r\nTo: {to}\r\nSubject: Parts\r\nMIME-Version: 1.0\r\n\
         Content-Type: multipart/mixed; boundary=\"b\"\r\n\r\n"
    );
    for i in 0..count {
        raw.push_str(&format!(
            "--b\r\nContent-Type: text/plain\r\n\
             Content-Disposition: attachment; filename=\"f{i}.txt\"\r\n\r\nx\r\n"
        ));
    }
    raw.push_str("--b--\r\n");
    raw.into_bytes()
}

/// A MIME message to `to` with `count` header lines.
pub fn many_headers(to: &str, count: usize) -> Vec<u8> {
    let mut raw: String = (0..count).map(|i| format!("X-H{i}: v\r\n")).collect();
    raw.push_str(&format!(
        "From: mallory@attacker.example\r\nTo: {to}\r\nSubject: Headers\r\n\r\nbody\r\n"
    ));
    raw.into_bytes()
}

/// JSON nested `depth` objects deep.
pub fn deep_json(depth: usize) -> Vec<u8> {
    format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth)).into_bytes()
}

/// A CSV file of `bytes` bytes (about): a header, then rows of one character.
pub fn one_character_rows(bytes: usize) -> Vec<u8> {
    let mut csv = b"email\n".to_vec();
    csv.resize(bytes - bytes % 2, b'a');
    for (i, b) in csv.iter_mut().enumerate().skip(6) {
        if i % 2 == 1 {
            *b = b'\n';
        }
    }
    csv
}
