//! What is kept of a received MIME message besides its raw form: parsed with mail-parser
//! (legacy charsets decoded), or, for a message it cannot read, only what the raw bytes
//! tell (never an error that would make the MTA retry forever).

use std::borrow::Cow;

use mail_parser::{Address, HeaderValue, MessageParser, MimeHeaders, PartType};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use postmesh_shared::text::cut_at;

/// One attachment, listed (its content stays in the raw message).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ThreadMessageAttachment)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    pub filename: Option<String>,
    pub content_type: String,
    /// Decoded bytes.
    pub size: usize,
}

/// What a message says of itself, as stored in columns and shown by the API.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema,
)]
#[schema(as = ThreadMessageContent)]
#[serde(rename_all = "camelCase")]
pub struct Content {
    /// `From:` as written (`Name <addr>` or `addr`); shown as the envelope sender when the
    /// message has none.
    pub from: Option<String>,
    pub to: Vec<String>,
    pub cc: Vec<String>,
    pub subject: String,
    pub text: Option<String>,
    pub html: Option<String>,
    /// `Message-ID`, without angle brackets.
    pub message_id: Option<String>,
    pub in_reply_to: Option<String>,
}

/// Attachments listed at most (the rest stay in the raw message, unlisted): a message of
/// 10,000 parts must not make every webhook and page carry 10,000 entries.
pub const MAX_LISTED_ATTACHMENTS: usize = 100;
/// `To` and `Cc` addresses kept at most, each.
pub const MAX_LISTED_ADDRESSES: usize = 1_000;
/// `References` kept at most: the nearest ancestors, which threading needs.
pub const MAX_REFERENCES: usize = 100;
/// Bytes of a Message-ID at most (a header line's limit, RFC 5322 §2.1.1); a longer one is
/// taken as none, as PostgreSQL indexes no entry over 2,704 bytes.
const MAX_ID: usize = 998;
/// Bytes of a base subject threads compare at most (the same index limit).
const MAX_SUBJECT_KEY: usize = MAX_HEADER_TEXT;
/// Bytes of a header's text kept where it is indexed or announced: a line's length at most
/// (RFC 5322 §2.1.1).
pub const MAX_HEADER_TEXT: usize = 998;

/// The largest text or HTML body stored beside the raw message; a larger one is read
/// from the raw message when shown, so ingesting it does not hold a second copy.
pub const INLINE_BODY_BYTES: usize = 1024 * 1024;

/// A message as read for storing: its content, threading and attachments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Its content; a body over [`INLINE_BODY_BYTES`] is left out (`bodies_in_raw`).
    pub content: Content,
    /// Whether a body was left out of `content`, to be read from the raw message.
    pub bodies_in_raw: bool,
    /// `References`, oldest first.
    pub references: Vec<String>,
    pub attachments: Vec<Attachment>,
    /// False when mail-parser could not read the message.
    pub readable: bool,
    /// SHA-256 of its decoded parts' contents: what a relay that adds headers or changes a
    /// transfer encoding leaves as it was.
    pub parts_digest: [u8; 32],
}

impl Parsed {
    /// Reads `raw`, leaving bodies over [`INLINE_BODY_BYTES`] in it.
    pub fn of(raw: &[u8]) -> Self {
        Self::read(raw, INLINE_BODY_BYTES)
    }

    /// Reads `raw` with its bodies, whatever their size.
    pub fn whole(raw: &[u8]) -> Self {
        Self::read(raw, usize::MAX)
    }

    fn read(raw: &[u8], body_limit: usize) -> Self {
        let Some(msg) = MessageParser::default().parse(raw) else {
            return Self::default();
        };
        Self::from_message(&msg, body_limit).without_nul()
    }

    /// Each NUL in its text replaced by U+FFFD: PostgreSQL text holds none, and a message is
    /// stored whatever it holds (its raw bytes keep them).
    fn without_nul(mut self) -> Self {
        fn clean(text: &mut String) {
            if text.contains('\0') {
                *text = text.replace('\0', "\u{FFFD}");
            }
        }
        let c = &mut self.content;
        let attachments = self.attachments.iter_mut().flat_map(|a| {
            let Attachment {
                filename,
                content_type,
                ..
            } = a;
            filename.as_mut().into_iter().chain([content_type])
        });
        [&mut c.subject]
            .into_iter()
            .chain(c.from.as_mut())
            .chain(c.text.as_mut())
            .chain(c.html.as_mut())
            .chain(c.message_id.as_mut())
            .chain(c.in_reply_to.as_mut())
            .chain(c.to.iter_mut())
            .chain(c.cc.iter_mut())
            .chain(self.references.iter_mut())
            .chain(attachments)
            .for_each(clean);
        self
    }

