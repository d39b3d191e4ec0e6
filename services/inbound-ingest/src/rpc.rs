//! The inbound service's typed RPCs: `address` (is this a live inbox of the workspace?),
//! `message` (a stored copy as a webhook shows it) and its answer to billing's `usage`
//! (mailboxes).

use serde_json::Value;

use postmesh_shared::text::cut_at;
use prost::Message as _;

use postmesh_shared::extract::rpc_workspace;
use postmesh_shared::nats::ServiceHost;
use postmesh_shared::proto::{
    InboundAttachment, InboundMessageReply, InboundMessageRequest, InboxAddressReply,
    InboxAddressRequest, OverviewReply, OverviewRequest, UsageReply, UsageRequest,
};
use postmesh_shared::{AddressId, ApiError, InboundMessageId};

use crate::mime::{Attachment, Parsed};
use crate::threads::raw_of;
use crate::{addresses, AppState};

/// Adds the inbound service's RPCs to `host`.
pub fn register(host: ServiceHost, state: AppState) -> ServiceHost {
    host.rpc(state.clone(), address)
        .rpc(state.clone(), message)
        .method(state.clone(), usage)
        .method(state, overview)
}

/// The workspace's unread threads, for the operations overview.
async fn overview(state: AppState, req: OverviewRequest) -> Result<OverviewReply, ApiError> {
    let unread_threads: i64 =
        sqlx::query_scalar("SELECT count(*) FROM threads WHERE workspace_id = $1 AND unread")
            .bind(rpc_workspace(&req.workspace_id)?)
            .fetch_one(&state.db)
            .await?;
    Ok(OverviewReply {
        unread_threads,
        ..OverviewReply::default()
    })
}

/// The workspace's live address `address_id`, if it is one (a malformed id is none).
async fn address(state: AppState, req: InboxAddressRequest) -> Result<InboxAddressReply, ApiError> {
    let workspace = rpc_workspace(&req.workspace_id)?;
    let Some(id) = AddressId::parse(&req.address_id) else {
        return Ok(InboxAddressReply::default());
    };
    Ok(match addresses::owned(&state.db, workspace, id).await? {
        Some(address) => InboxAddressReply {
            found: true,
            address,
        },
        None => InboxAddressReply::default(),
    })
}

/// The live inbox addresses of a workspace; other counts belong to other services.
async fn usage(state: AppState, req: UsageRequest) -> Result<UsageReply, ApiError> {
    Ok(UsageReply {
        mailboxes: addresses::count(&state.db, rpc_workspace(&req.workspace_id)?).await?,
        ..UsageReply::default()
    })
}

/// A stored copy's columns, as `message` reads them.
#[derive(sqlx::FromRow)]
struct MessageRow {
    message_id: Option<String>,
    address_id: uuid::Uuid,
    address: String,
    thread_id: uuid::Uuid,
    from: String,
    to_header: Vec<String>,
    cc_header: Vec<String>,
    subject: String,
    in_reply_to: Option<String>,
    refs: Vec<String>,
    received_at: i64,
    text_body: Option<String>,
    html_body: Option<String>,
    bodies_in_raw: bool,
    #[sqlx(json)]
    attachments: Vec<Attachment>,
    authentication: Value,
}

