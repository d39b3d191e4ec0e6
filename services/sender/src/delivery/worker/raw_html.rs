//! Tracking in a raw message (`/send-raw`, SMTP): its HTML parts found by mail-parser,
//! rewritten as a built message's HTML is, and put back in place as base64 UTF-8, the rest
//! of the message byte for byte as its client wrote it.

use base64::Engine as _;
use mail_parser::{MessageParser, MimeHeaders, PartType};

use crate::sending::raw_mime::without_fields;

/// An HTML part of a raw message: where its header and body stand, and its text.
pub(super) struct HtmlPart {
    header: usize,
    body: usize,
    end: usize,
    /// The part's text, decoded.
    pub html: String,
}

/// The HTML parts of `mime` tracking may rewrite: `text/html` that is no attachment, in
/// UTF-8 or ASCII (another charset is left as written), outside attached messages; none in
/// a signed or encrypted message (S/MIME, PGP/MIME), whose signature a rewrite would break.
pub(super) fn html_parts(mime: &[u8]) -> Vec<HtmlPart> {
    let Some(message) = MessageParser::default().parse(mime) else {
        return Vec::new();
    };
    let sealed = message.parts.iter().any(|part| {
        part.content_type().is_some_and(|t| {
            let sub = t.subtype().unwrap_or_default();
            match t.ctype() {
                kind if kind.eq_ignore_ascii_case("multipart") => {
                    sub.eq_ignore_ascii_case("signed") || sub.eq_ignore_ascii_case("encrypted")
                }
                kind if kind.eq_ignore_ascii_case("application") => {
                    sub.eq_ignore_ascii_case("pkcs7-mime")
                        || sub.eq_ignore_ascii_case("x-pkcs7-mime")
                }
                _ => false,
            }
        })
    });
    if sealed {
        return Vec::new();
    }
    message
        .parts
        .iter()
        .filter_map(|part| {
            let PartType::Html(html) = &part.body else {
                return None;
            };
            let attached = part
                .content_disposition()
                .is_some_and(|d| d.is_attachment());
            let charset = part.content_type().and_then(|t| t.attribute("charset"));
            let unicode = charset.is_none_or(|c| {
                c.eq_ignore_ascii_case("utf-8") || c.eq_ignore_ascii_case("us-ascii")
            });
            (!attached && unicode).then(|| HtmlPart {
                header: part.offset_header as usize,
                body: part.offset_body as usize,
                end: part.offset_end as usize,
                html: html.to_string(),
            })
        })
        .collect()
}

