//! Sender domains as a resource: submission (plan limits from billing, a platform-wide
//! unique name), listing, reading and deleting; the stored record and its public view.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use serde::{Deserialize, Serialize};
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use postmesh_shared::db::{self, now_unix, Turns};
use postmesh_shared::extract::{Caller, IdPath, JsonBody, QueryParams};
use postmesh_shared::proto::EntitlementsRequest;
use postmesh_shared::routes::Documented;
use postmesh_shared::{nats, ApiError, Success, WorkspaceId};

use crate::name::DomainName;
use crate::records;
use crate::AppState;

pub use postmesh_contracts::answers::domain::{
    DomainList, DomainView, InboundStatus, OutboundStatus, Ownership, Submitted, TrackingStatus,
    Verification,
};

/// A stored sender domain.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Domain {
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub name: String,
    pub verification_token: String,
    pub ownership: Ownership,
    pub inbound_status: InboundStatus,
    pub outbound_status: OutboundStatus,
    pub tracking_status: TrackingStatus,
    pub dkim_tokens: Vec<String>,
    pub created_at: i64,
    pub verified_at: Option<i64>,
}

/// The columns of [`Domain`].
pub const COLUMNS: &str = "id, workspace_id, name, verification_token, ownership, \
     inbound_status, outbound_status, tracking_status, dkim_tokens, created_at, verified_at";

/// What a periodic sweep looks at again.
#[derive(Clone, Copy, Debug)]
pub enum Sweep {
    /// Pending domains' ownership TXT.
    Ownership,
    /// Set-up tracking hosts' CNAME.
    Tracking,
}

/// A domain a sweep claimed, and the version of its row the claim left (PostgreSQL's
/// `xmin`, which every later write changes).
#[derive(Debug, sqlx::FromRow)]
pub struct Claimed {
    #[sqlx(flatten)]
    pub domain: Domain,
    pub version: String,
}

/// Claims up to `batch` domains `sweep` looks at that were not checked for `recheck_secs`
/// (each replica claims different ones: `SKIP LOCKED`), marked checked now.
pub async fn claim_due(
    db: &PgPool, sweep: Sweep, recheck_secs: i64, batch: i64,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let (checked, which) = match sweep {
        Sweep::Ownership => ("ownership_checked_at", "ownership = 'pending'"),
        Sweep::Tracking => ("tracking_checked_at", "tracking_status <> 'not_started'"),
    };
    let now = now_unix();
    sqlx::query_as(&format!(
        "UPDATE domains SET {checked} = $1
         WHERE id IN (SELECT id FROM domains WHERE {which} AND {checked} <= $2
                      ORDER BY {checked} LIMIT $3 FOR UPDATE SKIP LOCKED)
         RETURNING {COLUMNS}, xmin::text AS version"
    ))
    .bind(now)
    .bind(now - recheck_secs)
    .bind(batch)
    .fetch_all(db)
    .await
}

/// Where ownership is proven: TXT `_postmesh.<domain>`.
pub const VERIFY_LABEL: &str = "_postmesh";

impl Domain {
    /// Its own tracking host.
    pub fn tracking_host(&self) -> String {
        records::tracking_host(&self.name)
    }

    /// The name of its ownership TXT record.
    pub fn verification_name(&self) -> String {
        format!("{VERIFY_LABEL}.{}", self.name)
    }

    /// 409 unless ownership was verified: setup waits for the review.
    pub fn require_verified(&self) -> Result<(), ApiError> {
        match self.ownership {
            Ownership::Verified => Ok(()),
            Ownership::Pending => Err(ApiError::Conflict(format!(
                "ownership of {} is not verified yet: publish TXT {} = {} and call verify-ownership",
                self.name,
                self.verification_name(),
                self.verification_token
            ))),
            Ownership::Rejected => Err(ApiError::Conflict(format!(
                "ownership of {} was rejected",
                self.name
            ))),
        }
    }

    /// The public view.
    pub fn view(&self) -> DomainView {
        DomainView {
            id: Some(self.id),
            domain: self.name.clone(),
            platform: false,
            ownership_status: self.ownership,
            inbound_status: self.inbound_status,
            outbound_status: self.outbound_status,
            tracking_status: self.tracking_status,
            verification: Some(Verification {
                kind: "TXT".into(),
                name: self.verification_name(),
                value: self.verification_token.clone(),
            }),
            created_at: Some(self.created_at),
            verified_at: self.verified_at,
        }
    }
}

/// One domain in an answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainPage)]
pub struct DomainPage {
    pub domain: DomainView,
}

