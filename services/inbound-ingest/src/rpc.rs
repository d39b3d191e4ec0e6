//! The inbound service's typed RPCs: `address` (is this a live inbox of the workspace?),
//! `message` (a stored copy as a webhook shows it) and its answer to billing's `usage`
//! (mailboxes).

use serde_json::Value;

use postmesh_shared::text::cut_at;

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
    Ok(InboundMessageReply {
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
    })
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
