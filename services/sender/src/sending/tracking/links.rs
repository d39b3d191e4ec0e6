//! A tracked message's HTML: each `http(s)` link of `<a href>` and `<area href>` sent
//! through `{base}/t/c/{token}` — except unsubscribe links and those marked
//! `data-pm-notrack` — and a 1×1 pixel `{base}/t/o/{token}` before `</body>` (at the end
//! when there is none). One streaming pass (lol_html): time grows with the document.

use std::cell::Cell;
use std::rc::Rc;

use lol_html::html_content::ContentType;
use uuid::Uuid;

use postmesh_shared::tracking::Binding;

use crate::sending::tracking::Tracker;

/// Marks a link not to track; taken out of the message.
pub const NO_TRACK: &str = "data-pm-notrack";

/// What to do to one message's HTML.
pub struct Instrument<'a> {
    pub tracker: &'a Tracker,
    /// The from-domain's own tracking host (`track.<domain>`) and the domain, which links
    /// then point at and their tokens are bound to; else the tracker's base.
    pub bound: Option<Binding<'a>>,
    pub delivery: Uuid,
    pub opens: bool,
    pub clicks: bool,
    /// Links starting with this are unsubscribe links: never tracked.
    pub unsubscribe_prefix: Option<&'a str>,
}

/// Whether `link` is `http://` or `https://` (in any case).
fn is_http(link: &str) -> bool {
    let starts = |scheme: &str| {
        link.get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    };
    starts("http://") || starts("https://")
}