    /// What `msg` says, bodies over `body_limit` left in the raw message.
    fn from_message(msg: &mail_parser::Message<'_>, body_limit: usize) -> Self {
        // The parts as sent: mail-parser would render a missing one from the other, which is
        // the reader's choice to make (a webhook renders it its own way).
        let text = msg.text_part(0).and_then(|p| match &p.body {
            PartType::Text(text) => Some(Cow::Borrowed(text.as_ref())),
            _ => None,
        });
        let html = msg.html_part(0).and_then(|p| match &p.body {
            PartType::Html(html) => Some(Cow::Borrowed(html.as_ref())),
            _ => None,
        });
        let fits = |b: &Option<Cow<'_, str>>| b.as_ref().is_none_or(|b| b.len() <= body_limit);
        let bodies_in_raw = !fits(&text) || !fits(&html);
        let inline =
            |b: Option<Cow<'_, str>>| b.filter(|b| b.len() <= body_limit).map(|b| b.into_owned());
        let content = Content {
            from: msg.from().and_then(first_address),
            to: addresses(msg.to()),
            cc: addresses(msg.cc()),
            subject: msg.subject().unwrap_or_default().to_owned(),
            text: inline(text),
            html: inline(html),
            message_id: msg.message_id().map(bare_id).filter(|id| usable_id(id)),
            in_reply_to: ids(msg.in_reply_to()).into_iter().next(),
        };
        Self {
            content,
            bodies_in_raw,
            references: nearest(ids(msg.references())),
            attachments: msg
                .attachments()
                .take(MAX_LISTED_ATTACHMENTS)
                .map(|part| Attachment {
                    filename: part.attachment_name().map(str::to_owned),
                    content_type: part
                        .content_type()
                        .map(|ct| match ct.subtype() {
                            Some(sub) => format!("{}/{sub}", ct.ctype()),
                            None => ct.ctype().to_owned(),
                        })
                        .unwrap_or_else(|| "application/octet-stream".into())
                        .to_ascii_lowercase(),
                    size: part.contents().len(),
                })
                .collect(),
            readable: true,
            parts_digest: parts_digest(msg),
        }
    }

    /// What makes this message the same message again in one inbox: its Message-ID with
    /// the digest of its parts (a relay's retry adds headers; another message under a
    /// reused or guessed id is not taken for a repeat), else the SHA-256 of its raw bytes.
    pub fn dedup_key(&self, raw: &[u8]) -> String {
        match &self.content.message_id {
            Some(id) => format!("mid:{id}#{}", hex::encode(&self.parts_digest[..16])),
            None => format!("sha256:{}", hex::encode(Sha256::digest(raw))),
        }
    }

    /// The subject as threads compare it: without reply and forward prefixes (`Re:`,
    /// `Fwd:`, `AW:`, `[list]`, ...; RFC 5256's base subject), lower case, single spaces.
    pub fn subject_key(&self) -> String {
        cut_at(base_subject(&self.content.subject), MAX_SUBJECT_KEY).0
    }

    /// Message-IDs this message answers, nearest first: `In-Reply-To`, then `References`
    /// from the newest.
    pub fn ancestors(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.content.in_reply_to.iter().cloned().collect();
        ids.extend(self.references.iter().rev().cloned());
        ids.dedup();
        ids
    }
}

/// SHA-256 over each part's decoded contents, each after its length.
fn parts_digest(msg: &mail_parser::Message<'_>) -> [u8; 32] {
    let mut digest = Sha256::new();
    for part in &msg.parts {
        let contents = part.contents();
        digest.update((contents.len() as u64).to_le_bytes());
        digest.update(contents);
    }
    digest.finalize().into()
}

/// RFC 5256's base subject, lower case, with runs of white space as one space.
pub fn base_subject(subject: &str) -> String {
    let lower = subject.to_lowercase();
    mail_parser::parsers::fields::thread::thread_name(&lower)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn bare_id(id: &str) -> String {
    id.trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .to_owned()
}

fn ids(value: &HeaderValue<'_>) -> Vec<String> {
    match value {
        HeaderValue::Text(id) => vec![bare_id(id)],
        HeaderValue::TextList(list) => list.iter().map(|id| bare_id(id)).collect(),
        _ => Vec::new(),
    }
    .into_iter()
    .filter(|id| usable_id(id))
    .collect()
}

/// Whether a Message-ID (without its brackets) can stand for its message: neither empty
/// nor longer than [`MAX_ID`] (an index holds it).
fn usable_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID
}

fn first_address(address: &Address<'_>) -> Option<String> {
    address.first().and_then(|a| {
        let email = a.address()?;
        Some(match a.name() {
            Some(name) if !name.is_empty() => format!("{name} <{email}>"),
            _ => email.to_owned(),
        })
    })
}