/// `DELETE /sender-domains/{id}` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainDeleted)]
pub struct Deleted {
    pub deleted: bool,
    pub domain: String,
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(crate) struct ListQuery {
    include_unverified: Option<String>,
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<ListQuery>,
) -> Result<Success<DomainList>, ApiError> {
    let all = matches!(q.include_unverified.as_deref(), Some("1" | "true"));
    let rows: Vec<Domain> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM domains
         WHERE workspace_id = $1 AND ($2 OR ownership = 'verified')
         ORDER BY created_at, name"
    ))
    .bind(caller.workspace.as_uuid())
    .bind(all)
    .fetch_all(&state.db)
    .await?;
    let domains = state
        .settings
        .platform_domains
        .iter()
        .map(platform_view)
        .chain(rows.iter().map(Domain::view))
        .collect();
    Ok(Success::new(DomainList {
        inbound_mx_host: state.settings.inbound_mx_host.clone(),
        domains,
    }))
}

/// The body of `POST /sender-domains`: the name to send from.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainSubmission)]
pub(crate) struct Submission {
    /// A domain name of two labels or more; a Unicode one is taken in its `xn--` form.
    #[schema(format = IdnHostname, min_length = 1)]
    domain: String,
}

pub(crate) async fn submit(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<Submission>,
) -> Result<Success<Submitted>, ApiError> {
    let name = DomainName::parse(&body.domain).map_err(ApiError::BadRequest)?;
    if name.as_str().len() > records::MAX_DOMAIN_LEN {
        return Err(ApiError::BadRequest(format!(
            "a sender domain is at most {} characters: its DKIM records' names, \
             <token>._domainkey.{name}, must fit DNS's 253",
            records::MAX_DOMAIN_LEN
        )));
    }
    if state
        .settings
        .platform_domains
        .iter()
        .any(|p| name.is_within(p))
    {
        return Err(ApiError::BadRequest(format!(
            "{name} is a platform domain: every workspace may already send from it"
        )));
    }
    let limit = custom_domain_limit(&state, caller.workspace).await?;
    let domain = insert(&state.db, caller.workspace, &name, limit).await?;
    Ok(Success::new(Submitted {
        message: format!(
            "Publish a TXT record {} with the value {}, then call verify-ownership.",
            domain.verification_name(),
            domain.verification_token
        ),
        domain: domain.view(),
    }))
}

/// How many custom domains the workspace's plan allows; 402 when none.
async fn custom_domain_limit(state: &AppState, workspace: WorkspaceId) -> Result<i64, ApiError> {
    let (client, ns) = state
        .billing
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("billing is not reachable".into()))?;
    let ent = nats::call(
        client,
        ns,
        &EntitlementsRequest {
            workspace_id: workspace.to_string(),
        },
    )
    .await?;
    if ent.custom_domains <= 0 {
        return Err(ApiError::PaymentRequired(
            "custom sender domains need a plan that includes them: see /billing/entitlements"
                .into(),
        ));
    }
    Ok(ent.custom_domains)
}

/// How long another workspace's submission of a name waits for its ownership proof before
/// a new submission may take the name over.
pub const PENDING_RELEASE_SECS: i64 = 7 * 24 * 3600;

