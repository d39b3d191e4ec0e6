//! Filling a message: `{{name}}` placeholders from the request's variables (HTML-escaped in
//! the HTML body), and `utm_*` parameters appended to the links of the HTML body.

use std::borrow::Cow;

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

/// The most bytes a body may fill to: as much as a send's whole request may carry. Each
/// placeholder may repeat a variable, so the filled size is their product, not their sum.
pub const MAX_FILLED_BYTES: usize = 16 * 1024 * 1024;

/// Replaces each `{{ name }}` of `template` with its variable (escaped when `html`). A
/// placeholder without a variable is a 400 naming it, except `{{unsubscribe_url}}`, kept
/// for the worker; text that is not a placeholder (a lone `{{`, `{{#if}}`) stays as it is.
/// A body that would fill past [`MAX_FILLED_BYTES`] is a 400, found before it is made.
pub fn fill(template: &str, vars: &Map<String, Value>, html: bool) -> Result<String, ApiError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some((start, end, inner)) = next_placeholder(rest) {
        if out.len() > MAX_FILLED_BYTES {
            return Err(filled_too_large());
        }
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
    if out.len() > MAX_FILLED_BYTES {
        return Err(filled_too_large());
    }
    Ok(out)
}

fn filled_too_large() -> ApiError {
    ApiError::BadRequest(format!(
        "the body filled with its variables is larger than {} MiB",
        MAX_FILLED_BYTES >> 20
    ))
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

/// Appends `params` to every `http(s)` link (`<a href>`, `<area href>`) of `html`, leaving a
/// parameter the link already has alone: one streaming pass (lol_html), so the time grows
/// with the document, never with links × document.
pub fn add_utm(html: &str, params: &[(String, String)]) -> String {
    if params.is_empty() {
        return html.to_owned();
    }
    let tags = Tags::new(params);
    // Malformed markup may come out of the rewriter serialized so that it parses another
    // way (found by fuzzing): a document whose rewrite would change again is sent as
    // written, so tagging stays idempotent. Untouched markup passes through byte for byte,
    // so a second rewrite changes something exactly when it finds a link to tag; it is
    // only needed when a tag the pass rewrote may not parse back the same.
    let (once, plain) = tags.rewrite(html);
    if once != html && !plain && tags.would_tag(&once) {
        return html.to_owned();
    }
    once
}

/// Whether a start tag whose attributes have these names, written again as the rewriter
/// writes a changed tag (each attribute after one space, unchanged ones byte for byte, the
/// changed value in double quotes), parses into the same attributes: true for the names of
/// well-formed HTML, false for any name a tokenizer may have cut out of stray `=`, `/`,
/// quotes or `<`.
fn plain_names<'n>(mut names: impl Iterator<Item = &'n str>) -> bool {
    names.all(|n| {
        n.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'.'))
    })
}

/// The link selector [`add_utm`] rewrites.
const LINKS: &str = "a[href], area[href]";

/// The parameters to add, and their query string when a link has none of them (most links).
struct Tags<'a> {
    params: &'a [(String, String)],
    all: String,
}

