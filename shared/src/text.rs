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
