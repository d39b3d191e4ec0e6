//! A raw message as a client wrote it (RFC 5322), read with mail-parser for what a send takes
//! from it — From, Subject, Message-ID, `X-Postmesh-Email-Type`, `X-Postmesh-Topic`,
//! `X-Postmesh-Tags` and `X-Postmesh-Metadata` — and
//! kept as written but for the fields no recipient sees.

use sha2::{Digest, Sha256};

use postmesh_shared::extract::IdempotencyKey;
use postmesh_shared::{ApiError, EmailAddress};

use crate::sending::keyed::Keyed;
use crate::sending::request::{EmailType, HeaderText, SendBody, To, ToItem};
use crate::sending::tags::{self, Tag, METADATA_FIELD, TAGS_FIELD};
use crate::sending::tasks::TaskMessage;

/// Largest message taken, in bytes of MIME: SES v2 takes 40 MB of base64 (30 MB of MIME), and
/// what the sender adds to a message (its own headers) must fit beside it.
pub const MAX_RAW_BYTES: usize = 28 * 1024 * 1024;
/// Envelope recipients of one message at most (as `/send-email`'s).
pub(crate) const MAX_RCPT: usize = crate::sending::request::MAX_RECIPIENTS;
/// A repeat of a message (same workspace, Message-ID and envelope) within this many seconds
/// is the same send.
const REPEAT_WINDOW_SECS: i64 = 24 * 3600;
/// Sets the send's `emailType`; taken out before delivery.
pub const EMAIL_TYPE_FIELD: &str = "X-Postmesh-Email-Type";
/// Sets the send's `topic`; taken out before delivery.
pub const TOPIC_FIELD: &str = "X-Postmesh-Topic";
/// Fields no recipient sees: the blind copies' lists, our own, and (for mail with an unsubscribe
/// link of ours) the client's unsubscribe fields, which ours replace.
pub(crate) const PRIVATE_FIELDS: [&str; 6] = [
    "Bcc",
    "Resent-Bcc",
    EMAIL_TYPE_FIELD,
    TOPIC_FIELD,
    TAGS_FIELD,
    METADATA_FIELD,
];
const UNSUBSCRIBE_FIELDS: [&str; 2] = ["List-Unsubscribe", "List-Unsubscribe-Post"];

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// A raw message, read: its envelope sender, what the send takes from its header, and its
/// MIME as it will be stored.
pub struct RawMessage {
    pub envelope_from: EmailAddress,
    pub from: EmailAddress,
    pub subject: String,
    /// The message's Message-ID (without brackets), made here when it had none.
    pub message_id: String,
    /// Whether the Message-ID was the client's (a repeat of it is the same send).
    pub client_message_id: bool,
    pub email_type: Option<String>,
    pub topic: Option<String>,
    pub tags: Vec<Tag>,
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    pub mime: Vec<u8>,
}