impl<'a> Tags<'a> {
    fn new(params: &'a [(String, String)]) -> Self {
        Self {
            params,
            all: query(params.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        }
    }

    /// One rewriting pass, and whether every tag it changed has only [`plain_names`].
    fn rewrite(&self, html: &str) -> (String, bool) {
        let plain = std::cell::Cell::new(true);
        let settings = lol_html::RewriteStrSettings {
            element_content_handlers: vec![lol_html::element!(LINKS, |el| {
                if let Some(tagged) = el.get_attribute("href").and_then(|l| self.tag(&l)) {
                    if plain.get() {
                        let names: Vec<String> = el
                            .attributes()
                            .iter()
                            .map(|a| a.name_preserve_case())
                            .collect();
                        plain.set(plain_names(names.iter().map(String::as_str)));
                    }
                    el.set_attribute("href", &tagged)?;
                }
                Ok(())
            })],
            // Markup a browser would parse two ways is rewritten as the parser sees it, not
            // refused.
            strict: false,
            ..lol_html::RewriteStrSettings::new()
        };
        // Only a handler can fail a rewrite, and ours only on a bad attribute name.
        let once = lol_html::rewrite_str(html, settings).unwrap_or_else(|_| html.to_owned());
        (once, plain.get())
    }

    /// Whether a pass over `html` would tag a link: the same parse, its output dropped.
    fn would_tag(&self, html: &str) -> bool {
        let found = std::cell::Cell::new(false);
        let settings = lol_html::Settings {
            element_content_handlers: vec![lol_html::element!(LINKS, |el| {
                if !found.get()
                    && el
                        .get_attribute("href")
                        .and_then(|l| self.tag(&l))
                        .is_some()
                {
                    found.set(true);
                }
                Ok(())
            })],
            strict: false,
            ..lol_html::Settings::new()
        };
        let mut rewriter = lol_html::HtmlRewriter::new(settings, |_: &[u8]| {});
        // A failed pass changes nothing, as in `rewrite`.
        let ran = rewriter
            .write(html.as_bytes())
            .and_then(|()| rewriter.end());
        ran.is_ok() && found.get()
    }

    /// `link` with the parameters it lacks, or None when it is not `http(s)` or has them all.
    fn tag(&self, link: &str) -> Option<String> {
        // White space around the link is no part of it (as tracking reads it).
        let link = link.trim();
        let http = |scheme: &str| {
            link.get(..scheme.len())
                .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
        };
        if !(http("http://") || http("https://")) {
            return None;
        }
        let (base, fragment) = match link.find('#') {
            Some(i) => (&link[..i], &link[i..]),
            None => (link, ""),
        };
        let decoded: Cow<'_, str> = if base.contains("&amp;") {
            Cow::Owned(base.replace("&amp;", "&"))
        } else {
            Cow::Borrowed(base)
        };
        // A second `?` inside the query (`?a?utm_source=x`) separates names too, as the
        // parameters this adds after such a query must be found again.
        let existing: Vec<&str> = decoded
            .split_once('?')
            .map(|(_, q)| {
                q.split(['&', ';', '?'])
                    .filter_map(|p| p.split('=').next())
                    .collect()
            })
            .unwrap_or_default();
        let lacking = |(k, _): &&(String, String)| !existing.contains(&k.as_str());
        let missing = self.params.iter().filter(lacking).count();
        let added: Cow<'_, str> = match missing {
            0 => return None,
            n if n == self.params.len() => Cow::Borrowed(&self.all),
            _ => Cow::Owned(query(
                self.params
                    .iter()
                    .filter(lacking)
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            )),
        };
        let sep = if !base.contains('?') {
            "?"
        } else if base.ends_with('?') || base.ends_with('&') {
            ""
        } else {
            "&amp;"
        };
        Some(format!("{base}{sep}{added}{fragment}"))
    }
}