fn addresses(address: Option<&Address<'_>>) -> Vec<String> {
    address
        .map(|a| {
            a.iter()
                .filter_map(|a| a.address())
                .take(MAX_LISTED_ADDRESSES)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The last [`MAX_REFERENCES`] of `references` (oldest first, as written).
fn nearest(mut references: Vec<String>) -> Vec<String> {
    let cut = references.len().saturating_sub(MAX_REFERENCES);
    references.drain(..cut);
    references
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_messages_are_read_in_linear_time_and_listed_within_bounds() {
        let mut parts = String::from(
            "From: a@x.com\r\nSubject: parts\r\nMIME-Version: 1.0\r\n\
             Content-Type: multipart/mixed; boundary=\"b\"\r\n\r\n",
        );
        for i in 0..10_000 {
            parts.push_str(&format!(
                "--b\r\nContent-Type: text/plain\r\n\
                 Content-Disposition: attachment; filename=\"f{i}.txt\"\r\n\r\nx\r\n"
            ));
        }
        parts.push_str("--b--\r\n");
        let p = Parsed::of(parts.as_bytes());
        assert!(p.readable);
        assert_eq!(p.attachments.len(), MAX_LISTED_ATTACHMENTS);
        let mut headers: String = (0..100_000).map(|i| format!("X-H{i}: v\r\n")).collect();
        let to: Vec<String> = (0..5_000).map(|i| format!("r{i}@x.com")).collect();
        let refs: String = (0..5_000).map(|i| format!(" <m{i}@x.com>")).collect();
        headers.push_str(&format!(
            "From: a@x.com\r\nTo: {}\r\nReferences:{refs}\r\nSubject: h\r\n\r\nbody\r\n",
            to.join(", ")
        ));
        let p = Parsed::of(headers.as_bytes());
        assert_eq!(p.content.subject, "h");
        assert_eq!(p.content.to.len(), MAX_LISTED_ADDRESSES);
        assert_eq!(p.references.len(), MAX_REFERENCES);
        assert_eq!(p.references.last().map(String::as_str), Some("m4999@x.com"));
    }

    #[test]
    fn base_subjects_drop_reply_and_forward_prefixes() {
        for (subject, key) in [
            ("Hello  World", "hello world"),
            ("Re: Hello World", "hello world"),
            ("RE: re: Hello World", "hello world"),
            ("Fwd: Re: Hello World", "hello world"),
            ("AW: Hello World", "hello world"),
            ("[list] Re: Hello World", "hello world"),
            ("", ""),
        ] {
            assert_eq!(base_subject(subject), key, "{subject:?}");
        }
    }

    #[test]
    fn a_message_is_read_with_its_threading_headers() {
        let raw = b"From: Ann Lee <ann@example.com>\r\nTo: a@x.io, b@x.io\r\nCc: c@x.io\r\n\
Subject: Re: Plans\r\nMessage-ID: <m2@example.com>\r\nIn-Reply-To: <m1@x.io>\r\n\
References: <m0@x.io> <m1@x.io>\r\n\r\nHi\r\n";
        let p = Parsed::of(raw);
        assert!(p.readable);
        let c = &p.content;
        assert_eq!(c.from.as_deref(), Some("Ann Lee <ann@example.com>"));
        assert_eq!((c.to.len(), c.cc.len()), (2, 1));
        assert_eq!(c.message_id.as_deref(), Some("m2@example.com"));
        assert_eq!(p.ancestors(), ["m1@x.io", "m0@x.io"]);
        assert!(p.dedup_key(raw).starts_with("mid:m2@example.com#"));
        assert_eq!(c.text.as_deref().map(str::trim), Some("Hi"));
    }

    #[test]
    fn a_large_body_is_left_in_the_raw_message() {
        let raw = b"Subject: big\r\nContent-Type: text/plain\r\n\r\n0123456789\r\n";
        let cut = Parsed::read(raw, 5);
        assert!(cut.bodies_in_raw && cut.content.text.is_none());
        let whole = Parsed::read(raw, usize::MAX);
        assert!(!whole.bodies_in_raw);
        assert_eq!(
            whole.content.text.as_deref().map(str::trim),
            Some("0123456789")
        );
    }

    #[test]
    fn a_message_id_is_a_repeat_only_with_the_same_parts() {
        let key = |raw: &[u8]| Parsed::of(raw).dedup_key(raw);
        let sent = b"Message-ID: <m@x.io>\r\nSubject: a\r\n\r\nHello\r\n";
        let relayed = b"Received: from relay\r\nMessage-ID: <m@x.io>\r\nSubject: a\r\n\
Content-Transfer-Encoding: base64\r\n\r\nSGVsbG8NCg==\r\n";
        let other = b"Message-ID: <m@x.io>\r\nSubject: a\r\n\r\nGoodbye\r\n";
        assert_eq!(key(sent), key(relayed));
        assert_ne!(key(sent), key(other));
    }

    #[test]
    fn without_a_message_id_the_raw_bytes_decide() {
        let p = Parsed::of(b"Subject: x\r\n\r\nbody");
        assert!(p
            .dedup_key(b"Subject: x\r\n\r\nbody")
            .starts_with("sha256:"));
        assert_ne!(p.dedup_key(b"a"), p.dedup_key(b"b"));
    }
}