/// The workspace's stored copy `message_id` with its bodies cut to `max_body_bytes`, or
/// not found (a malformed id, another workspace's copy, a deleted address's).
async fn message(
    state: AppState, req: InboundMessageRequest,
) -> Result<InboundMessageReply, ApiError> {
    let workspace = rpc_workspace(&req.workspace_id)?;
    let Some(id) = InboundMessageId::parse(&req.message_id) else {
        return Ok(InboundMessageReply::default());
    };
    let row: Option<MessageRow> = sqlx::query_as(
        "SELECT m.message_id, m.address_id, a.address, m.thread_id,
             COALESCE(m.from_header, m.envelope_from) AS from, m.to_header, m.cc_header,
             m.subject, m.in_reply_to, m.refs, m.received_at, m.text_body, m.html_body,
             m.bodies_in_raw, m.attachments, m.authentication
         FROM messages m JOIN addresses a ON a.id = m.address_id AND a.deleted_at IS NULL
         WHERE m.id = $1 AND m.workspace_id = $2",
    )
    .bind(id)
    .bind(workspace)
    .fetch_optional(&state.db)
    .await?;
    let Some(mut row) = row else {
        return Ok(InboundMessageReply::default());
    };
    if row.bodies_in_raw {
        let whole = Parsed::whole(&raw_of(&state.db, id).await?).content;
        (row.text_body, row.html_body) = (whole.text, whole.html);
    }
    let limit = usize::try_from(req.max_body_bytes).unwrap_or(usize::MAX);
    let mut truncated = false;
    let mut cut = |body: Option<String>| {
        body.map(|b| {
            let (b, cut) = cut_at(b, limit);
            truncated |= cut;
            b
        })
    };
    let (text, html) = (cut(row.text_body), cut(row.html_body));
    let (from_name, from_address) = split_from(&row.from);
    let verdict = |check: &str| {
        row.authentication[check]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let mut reply = InboundMessageReply {
        found: true,
        email_id: row.message_id.unwrap_or_default(),
        address_id: row.address_id.to_string(),
        address: row.address,
        thread_id: row.thread_id.to_string(),
        from_address,
        from_name,
        to: row.to_header,
        cc: row.cc_header,
        subject: row.subject,
        in_reply_to: row.in_reply_to.unwrap_or_default(),
        references: row.refs,
        received_at: row.received_at,
        text,
        html,
        truncated,
        attachments: row
            .attachments
            .into_iter()
            .map(|a| InboundAttachment {
                filename: a.filename.unwrap_or_default(),
                content_type: a.content_type,
                size: i64::try_from(a.size).unwrap_or(i64::MAX),
            })
            .collect(),
        spf: verdict("spf"),
        dkim: verdict("dkim"),
        dmarc: verdict("dmarc"),
    };
    fit(&mut reply);
    Ok(reply)
}

/// The largest `message` reply: NATS carries 1 MiB at most, the envelope included.
const MAX_REPLY_BYTES: usize = 960 * 1024;
/// Bytes of one header value (the subject, an address, a reference, a file name) kept.
const MAX_FIELD_BYTES: usize = 998;
/// Addresses of `to`, of `cc`, and references kept.
const MAX_LIST: usize = 100;

/// `text` cut to [`MAX_FIELD_BYTES`]; whether it was.
fn cut_field(text: &mut String) -> bool {
    let (kept, cut) = cut_at(std::mem::take(text), MAX_FIELD_BYTES);
    *text = kept;
    cut
}

/// Cuts `reply` to fit one NATS message, whatever its sender put in it: each header value
/// to [`MAX_FIELD_BYTES`], each list to [`MAX_LIST`], then both bodies to what is left of
/// [`MAX_REPLY_BYTES`]; `truncated` says so. Too large, the reply could never be sent, and
/// the message's webhook would wait for it until it went to the dead letters.
fn fit(reply: &mut InboundMessageReply) {
    let mut cut = false;
    for text in [
        &mut reply.subject,
        &mut reply.from_name,
        &mut reply.from_address,
        &mut reply.in_reply_to,
    ] {
        cut |= cut_field(text);
    }
    for list in [&mut reply.to, &mut reply.cc, &mut reply.references] {
        if list.len() > MAX_LIST {
            list.truncate(MAX_LIST);
            cut = true;
        }
        for text in list.iter_mut() {
            cut |= cut_field(text);
        }
    }
    for attachment in &mut reply.attachments {
        cut |= cut_field(&mut attachment.filename);
        cut |= cut_field(&mut attachment.content_type);
    }
    let body_len = |b: &Option<String>| b.as_ref().map_or(0, String::len);
    let bodies = body_len(&reply.text) + body_len(&reply.html);
    // Less a few bytes: the bodies' length prefixes may grow or shrink as they are cut.
    let room = MAX_REPLY_BYTES.saturating_sub(reply.encoded_len() - bodies + 16);
    if bodies > room {
        for body in [&mut reply.text, &mut reply.html] {
            if let Some(b) = body.take() {
                *body = Some(cut_at(b, room / 2).0);
            }
        }
        cut = true;
    }
    reply.truncated |= cut;
}

/// `Name <addr>` as (name, address); a bare address has no name.
fn split_from(from: &str) -> (String, String) {
    match from.rsplit_once('<') {
        Some((name, rest)) if rest.ends_with('>') => (
            name.trim().trim_matches('"').to_owned(),
            rest.trim_end_matches('>').trim().to_owned(),
        ),
        _ => (String::new(), from.trim().to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_of_any_message_fits_one_nats_message() {
        let long = |n: usize| "x".repeat(n);
        let mut reply = InboundMessageReply {
            found: true,
            subject: long(300_000),
            to: vec![long(400); 1000],
            cc: vec![long(400); 1000],
            references: vec![long(2000); 1000],
            text: Some(long(400_000)),
            html: Some(long(400_000)),
            attachments: vec![
                InboundAttachment {
                    filename: long(6000),
                    content_type: long(6000),
                    size: 1,
                };
                100
            ],
            ..Default::default()
        };
        fit(&mut reply);
        assert!(
            reply.encoded_len() <= MAX_REPLY_BYTES,
            "{}",
            reply.encoded_len()
        );
        assert!(reply.truncated);
        assert_eq!(
            (reply.to.len(), reply.subject.len()),
            (MAX_LIST, MAX_FIELD_BYTES)
        );
        // A message of ordinary size is left whole.
        let mut small = InboundMessageReply {
            subject: "Hello".into(),
            text: Some(long(200_000)),
            ..Default::default()
        };
        fit(&mut small);
        assert_eq!(small.text.as_ref().map(String::len), Some(200_000));
        assert!(!small.truncated);
    }

    #[test]
    fn a_from_header_splits_into_name_and_address() {
        assert_eq!(
            split_from("Ann Lee <ann@example.com>"),
            ("Ann Lee".into(), "ann@example.com".into())
        );
        assert_eq!(
            split_from("ann@example.com"),
            (String::new(), "ann@example.com".into())
        );
    }
}
