//! Inbox addresses as a resource: on the platform inbound domain or on a domain the
//! workspace verified for inbound, unique across the platform, within the plan's mailbox
//! limit; deleting one stops its mail at once and removes its messages after the retention.

use std::fmt;

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use postmesh_shared::db::{self, now_unix, Turns};
use postmesh_shared::extract::{Caller, IdPath, JsonBody, QueryParams};
use postmesh_shared::proto::{EntitlementsRequest, InboundDomainRequest};
use postmesh_shared::{nats, AddressId, ApiError, EmailAddress, Success, WorkspaceId};

use crate::AppState;

/// A lower-cased domain name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain(String);

impl Domain {
    /// Parses a domain name (ASCII labels); `None` when it is not one.
    pub fn parse(raw: &str) -> Option<Self> {
        let address = EmailAddress::parse(&format!("postmaster@{}", raw.trim()))?;
        Some(Self(address.as_str()["postmaster@".len()..].to_owned()))
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An inbox address: a valid `local@domain`, lower-cased, without a `+tag`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InboxAddress(String);

impl InboxAddress {
    /// Parses the address of a new inbox; `+` is refused, as it marks a sub-address.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let address = EmailAddress::parse(raw)
            .ok_or_else(|| format!("{:?} is not a valid email address", raw.trim()))?;
        let text = address.as_str().to_lowercase();
        if text
            .split('@')
            .next()
            .is_some_and(|local| local.contains('+'))
        {
            return Err(format!(
                "{text}: '+' is reserved for sub-addresses (support+tag@ is delivered to support@)"
            ));
        }
        Ok(Self(text))
    }

    /// The inbox a recipient is delivered to: lower-cased, any `+tag` removed; `None` for
    /// what is not an address.
    pub fn of_recipient(raw: &str) -> Option<Self> {
        let raw = raw.trim().trim_start_matches('<').trim_end_matches('>');
        let address = EmailAddress::parse(raw)?;
        let (local, domain) = address.as_str().rsplit_once('@')?;
        let local = local.split_once('+').map_or(local, |(base, _)| base);
        (!local.is_empty()).then(|| Self(format!("{local}@{domain}").to_lowercase()))
    }

    /// The part after `@`.
    pub fn domain(&self) -> &str {
        self.0.rsplit_once('@').map_or("", |(_, d)| d)
    }

    /// The address as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An inbox address as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = InboxAddress)]
#[serde(rename_all = "camelCase")]
pub struct AddressView {
    pub id: AddressId,
    pub address: String,
    pub created_at: i64,
}

/// `POST /inbox/addresses` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = InboxAddressCreated)]
pub struct Created {
    pub address: AddressView,
}

/// `GET /inbox/addresses` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = InboxAddressList)]
pub struct AddressList {
    pub addresses: Vec<AddressView>,
}

/// `DELETE /inbox/addresses/{id}` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = InboxAddressDeleted)]
pub struct Deleted {
    pub deleted: bool,
    /// Whether its messages are gone already (`?purge=1`), or kept for the retention.
    pub purged: bool,
}

/// The body of `POST /inbox/addresses`: the address of the new inbox.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = InboxAddressCreateRequest)]
pub(crate) struct NewAddress {
    /// On the platform inbound domain or one the workspace verified for inbound; without `+`,
    /// which marks sub-addresses.
    #[schema(format = Email, pattern = "^[^+]*$")]
    address: String,
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<NewAddress>,
) -> Result<(StatusCode, Success<Created>), ApiError> {
    let address = InboxAddress::parse(&body.address).map_err(ApiError::BadRequest)?;
    let (client, ns) = match &state.nats {
        Some(client) => (client, &state.ns),
        None => {
            return Err(ApiError::Unavailable(
                "billing and domains are not reachable".into(),
            ))
        }
    };
    if address.domain() != state.inbound_domain.0 {
        let owner = nats::call(
            client,
            ns,
            &InboundDomainRequest {
                domain: address.domain().to_owned(),
            },
        )
        .await?;
        if !owner.found || owner.workspace_id != caller.workspace.to_string() {
            return Err(ApiError::BadRequest(format!(
                "{} is neither the platform inbound domain ({}) nor a domain this workspace \
                 verified for inbound: verify its ownership and MX (POST /sender-domains/{{id}}/verify-inbound)",
                address.domain(),
                state.inbound_domain
            )));
        }
    }
    let limit = nats::call(
        client,
        ns,
        &EntitlementsRequest {
            workspace_id: caller.workspace.to_string(),
        },
    )
    .await?
    .mailboxes;
    // On a custom domain the caller holds now, an inbox another workspace left on it (it held
    // the domain before) is let go: the name is the new holder's to use.
    let takes_over = address.domain() != state.inbound_domain.0;
    let view = insert(&state.db, caller.workspace, &address, limit, takes_over).await?;
    Ok((StatusCode::CREATED, Success::new(Created { address: view })))
}

/// Inserts `address` unless it is taken (409) or the workspace holds `limit` addresses
/// (403). A workspace's creations take turns, so two at once cannot both fit the limit.
/// `takes_over`: the workspace holds the address's domain now, so another workspace's live
/// inbox of the address (from when it held the domain) is deleted instead of a 409.
async fn insert(
    db: &PgPool, workspace: WorkspaceId, address: &InboxAddress, limit: i64, takes_over: bool,
) -> Result<AddressView, ApiError> {
    let mut tx = db.begin().await?;
    db::take_turns(&mut tx, Turns::Workspace, workspace).await?;
    let holder: Option<Uuid> = sqlx::query_scalar(
        "SELECT workspace_id FROM addresses WHERE address = $1 AND deleted_at IS NULL FOR UPDATE",
    )
    .bind(address.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    match holder {
        None => {}
        Some(other) if takes_over && other != workspace.as_uuid() => {
            sqlx::query(
                "UPDATE addresses SET deleted_at = $2 WHERE address = $1 AND deleted_at IS NULL",
            )
            .bind(address.as_str())
            .bind(now_unix())
            .execute(&mut *tx)
            .await?;
            tracing::info!(address = %address.as_str(), former = %other, "an inbox left on a domain that changed hands is let go");
        }
        Some(_) => return Err(taken_error(address)),
    }
    ApiError::within_plan(count(&mut *tx, workspace).await?, limit, "mailboxes")?;
    let inserted = sqlx::query_as(
        "INSERT INTO addresses (id, workspace_id, address, created_at)
         VALUES ($1, $2, $3, $4) RETURNING id, address, created_at",
    )
    .bind(AddressId::new())
    .bind(workspace.as_uuid())
    .bind(address.as_str())
    .bind(now_unix())
    .fetch_one(&mut *tx)
    .await;
    match inserted {
        Ok(view) => {
            tx.commit().await?;
            Ok(view)
        }
        Err(e) if db::is_unique_violation(&e) => Err(taken_error(address)),
        Err(e) => Err(e.into()),
    }
}

fn taken_error(address: &InboxAddress) -> ApiError {
    ApiError::Conflict(format!("{} is already an inbox", address.as_str()))
}

/// The live addresses a workspace holds (its mailboxes).
pub async fn count(db: impl PgExecutor<'_>, workspace: WorkspaceId) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM addresses WHERE workspace_id = $1 AND deleted_at IS NULL",
    )
    .bind(workspace.as_uuid())
    .fetch_one(db)
    .await
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<AddressList>, ApiError> {
    let addresses = sqlx::query_as(
        "SELECT id, address, created_at FROM addresses
         WHERE workspace_id = $1 AND deleted_at IS NULL ORDER BY created_at, address",
    )
    .bind(caller.workspace.as_uuid())
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(AddressList { addresses }))
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(crate) struct DeleteQuery {
    purge: Option<String>,
}

pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<AddressId>,
    QueryParams(q): QueryParams<DeleteQuery>,
) -> Result<Success<Deleted>, ApiError> {
    let purge = matches!(q.purge.as_deref(), Some("1" | "true"));
    let mut tx = state.db.begin().await?;
    let done = if purge {
        sqlx::query(
            "DELETE FROM addresses WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL",
        )
        .bind(id)
        .bind(caller.workspace)
        .execute(&mut *tx)
        .await?
    } else {
        // Kept for the retention, out of sight: its threads no longer count as unread.
        sqlx::query("UPDATE threads SET read_count = message_count WHERE address_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE addresses SET deleted_at = $3
             WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL",
        )
        .bind(id)
        .bind(caller.workspace)
        .bind(now_unix())
        .execute(&mut *tx)
        .await?
    };
    if done.rows_affected() == 0 {
        return Err(not_found());
    }
    tx.commit().await?;
    Ok(Success::new(Deleted {
        deleted: true,
        purged: purge,
    }))
}

/// The 404 of an address that is not the caller's (or no longer exists).
pub fn not_found() -> ApiError {
    ApiError::NotFound("no such inbox address".into())
}

/// Removes deleted addresses whose retention has passed, with their threads and messages
/// (a batch per pass; true when more may be due).
pub async fn purge_expired(db: &PgPool, retention_days: u32) -> Result<bool, sqlx::Error> {
    const BATCH: i64 = 100;
    let before = now_unix() - i64::from(retention_days) * 86_400;
    let purged = sqlx::query(
        "DELETE FROM addresses WHERE id IN (
             SELECT id FROM addresses WHERE deleted_at <= $1 ORDER BY deleted_at LIMIT $2)",
    )
    .bind(before)
    .bind(BATCH)
    .execute(db)
    .await?;
    Ok(purged.rows_affected() as i64 == BATCH)
}

/// The address text of the workspace's live inbox `id`, if it is one.
pub async fn owned(
    db: &PgPool, workspace: WorkspaceId, id: AddressId,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT address FROM addresses WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL",
    )
    .bind(id)
    .bind(workspace)
    .fetch_optional(db)
    .await
}

