//! The upstream MTA's two calls (the gateway checks its secret): `validate` at RCPT TO and
//! `ingest` at DATA. A message is stored once per recipient inbox, deduplicated by a unique
//! index on (inbox, Message-ID or SHA-256), threaded, and announced on the INBOUND stream
//! through the outbox in the transaction that stores it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;

use axum::body::Bytes;
use axum::extract::State;
use base64::Engine as _;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgConnection;
use utoipa::openapi::schema::{AnyOfBuilder, KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};

use postmesh_shared::db::{self, now_unix, Turns};
use postmesh_shared::extract::{holds_nul, JsonBody};
use postmesh_shared::jetstream::outbox::{self, OutboxMessage};
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::InboundReceived;
use postmesh_shared::text::cut_at;
use postmesh_shared::{cpu, AddressId, ApiError, InboundMessageId, Success, WorkspaceId};

use crate::addresses::{self, InboxAddress};
use crate::mime::{self, Parsed};
use crate::threads;
use crate::AppState;

/// The largest message accepted, decoded (spec §8).
pub const MAX_MESSAGE_BYTES: usize = 10 * 1024 * 1024;

/// The body of `POST /inbound-email/validate`: a recipient given at RCPT TO.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = InboundValidateRequest)]
pub(crate) struct ValidateBody {
    address: String,
}

/// `POST /inbound-email/validate` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = InboundValidation)]
pub struct Validated {
    pub accepted: bool,
}

pub(crate) async fn validate(
    State(state): State<AppState>, JsonBody(body): JsonBody<ValidateBody>,
) -> Result<Success<Validated>, ApiError> {
    let accepted = match InboxAddress::of_recipient(&body.address) {
        Some(inbox) => addresses::receiving(&state, &inbox).await?.is_some(),
        None => false,
    };
    Ok(Success::new(Validated { accepted }))
}

/// `POST /inbound-email/ingest` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = InboundIngested)]
pub struct Ingested {
    /// Copies stored now (one per recipient inbox).
    pub stored: u32,
    /// Copies that were stored before (a retry, or the same message again).
    pub duplicates: u32,
}

/// The body as the MTA sends it; `rawBase64` is borrowed from the request, not copied.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = InboundIngestRequest)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IngestBody<'a> {
    from: String,
    /// The envelope recipients; those that are not a live inbox are left out (none: 404).
    #[schema(min_items = 1)]
    to: Vec<String>,
    /// The message, base64 (ASCII whitespace ignored); not empty.
    #[serde(borrow)]
    #[schema(
        content_encoding = "base64",
        min_length = 4,
        pattern = r"^[A-Za-z0-9+/=\t\n\f\r ]+$"
    )]
    raw_base64: Cow<'a, str>,
    /// Checked apart from the rest: missing or malformed is 503 (the MTA retries).
    #[serde(default)]
    #[schema(value_type = Authentication, required = true)]
    authentication: Option<Value>,
}

/// What the MTA found out about the message's origin, stored with each copy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = InboundAuthentication)]
#[serde(rename_all = "camelCase")]
pub struct Authentication {
    #[schema(schema_with = ip_address_schema)]
    pub source_ip: IpAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helo: Option<String>,
    pub spf: Verdict,
    pub dkim: Verdict,
    pub dmarc: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Whatever detail the MTA adds, kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<Value>,
}

/// A check's result word (`pass`, `fail`, `none`, `softfail`, `temperror`, ...), lower case.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Verdict(String);

impl TryFrom<String> for Verdict {
    type Error = String;

    fn try_from(word: String) -> Result<Self, String> {
        let ok = (1..=32).contains(&word.len()) && word.chars().all(|c| c.is_ascii_alphabetic());
        if ok {
            Ok(Self(word.to_ascii_lowercase()))
        } else {
            Err(format!(
                "{word:?} is not a result word such as pass, fail or none"
            ))
        }
    }
}

impl From<Verdict> for String {
    fn from(v: Verdict) -> String {
        v.0
    }
}

/// A string of 1-32 ASCII letters, as [`Verdict::try_from`] accepts.
impl utoipa::PartialSchema for Verdict {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(32))
            .pattern(Some("^[A-Za-z]+$"))
            .description(Some(
                "A check's result word (pass, fail, none, softfail, temperror, ...).",
            ))
            .into()
    }
}

impl utoipa::ToSchema for Verdict {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("InboundVerdict")
    }
}

/// An IPv4 or IPv6 address, as [`IpAddr`] reads and writes it.
fn ip_address_schema() -> RefOr<Schema> {
    let ip = |format| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(format)))
    };
    AnyOfBuilder::new()
        .item(ip(KnownFormat::Ipv4))
        .item(ip(KnownFormat::Ipv6))
        .into()
}

impl Authentication {
    /// The `authentication` object of a request: 503 when missing or malformed, so the MTA
    /// keeps the message and retries once it sends what is needed.
    fn of(raw: Option<Value>) -> Result<Self, ApiError> {
        let raw = raw.ok_or_else(|| {
            ApiError::Unavailable("authentication is missing: retry with the MTA's results".into())
        })?;
        serde_json::from_value(raw)
            .map_err(|e| ApiError::Unavailable(format!("authentication is malformed: {e}")))
    }
}

