//! Contacts of a workspace: `POST /contacts` upserts one (found by `externalId`, else by
//! email), `GET /contacts` pages through them (`?tag=`, `?email=`), `GET/PATCH/DELETE
//! /contacts/{id}` read, change and remove one, and `POST /contacts/import` upserts up to
//! 10,000 from a JSON array or a CSV file, keeping the good rows and naming the bad ones.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sqlx::types::Json;
use sqlx::PgConnection;
use uuid::Uuid;

use postmesh_shared::db::{is_unique_violation, now_unix};
use postmesh_shared::extract::{Caller, IdPath, JsonBody, Page, PageQuery, QueryParams};
use postmesh_shared::{email, ApiError, EmailAddress, Success, WorkspaceId};

use crate::AppState;

mod imports;
mod input;

pub(crate) use imports::import;
pub use imports::{csv_rows, json_rows, Imported, RowError};
pub(crate) use input::name_schema;
pub use input::{name, ContactBody, ContactInput, Name};

/// Rows of one import at most.
pub const MAX_IMPORT_ROWS: usize = 10_000;
/// Attributes of a contact at most, and the largest of them as JSON.
const MAX_ATTRIBUTES: usize = 100;
const MAX_ATTRIBUTES_BYTES: usize = 16 * 1024;
/// Tags, and topics, of a contact at most.
const MAX_TAGS: usize = 100;
/// Longest tag, topic, attribute name or external id.
pub(crate) const MAX_NAME_LEN: usize = 200;
/// Contacts per page by default.
const DEFAULT_LIMIT: i64 = 50;

/// A contact as stored and answered.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Contact {
    pub id: Uuid,
    /// None for a contact known by its external id alone (an event made it).
    pub email: Option<String>,
    pub external_id: Option<String>,
    #[schema(value_type = Object)]
    pub attributes: Json<Map<String, Value>>,
    pub tags: Vec<String>,
    #[schema(value_type = BTreeMap<String, Subscription>)]
    pub topics: Json<BTreeMap<String, Subscription>>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A contact's standing on one topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = ContactSubscription)]
pub enum Subscription {
    Subscribed,
    Unsubscribed,
}

/// Why a contact could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ContactError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error("no such contact")]
    NotFound,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl From<ContactError> for ApiError {
    fn from(e: ContactError) -> Self {
        match e {
            ContactError::Invalid(m) => ApiError::BadRequest(m),
            ContactError::Conflict(m) => ApiError::Conflict(m),
            ContactError::NotFound => ApiError::NotFound("no such contact".into()),
            ContactError::Database(e) => e.into(),
        }
    }
}

const COLUMNS: &str = "id, email, external_id, attributes, tags, topics, created_at, updated_at";

/// Writes `input` over contact `id` (merging attributes and topics, replacing tags). What
/// the merge leaves is held to a contact's bounds as one request is ([`MAX_ATTRIBUTES`] in
/// [`MAX_ATTRIBUTES_BYTES`], [`MAX_TAGS`] topics): a 400 beyond them, or rows of new keys
/// would grow one contact without end, each write rewriting it whole.
async fn update(
    conn: &mut PgConnection, workspace: WorkspaceId, id: Uuid, input: &ContactInput,
) -> Result<Contact, ContactError> {
    let changed = sqlx::query_as::<_, Contact>(&format!(
        "UPDATE contacts SET
             email = COALESCE($3, email), email_key = COALESCE($9, email_key),
             external_id = COALESCE($4, external_id),
             attributes = CASE WHEN $5::jsonb IS NULL THEN attributes
                 ELSE (SELECT COALESCE(jsonb_object_agg(key, value), '{{}}')
                       FROM jsonb_each(attributes || $5::jsonb)
                       WHERE value <> 'null'::jsonb) END,
             tags = COALESCE($6, tags), topics = topics || COALESCE($7::jsonb, '{{}}'),
             updated_at = $8
         WHERE workspace_id = $1 AND id = $2
           AND ($5::jsonb IS NULL
                OR (SELECT count(*) <= $10 FROM jsonb_each(attributes || $5::jsonb)
                    WHERE value <> 'null'::jsonb))
           AND ($5::jsonb IS NULL OR octet_length((attributes || $5::jsonb)::text) <= $11)
           AND ($7::jsonb IS NULL
                OR (SELECT count(*) <= $12 FROM jsonb_object_keys(topics || $7::jsonb)))
         RETURNING {COLUMNS}"
    ))
    .bind(workspace)
    .bind(id)
    .bind(input.email.as_ref().map(EmailAddress::as_str))
    .bind(&input.external_id)
    .bind(input.attributes.as_ref().map(Json))
    .bind(&input.tags)
    .bind(input.topics.as_ref().map(Json))
    .bind(now_unix())
    .bind(input.email.as_ref().map(EmailAddress::key))
    .bind(MAX_ATTRIBUTES as i64)
    // The stored text puts a space after each colon and comma: two bytes a key more.
    .bind((MAX_ATTRIBUTES_BYTES + 2 * MAX_ATTRIBUTES) as i32)
    .bind(MAX_TAGS as i64)
    .fetch_optional(&mut *conn)
    .await;
    match changed {
        Ok(Some(contact)) => Ok(contact),
        Ok(None) => {
            let exists: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM contacts WHERE workspace_id = $1 AND id = $2)",
            )
            .bind(workspace)
            .bind(id)
            .fetch_one(conn)
            .await?;
            Err(match exists {
                true => ContactError::Invalid(format!(
                    "with these, the contact would hold more than {MAX_ATTRIBUTES} attributes \
                     ({} KiB) or {MAX_TAGS} topics",
                    MAX_ATTRIBUTES_BYTES / 1024
                )),
                false => ContactError::NotFound,
            })
        }
        Err(e) if is_unique_violation(&e) => Err(ContactError::Conflict(
            "another contact has that email or externalId".into(),
        )),
        Err(e) => Err(e.into()),
    }
}