/// `pairs` URL-encoded as a query, `&` written `&amp;` as inside an HTML attribute.
fn query<'p>(pairs: impl Iterator<Item = (&'p str, &'p str)>) -> String {
    let pairs: Vec<_> = pairs.collect();
    serde_urlencoded::to_string(&pairs)
        .unwrap_or_default()
        .replace('&', "&amp;")
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
    fn a_body_filling_past_its_bound_is_refused_before_it_is_made() {
        let template = "{{a}}".repeat(300);
        let vars: Map<String, Value> = [("a".to_owned(), Value::String("&".repeat(64 * 1024)))]
            .into_iter()
            .collect();
        let err = fill(&template, &vars, true).unwrap_err();
        assert!(err.to_string().contains("larger than 16 MiB"), "{err}");
        let small: Map<String, Value> = [("a".to_owned(), Value::String("x".into()))]
            .into_iter()
            .collect();
        assert_eq!(fill(&template, &small, true).unwrap().len(), 300);
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
            r##"<a href="https://x.com/a?utm_source=news+letter&amp;utm_medium=email">a</a> <A HREF="http://x.com/b?utm_source=keep&amp;utm_medium=email#top">b</A> <a href="mailto:q@x.com">m</a> <a href="#in">i</a>"##
        );
        assert_eq!(add_utm(html, &[]), html);
    }

    /// Documents made of link tags, text, entities, comments and scripts.
    fn documents(count: usize) -> Vec<String> {
        const PIECES: &[&str] = &[
            r#"<a href="https://x.com/p">"#,
            r#"<a class="b" href="http://x.com/?q=1&amp;r=2#f">"#,
            r#"<a href="https://x.com/?utm_source=own">"#,
            r#"<a href="mailto:a@x.com">"#,
            r#"<area href="https://x.com/m">"#,
            "</a>",
            "text & more ",
            "&lt;a href=\"https://x.com/t\"&gt;",
            "<!-- <a href=\"https://x.com/c\"> -->",
            "<script>var s = '<a href=\"https://x.com/s\">';</script>",
            "<p>",
            "</p>",
            "<link href=\"https://x.com/style.css\">",
            "é ✓ ",
        ];
        postmesh_shared::text::sample_documents(PIECES, count)
    }

    /// The document with every link tag's attributes left out.
    fn outside_links(html: &str) -> String {
        let mut out = String::new();
        let mut rest = html;
        while let Some(at) = rest.find("<a").or_else(|| rest.find("<area")) {
            let at = [rest.find("<a "), rest.find("<area ")]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(at);
            out.push_str(&rest[..at]);
            let end = rest[at..].find('>').map_or(rest.len(), |e| at + e + 1);
            out.push_str("<link-tag>");
            rest = &rest[end..];
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn utm_rewriting_is_idempotent_and_leaves_the_rest_alone() {
        let p = vec![("utm_source".to_owned(), "news".to_owned())];
        for doc in documents(500) {
            let once = add_utm(&doc, &p);
            assert_eq!(add_utm(&once, &p), once, "not idempotent on {doc}");
            assert_eq!(
                outside_links(&once),
                outside_links(&doc),
                "changed outside links: {doc}"
            );
            let links = doc.matches("<a href=\"https://x.com/p\">").count();
            assert_eq!(
                once.matches("https://x.com/p?utm_source=news").count(),
                links,
                "{doc}"
            );
        }
    }

    /// Link tags whose attributes a tokenizer cuts in odd places: a rewrite that writes such
    /// a tag again must still be its own fixed point.
    #[test]
    fn utm_rewriting_is_idempotent_on_odd_attributes() {
        const PIECES: &[&str] = &[
            r#"<a href="https://x.com/p">"#,
            r#"<a e/=x href="https://x.com/q">"#,
            r#"<a href='https://x.com/"q'>"#,
            "<a/href=https://x.com/u>",
            r#"<a href=https://x.com/v title=a"b>"#,
            r#"<a href="https://x.com/w"title="t">"#,
            r#"<a ="x" href="https://x.com/e">"#,
            r#"<a href="https://x.com/s" "y>"#,
            r#"<area href="https://x.com/m" / >"#,
            r#"<a href="https://x.com/<q>>""#,
            r#"e/="fahttps:/?aref~"#,
            "<f=<p>",
            "<a tps:/",
            "<a href=\"",
            "=\"",
            "\" ",
            "</a>",
            "<p>",
            " ",
        ];
        let p = vec![("utm_source".to_owned(), "news".to_owned())];
        for doc in postmesh_shared::text::sample_documents(PIECES, 2_000) {
            let once = add_utm(&doc, &p);
            assert_eq!(add_utm(&once, &p), once, "not idempotent on {doc}");
        }
    }

    /// Found by the `link_rewrite` fuzz target: a query holding a second `?`.
    #[test]
    fn utm_rewriting_is_idempotent_after_a_second_question_mark() {
        let p = vec![
            ("utm_source".to_owned(), "news".to_owned()),
            ("utm_campaign".to_owned(), "fall".to_owned()),
        ];
        for link in [
            "https://ex?aref?",
            "https://ex?a?b=1",
            "https://ex?a=1?utm_source=x",
        ] {
            let doc = format!("<a href=\"{link}\">x</a>");
            let once = add_utm(&doc, &p);
            assert_eq!(add_utm(&once, &p), once, "not idempotent on {doc}");
        }
    }

    #[test]
    fn utm_rewriting_is_idempotent_on_markup_the_rewriter_reserializes() {
        let p = [("utm_source".to_owned(), "postmesh".to_owned())];
        let doc = "~<f=<p><a href=\"https://xm<q>>\"e/=\"fahttps:/\u{1c7}?aref~<f=<p><a \
                   href=\"ht<f=<p><a href=\"https://xm<q>>\"e/=\"fahttps:/\u{1c7}?aref~<f=<p><a tps:/";
        let once = add_utm(doc, &p);
        assert_eq!(add_utm(&once, &p), once);
    }

    #[test]
    fn utm_rewriting_is_linear_in_the_links() {
        // 200,000 links: one pass, where a rescan of the rest per link would never end.
        let html = "<a href=\"https://x.com/p\">x</a> ".repeat(200_000);
        let p = vec![("utm_source".to_owned(), "news".to_owned())];
        let out = add_utm(&html, &p);
        assert_eq!(out.matches("?utm_source=news").count(), 200_000);
    }
}
