//! Received HTML made safe to parse: one linear pass rewrites it as properly nested markup
//! at most [`MAX_DEPTH`] elements deep with at most [`MAX_ATTRIBUTES`] distinct attributes
//! per element, so the HTML parser and the recursive converters after it (quote stripping,
//! HTML→text, HTML→Markdown) run in linear time and bounded stack whatever a sender wrote.
//! Elements below the cap are flattened: their tags go, their text stays. Comments,
//! processing instructions and scripts go; the text of raw-text elements (`style`, `title`,
//! …) has its `<` escaped, so no markup hides in it whatever the parser makes of it.

/// Elements open at once at most; deeper start tags are left out, their text kept.
pub const MAX_DEPTH: usize = 100;
/// Attributes kept per element (the first of each name, as HTML parsers keep).
pub const MAX_ATTRIBUTES: usize = 32;

/// Elements that have no end tag.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link", "meta", "param",
    "source", "track", "wbr",
];
/// Elements whose content is text up to their end tag.
const RAW_TEXT: &[&str] = &[
    "style", "title", "textarea", "xmp", "iframe", "noembed", "noframes", "noscript",
];
/// Starting one of these closes an open `p` (HTML's "close a p element").
const CLOSES_P: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "center",
    "details",
    "dialog",
    "dir",
    "div",
    "dl",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hr",
    "li",
    "main",
    "menu",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "ul",
];
/// Where the search for an open element to close implicitly stops.
const SCOPE: &[&str] = &[
    "applet", "button", "caption", "html", "marquee", "math", "object", "svg", "table", "template",
];

/// HTML rewritten within the bounds, and how many start tags were left out (flattened).
#[derive(Debug)]
pub struct Bounded {
    pub html: String,
    pub flattened: usize,
}

/// Rewrites `html` within [`MAX_DEPTH`] and [`MAX_ATTRIBUTES`], in one pass.
pub fn bound(html: &str) -> Bounded {
    let mut w = Writer {
        out: String::with_capacity(html.len() + html.len() / 16),
        open: Vec::with_capacity(32),
        excess: 0,
        flattened: 0,
    };
    let b = html.as_bytes();
    let mut i = 0;
    while let Some(lt) = html[i..].find('<').map(|at| i + at) {
        w.out.push_str(&html[i..lt]);
        i = match b.get(lt + 1) {
            Some(c) if c.is_ascii_alphabetic() => match tag(html, lt + 1) {
                Some(tag) => w.start(html, tag),
                None => html.len(), // cut off inside the tag: parsers drop it
            },
            Some(b'/') => match b.get(lt + 2) {
                Some(c) if c.is_ascii_alphabetic() => match tag(html, lt + 2) {
                    Some(tag) => {
                        w.end(&tag.name);
                        tag.next
                    }
                    None => html.len(),
                },
                Some(b'>') => lt + 3,
                Some(_) => after(html, lt + 2, ">"), // a bogus comment
                None => {
                    w.out.push_str("&lt;/");
                    html.len()
                }
            },
            Some(b'!') if html[lt..].starts_with("<!--") => comment_end(html, lt + 4),
            Some(b'!') => {
                if html[lt + 2..]
                    .get(..7)
                    .is_some_and(|d| d.eq_ignore_ascii_case("doctype"))
                {
                    w.out.push_str("<!DOCTYPE html>");
                }
                after(html, lt + 2, ">")
            }
            Some(b'?') => after(html, lt + 1, ">"),
            _ => {
                w.out.push_str("&lt;");
                lt + 1
            }
        };
    }
    if i < html.len() {
        w.out.push_str(&html[i..]);
    }
    while let Some(name) = w.open.pop() {
        w.close(&name);
    }
    Bounded {
        html: w.out,
        flattened: w.flattened,
    }
}