/// `mime` with each part replaced by its new HTML: the part's header fields but its
/// `Content-Transfer-Encoding`, then the HTML in base64 lines of 76.
pub(super) fn replaced(mime: &[u8], parts: &[(HtmlPart, String)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(mime.len() + mime.len() / 2);
    let mut at = 0;
    for (part, html) in parts {
        if part.header < at || part.end > mime.len() || part.header > part.body {
            continue;
        }
        out.extend_from_slice(&mime[at..part.header]);
        let header = without_fields(
            &mime[part.header..part.body],
            &["content-transfer-encoding"],
        );
        // The header's own blank line last: the new field goes before it.
        let fields = header
            .strip_suffix(b"\r\n\r\n")
            .map(|f| [f, b"\r\n"].concat())
            .or_else(|| header.strip_suffix(b"\n\n").map(|f| [f, b"\n"].concat()))
            .unwrap_or(header);
        out.extend_from_slice(&fields);
        out.extend_from_slice(b"Content-Transfer-Encoding: base64\r\n\r\n");
        let encoded = base64::engine::general_purpose::STANDARD.encode(html.as_bytes());
        for (i, line) in encoded.as_bytes().chunks(76).enumerate() {
            if i > 0 {
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(line);
        }
        at = part.end;
    }
    out.extend_from_slice(&mime[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESSAGE: &str = "From: a@example.com\r\nTo: b@example.com\r\nSubject: Hi\r\n\
MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"m\"\r\n\r\n--m\r\n\
Content-Type: multipart/alternative; boundary=\"a\"\r\n\r\n--a\r\n\
Content-Type: text/plain; charset=utf-8\r\n\r\nRead https://example.com/x\r\n--a\r\n\
Content-Type: text/html; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n\
<p>R=C3=A9sum=C3=A9 <a href=3D\"https://example.com/x\">x</a></p>\r\n--a--\r\n--m\r\n\
Content-Type: text/html; name=\"page.html\"\r\nContent-Disposition: attachment; filename=\"page.html\"\r\n\r\n\
<a href=\"https://example.com/attached\">kept</a>\r\n--m\r\n\
Content-Type: text/html; charset=iso-8859-1\r\n\r\n<a href=\"https://example.com/latin\">kept</a>\r\n--m--\r\n";

    #[test]
    fn the_html_body_is_rewritten_in_place_and_the_rest_kept() {
        let parts = html_parts(MESSAGE.as_bytes());
        assert_eq!(parts.len(), 1, "an attachment and another charset are left");
        assert_eq!(
            parts[0].html,
            "<p>Résumé <a href=\"https://example.com/x\">x</a></p>"
        );
        let new = parts[0]
            .html
            .replace("https://example.com/x", "https://t.example.com/t/c/1");
        let out = replaced(
            MESSAGE.as_bytes(),
            &[(parts.into_iter().next().unwrap(), new)],
        );
        let parsed = MessageParser::default().parse(&out).unwrap();
        assert_eq!(
            parsed.body_html(0).unwrap(),
            "<p>Résumé <a href=\"https://t.example.com/t/c/1\">x</a></p>"
        );
        assert_eq!(parsed.body_text(0).unwrap(), "Read https://example.com/x");
        let text = String::from_utf8_lossy(&out).into_owned();
        assert!(!text.contains("quoted-printable"), "{text}");
        assert!(text.contains("https://example.com/attached"), "{text}");
        assert!(text.contains("https://example.com/latin"), "{text}");
        assert!(text.starts_with("From: a@example.com\r\n"), "{text}");
        let before = MessageParser::default().parse(MESSAGE.as_bytes()).unwrap();
        assert_eq!(parsed.parts.len(), before.parts.len(), "{text}");
    }

    #[test]
    fn a_single_part_html_message_keeps_its_header() {
        let message = "From: a@example.com\r\nSubject: One\r\nContent-Type: text/html\r\n\r\n<a href=\"https://example.com/\">x</a>\r\n";
        let parts = html_parts(message.as_bytes());
        assert_eq!(parts.len(), 1);
        let new = "<b>new</b>".to_owned();
        let out = replaced(
            message.as_bytes(),
            &[(parts.into_iter().next().unwrap(), new)],
        );
        let parsed = MessageParser::default().parse(&out).unwrap();
        assert_eq!(parsed.subject(), Some("One"));
        assert_eq!(parsed.body_html(0).unwrap(), "<b>new</b>");
    }

    #[test]
    fn a_signed_message_is_left_whole() {
        let signed = "From: a@example.com\r\nContent-Type: multipart/signed; \
protocol=\"application/pkcs7-signature\"; micalg=sha-256; boundary=s\r\n\r\n--s\r\n\
Content-Type: text/html; charset=utf-8\r\n\r\n<a href=\"https://example.com/\">x</a>\r\n--s\r\n\
Content-Type: application/pkcs7-signature; name=smime.p7s\r\n\r\nMIIB\r\n--s--\r\n";
        assert!(html_parts(signed.as_bytes()).is_empty());
        let plain = signed.replace("multipart/signed", "multipart/mixed");
        assert_eq!(html_parts(plain.as_bytes()).len(), 1);
    }

    #[test]
    fn a_message_that_is_no_mime_has_no_part_to_rewrite() {
        assert!(html_parts(b"").is_empty());
        assert!(html_parts(b"just text, no header").is_empty());
    }
}