/// What a new contact needs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Creation {
    /// An email (the contacts API: a contact is someone to write to).
    NeedsEmail,
    /// Its external id is enough (an event about a contact not seen before is never
    /// dropped; the contact gets an email when one is given).
    ExternalIdEnough,
}

/// Creates or updates the contact `input` names: the one with its `externalId`, else the one
/// with its email; answers it and whether it is new. Two writes of one new contact at once
/// both see none: the loser's insert fails and it updates the winner's row instead.
pub async fn upsert(
    conn: &mut PgConnection, workspace: WorkspaceId, input: &ContactInput,
) -> Result<(Contact, bool), ContactError> {
    upsert_as(conn, workspace, input, Creation::NeedsEmail).await
}

/// [`upsert`], creating a contact as `creation` allows.
pub async fn upsert_as(
    conn: &mut PgConnection, workspace: WorkspaceId, input: &ContactInput, creation: Creation,
) -> Result<(Contact, bool), ContactError> {
    let email_key = input.email.as_ref().map(EmailAddress::key);
    if email_key.is_none() && input.external_id.is_none() {
        return Err(ContactError::Invalid(
            "give email or externalId to find the contact by".into(),
        ));
    }
    for _ in 0..3 {
        let found: Vec<(Uuid, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT id, external_id, email_key FROM contacts
             WHERE workspace_id = $1 AND (external_id = $2 OR email_key = $3)",
        )
        .bind(workspace)
        .bind(&input.external_id)
        .bind(&email_key)
        .fetch_all(&mut *conn)
        .await?;
        let by_external = found
            .iter()
            .find(|f| f.1.is_some() && f.1 == input.external_id);
        let by_email = found.iter().find(|f| f.2.is_some() && f.2 == email_key);
        let target = match (by_external, by_email) {
            (Some(a), Some(b)) if a.0 != b.0 => {
                return Err(ContactError::Conflict(
                    "the email belongs to another contact than the externalId".into(),
                ))
            }
            (Some(a), _) => Some(a.0),
            (None, Some(b)) if b.1.is_some() && input.external_id.is_some() => {
                return Err(ContactError::Conflict(
                    "the email belongs to a contact with another externalId".into(),
                ))
            }
            (None, Some(b)) => Some(b.0),
            (None, None) => None,
        };
        if let Some(id) = target {
            return Ok((update(conn, workspace, id, input).await?, false));
        }
        if input.email.is_none() && creation == Creation::NeedsEmail {
            return Err(ContactError::Invalid(
                "no contact has that externalId; give email to create one".into(),
            ));
        }
        let email = input.email.as_ref();
        let now = now_unix();
        let attributes: Map<String, Value> = input
            .attributes
            .iter()
            .flatten()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let made = sqlx::query_as::<_, Contact>(&format!(
            "INSERT INTO contacts (id, workspace_id, email, email_key, external_id, attributes,
                                   tags, topics, created_at, updated_at)
             VALUES ($1, $2, $3, $9, $4, $5, $6, $7, $8, $8)
             RETURNING {COLUMNS}"
        ))
        .bind(Uuid::now_v7())
        .bind(workspace)
        .bind(email.map(EmailAddress::as_str))
        .bind(&input.external_id)
        .bind(Json(&attributes))
        .bind(input.tags.clone().unwrap_or_default())
        .bind(Json(input.topics.clone().unwrap_or_default()))
        .bind(now)
        .bind(email.map(EmailAddress::key))
        .fetch_one(&mut *conn)
        .await;
        match made {
            Ok(contact) => return Ok((contact, true)),
            Err(e) if is_unique_violation(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ContactError::Conflict(
        "the contact is being written concurrently; retry".into(),
    ))
}

/// The contact with `external_id`.
pub async fn find_by_external_id(
    conn: &mut PgConnection, workspace: WorkspaceId, external_id: &str,
) -> Result<Option<Contact>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM contacts WHERE workspace_id = $1 AND external_id = $2"
    ))
    .bind(workspace)
    .bind(external_id)
    .fetch_optional(conn)
    .await
}

/// The contact with `email`, compared without regard to case.
pub async fn find_by_email(
    conn: &mut PgConnection, workspace: WorkspaceId, email: &EmailAddress,
) -> Result<Option<Contact>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM contacts WHERE workspace_id = $1 AND email_key = $2"
    ))
    .bind(workspace)
    .bind(email.key())
    .fetch_optional(conn)
    .await
}