/// The rewritten document being written, and its open elements.
struct Writer {
    out: String,
    /// The elements kept open, innermost last.
    open: Vec<String>,
    /// Start tags left out below the cap and not yet closed.
    excess: usize,
    flattened: usize,
}

impl Writer {
    /// Writes a start tag (unless below the cap) and what raw text follows it; answers
    /// where the input goes on.
    fn start(&mut self, html: &str, tag: Tag) -> usize {
        let name = tag.name.as_str();
        if name == "script" {
            return raw_end(html, tag.next, name).1;
        }
        if name == "plaintext" {
            escape_lt(&mut self.out, &html[tag.next..]);
            return html.len();
        }
        self.close_implied(name);
        let void = VOID.contains(&name);
        let kept = self.excess == 0 && (void || self.open.len() < MAX_DEPTH);
        if kept {
            self.out.push('<');
            self.out.push_str(name);
            for (attr, value) in &tag.attributes {
                self.out.push(' ');
                self.out.push_str(attr);
                self.out.push_str("=\"");
                self.out.push_str(&value.replace('"', "&quot;"));
                self.out.push('"');
            }
            self.out.push('>');
        } else {
            self.flattened += 1;
        }
        if RAW_TEXT.contains(&name) {
            let (text, next) = raw_end(html, tag.next, name);
            escape_lt(&mut self.out, text);
            if kept {
                self.close(name);
            }
            return next;
        }
        match (void, kept) {
            (true, _) => {}
            (false, true) if tag.self_closing => self.close(name),
            (false, true) => self.open.push(tag.name),
            (false, false) if tag.self_closing => {}
            (false, false) => self.excess += 1,
        }
        tag.next
    }

    /// An end tag: closes the innermost open element of its name and all inside it; one
    /// below the cap closes a left-out element; one that matches nothing is left out.
    fn end(&mut self, name: &str) {
        if self.excess > 0 {
            self.excess -= 1;
        } else if let Some(at) = self.open.iter().rposition(|n| n == name) {
            self.close_from(at);
        }
    }

    /// Closes the open elements from `at` inward.
    fn close_from(&mut self, at: usize) {
        while self.open.len() > at {
            let n = self.open.pop().unwrap_or_default();
            self.close(&n);
        }
    }

    /// Closes what starting `name` closes in HTML: an open `li` for a new `li`, a cell for
    /// a cell, a row for a row, a `p` for a block; never past the edge of its container.
    fn close_implied(&mut self, name: &str) {
        if self.excess > 0 {
            return;
        }
        let (targets, stops): (&[&str], &[&str]) = match name {
            "li" => (&["li"], &["ul", "ol"]),
            "dt" | "dd" => (&["dt", "dd"], &["dl"]),
            "td" | "th" => (&["td", "th"], &["tr"]),
            "tr" => (&["tr"], &["tbody", "thead", "tfoot"]),
            "thead" | "tbody" | "tfoot" => (&["thead", "tbody", "tfoot"], &[]),
            "option" => (&["option"], &["select"]),
            _ if CLOSES_P.contains(&name) => (&["p"], &[]),
            _ => return,
        };
        let found = self.open.iter().rposition(|n| {
            let n = n.as_str();
            targets.contains(&n) || stops.contains(&n) || SCOPE.contains(&n)
        });
        if let Some(at) = found.filter(|&at| targets.contains(&self.open[at].as_str())) {
            self.close_from(at);
        }
    }

    fn close(&mut self, name: &str) {
        self.out.push_str("</");
        self.out.push_str(name);
        self.out.push('>');
    }
}

/// A tag as read: its lowercase name, kept attributes, whether it ends in `/>`, and the
/// input position after its `>`.
struct Tag {
    name: String,
    attributes: Vec<(String, String)>,
    self_closing: bool,
    next: usize,
}