/// The live inbox of `address`, with its workspace.
/// The live inbox of `address` that receives now: on the platform inbound domain, or on a
/// custom domain its workspace still holds verified for inbound (asked of the domain
/// service each time, so a deleted or unverified domain stops its mail at once).
pub async fn receiving(
    state: &AppState, address: &InboxAddress,
) -> Result<Option<(AddressId, WorkspaceId)>, ApiError> {
    let Some((id, workspace)) = live(&state.db, address).await? else {
        return Ok(None);
    };
    if address.domain() == state.inbound_domain.0 {
        return Ok(Some((id, workspace)));
    }
    let Some(client) = &state.nats else {
        return Err(ApiError::Unavailable("domains are not reachable".into()));
    };
    let req = InboundDomainRequest {
        domain: address.domain().to_owned(),
    };
    let owner = nats::call(client, &state.ns, &req).await?;
    let held = owner.found && owner.workspace_id == workspace.to_string();
    Ok(held.then_some((id, workspace)))
}

/// The address's inbox unless it was deleted (whatever its domain's standing).
pub async fn live(
    db: impl PgExecutor<'_>, address: &InboxAddress,
) -> Result<Option<(AddressId, WorkspaceId)>, sqlx::Error> {
    let row: Option<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT id, workspace_id FROM addresses WHERE address = $1 AND deleted_at IS NULL",
    )
    .bind(address.as_str())
    .fetch_optional(db)
    .await?;
    Ok(row.map(|(id, ws)| (id.into(), ws.into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inbox_addresses_are_lowercased_and_refuse_tags() {
        let ok = |raw: &str| InboxAddress::parse(raw).map(|a| a.0);
        assert_eq!(
            ok(" Support@Inbound.Example.COM ").unwrap(),
            "support@inbound.example.com"
        );
        assert!(ok("support+x@example.com").is_err());
        assert!(ok("not an address").is_err());
        assert!(ok("a@nodot").is_err());
    }

    #[test]
    fn recipients_lose_their_tag_and_case() {
        let inbox = |raw: &str| InboxAddress::of_recipient(raw).map(|a| a.0);
        assert_eq!(
            inbox("Support+X@Example.com").as_deref(),
            Some("support@example.com")
        );
        assert_eq!(
            inbox("<ann@example.com>").as_deref(),
            Some("ann@example.com")
        );
        assert_eq!(inbox("+only@example.com"), None);
        assert_eq!(inbox("nobody"), None);
        assert_eq!(
            InboxAddress::of_recipient("a+b+c@x.io").unwrap().domain(),
            "x.io"
        );
    }

    #[test]
    fn domains_are_lowercased() {
        assert_eq!(
            Domain::parse(" Inbound.Example.COM").unwrap().to_string(),
            "inbound.example.com"
        );
        assert!(Domain::parse("not a domain").is_none());
    }
}