/// A copy to store: the inbox and its workspace.
type Inbox = (AddressId, WorkspaceId, InboxAddress);

pub(crate) async fn ingest(
    State(state): State<AppState>, body: Bytes,
) -> Result<Success<Ingested>, ApiError> {
    // Decoded and parsed on the CPU pool when large, off the worker other requests share.
    let (raw, envelope_from, recipients, auth) =
        cpu::run_sized(body.len(), move || decode(&body)).await?;
    let inboxes = inboxes_of(&state, &recipients).await?;
    let workspaces: Vec<WorkspaceId> = inboxes.iter().map(|(_, w, _)| *w).collect();
    state
        .budget
        .spend(&state.db, &workspaces, raw.len())
        .await?;
    let (raw, parsed) = cpu::run_sized(raw.len(), move || {
        let parsed = Parsed::of(&raw);
        (raw, parsed)
    })
    .await;
    let mut conn = state.db.acquire().await?;
    let subject = Stream::Inbound.subject(&state.ns);
    let (stored, duplicates) = store(
        &mut conn,
        &inboxes,
        &raw,
        &parsed,
        &envelope_from,
        &auth,
        subject,
    )
    .await?;
    drop(conn);
    tracing::info!(
        stored = stored.len(),
        duplicates,
        size = raw.len(),
        "inbound message ingested"
    );
    if let Some(outbox) = &state.outbox {
        for id in &stored {
            // The relay publishes what this does not.
            if let Err(e) = outbox.publish_now(id.as_uuid()).await {
                tracing::warn!(error = %e, "INBOUND publish deferred to the relay");
            }
        }
    }
    Ok(Success::new(Ingested {
        stored: stored.len() as u32,
        duplicates,
    }))
}

/// The request's message (decoded), envelope sender, recipients and authentication, in the
/// order of the checks: bad JSON (or an escaped NUL) 400, over 10 MiB 413 (from the base64 length, before
/// decoding), authentication 503, bad base64 400.
fn decode(body: &[u8]) -> Result<(Vec<u8>, String, Vec<String>, Authentication), ApiError> {
    // The envelope and its authentication are stored as text and jsonb, which hold no NUL
    // (the message itself is base64 and may hold anything).
    if holds_nul(body) {
        return Err(ApiError::BadRequest(
            "invalid body: text must not hold NUL characters (\\u0000)".into(),
        ));
    }
    let req: IngestBody<'_> = serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("invalid body: {e}")))?;
    let encoded: Cow<'_, str> = if req.raw_base64.contains(|c: char| c.is_ascii_whitespace()) {
        Cow::Owned(req.raw_base64.split_ascii_whitespace().collect())
    } else {
        Cow::Borrowed(&req.raw_base64)
    };
    if decoded_len(&encoded) > MAX_MESSAGE_BYTES {
        return Err(too_large());
    }
    let auth = Authentication::of(req.authentication)?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded.as_bytes())
        .map_err(|e| ApiError::BadRequest(format!("rawBase64 is not base64: {e}")))?;
    if raw.len() > MAX_MESSAGE_BYTES {
        return Err(too_large());
    }
    if raw.is_empty() {
        return Err(ApiError::BadRequest("rawBase64 holds no message".into()));
    }
    Ok((raw, req.from, req.to, auth))
}

fn too_large() -> ApiError {
    ApiError::PayloadTooLarge(format!(
        "the message is over {MAX_MESSAGE_BYTES} bytes (10 MiB)"
    ))
}

/// The decoded length of padded base64 text.
fn decoded_len(encoded: &str) -> usize {
    let padding = encoded
        .bytes()
        .rev()
        .take_while(|&b| b == b'=')
        .count()
        .min(2);
    (encoded.len() / 4 * 3 + (encoded.len() % 4).saturating_sub(1)).saturating_sub(padding)
}

/// The live inboxes among `recipients`, each once, in a stable order (the order their locks
/// are taken in); 404 when there is none.
async fn inboxes_of(state: &AppState, recipients: &[String]) -> Result<Vec<Inbox>, ApiError> {
    let wanted: BTreeMap<String, InboxAddress> = recipients
        .iter()
        .filter_map(|r| InboxAddress::of_recipient(r))
        .map(|a| (a.as_str().to_owned(), a))
        .collect();
    let mut inboxes = Vec::new();
    for address in wanted.into_values() {
        if let Some((id, workspace)) = addresses::receiving(state, &address).await? {
            inboxes.push((id, workspace, address));
        }
    }
    if inboxes.is_empty() {
        return Err(ApiError::NotFound(format!(
            "no inbox for {}",
            recipients.join(", ")
        )));
    }
    inboxes.sort_by_key(|(id, ..)| *id);
    Ok(inboxes)
}