/// Reads the tag whose name starts at `at`; `None` when the input ends inside it.
fn tag(html: &str, at: usize) -> Option<Tag> {
    let b = html.as_bytes();
    let is_space = |c: u8| matches!(c, b'\t' | b'\n' | b'\x0c' | b'\r' | b' ');
    let mut i = at;
    while i < b.len() && !is_space(b[i]) && b[i] != b'/' && b[i] != b'>' {
        i += 1;
    }
    let name = html[at..i].to_ascii_lowercase();
    let mut tag = Tag {
        name,
        attributes: Vec::new(),
        self_closing: false,
        next: 0,
    };
    loop {
        while i < b.len() && (is_space(b[i]) || b[i] == b'/') {
            tag.self_closing = b[i] == b'/' && b.get(i + 1) == Some(&b'>');
            i += 1;
        }
        match b.get(i)? {
            b'>' => {
                tag.next = i + 1;
                return Some(tag);
            }
            _ => tag.self_closing = false,
        }
        let start = i;
        i += 1; // a name may start with '='
        while i < b.len() && !is_space(b[i]) && !matches!(b[i], b'/' | b'>' | b'=') {
            i += 1;
        }
        let attr = &html[start..i];
        while i < b.len() && is_space(b[i]) {
            i += 1;
        }
        let mut value = "";
        if b.get(i) == Some(&b'=') {
            i += 1;
            while i < b.len() && is_space(b[i]) {
                i += 1;
            }
            match b.get(i)? {
                &q @ (b'"' | b'\'') => {
                    let end = html[i + 1..].find(q as char)? + i + 1;
                    value = &html[i + 1..end];
                    i = end + 1;
                }
                _ => {
                    let end = html[i..]
                        .find(|c: char| c.is_ascii_whitespace() || c == '>')
                        .map_or(html.len(), |e| i + e);
                    value = &html[i..end];
                    i = end;
                }
            }
        }
        let named = attr
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b':' | b'.'));
        if named && tag.attributes.len() < MAX_ATTRIBUTES {
            let attr = attr.to_ascii_lowercase();
            if !tag.attributes.iter().any(|(a, _)| *a == attr) {
                tag.attributes.push((attr, value.to_owned()));
            }
        }
    }
}

/// The raw text from `from` to the end tag of `name` (or the input's end), and the position
/// after that end tag.
fn raw_end<'h>(html: &'h str, from: usize, name: &str) -> (&'h str, usize) {
    let b = html.as_bytes();
    let mut i = from;
    while let Some(at) = html[i..].find("</").map(|at| i + at) {
        let name_end = at + 2 + name.len();
        let matches = html
            .get(at + 2..name_end)
            .is_some_and(|n| n.eq_ignore_ascii_case(name));
        if matches
            && matches!(
                b.get(name_end),
                Some(b'\t' | b'\n' | b'\x0c' | b'\r' | b' ' | b'/' | b'>')
            )
        {
            return (&html[from..at], after(html, name_end, ">"));
        }
        i = at + 2;
    }
    (&html[from..], html.len())
}

/// Where a comment whose text starts at `from` ends: after `-->` or `--!>`, or at once for
/// `<!-->` and `<!--->`.
fn comment_end(html: &str, from: usize) -> usize {
    let rest = &html[from..];
    if rest.starts_with('>') {
        return from + 1;
    }
    if rest.starts_with("->") {
        return from + 2;
    }
    let mut i = from;
    while let Some(at) = html[i..].find("--").map(|at| i + at) {
        if html[at + 2..].starts_with('>') {
            return at + 3;
        }
        if html[at + 2..].starts_with("!>") {
            return at + 4;
        }
        i = at + 1;
    }
    html.len()
}

/// The position after the first `end` at or after `from`, or the input's end.
fn after(html: &str, from: usize, end: &str) -> usize {
    html[from..]
        .find(end)
        .map_or(html.len(), |at| from + at + end.len())
}

