//! What a delivery sends: the `inbound.received` event of a message, in the endpoint's body
//! format, or a stored delivery event (`email.*`), signed as Standard Webhooks says — `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, one signature per
//! secret in force (two while a rotated-out secret still signs).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

use postmesh_shared::proto::InboundMessageReply;
use postmesh_shared::text::cut_at;

use crate::content::quotes;
use crate::content::quotes::BodyFormat;

/// The event type of a received message.
pub const INBOUND_RECEIVED: &str = "inbound.received";

/// The JSON body of a delivery; it borrows the message, which each of its targets shares.
#[derive(Debug, Serialize)]
pub struct Event<'m> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// When the event was made (RFC 3339).
    pub timestamp: String,
    pub data: Data<'m>,
}

/// A received message as a webhook shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Data<'m> {
    /// The stored copy's id.
    pub message_id: String,
    /// Its `Message-ID` header (without angle brackets), when it has one.
    pub email_id: Option<&'m str>,
    pub address_id: &'m str,
    pub address: &'m str,
    pub thread_id: &'m str,
    pub from: From<'m>,
    pub to: &'m [String],
    pub cc: &'m [String],
    pub subject: &'m str,
    pub in_reply_to: Option<&'m str>,
    pub references: &'m [String],
    pub received_at: i64,
    pub body_format: BodyFormat,
    pub body: String,
    pub stripped_quotes: bool,
    pub truncated: bool,
    pub attachments: Vec<Attachment<'m>>,
    pub authentication: Authentication<'m>,
}

/// The sender, as `From:` gives it.
#[derive(Debug, Serialize)]
pub struct From<'m> {
    pub address: &'m str,
    pub name: Option<&'m str>,
}

/// An attachment, listed.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment<'m> {
    pub filename: Option<&'m str>,
    pub content_type: &'m str,
    pub size: i64,
}

/// What the MTA found out about the message's origin.
#[derive(Debug, Serialize)]
pub struct Authentication<'m> {
    pub spf: &'m str,
    pub dkim: &'m str,
    pub dmarc: &'m str,
}

/// How a target wants its bodies.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub format: BodyFormat,
    pub strip_quotes: bool,
    /// Bodies longer than this (bytes) are cut, with `truncated`.
    pub max_body_bytes: usize,
}

fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

impl<'m> Event<'m> {
    /// The event of message `m` for a target of `shape`, made at `now` (RFC 3339).
    pub fn received(
        m: &'m InboundMessageReply, message_id: String, shape: Shape, now: String,
    ) -> Self {
        let rendered = quotes::render(
            m.text.as_deref(),
            m.html.as_deref(),
            shape.format,
            shape.strip_quotes,
        );
        let (body, cut) = cut_at(rendered.body, shape.max_body_bytes);
        Self {
            kind: INBOUND_RECEIVED,
            timestamp: now,
            data: Data {
                message_id,
                email_id: non_empty(&m.email_id),
                address_id: &m.address_id,
                address: &m.address,
                thread_id: &m.thread_id,
                from: From {
                    address: &m.from_address,
                    name: non_empty(&m.from_name),
                },
                to: &m.to,
                cc: &m.cc,
                subject: &m.subject,
                in_reply_to: non_empty(&m.in_reply_to),
                references: &m.references,
                received_at: m.received_at,
                body_format: shape.format,
                body,
                stripped_quotes: rendered.stripped_quotes,
                truncated: cut || m.truncated,
                attachments: m
                    .attachments
                    .iter()
                    .map(|a| Attachment {
                        filename: non_empty(&a.filename),
                        content_type: &a.content_type,
                        size: a.size,
                    })
                    .collect(),
                authentication: Authentication {
                    spf: &m.spf,
                    dkim: &m.dkim,
                    dmarc: &m.dmarc,
                },
            },
        }
    }
}

/// The JSON body of a delivery event's delivery: its stored type and data, stamped now.
#[derive(Debug, Serialize)]
pub struct Envelope<'e, D: ?Sized = serde_json::Value> {
    #[serde(rename = "type")]
    pub kind: &'e str,
    /// When this delivery was made (RFC 3339).
    pub timestamp: String,
    /// The stored data: a `Value`, or as read from the database, unparsed.
    pub data: &'e D,
}

impl<'e, D: Serialize + ?Sized> Envelope<'e, D> {
    /// The body of event `kind` with `data`, made at `now`.
    pub fn new(kind: &'e str, now: String, data: &'e D) -> Self {
        Self {
            kind,
            timestamp: now,
            data,
        }
    }
}

/// `webhook-id` of an attempt: the same for every retry of it.
pub fn webhook_id(attempt: uuid::Uuid) -> String {
    format!("msg_{}", attempt.simple())
}

/// The `webhook-signature` header: `v1,<signature>` for each key, space-separated.
pub fn sign(keys: &[&[u8]], id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter()
        .map(|key| {
            let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(timestamp.to_string().as_bytes());
            mac.update(b".");
            mac.update(body);
            format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_follow_standard_webhooks() {
        // The example of the Standard Webhooks specification.
        let key = STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        let header = sign(&[&key], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(header, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let two = sign(&[&key, b"another key"], "msg_x", 1, b"{}");
        assert_eq!(two.split(' ').count(), 2);
        assert!(two.split(' ').all(|s| s.starts_with("v1,")));
    }
}
