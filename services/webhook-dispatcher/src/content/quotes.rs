//! A message's body as an endpoint asks for it (`bodyFormat`): its text, its HTML, or
//! Markdown converted from the HTML (htmd), one rendered from the other when the message has
//! only one; with `stripQuotes`, without the quoted replies the big mail clients add — `>`
//! blocks, "On … wrote:" and Outlook's "From: … Sent: …" headers with what follows, and in
//! HTML Gmail's `gmail_quote`, Apple Mail's `blockquote type=cite` and Outlook's
//! `divRplyFwdMsg` containers.

use std::io::Write as _;

use html5ever::serialize::{SerializeOpts, TraversalScope};
use html5ever::tendril::TendrilSink;
use markup5ever_rcdom::{Handle, NodeData, RcDom, SerializableHandle};

use postmesh_shared::text::escape_html;

use serde::{Deserialize, Serialize};

use crate::content::bounded;

/// How a delivery carries the message's body.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
#[schema(as = WebhookBodyFormat)]
pub enum BodyFormat {
    #[default]
    Text,
    Html,
    Markdown,
}

/// A body rendered for an endpoint.
#[derive(Debug, PartialEq, Eq)]
pub struct Rendered {
    pub body: String,
    /// Whether quoted text was removed.
    pub stripped_quotes: bool,
}

/// The width plain text rendered from HTML is wrapped at.
const TEXT_WIDTH: usize = 78;

/// Renders a message's `text` and `html` parts as `format`, without quotes when `strip`.
pub fn render(text: Option<&str>, html: Option<&str>, format: BodyFormat, strip: bool) -> Rendered {
    let use_html = match format {
        BodyFormat::Text => text.is_none() && html.is_some(),
        BodyFormat::Html | BodyFormat::Markdown => html.is_some(),
    };
    if use_html {
        let html = html.unwrap_or_default();
        if matches!(format, BodyFormat::Html) && !strip {
            return Rendered {
                body: html.to_owned(),
                stripped_quotes: false,
            };
        }
        // Parsed only within bounds: a sender's markup never costs more than linear time
        // or a bounded stack in the parser and the converters.
        let safe = bounded::bound(html);
        if safe.flattened > 0 {
            tracing::warn!(
                flattened = safe.flattened,
                "a received HTML body nests too deeply; its inner tags are flattened"
            );
        }
        let stripped = if strip { strip_html(&safe.html) } else { None };
        let stripped_quotes = stripped.is_some();
        let body = match (format, stripped) {
            (BodyFormat::Html, None) => html.to_owned(),
            (BodyFormat::Html, Some(out)) => out,
            (BodyFormat::Text, out) => html_to_text(out.as_deref().unwrap_or(&safe.html)),
            (BodyFormat::Markdown, out) => html_to_markdown(out.as_deref().unwrap_or(&safe.html)),
        };
        return Rendered {
            body,
            stripped_quotes,
        };
    }
    // Mail's CRLF line ends, as JSON readers expect them.
    let text = text.unwrap_or_default().replace("\r\n", "\n");
    let (text, stripped_quotes) = if strip {
        strip_text(&text)
    } else {
        (text, false)
    };
    let body = match format {
        BodyFormat::Html => format!("<pre>{}</pre>", escape_html(&text)),
        BodyFormat::Text | BodyFormat::Markdown => text,
    };
    Rendered {
        body,
        stripped_quotes,
    }
}

/// HTML as plain text.
fn html_to_text(html: &str) -> String {
    // Deep lists and quotes indent past the width: wider lines, never an empty body.
    html2text::config::plain()
        .allow_width_overflow()
        .string_from_read(html.as_bytes(), TEXT_WIDTH)
        .unwrap_or_default()
        .trim_end()
        .to_owned()
}

/// HTML as Markdown: links, lists, emphasis and tables kept.
fn html_to_markdown(html: &str) -> String {
    htmd::HtmlToMarkdown::builder()
        .skip_tags(vec!["head", "script", "style"])
        .build()
        .convert(html)
        .unwrap_or_default()
}

/// Plain text without its quoted reply: from an attribution line ("On … wrote:", Outlook's
/// "From:" header followed by "Sent:", "-----Original Message-----") on, and every `>` line.
pub fn strip_text(text: &str) -> (String, bool) {
    let lines: Vec<&str> = text.lines().collect();
    let cut = (0..lines.len())
        .find(|&i| starts_quote(&lines[i..]))
        .unwrap_or(lines.len());
    let mut kept: Vec<&str> = lines[..cut]
        .iter()
        .copied()
        .filter(|l| !l.trim_start().starts_with('>'))
        .collect();
    if kept.len() == lines.len() {
        return (text.to_owned(), false);
    }
    // The rule Outlook draws above its header, and blank lines.
    while kept
        .last()
        .is_some_and(|l| is_rule(l) || l.trim().is_empty())
    {
        kept.pop();
    }
    (kept.join("\n"), true)
}