/// Appends `text` with each `<` escaped.
fn escape_lt(out: &mut String, text: &str) {
    let mut rest = text;
    while let Some(at) = rest.find('<') {
        out.push_str(&rest[..at]);
        out.push_str("&lt;");
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_markup_keeps_its_shape() {
        let html = r#"<!doctype html><html><head><style>p{}</style></head><body><p class="a" id=x>Hi &amp; <b>there</b><br/>x</p><ul><li>one<li>two</ul><table><tr><td>a<td>b</table></body></html>"#;
        let out = bound(html).html;
        assert_eq!(
            out,
            r#"<!DOCTYPE html><html><head><style>p{}</style></head><body><p class="a" id="x">Hi &amp; <b>there</b><br>x</p><ul><li>one</li><li>two</li></ul><table><tr><td>a</td><td>b</td></tr></table></body></html>"#
        );
    }

    #[test]
    fn depth_below_the_cap_is_flattened_and_its_text_kept() {
        let n = 50_000;
        let html = format!("{}deep{}after", "<div>".repeat(n), "</div>".repeat(n));
        let bounded = bound(&html);
        assert_eq!(bounded.flattened, n - MAX_DEPTH);
        let kept = format!(
            "{}deep{}after",
            "<div>".repeat(MAX_DEPTH),
            "</div>".repeat(MAX_DEPTH)
        );
        assert_eq!(bounded.html, kept);
    }

    #[test]
    fn nothing_hides_markup_from_the_count() {
        // An abruptly closed comment, a self-closing div (which HTML leaves open), markup
        // in raw text, a tag cut off at the end.
        let n = 1_000;
        for html in [
            format!("<!-->{}", "<div>".repeat(n)),
            "<div/>".repeat(n),
            format!("<svg><style>{}</style></svg>", "<g>".repeat(n)),
            format!("<title>{}", "<b>".repeat(n)),
            format!("{}<div a=\"", "<i>".repeat(n)),
        ] {
            let out = bound(&html).html;
            assert!(
                depth(&out) <= MAX_DEPTH,
                "{} deep: {}",
                depth(&out),
                &html[..40]
            );
        }
    }

    #[test]
    fn attributes_are_capped_and_deduplicated() {
        let attrs: String = (0..100_000).map(|i| format!(" a{i}=1 a0=2")).collect();
        let out = bound(&format!("<p{attrs}>x</p>")).html;
        assert_eq!(out.matches('=').count(), MAX_ATTRIBUTES);
        assert!(out.starts_with("<p a0=\"1\" a1=\"1\""), "{}", &out[..40]);
        let quoted = bound(r#"<a title='say "hi"' href="x>y">t</a>"#).html;
        assert_eq!(quoted, r#"<a title="say &quot;hi&quot;" href="x>y">t</a>"#);
    }

    #[test]
    fn scripts_and_comments_go_stray_brackets_are_text() {
        let out = bound("a < b <!-- <div> --> <script>x</div></script>c <3 </ x>").html;
        assert_eq!(out, "a &lt; b  c &lt;3 ");
    }

    #[test]
    fn implied_ends_close_only_within_their_container() {
        let out =
            bound("<ul><li>a<ul><li>b<li>c</ul><li>d</ul><table><tr><td>1<tr><td>2</table>").html;
        assert_eq!(
            out,
            "<ul><li>a<ul><li>b</li><li>c</li></ul></li><li>d</li></ul><table><tr><td>1</td></tr><tr><td>2</td></tr></table>"
        );
    }

    /// How deeply the tags of rewritten markup nest.
    fn depth(html: &str) -> usize {
        let (mut depth, mut max) = (0usize, 0);
        for tag in html.split('<').skip(1) {
            let name: String = tag
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '/')
                .collect();
            if let Some(_closing) = name.strip_prefix('/') {
                depth -= 1;
            } else if !VOID.contains(&name.as_str()) && !name.is_empty() {
                depth += 1;
                max = max.max(depth);
            }
        }
        max
    }
}
