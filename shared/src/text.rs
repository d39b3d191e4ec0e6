//! Text helpers shared by services.

/// `text` cut to at most `limit` bytes at a character boundary; whether it was cut.
pub fn cut_at(mut text: String, limit: usize) -> (String, bool) {
    if text.len() <= limit {
        return (text, false);
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

/// Escapes text for HTML content and attribute values.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The URL a browser reads from an `href` attribute as written in the markup: character
/// references decoded (`&amp;` `&lt;` `&gt;` `&quot;` `&apos;` `&#N;` `&#xH;`), ASCII tabs
/// and line breaks removed (those written as references too, as a URL parser does), C0
/// controls and spaces trimmed. None when it holds another named reference (`&uuml;`), which
/// a browser decodes from a table not kept here. One pass.
pub fn attribute_url(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw.trim_matches(|c: char| c <= ' ');
    while let Some(at) = rest.find(['&', '\t', '\n', '\r']) {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if !rest.starts_with('&') {
            rest = &rest[1..];
            continue;
        }
        match character_reference(rest) {
            Reference::Char(c, used) => {
                if !matches!(c, '\t' | '\n' | '\r') {
                    out.push(c);
                }
                rest = &rest[used..];
            }
            Reference::Unknown => return None,
            Reference::None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    Some(out)
}

/// What an `&` at the start of a text begins.
enum Reference {
    /// A reference to this character, of this length.
    Char(char, usize),
    /// A named reference not decoded here.
    Unknown,
    /// No reference: the `&` stands for itself.
    None,
}

/// What the reference at the start of `s` (`&…;`) stands for.
fn character_reference(s: &str) -> Reference {
    // The longest reference read: `&#x10FFFF;`; named ones run to 32 characters.
    let Some(end) = s.get(..34).unwrap_or(s).find(';') else {
        return Reference::None;
    };
    let name = &s[1..end];
    let c = match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        _ if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric()) => {
            return Reference::Unknown
        }
        _ => {
            let numeric = name.strip_prefix('#').and_then(|digits| {
                let code = match digits.strip_prefix(['x', 'X']) {
                    Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                    None => digits.parse().ok()?,
                };
                char::from_u32(code).filter(|c| *c != '\0')
            });
            match numeric {
                Some(c) => c,
                None => return Reference::None,
            }
        }
    };
    Reference::Char(c, end + 1)
}

/// `count` documents of up to 20 of `pieces` each, the same on every run (xorshift from a
/// fixed seed): the inputs of property tests over parsers and rewriters.
pub fn sample_documents(pieces: &[&str], count: usize) -> Vec<String> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let pick = |n: u64, len: usize| usize::try_from(n % len as u64).unwrap_or(0);
    (0..count)
        .map(|_| {
            let len = pick(next(), 20);
            (0..len)
                .map(|_| pieces[pick(next(), pieces.len())])
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_at_character_boundaries() {
        assert_eq!(cut_at("héllo".into(), 10), ("héllo".into(), false));
        assert_eq!(cut_at("héllo".into(), 2), ("h".into(), true));
        assert_eq!(cut_at("héllo".into(), 3), ("hé".into(), true));
    }

    #[test]
    fn an_href_reads_as_a_browser_reads_it() {
        let url = |raw: &str| attribute_url(raw).unwrap();
        // What `escape_html` writes of a name, and other ways of writing `&`.
        assert_eq!(
            url(" https://x.com/?n=O&#39;Brien&amp;a=1&#38;b=2&#x26;c=&quot;3&quot; "),
            "https://x.com/?n=O'Brien&a=1&b=2&c=\"3\""
        );
        assert_eq!(url("https://x.com/a\r\n/b\tc"), "https://x.com/a/bc");
        // Line breaks and tabs written as references go too; only ASCII space is trimmed.
        assert_eq!(
            url("\u{1}https://x.com/a&#10;b&#9;\u{a0}"),
            "https://x.com/ab\u{a0}"
        );
        // Not a reference: kept as written.
        assert_eq!(
            url("https://x.com/?a=1&b=2&#0;&#xZZ;&x-y;&"),
            "https://x.com/?a=1&b=2&#0;&#xZZ;&x-y;&"
        );
        // A named reference a browser decodes from its table: not read here.
        assert_eq!(attribute_url("https://shop.de/m&uuml;nchen"), None);
        assert_eq!(attribute_url("https://x.com/&copy;"), None);
        // Hostile: a long run of ampersands is read once.
        let long = "&".repeat(100_000);
        assert_eq!(url(&long), long);
    }
}
