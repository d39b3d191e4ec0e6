//! Stage 2, build: the MIME message of a job — Message-ID on our domain (or the sender's
//! own), Date, From/To/Cc/Reply-To, the threading headers, plain text and HTML as
//! alternatives, and attachments — from a code email's job or a task's stored message; a
//! raw message's stored MIME as its client wrote it.

use lettre::address::Envelope;
use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Attachment, Mailbox, MultiPart, SinglePart};
use lettre::Message;
use std::borrow::Cow;

use postmesh_shared::proto::CodeEmail;

use crate::delivery::transport::Outgoing;
use crate::sending::render::put_unsubscribe;
use crate::sending::tasks::LoadedTask;

/// Marks a test send (`testSend`).
const TEST_HEADER: &str = "X-Postmesh-Test";

/// What a message is made of.
pub(super) struct Draft<'a> {
    pub message_id: String,
    pub from_email: &'a str,
    pub from_name: Option<&'a str>,
    pub to: &'a str,
    pub cc: &'a [String],
    pub bcc: &'a [String],
    pub reply_to: Option<&'a str>,
    pub subject: &'a str,
    pub text: Cow<'a, str>,
    pub html: Cow<'a, str>,
    /// The recipient's one-click unsubscribe link (`List-Unsubscribe`).
    pub unsubscribe: Option<String>,
    pub in_reply_to: Option<&'a str>,
    pub references: &'a [String],
    pub attachments: &'a [crate::sending::request::Attachment],
    pub test: bool,
}

impl<'a> Draft<'a> {
    /// The draft of a verification code email.
    pub fn of_code(code: &'a CodeEmail, message_id: String) -> Self {
        Self {
            message_id,
            from_email: &code.from_email,
            from_name: None,
            to: &code.to,
            cc: &[],
            bcc: &[],
            reply_to: None,
            subject: &code.subject,
            text: Cow::Borrowed(&code.text),
            html: Cow::Borrowed(""),
            unsubscribe: None,
            in_reply_to: None,
            references: &[],
            attachments: &[],
            test: false,
        }
    }

    /// The draft of a task's message to `to`; `message_id` unless the task sets its own;
    /// with the recipient's `unsubscribe` link in its header and in place of
    /// `{{unsubscribe_url}}`.
    pub fn of_task(
        task: &'a LoadedTask, to: &'a str, message_id: String, unsubscribe: Option<String>,
    ) -> Self {
        let m = &task.message;
        Self {
            message_id: m.message_id.clone().unwrap_or(message_id),
            from_email: &m.from_email,
            from_name: m.from_name.as_deref(),
            to,
            cc: &m.cc,
            bcc: &m.bcc,
            reply_to: m.reply_to.as_deref(),
            subject: &m.subject,
            text: put_unsubscribe(&m.text, unsubscribe.as_deref(), false),
            html: put_unsubscribe(&m.html, unsubscribe.as_deref(), true),
            unsubscribe,
            in_reply_to: m.in_reply_to.as_deref(),
            references: &m.references,
            attachments: &task.attachments,
            test: m.test,
        }
    }
}

fn mailbox(what: &str, raw: &str) -> Result<Mailbox, String> {
    raw.parse()
        .map_err(|e| format!("invalid {what} address {raw:?}: {e}"))
}

/// The body: text and/or HTML (as alternatives when both).
fn body(text: &str, html: &str) -> MultiPart {
    match (text.is_empty(), html.is_empty()) {
        (false, false) => MultiPart::alternative_plain_html(text.to_owned(), html.to_owned()),
        (true, false) => MultiPart::mixed().singlepart(SinglePart::html(html.to_owned())),
        _ => MultiPart::mixed().singlepart(SinglePart::plain(text.to_owned())),
    }
}

/// The draft's message; the error says why it can never be built.
pub(super) fn build(d: &Draft<'_>) -> Result<Message, String> {
    let from = match d.from_name {
        Some(name) => Mailbox::new(
            Some(name.to_owned()),
            d.from_email
                .parse()
                .map_err(|e| format!("invalid from address: {e}"))?,
        ),
        None => mailbox("from", d.from_email)?,
    };
    let mut builder = Message::builder()
        .message_id(Some(d.message_id.clone()))
        .date_now()
        .from(from)
        .subject(d.subject);
    builder = builder.to(mailbox("recipient", d.to)?);
    for cc in d.cc {
        builder = builder.cc(mailbox("cc", cc)?);
    }
    for bcc in d.bcc {
        builder = builder.bcc(mailbox("bcc", bcc)?);
    }
    if let Some(reply_to) = d.reply_to {
        builder = builder.reply_to(mailbox("reply-to", reply_to)?);
    }
    if let Some(id) = d.in_reply_to {
        builder = builder.in_reply_to(id.to_owned());
    }
    if !d.references.is_empty() {
        builder = builder.references(d.references.join(" "));
    }
    if let Some(link) = &d.unsubscribe {
        // RFC 8058 one-click: a POST to the link unsubscribes.
        builder = builder
            .raw_header(HeaderValue::new(
                HeaderName::new_from_ascii_str("List-Unsubscribe"),
                format!("<{link}>"),
            ))
            .raw_header(HeaderValue::new(
                HeaderName::new_from_ascii_str("List-Unsubscribe-Post"),
                "List-Unsubscribe=One-Click".into(),
            ));
    }
    if d.test {
        builder = builder.raw_header(HeaderValue::new(
            HeaderName::new_from_ascii_str(TEST_HEADER),
            "true".into(),
        ));
    }
    let built = if d.attachments.is_empty() {
        match (d.text.is_empty(), d.html.is_empty()) {
            (false, false) => builder.multipart(body(&d.text, &d.html)),
            (true, false) => builder.singlepart(SinglePart::html(d.html.to_string())),
            _ => builder.singlepart(SinglePart::plain(d.text.to_string())),
        }
    } else {
        let mut mixed = MultiPart::mixed().multipart(body(&d.text, &d.html));
        for a in d.attachments {
            let kind = ContentType::parse(&a.content_type)
                .map_err(|e| format!("attachment {:?}: {e}", a.filename))?;
            mixed =
                mixed.singlepart(Attachment::new(a.filename.clone()).body(a.content.clone(), kind));
        }
        builder.multipart(mixed)
    };
    built.map_err(|e| format!("could not build the message: {e}"))
}

/// A raw task's message to `to`: its stored MIME as the client wrote it, after the
/// recipient's one-click unsubscribe fields when it has a link.
pub(super) fn raw(
    task: &LoadedTask, mime: &[u8], to: &str, unsubscribe: Option<&str>,
) -> Result<Outgoing, String> {
    let m = &task.message;
    let address = |what: &str, a: &str| {
        a.parse::<lettre::Address>()
            .map_err(|e| format!("invalid {what} address {a:?}: {e}"))
    };
    let from = address(
        "envelope sender",
        m.envelope_from.as_deref().unwrap_or(&m.from_email),
    )?;
    let envelope = Envelope::new(Some(from), vec![address("recipient", to)?])
        .map_err(|e| format!("invalid envelope: {e}"))?;
    let mut bytes = Vec::with_capacity(mime.len() + 256);
    if let Some(link) = unsubscribe {
        // RFC 8058 one-click, as on the messages built here.
        bytes.extend_from_slice(
            format!(
                "List-Unsubscribe: <{link}>\r\nList-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n"
            )
            .as_bytes(),
        );
    }
    bytes.extend_from_slice(mime);
    Ok(Outgoing {
        envelope,
        bytes,
        message_id: m.message_id.clone().unwrap_or_default(),
    })
}