impl RawMessage {
    /// Reads `mime`, sent from `envelope_from`; `our_unsubscribe`: lifecycle and marketing
    /// mail gets our `List-Unsubscribe`, which replaces the client's.
    pub fn parse(
        envelope_from: EmailAddress, mime: Vec<u8>, our_unsubscribe: bool,
    ) -> Result<Self, ApiError> {
        if mime.len() > MAX_RAW_BYTES {
            return Err(ApiError::PayloadTooLarge(format!(
                "the message is larger than {} MiB",
                MAX_RAW_BYTES / (1024 * 1024)
            )));
        }
        let parsed = mail_parser::MessageParser::default()
            .parse_headers(&mime)
            .ok_or_else(|| bad("the message has no header"))?;
        let from = parsed
            .from()
            .and_then(|a| a.first())
            .and_then(|a| a.address())
            .ok_or_else(|| bad("the message has no From: address"))?;
        let from = EmailAddress::parse(from)
            .ok_or_else(|| bad(format!("From: {from:?} is not a valid address")))?;
        let subject = one_line(parsed.subject().unwrap_or_default());
        let subject = if subject.trim().is_empty() {
            "(no subject)".to_owned()
        } else {
            subject
        };
        // Unfolded (RFC 5322 §2.2.3): a client folds a long value over lines.
        let field = |name: &str| {
            parsed
                .header_raw(name)
                .map(|v| v.replace(['\r', '\n'], "").trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let (email_type, topic) = (field(EMAIL_TYPE_FIELD), field(TOPIC_FIELD));
        let tags = field(TAGS_FIELD)
            .map(|f| tags::tags_of_field(&f))
            .transpose()?
            .unwrap_or_default();
        let metadata = field(METADATA_FIELD)
            .map(|f| tags::metadata_of_field(&f))
            .transpose()?;
        let client_id = parsed
            .message_id()
            .map(str::trim)
            .filter(|id| !id.is_empty())
            .map(|id| crate::sending::request::msg_id("Message-ID", id))
            .transpose()?;
        let client_message_id = client_id.is_some();
        let message_id = client_id
            .map(|id| id.trim_start_matches('<').trim_end_matches('>').to_owned())
            .unwrap_or_else(|| format!("{}@{}", uuid::Uuid::now_v7().simple(), from.domain()));
        let kind = EmailType::parse(email_type.as_deref());
        let mut drop: Vec<&str> = PRIVATE_FIELDS.to_vec();
        if our_unsubscribe && kind.is_some_and(|k| k != EmailType::Transactional) {
            drop.extend(UNSUBSCRIBE_FIELDS);
        }
        let mut kept = without_fields(&mime, &drop);
        if !client_message_id {
            let mut with_id = format!("Message-ID: <{message_id}>\r\n").into_bytes();
            with_id.append(&mut kept);
            kept = with_id;
        }
        Ok(Self {
            envelope_from,
            from,
            subject,
            message_id,
            client_message_id,
            email_type,
            topic,
            tags,
            metadata,
            mime: kept,
        })
    }

    /// The send this message is, to `rcpt_to`.
    pub(crate) fn send_body(&self, rcpt_to: Vec<EmailAddress>) -> SendBody {
        SendBody {
            to: Some(To::Many(
                rcpt_to
                    .into_iter()
                    .map(|a| ToItem::Address(a.to_string()))
                    .collect(),
            )),
            subject: Some(HeaderText::from(self.subject.as_str())),
            text: Some("(raw)".into()),
            from_email: Some(self.from.as_str().into()),
            email_type: self.email_type.as_deref().map(Into::into),
            topic: self.topic.as_deref().map(HeaderText::from),
            tags: Some(self.tags.clone()).filter(|t| !t.is_empty()),
            metadata: self.metadata.clone(),
            ..SendBody::default()
        }
    }

    /// The task's message: the header's facts; its MIME is stored beside it.
    pub fn task_message(&self) -> TaskMessage {
        TaskMessage {
            from_email: self.from.to_string(),
            from_name: None,
            reply_to: None,
            cc: Vec::new(),
            bcc: Vec::new(),
            subject: self.subject.clone(),
            html: String::new(),
            text: String::new(),
            message_id: Some(format!("<{}>", self.message_id)),
            in_reply_to: None,
            references: Vec::new(),
            test: false,
            envelope_from: Some(self.envelope_from.to_string()),
            ..TaskMessage::default()
        }
    }

    /// A repeat within a day of a message with the client's own Message-ID, from the same
    /// envelope sender to the same envelope recipients and under the same kind of key, is
    /// the same send (a relay that splits a message's recipients into several transactions
    /// sends each part, and a retry of the recipients refused before is no repeat).
    pub(crate) fn keyed(&self, rcpt_to: &[EmailAddress], test: bool) -> Option<Keyed> {
        if !self.client_message_id {
            return None;
        }
        let mut recipients: Vec<String> = rcpt_to.iter().map(EmailAddress::key).collect();
        recipients.sort_unstable();
        recipients.dedup();
        let mut digest = Sha256::new();
        for part in [self.message_id.clone(), self.envelope_from.key()]
            .into_iter()
            .chain(recipients)
        {
            digest.update(part.as_bytes());
            digest.update([0]);
        }
        digest.update([u8::from(test)]);
        let digest = digest.finalize();
        let key = IdempotencyKey::parse(&format!("mid_{digest:x}")).ok()?;
        Some(Keyed::within(key, REPEAT_WINDOW_SECS))
    }
}

/// `text` on one line of at most 998 characters (control characters become spaces).
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(998)
        .collect()
}

/// The length of the header field name `line` starts with, if it starts with one.
fn field_name(line: &[u8]) -> Option<&[u8]> {
    let colon = line.iter().position(|&b| b == b':')?;
    let name = line[..colon].trim_ascii_end();
    (!name.is_empty() && name.iter().all(|&b| b.is_ascii_graphic())).then_some(name)
}

/// `mime` without the header fields `drop` names (in any case), folded lines included;
/// the body untouched. One pass over the header.
pub fn without_fields(mime: &[u8], drop: &[&str]) -> Vec<u8> {
    let mut out = Vec::with_capacity(mime.len());
    let (mut pos, mut skipping) = (0, false);
    while pos < mime.len() {
        let end = mime[pos..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(mime.len(), |i| pos + i + 1);
        let line = &mime[pos..end];
        if line == b"\r\n" || line == b"\n" {
            break;
        }
        if !matches!(line.first(), Some(b' ' | b'\t')) {
            skipping = field_name(line)
                .is_some_and(|name| drop.iter().any(|d| d.as_bytes().eq_ignore_ascii_case(name)));
        }
        if !skipping {
            out.extend_from_slice(line);
        }
        pos = end;
    }
    out.extend_from_slice(&mime[pos..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_fields_go_with_their_folded_lines_and_the_body_stays() {
        let mime = b"From: a@example.com\r\nBcc: x@example.com,\r\n y@example.com\r\n\
X-POSTMESH-TOPIC: news\r\nSubject: hi\r\nResent-Bcc: z@example.com\r\n\r\nBcc: not a header\r\n";
        let kept = without_fields(mime, &PRIVATE_FIELDS);
        assert_eq!(
            kept,
            b"From: a@example.com\r\nSubject: hi\r\n\r\nBcc: not a header\r\n"
        );
    }

    #[test]
    fn a_header_without_a_body_or_line_ends_is_kept_whole() {
        assert_eq!(
            without_fields(b"Subject: x", &PRIVATE_FIELDS),
            b"Subject: x"
        );
        assert_eq!(without_fields(b"", &PRIVATE_FIELDS), b"");
        // Hostile: a long run of folded lines and no colon is read once, linearly.
        let mut hostile = b"Bcc: a\r\n".to_vec();
        hostile.extend(std::iter::repeat_n(b" x\r\n".as_slice(), 200_000).flatten());
        hostile.extend_from_slice(b"\r\nbody");
        assert_eq!(without_fields(&hostile, &PRIVATE_FIELDS), b"\r\nbody");
    }

    #[test]
    fn a_message_without_an_id_gets_one_on_the_senders_domain() {
        let from = EmailAddress::parse("env@example.com").unwrap();
        let raw = b"From: Ann <ann@example.org>\r\nSubject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\n\
X-Postmesh-Email-Type: marketing\r\nList-Unsubscribe: <https://x>\r\n\r\nbody\r\n";
        let m = RawMessage::parse(from, raw.to_vec(), true).unwrap();
        assert_eq!(m.from.as_str(), "ann@example.org");
        assert_eq!(m.subject, "Grüße");
        assert_eq!(m.email_type.as_deref(), Some("marketing"));
        assert!(!m.client_message_id && m.keyed(&[], false).is_none());
        assert!(m.message_id.ends_with("@example.org"), "{}", m.message_id);
        let text = String::from_utf8(m.mime).unwrap();
        assert!(text.starts_with(&format!("Message-ID: <{}>\r\n", m.message_id)));
        assert!(!text.contains("X-Postmesh") && !text.contains("List-Unsubscribe"));
        assert!(text.ends_with("\r\n\r\nbody\r\n"));
    }

    #[test]
    fn folded_fields_are_read_unfolded_and_a_clients_unsubscribe_stays_without_ours() {
        let from = EmailAddress::parse("env@example.com").unwrap();
        let raw = b"From: a@example.com\r\nX-Postmesh-Email-Type: marketing\r\n\
X-Postmesh-Metadata: {\"customer\": \"Jane\r\n Doe\"}\r\nX-Postmesh-Topic: weekly\r\n news\r\n\
List-Unsubscribe: <https://client.example/u>\r\n\r\nbody\r\n";
        let m = RawMessage::parse(from.clone(), raw.to_vec(), false).unwrap();
        let metadata = m.metadata.as_ref().unwrap();
        assert_eq!(metadata["customer"], "Jane Doe");
        assert_eq!(m.topic.as_deref(), Some("weekly news"));
        let text = String::from_utf8(m.mime).unwrap();
        assert!(
            text.contains("List-Unsubscribe: <https://client.example/u>"),
            "{text}"
        );
        let ours = RawMessage::parse(from, raw.to_vec(), true).unwrap();
        assert!(!String::from_utf8(ours.mime)
            .unwrap()
            .contains("List-Unsubscribe"));
    }

    #[test]
    fn a_message_without_from_or_with_a_bad_id_is_refused() {
        let from = EmailAddress::parse("env@example.com").unwrap();
        assert!(RawMessage::parse(from.clone(), b"Subject: x\r\n\r\nbody".to_vec(), true).is_err());
        let bad_id = b"From: a@example.com\r\nMessage-ID: <no-at-sign>\r\n\r\n";
        assert!(RawMessage::parse(from.clone(), bad_id.to_vec(), true).is_err());
        let id = b"From: a@example.com\r\nMessage-ID: <x@y>\r\n\r\n";
        let m = RawMessage::parse(from, id.to_vec(), true).unwrap();
        assert_eq!((m.message_id.as_str(), m.client_message_id), ("x@y", true));
        assert_eq!(m.mime, id);
    }

    #[test]
    fn a_repeat_is_the_same_message_to_the_same_envelope() {
        let address = |a: &str| EmailAddress::parse(a).unwrap();
        let raw = b"From: a@example.com\r\nMessage-ID: <x@y>\r\n\r\nbody".to_vec();
        let message = |from: &str| RawMessage::parse(address(from), raw.clone(), true).unwrap();
        let key = |m: &RawMessage, to: &[&str], test: bool| {
            let to: Vec<EmailAddress> = to.iter().map(|a| address(a)).collect();
            m.keyed(&to, test).unwrap().key.as_str().to_owned()
        };
        let m = message("env@example.com");
        let first = key(&m, &["b@x.io", "c@x.io"], false);
        assert_eq!(first, key(&m, &["C@x.io", "b@x.io", "b@x.io"], false));
        assert_ne!(
            first,
            key(&m, &["d@x.io"], false),
            "a relay's next transaction"
        );
        assert_ne!(
            first,
            key(&m, &["b@x.io"], false),
            "the refused part retried"
        );
        assert_ne!(
            first,
            key(&m, &["b@x.io", "c@x.io"], true),
            "a test key's send"
        );
        let other_sender = message("bounce@example.com");
        assert_ne!(first, key(&other_sender, &["b@x.io", "c@x.io"], false));
    }
}