/// A line drawn of underscores or dashes.
fn is_rule(line: &str) -> bool {
    let line = line.trim();
    line.len() >= 5 && line.chars().all(|c| c == '_' || c == '-')
}

/// Whether the first of `lines` starts a quoted reply's attribution.
fn starts_quote(lines: &[&str]) -> bool {
    let line = lines[0].trim();
    let next = lines.get(1).map(|l| l.trim()).unwrap_or_default();
    if line.starts_with("-----Original Message-----") {
        return true;
    }
    // "On Mon, 23 Nov 2026 at 10:00, Ann <ann@example.com> wrote:" — Gmail wraps it.
    if line.starts_with("On ") && (line.ends_with("wrote:") || next.ends_with("wrote:")) {
        return true;
    }
    // Outlook: "From: Ann <ann@example.com>" then "Sent: ..." within the next lines.
    if line.starts_with("From:") {
        return lines
            .iter()
            .skip(1)
            .take(4)
            .any(|l| l.trim_start().starts_with("Sent:"));
    }
    false
}

/// HTML without its quoted reply: quote containers removed, and from an Outlook reply header
/// on, everything; `None` when it has none. The HTML must be within [`bounded`]'s bounds.
pub fn strip_html(html: &str) -> Option<String> {
    let dom = html5ever::parse_document(RcDom::default(), Default::default()).one(html);
    let (mut removed, mut cut) = (false, false);
    prune(&dom.document, &mut removed, &mut cut);
    if !removed {
        return None;
    }
    let mut out = Vec::with_capacity(html.len());
    let document: SerializableHandle = dom.document.clone().into();
    let opts = SerializeOpts {
        traversal_scope: TraversalScope::ChildrenOnly(None),
        ..Default::default()
    };
    html5ever::serialize(&mut out, &document, opts).ok()?;
    let _ = out.flush();
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// Drops `node`'s quote containers, and every node after a cut marker (`cut`, which then
/// holds for the rest of the document).
fn prune(node: &Handle, removed: &mut bool, cut: &mut bool) {
    let children = std::mem::take(&mut *node.children.borrow_mut());
    let mut kept = Vec::with_capacity(children.len());
    for child in children {
        if *cut {
            *removed = true;
            continue;
        }
        match quote_kind(&child) {
            Some(Quote::Container) => *removed = true,
            Some(Quote::Cut) => {
                *removed = true;
                *cut = true;
            }
            None => {
                prune(&child, removed, cut);
                kept.push(child);
            }
        }
    }
    *node.children.borrow_mut() = kept;
}

/// How an element marks quoted text.
enum Quote {
    /// It holds the quote: it goes.
    Container,
    /// The quote starts here: it and everything after it go.
    Cut,
}

fn quote_kind(node: &Handle) -> Option<Quote> {
    let NodeData::Element { name, attrs, .. } = &node.data else {
        return None;
    };
    let attrs = attrs.borrow();
    let attr = |wanted: &str| {
        attrs
            .iter()
            .find(|a| &*a.name.local == wanted)
            .map(|a| a.value.to_string())
            .unwrap_or_default()
    };
    let (id, class) = (attr("id"), attr("class"));
    let classes: Vec<&str> = class.split_whitespace().collect();
    if matches!(
        id.as_str(),
        "divRplyFwdMsg" | "appendonsend" | "mail-editor-reference-message-container"
    ) || classes.contains(&"OutlookMessageHeader")
    {
        return Some(Quote::Cut);
    }
    if &*name.local == "blockquote"
        || classes
            .iter()
            .any(|c| matches!(*c, "gmail_quote" | "gmail_quote_container" | "yahoo_quoted"))
    {
        return Some(Quote::Container);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_quotes_go_from_the_attribution_on() {
        let gmail = "Sounds good.\n\nOn Mon, Nov 23, 2026 at 10:00 AM Ann Lee <ann@example.com>\nwrote:\n> Lunch?\n> A";
        assert_eq!(strip_text(gmail), ("Sounds good.".into(), true));
        let outlook = "Yes.\n\n________________________________\nFrom: Ann Lee <ann@example.com>\nSent: Monday, November 23, 2026 10:00\nTo: Bo\nSubject: Lunch\n\nLunch?";
        assert_eq!(strip_text(outlook), ("Yes.".into(), true));
        let plain = "From: here to there.\nNo quote.";
        assert_eq!(strip_text(plain), (plain.into(), false));
    }

    #[test]
    fn html_quote_containers_and_what_follows_an_outlook_header_go() {
        let html = r#"<div>Top</div><div class="gmail_quote"><div class="gmail_attr">On Mon Ann wrote:</div><blockquote>old</blockquote></div>"#;
        let out = strip_html(html).unwrap();
        assert!(
            out.contains("Top") && !out.contains("old") && !out.contains("wrote"),
            "{out}"
        );
        let outlook = r#"<div>Reply</div><div id="appendonsend"></div><hr><div id="divRplyFwdMsg"><b>From:</b> Ann</div><div>old</div>"#;
        let out = strip_html(outlook).unwrap();
        assert!(
            out.contains("Reply") && !out.contains("old") && !out.contains("<hr"),
            "{out}"
        );
        let clean = "<p>Hello</p>";
        assert_eq!(strip_html(clean), None);
    }

    #[test]
    fn each_format_comes_from_the_part_that_fits_it() {
        let html = Some("<p>Hi <b>there</b></p><ul><li>one</li></ul>");
        let md = render(None, html, BodyFormat::Markdown, false).body;
        assert!(md.contains("**there**") && md.contains("one"), "{md}");
        let text = render(None, html, BodyFormat::Text, false).body;
        assert!(text.contains("Hi there") && !text.contains('<'), "{text}");
        let pre = render(Some("a < b"), None, BodyFormat::Html, false).body;
        assert_eq!(pre, "<pre>a &lt; b</pre>");
        let both = render(Some("plain"), html, BodyFormat::Text, false).body;
        assert_eq!(both, "plain");
    }

    #[test]
    fn hostile_markup_renders_on_a_worker_stack() {
        let n = 50_000;
        let docs = [
            format!("{}deep{}", "<div>".repeat(n), "</div>".repeat(n)),
            format!("{}deep", "<table><td>".repeat(n)),
            format!("{}deep", "<table><tr><td>".repeat(n)),
            format!("{}deep", "<ul><li>".repeat(n)),
            format!("{}deep", "<dl><dd><a href=x><em>".repeat(n)),
            format!("{}deep", "<blockquote>".repeat(n)),
            format!("{}{}deep", "<svg><g>".repeat(n), "</g></svg>".repeat(n)),
            (0..n)
                .map(|i| format!("<p><b id={i}><i id={i}>"))
                .collect::<String>()
                + "deep",
            format!(
                "<div class=gmail_quote>{}{}deep",
                "<div>".repeat(n),
                "</div>".repeat(n + 1)
            ),
        ];
        // A tokio worker's stack is 2 MiB.
        let rendered = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let mut bodies = Vec::new();
                for doc in &docs {
                    for format in [BodyFormat::Text, BodyFormat::Markdown, BodyFormat::Html] {
                        for strip in [false, true] {
                            let quoted = strip && doc.starts_with("<blockquote>");
                            let body = render(None, Some(doc), format, strip).body;
                            // A quote's content goes with it when quotes are stripped.
                            bodies.push(if quoted { format!("{body}deep") } else { body });
                        }
                    }
                }
                bodies
            })
            .unwrap()
            .join()
            .expect("rendering overflowed or panicked");
        for (i, body) in rendered.iter().enumerate() {
            // Text wraps at the width, even inside a word, and quotes mark each line.
            let joined: String = body
                .chars()
                .filter(|c| !c.is_whitespace() && *c != '>')
                .collect();
            assert!(
                joined.contains("deep"),
                "rendering {i}: {}",
                &body[body.len().saturating_sub(300)..]
            );
        }
    }

    #[test]
    fn stripping_text_never_panics_and_never_grows() {
        let pieces = [
            "Thanks!\n",
            "\n",
            "> quoted\n",
            ">\n",
            "On Mon, Ann wrote:\n",
            "On Mon,\n",
            "wrote:\n",
            "From: Ann\n",
            "Sent: Monday\n",
            "-----Original Message-----\n",
            "______\n",
            "é ✓\n",
            "\r\n",
            "plain text",
        ];
        for doc in postmesh_shared::text::sample_documents(&pieces, 2_000) {
            let (out, stripped) = strip_text(&doc);
            assert!(out.len() <= doc.len(), "grew: {doc:?} -> {out:?}");
            assert_eq!(stripped, out != doc, "{doc:?}");
        }
    }

    #[test]
    fn stripping_html_never_panics_and_leaves_no_quote_container() {
        let pieces = [
            "<div>",
            "</div>",
            "<p>",
            "</p>",
            "text ",
            "<blockquote>",
            "</blockquote>",
            "<div class=gmail_quote>",
            "<div id=divRplyFwdMsg>",
            "<hr>",
            "<b>",
            "</b>",
            "<table><tr><td>",
            "</td></tr></table>",
            "&amp;",
            "<",
            ">",
            "<!--",
            "-->",
        ];
        for doc in postmesh_shared::text::sample_documents(&pieces, 2_000) {
            let safe = bounded::bound(&doc).html;
            if let Some(out) = strip_html(&safe) {
                assert!(
                    !out.contains("<blockquote") && !out.contains("gmail_quote"),
                    "{doc:?} -> {out:?}"
                );
            }
        }
    }
}