/// Inserts `name` for `workspace` unless the name is taken anywhere (409; the unique index
/// settles a race) or the workspace holds `limit` domains already (403). A name another
/// workspace submitted more than [`PENDING_RELEASE_SECS`] ago and never proved (nor an
/// admin reviewed) is released to this submission: whoever submits a name first cannot
/// hold it against its owner. Submissions of one workspace take turns, so two at once
/// cannot both fit under the limit.
async fn insert(
    db: &PgPool, workspace: WorkspaceId, name: &DomainName, limit: i64,
) -> Result<Domain, ApiError> {
    let mut tx = db.begin().await?;
    db::take_turns(&mut tx, Turns::Workspace, workspace).await?;
    // A pending domain holds nothing outside this table (sending and receiving need proven
    // ownership), so releasing it is deleting its row.
    let released = sqlx::query(
        "DELETE FROM domains WHERE name = $1 AND workspace_id <> $2 AND ownership = 'pending'
             AND created_at <= $3",
    )
    .bind(name.as_str())
    .bind(workspace.as_uuid())
    .bind(now_unix() - PENDING_RELEASE_SECS)
    .execute(&mut *tx)
    .await?;
    if released.rows_affected() > 0 {
        tracing::info!(domain = %name, "a name left unproven was released to a new submission");
    }
    let taken: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM domains WHERE name = $1)")
        .bind(name.as_str())
        .fetch_one(&mut *tx)
        .await?;
    if taken {
        return Err(taken_error(name));
    }
    ApiError::within_plan(count(&mut *tx, workspace).await?, limit, "custom domains")?;
    let token = format!(
        "postmesh-verify={}",
        hex::encode(rand::random::<[u8; 16]>())
    );
    let inserted = sqlx::query_as(&format!(
        "INSERT INTO domains (id, workspace_id, name, verification_token, created_at)
         VALUES ($1, $2, $3, $4, $5) RETURNING {COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(workspace.as_uuid())
    .bind(name.as_str())
    .bind(&token)
    .bind(now_unix())
    .fetch_one(&mut *tx)
    .await;
    match inserted {
        Ok(domain) => {
            tx.commit().await?;
            Ok(domain)
        }
        Err(e) if db::is_unique_violation(&e) => {
            Err(ApiError::Conflict(format!("{name} is already registered")))
        }
        Err(e) => Err(e.into()),
    }
}

fn taken_error(name: &DomainName) -> ApiError {
    ApiError::Conflict(format!("{name} is already registered"))
}

/// The custom domains a workspace holds (rejected ones do not count).
pub async fn count(db: impl PgExecutor<'_>, workspace: WorkspaceId) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM domains WHERE workspace_id = $1 AND ownership <> 'rejected'",
    )
    .bind(workspace.as_uuid())
    .fetch_one(db)
    .await
}

pub(crate) async fn show(
    OwnedDomain(domain): OwnedDomain,
) -> Result<Success<DomainPage>, ApiError> {
    Ok(Success::new(DomainPage {
        domain: domain.view(),
    }))
}

pub(crate) async fn remove(
    State(state): State<AppState>, OwnedDomain(domain): OwnedDomain,
) -> Result<Success<Deleted>, ApiError> {
    // The provider's identity goes first: a failure there leaves the record to retry with.
    if !domain.dkim_tokens.is_empty() {
        state.ses()?.delete_identity(&domain.name).await?;
    }
    // Its tracking host, if it ever set one up, answers none of its links from now on:
    // released before the row goes (a failure leaves the record to retry with) and again
    // after, since a check under way may have held it in between (and, coming later,
    // finds the row gone and releases it itself).
    let hosts = state
        .hosts
        .as_ref()
        .filter(|_| domain.tracking_status != TrackingStatus::NotStarted);
    if let Some(hosts) = hosts {
        hosts.release(&domain.tracking_host(), domain.id).await?;
    }
    sqlx::query("DELETE FROM domains WHERE id = $1")
        .bind(domain.id)
        .execute(&state.db)
        .await?;
    if let Some(hosts) = hosts {
        if let Err(e) = hosts.release(&domain.tracking_host(), domain.id).await {
            tracing::warn!(domain = %domain.name, error = %e, "tracking host not released again");
        }
    }
    Ok(Success::new(Deleted {
        deleted: true,
        domain: domain.name,
    }))
}

/// The domain `id` of the caller's workspace; another workspace's domain is a 404.
async fn owned(db: &PgPool, caller: &Caller, id: Uuid) -> Result<Domain, ApiError> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM domains WHERE id = $1 AND workspace_id = $2"
    ))
    .bind(id)
    .bind(caller.workspace.as_uuid())
    .fetch_optional(db)
    .await?
    .ok_or_else(|| ApiError::NotFound("no such sender domain".into()))
}

/// The caller's domain that the path's `{id}` names: 400 for a malformed id, 404 for none
/// or another workspace's.
pub struct OwnedDomain(pub Domain);

impl Documented for OwnedDomain {}

impl FromRequestParts<AppState> for OwnedDomain {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, state).await?;
        let IdPath(id) = IdPath::<Uuid>::from_request_parts(parts, state).await?;
        owned(&state.db, &caller, id).await.map(Self)
    }
}

/// An [`OwnedDomain`] whose ownership is verified, as every setup call needs; 409 otherwise.
pub struct VerifiedDomain(pub Domain);

impl Documented for VerifiedDomain {}

impl FromRequestParts<AppState> for VerifiedDomain {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let OwnedDomain(domain) = OwnedDomain::from_request_parts(parts, state).await?;
        domain.require_verified()?;
        Ok(Self(domain))
    }
}

/// A platform domain's entry.
fn platform_view(name: &DomainName) -> DomainView {
    DomainView {
        id: None,
        domain: name.to_string(),
        platform: true,
        ownership_status: Ownership::Verified,
        inbound_status: InboundStatus::Verified,
        outbound_status: OutboundStatus::Verified,
        tracking_status: TrackingStatus::NotStarted,
        verification: None,
        created_at: None,
        verified_at: None,
    }
}
