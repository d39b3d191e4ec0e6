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
}
