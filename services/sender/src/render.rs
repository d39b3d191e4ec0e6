//! Filling a message: `{{name}}` placeholders from the request's variables (HTML-escaped in
//! the HTML body), and `utm_*` parameters appended to the links of the HTML body.

use serde_json::{Map, Value};

use postmesh_shared::text::escape_html;
use postmesh_shared::ApiError;

/// Whether `name` can be a placeholder's name.
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// A variable's value as text; only strings, numbers and booleans fill a placeholder.
fn value_text(name: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::BadRequest(format!(
            "variable {name:?} must be a string, number or boolean"
        ))),
    }
}

/// The placeholder of a recipient's unsubscribe link, filled per message by the worker.
pub const UNSUBSCRIBE_URL: &str = "unsubscribe_url";

/// Replaces each `{{ name }}` of `template` with its variable (escaped when `html`). A
/// placeholder without a variable is a 400 naming it, except `{{unsubscribe_url}}`, kept
/// for the worker; text that is not a placeholder (a lone `{{`, `{{#if}}`) stays as it is.
pub fn fill(template: &str, vars: &Map<String, Value>, html: bool) -> Result<String, ApiError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some((start, end, inner)) = next_placeholder(rest) {
        out.push_str(&rest[..start]);
        let (whole, name) = (&rest[start..end], inner.trim());
        if name == UNSUBSCRIBE_URL && !vars.contains_key(name) {
            // Each recipient's own link, put in when its message is built.
            out.push_str(whole);
        } else if is_name(name) {
            let value = vars.get(name).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "missing variable {name:?} (used as {{{{{name}}}}})"
                ))
            })?;
            let text = value_text(name, value)?;
            out.push_str(&if html { escape_html(&text) } else { text });
        } else {
            out.push_str(whole);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The next `{{ … }}` of `s`: where it starts and ends, and what it holds. A `{{` that
/// another `{{` follows before the `}}` is text (`a {{ b {{name}}`: the placeholder is the
/// second).
fn next_placeholder(s: &str) -> Option<(usize, usize, &str)> {
    let open = s.find("{{")?;
    let close = open + 2 + s[open + 2..].find("}}")?;
    let start = s[open + 2..close]
        .rfind("{{")
        .map_or(open, |inner| open + 2 + inner);
    Some((start, close + 2, &s[start + 2..close]))
}

/// `template` with each `{{unsubscribe_url}}` replaced by `link` (escaped when `html`;
/// empty for mail that has none).
pub fn put_unsubscribe<'a>(
    template: &'a str, link: Option<&str>, html: bool,
) -> std::borrow::Cow<'a, str> {
    if !template.contains("{{") {
        return template.into();
    }
    let link = link.unwrap_or_default();
    let link = if html {
        escape_html(link)
    } else {
        link.to_owned()
    };
    let mut out = String::with_capacity(template.len() + link.len());
    let mut rest = template;
    while let Some((start, end, inner)) = next_placeholder(rest) {
        out.push_str(&rest[..start]);
        if inner.trim() == UNSUBSCRIBE_URL {
            out.push_str(&link);
        } else {
            out.push_str(&rest[start..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out.into()
}

/// Appends `params` to every `http(s)` link (`href="..."` or `href='...'`) of `html`,
/// leaving a parameter the link already has alone.
pub fn add_utm(html: &str, params: &[(String, String)]) -> String {
    if params.is_empty() {
        return html.to_owned();
    }
    let mut out = String::with_capacity(html.len() + 64);
    let mut rest = html;
    while let Some(at) = find_href(rest) {
        let quote_at = at + 5;
        let quote = rest.as_bytes()[quote_at] as char;
        out.push_str(&rest[..=quote_at]);
        rest = &rest[quote_at + 1..];
        let Some(end) = rest.find(quote) else { break };
        let link = &rest[..end];
        out.push_str(&with_params(link, params));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The next `href=` followed by a quote, case-insensitively.
fn find_href(s: &str) -> Option<usize> {
    let lower = s.to_ascii_lowercase();
    let mut from = 0;
    while let Some(i) = lower[from..].find("href=") {
        let at = from + i;
        if matches!(s.as_bytes().get(at + 5), Some(b'"' | b'\'')) {
            return Some(at);
        }
        from = at + 5;
    }
    None
}

fn with_params(link: &str, params: &[(String, String)]) -> String {
    let lower = link.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return link.to_owned();
    }
    let (base, fragment) = match link.find('#') {
        Some(i) => (&link[..i], &link[i..]),
        None => (link, ""),
    };
    let decoded = base.replace("&amp;", "&");
    let existing: Vec<&str> = decoded
        .split_once('?')
        .map(|(_, q)| {
            q.split(['&', ';'])
                .filter_map(|p| p.split('=').next())
                .collect()
        })
        .unwrap_or_default();
    let added: Vec<(&str, &str)> = params
        .iter()
        .filter(|(k, _)| !existing.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if added.is_empty() {
        return link.to_owned();
    }
    let query = serde_urlencoded::to_string(&added).unwrap_or_default();
    // Inside an HTML attribute `&` is written `&amp;`.
    let query = query.replace('&', "&amp;");
    let sep = if !base.contains('?') {
        "?"
    } else if base.ends_with('?') || base.ends_with('&') {
        ""
    } else {
        "&amp;"
    };
    format!("{base}{sep}{query}{fragment}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn placeholders_are_filled_and_escaped_in_html() {
        let v = vars(serde_json::json!({"name": "<Ann & Bo>", "n": 3, "ok": true}));
        assert_eq!(
            fill("Hi {{name}}, {{ n }} {{ok}}", &v, false).unwrap(),
            "Hi <Ann & Bo>, 3 true"
        );
        assert_eq!(
            fill("<p>{{name}}</p>", &v, true).unwrap(),
            "<p>&lt;Ann &amp; Bo&gt;</p>"
        );
        assert_eq!(
            fill("{{#if x}} {{ unclosed", &v, false).unwrap(),
            "{{#if x}} {{ unclosed"
        );
        // A stray `{{` is text, and the placeholder after it is filled.
        assert_eq!(
            fill("a {{ b {{name}} {{{n}}}", &v, false).unwrap(),
            "a {{ b <Ann & Bo> {{{n}}}"
        );
        assert_eq!(
            fill("{{ {{unsubscribe_url}}", &v, true).unwrap(),
            "{{ {{unsubscribe_url}}"
        );
        assert_eq!(
            put_unsubscribe(
                "x {{ y {{ unsubscribe_url }} {{z}}",
                Some("https://u/?a&b"),
                true
            ),
            "x {{ y https://u/?a&amp;b {{z}}"
        );
        let err = fill("Hi {{ missing }}", &v, false).unwrap_err().to_string();
        assert!(err.contains("\"missing\""), "{err}");
        let err = fill("{{o}}", &vars(serde_json::json!({"o": {}})), false).unwrap_err();
        assert!(err.to_string().contains("string, number or boolean"));
    }

    #[test]
    fn utm_parameters_join_http_links_only() {
        let p = vec![
            ("utm_source".to_owned(), "news letter".to_owned()),
            ("utm_medium".to_owned(), "email".to_owned()),
        ];
        let html = r##"<a href="https://x.com/a">a</a> <A HREF='http://x.com/b?utm_source=keep#top'>b</A> <a href="mailto:q@x.com">m</a> <a href="#in">i</a>"##;
        assert_eq!(
            add_utm(html, &p),
            r##"<a href="https://x.com/a?utm_source=news+letter&amp;utm_medium=email">a</a> <A HREF='http://x.com/b?utm_source=keep&amp;utm_medium=email#top'>b</A> <a href="mailto:q@x.com">m</a> <a href="#in">i</a>"##
        );
        assert_eq!(add_utm(html, &[]), html);
    }
}