/// The contact `id`.
pub async fn find_by_id(
    conn: &mut PgConnection, workspace: WorkspaceId, id: Uuid,
) -> Result<Option<Contact>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM contacts WHERE workspace_id = $1 AND id = $2"
    ))
    .bind(workspace)
    .bind(id)
    .fetch_optional(conn)
    .await
}

/// Gives each of `recipients` without an `externalId` its stored contact's (a recipient
/// object's own `externalId` wins), in one query.
pub async fn fill_external_ids(
    db: &sqlx::PgPool, workspace: WorkspaceId, recipients: &mut [crate::model::Recipient],
) -> Result<(), sqlx::Error> {
    let missing: Vec<String> = recipients
        .iter()
        .filter(|r| r.external_id.is_none())
        .map(|r| r.email.key())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let stored: std::collections::HashMap<String, String> = sqlx::query_as(
        "SELECT email_key, external_id FROM contacts
         WHERE workspace_id = $1 AND email_key = ANY($2) AND external_id IS NOT NULL",
    )
    .bind(workspace)
    .bind(&missing)
    .fetch_all(db)
    .await?
    .into_iter()
    .collect();
    for r in recipients.iter_mut().filter(|r| r.external_id.is_none()) {
        r.external_id = stored.get(&r.email.key()).cloned();
    }
    Ok(())
}

/// `POST /contacts` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ContactUpserted)]
pub struct Upserted {
    pub contact: Contact,
    pub created: bool,
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<ContactBody>,
) -> Result<(StatusCode, Success<Upserted>), ApiError> {
    let input = ContactInput::parse(body).map_err(ApiError::BadRequest)?;
    let mut conn = state.db.acquire().await?;
    let (contact, created) = upsert(&mut conn, caller.workspace, &input).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Success::new(Upserted { contact, created })))
}

/// `GET /contacts` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    pub tag: Option<String>,
    pub email: Option<String>,
}

/// `GET /contacts` answer: a page, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ContactPage {
    pub contacts: Vec<Contact>,
    pub limit: i64,
    pub offset: i64,
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<ListQuery>,
    QueryParams(page): QueryParams<PageQuery>,
) -> Result<Success<ContactPage>, ApiError> {
    let Page { limit, offset } = page.page(DEFAULT_LIMIT)?;
    let contacts = sqlx::query_as::<_, Contact>(&format!(
        "SELECT {COLUMNS} FROM contacts
         WHERE workspace_id = $1 AND ($2::text IS NULL OR tags @> ARRAY[$2])
           AND ($3::text IS NULL OR email_key = $3)
         ORDER BY id DESC LIMIT $4 OFFSET $5"
    ))
    .bind(caller.workspace)
    .bind(q.tag.as_deref().map(str::trim))
    .bind(q.email.as_deref().map(email::key))
    .bind(limit)
    .bind(offset)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(ContactPage {
        contacts,
        limit,
        offset,
    }))
}

/// `GET /contacts/{id}` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ContactOne)]
pub struct One {
    pub contact: Contact,
}

pub(crate) async fn read(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<One>, ApiError> {
    let contact = sqlx::query_as::<_, Contact>(&format!(
        "SELECT {COLUMNS} FROM contacts WHERE workspace_id = $1 AND id = $2"
    ))
    .bind(caller.workspace)
    .bind(id)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ContactError::NotFound)?;
    Ok(Success::new(One { contact }))
}

pub(crate) async fn change(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
    JsonBody(body): JsonBody<ContactBody>,
) -> Result<Success<One>, ApiError> {
    let input = ContactInput::parse(body).map_err(ApiError::BadRequest)?;
    let mut conn = state.db.acquire().await?;
    let contact = update(&mut conn, caller.workspace, id, &input).await?;
    Ok(Success::new(One { contact }))
}

/// `DELETE /contacts/{id}` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ContactDeleted)]
pub struct Deleted {
    pub deleted: bool,
}

pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Deleted>, ApiError> {
    let done = sqlx::query("DELETE FROM contacts WHERE workspace_id = $1 AND id = $2")
        .bind(caller.workspace)
        .bind(id)
        .execute(&state.db)
        .await?;
    if done.rows_affected() == 0 {
        return Err(ContactError::NotFound.into());
    }
    Ok(Success::new(Deleted { deleted: true }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_fields_are_named() {
        let parse = |v: Value| ContactInput::parse(serde_json::from_value(v).unwrap());
        assert!(parse(serde_json::json!({"email": "nope"}))
            .unwrap_err()
            .contains("email"));
        assert!(parse(serde_json::json!({"email": "a@x.com", "tags": [""]}))
            .unwrap_err()
            .contains("tag"));
        let many: Map<String, Value> = (0..=MAX_ATTRIBUTES)
            .map(|i| (format!("k{i}"), Value::Null))
            .collect();
        assert!(
            parse(serde_json::json!({"email": "a@x.com", "attributes": many}))
                .unwrap_err()
                .contains("attributes")
        );
    }
}