impl Instrument<'_> {
    /// The base of the tracking URLs.
    fn base(&self) -> String {
        match self.bound {
            Some(Binding { host, .. }) => format!("https://{host}"),
            None => self.tracker.base_url.clone(),
        }
    }

    /// The pixel's markup.
    fn pixel(&self, base: &str) -> Option<String> {
        Some(format!(
            "<img src=\"{base}/t/o/{}\" width=\"1\" height=\"1\" alt=\"\" \
             style=\"display:block;width:1px;height:1px;border:0\">",
            self.tracker.key.open(self.delivery, self.bound)?
        ))
    }

    /// The tracked form of `href` as written in the markup, if it is to be tracked.
    fn tracked(&self, base: &str, href: &str) -> Option<String> {
        // The destination as a browser reads the attribute (one we cannot read stays as
        // written, untracked).
        let link = postmesh_shared::text::attribute_url(href)?;
        let unsubscribe = self.unsubscribe_prefix.is_some_and(|p| link.starts_with(p));
        if !is_http(&link) || unsubscribe {
            return None;
        }
        let token = self.tracker.key.click(self.delivery, &link, self.bound)?;
        Some(format!("{base}/t/c/{token}"))
    }

    /// `html` with its pixel and tracked links, as asked.
    pub fn apply(&self, html: &str) -> String {
        if html.is_empty() || !(self.opens || self.clicks) {
            return html.to_owned();
        }
        // Shared with the end tag's handler, which must own what it holds.
        let placed = Rc::new(Cell::new(false));
        let base = self.base();
        let pixel = self.opens.then(|| self.pixel(&base)).flatten();
        let mut handlers = Vec::new();
        if self.clicks {
            handlers.push(lol_html::element!("a[href], area[href]", |el| {
                if el.has_attribute(NO_TRACK) {
                    el.remove_attribute(NO_TRACK);
                    return Ok(());
                }
                if let Some(tracked) = el
                    .get_attribute("href")
                    .and_then(|h| self.tracked(&base, &h))
                {
                    el.set_attribute("href", &tracked)?;
                }
                Ok(())
            }));
        }
        if let Some(pixel) = &pixel {
            handlers.push(lol_html::element!("body", |el| {
                let (placed, pixel) = (placed.clone(), pixel.clone());
                el.on_end_tag(lol_html::end_tag!(move |end| {
                    if !placed.replace(true) {
                        end.before(&pixel, ContentType::Html);
                    }
                    Ok(())
                }))
            }));
        }
        let settings = lol_html::RewriteStrSettings {
            element_content_handlers: handlers,
            strict: false,
            ..lol_html::RewriteStrSettings::new()
        };
        // Our handlers fail only on an attribute the markup cannot hold: sent untracked.
        let mut out = lol_html::rewrite_str(html, settings).unwrap_or_else(|_| html.to_owned());
        if let (Some(pixel), false) = (&pixel, placed.get()) {
            out.push_str(pixel);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use postmesh_shared::tracking::{HitKind, TrackingKey};

    fn tracker() -> Tracker {
        Tracker {
            key: TrackingKey::new("k"),
            base_url: "https://t.example.com".into(),
        }
    }

    fn instrument(t: &Tracker, opens: bool, clicks: bool) -> Instrument<'_> {
        Instrument {
            tracker: t,
            bound: None,
            delivery: Uuid::nil(),
            opens,
            clicks,
            unsubscribe_prefix: Some("https://app.example.com/unsubscribe"),
        }
    }

    /// The destinations of the tracked links of `html`, in order.
    fn destinations(t: &Tracker, html: &str) -> Vec<String> {
        html.split("https://t.example.com/t/c/")
            .skip(1)
            .map(|rest| {
                let token = &rest[..rest.find('"').unwrap()];
                t.key
                    .verify(token, HitKind::Click, None)
                    .unwrap()
                    .url
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn links_are_tracked_but_unsubscribe_and_marked_ones() {
        let t = tracker();
        let html = r#"<html><body><a href="https://x.com/a?b=1&amp;c=2">a</a>
<a href=" https://x.com/n?who=O&#39;Brien&#38;x=&quot;y&quot;
 ">n</a>
<a href="https://app.example.com/unsubscribe?token=z">u</a>
<a data-pm-notrack href="https://x.com/keep">k</a> <a href="mailto:q@x.com">m</a>
<AREA HREF="http://x.com/m"></body></html>"#;
        let out = instrument(&t, false, true).apply(html);
        assert_eq!(
            destinations(&t, &out),
            [
                "https://x.com/a?b=1&c=2",
                "https://x.com/n?who=O'Brien&x=\"y\"",
                "http://x.com/m"
            ]
        );
        assert!(out.contains(r#"href="https://app.example.com/unsubscribe?token=z""#));
        assert!(
            out.contains(r#"<a href="https://x.com/keep">k</a>"#),
            "{out}"
        );
        assert!(out.contains("mailto:q@x.com") && !out.contains("/t/o/"));
    }

    #[test]
    fn the_pixel_goes_before_the_body_ends_or_at_the_end() {
        let t = tracker();
        let out = instrument(&t, true, false).apply("<body><p>hi</p></body>\n");
        let pixel = out.find("/t/o/").unwrap();
        assert!(pixel > out.find("hi").unwrap() && pixel < out.find("</body>").unwrap());
        assert_eq!(out.matches("<img").count(), 1);
        let out = instrument(&t, true, false).apply("<p>no body</p>");
        assert!(out.starts_with("<p>no body</p><img"), "{out}");
        let token_at = out.find("/t/o/").unwrap() + 5;
        let token = &out[token_at..token_at + out[token_at..].find('"').unwrap()];
        assert!(t.key.verify(token, HitKind::Open, None).is_some());
        // Nothing asked, nothing changed.
        assert_eq!(
            instrument(&t, false, false).apply("<a href=\"https://x\">"),
            "<a href=\"https://x\">"
        );
    }

    #[test]
    fn a_domains_own_host_carries_tokens_bound_to_it() {
        let t = tracker();
        let mut i = instrument(&t, true, true);
        let bound = Some(Binding {
            host: "track.a.example",
            domain: Uuid::now_v7(),
        });
        i.bound = bound;
        let out = i.apply("<body><a href=\"https://x.com/p\">x</a></body>");
        let token = |path: &str| {
            let at = out.find(path).unwrap_or_else(|| panic!("{path} in {out}")) + path.len();
            out[at..at + out[at..].find('"').unwrap()].to_owned()
        };
        let (click, open) = (
            token("https://track.a.example/t/c/"),
            token("https://track.a.example/t/o/"),
        );
        assert!(t.key.verify(&click, HitKind::Click, bound).is_some());
        assert!(t.key.verify(&open, HitKind::Open, bound).is_some());
        assert_eq!(t.key.verify(&click, HitKind::Click, None), None);
        assert_eq!(t.key.verify(&open, HitKind::Open, None), None);
    }

    #[test]
    fn rewriting_is_linear_in_the_links() {
        let t = tracker();
        let html = "<a href=\"https://x.com/p\">x</a> ".repeat(100_000);
        let out = instrument(&t, true, true).apply(&html);
        assert_eq!(out.matches("/t/c/").count(), 100_000);
    }
}