/// Stores a copy in each inbox that does not hold the message yet, in one transaction:
/// the copy, its raw form, its thread, and its INBOUND message in the outbox. Returns the
/// new copies and the count of copies that existed.
async fn store(
    conn: &mut PgConnection, inboxes: &[Inbox], raw: &[u8], parsed: &Parsed, envelope_from: &str,
    auth: &Authentication, subject: String,
) -> Result<(Vec<InboundMessageId>, u32), ApiError> {
    let dedup_key = parsed.dedup_key(raw);
    let auth = serde_json::to_value(auth).map_err(|e| ApiError::internal("authentication", e))?;
    let attachments = serde_json::to_value(&parsed.attachments)
        .map_err(|e| ApiError::internal("attachments", e))?;
    let envelope_to: Vec<&str> = inboxes.iter().map(|(_, _, a)| a.as_str()).collect();
    let now = now_unix();
    let c = &parsed.content;
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    // One writer per inbox at a time: the dedup check and the thread choice see every
    // earlier copy. Taken in address-id order, so two ingests never wait on each other.
    for (id, ..) in inboxes {
        db::take_turns(&mut tx, Turns::Inbox, *id).await?;
    }
    let (mut stored, mut duplicates) = (Vec::new(), 0);
    for (address_id, workspace, address) in inboxes {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM messages WHERE address_id = $1 AND dedup_key = $2)",
        )
        .bind(address_id)
        .bind(&dedup_key)
        .fetch_one(&mut *tx)
        .await?;
        if exists {
            duplicates += 1;
            continue;
        }
        let thread = threads::assign(&mut tx, *address_id, *workspace, parsed, now).await?;
        let id = InboundMessageId::new();
        sqlx::query(
            "INSERT INTO messages (id, address_id, thread_id, workspace_id, dedup_key,
                 envelope_from, envelope_to, from_header, to_header, cc_header, subject,
                 text_body, html_body, message_id, in_reply_to, refs, attachments,
                 authentication, parsed, bodies_in_raw, size, received_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                 $17, $18, $19, $20, $21, $22)",
        )
        .bind(id)
        .bind(address_id)
        .bind(thread)
        .bind(workspace)
        .bind(&dedup_key)
        .bind(envelope_from)
        .bind(&envelope_to)
        .bind(&c.from)
        .bind(&c.to)
        .bind(&c.cc)
        .bind(&c.subject)
        .bind(&c.text)
        .bind(&c.html)
        .bind(&c.message_id)
        .bind(&c.in_reply_to)
        .bind(&parsed.references)
        .bind(&attachments)
        .bind(&auth)
        .bind(parsed.readable)
        .bind(parsed.bodies_in_raw)
        .bind(raw.len() as i64)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        copy_raw(&mut tx, id, raw).await?;
        let announcement = InboundReceived {
            message_id: id.to_string(),
            workspace_id: workspace.to_string(),
            address_id: address_id.to_string(),
            address: address.as_str().to_owned(),
            thread_id: thread.to_string(),
            envelope_from: envelope_from.to_owned(),
            // Whole, a subject of a megabyte would make an announcement NATS refuses.
            subject: cut_at(parsed.content.subject.clone(), mime::MAX_HEADER_TEXT).0,
            received_at: now,
            size: raw.len() as i64,
        };
        outbox::enqueue(
            &mut tx,
            &OutboxMessage {
                id: id.as_uuid(),
                subject: subject.clone(),
                payload: announcement.encode_to_vec().into(),
            },
        )
        .await?;
        stored.push(id);
    }
    tx.commit().await?;
    Ok((stored, duplicates))
}

/// Writes the raw message of copy `id` with `COPY ... FROM STDIN (FORMAT binary)` in chunks,
/// so it is never copied whole into a statement's arguments or the connection's buffer.
async fn copy_raw(
    conn: &mut PgConnection, id: InboundMessageId, raw: &[u8],
) -> Result<(), ApiError> {
    const CHUNK: usize = 256 * 1024;
    let len = i32::try_from(raw.len()).map_err(|e| ApiError::internal("raw size", e))?;
    let mut head = Vec::with_capacity(64);
    head.extend_from_slice(b"PGCOPY\n\xff\r\n\0"); // signature
    head.extend_from_slice(&0i32.to_be_bytes()); // flags
    head.extend_from_slice(&0i32.to_be_bytes()); // header extension length
    head.extend_from_slice(&2i16.to_be_bytes()); // one row of two fields
    head.extend_from_slice(&16i32.to_be_bytes());
    head.extend_from_slice(id.as_uuid().as_bytes());
    head.extend_from_slice(&len.to_be_bytes());
    let mut copy = conn
        .copy_in_raw("COPY message_raw (message_id, raw) FROM STDIN (FORMAT binary)")
        .await?;
    copy.send(head).await?;
    for chunk in raw.chunks(CHUNK) {
        copy.send(chunk).await?;
    }
    copy.send(&(-1i16).to_be_bytes()[..]).await?; // trailer
    copy.finish().await?;
    Ok(())
}
