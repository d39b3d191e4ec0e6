//! The ownership review: the TXT record `_postmesh.<domain>` checked on demand and by a
//! periodic sweep, and an admin's approval or rejection. Only `pending` moves: to
//! `verified` (TXT found, or approved) or `rejected` (an admin's decision, final).

use axum::extract::State;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, IdPath};
use postmesh_shared::{ApiError, Success};

use crate::dns::{Dns, LookupError};
use crate::domains::{
    claim_due, Claimed, Domain, DomainView, OwnedDomain, Ownership, Sweep, COLUMNS,
};
use crate::AppState;

pub use postmesh_contracts::answers::domain::Reviewed;

/// Pending domains one sweep pass checks at most.
pub const SWEEP_BATCH: i64 = 50;

/// Pending domains awaiting review (admin).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainPendingList)]
pub struct PendingList {
    pub domains: Vec<DomainView>,
}

pub(crate) async fn verify(
    State(state): State<AppState>, OwnedDomain(domain): OwnedDomain,
) -> Result<Success<Reviewed>, ApiError> {
    let domain = match domain.ownership {
        Ownership::Pending => check(&state.db, &state.dns, domain)
            .await?
            .ok_or_else(|| ApiError::NotFound("domain not found".into()))?,
        Ownership::Verified => domain,
        Ownership::Rejected => domain.require_verified().map(|_| domain)?,
    };
    let verified = domain.ownership == Ownership::Verified;
    let message = if verified {
        format!(
            "{} is verified: set up sending and receiving next",
            domain.name
        )
    } else {
        format!(
            "TXT {} = {} not found yet; DNS changes can take a while to appear",
            domain.verification_name(),
            domain.verification_token
        )
    };
    Ok(Success::new(Reviewed {
        verified,
        message,
        domain: domain.view(),
    }))
}

/// Looks for the domain's TXT token; found, the domain becomes verified. The domain as stored
/// then; none when it was removed meanwhile.
async fn check(db: &PgPool, dns: &Dns, domain: Domain) -> Result<Option<Domain>, LookupErrorOrDb> {
    let found = dns
        .txt(&domain.verification_name())
        .await?
        .iter()
        .any(|txt| txt.trim() == domain.verification_token);
    let now = now_unix();
    let updated: Option<Domain> = sqlx::query_as(&format!(
        "UPDATE domains SET ownership_checked_at = $2,
             ownership = CASE WHEN $3 THEN 'verified' ELSE ownership END,
             verified_at = CASE WHEN $3 THEN $2 ELSE verified_at END
         WHERE id = $1 AND ownership = 'pending' RETURNING {COLUMNS}"
    ))
    .bind(domain.id)
    .bind(now)
    .bind(found)
    .fetch_optional(db)
    .await?;
    // Reviewed (an admin) or removed meanwhile: the stored state stands.
    match updated {
        Some(d) => Ok(Some(d)),
        None => Ok(reload(db, domain.id).await?),
    }
}

/// A failed check: DNS could not answer, or the database failed.
#[derive(Debug, thiserror::Error)]
pub enum LookupErrorOrDb {
    #[error(transparent)]
    Dns(#[from] LookupError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl From<LookupErrorOrDb> for ApiError {
    fn from(e: LookupErrorOrDb) -> Self {
        match e {
            LookupErrorOrDb::Dns(e) => e.into(),
            LookupErrorOrDb::Db(e) => e.into(),
        }
    }
}

async fn reload(db: &PgPool, id: Uuid) -> Result<Option<Domain>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM domains WHERE id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await
}

/// One sweep pass: claims up to [`SWEEP_BATCH`] pending domains not checked for
/// `recheck_secs` ([`claim_due`]) and checks them; how many it took.
pub async fn sweep(db: &PgPool, dns: &Dns, recheck_secs: i64) -> Result<usize, LookupErrorOrDb> {
    let due = claim_due(db, Sweep::Ownership, recheck_secs, SWEEP_BATCH).await?;
    let taken = due.len();
    for Claimed { domain, .. } in due {
        let name = domain.name.clone();
        match check(db, dns, domain).await {
            Ok(Some(d)) if d.ownership == Ownership::Verified => {
                tracing::info!(domain = %name, "ownership verified by the sweep")
            }
            Ok(_) => {}
            Err(LookupErrorOrDb::Dns(e)) => {
                tracing::warn!(domain = %name, error = %e, "ownership check failed")
            }
            Err(e) => return Err(e),
        }
    }
    Ok(taken)
}

/// 403 unless the caller's key has the admin role.
fn require_admin(caller: &Caller) -> Result<(), ApiError> {
    if caller.is_admin() {
        Ok(())
    } else {
        Err(ApiError::Forbidden(
            "the ownership review is for administrators".into(),
        ))
    }
}

pub(crate) async fn pending(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<PendingList>, ApiError> {
    require_admin(&caller)?;
    let rows: Vec<Domain> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM domains WHERE ownership = 'pending' ORDER BY created_at LIMIT 100"
    ))
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(PendingList {
        domains: rows.iter().map(Domain::view).collect(),
    }))
}

pub(crate) async fn approve(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Reviewed>, ApiError> {
    review(&state.db, &caller, id, Ownership::Verified).await
}

pub(crate) async fn reject(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Reviewed>, ApiError> {
    review(&state.db, &caller, id, Ownership::Rejected).await
}

/// An admin's decision on a pending domain of any workspace; deciding again the same way
/// changes nothing, deciding otherwise is a 409.
async fn review(
    db: &PgPool, caller: &Caller, id: Uuid, decision: Ownership,
) -> Result<Success<Reviewed>, ApiError> {
    require_admin(caller)?;
    let reviewer = Some(caller.account.as_uuid());
    let updated: Option<Domain> = sqlx::query_as(&format!(
        "UPDATE domains SET ownership = $2, reviewed_by = $3,
             verified_at = CASE WHEN $2 = 'verified' THEN $4 ELSE verified_at END
         WHERE id = $1 AND ownership = 'pending' RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(decision)
    .bind(reviewer)
    .bind(now_unix())
    .fetch_optional(db)
    .await?;
    let domain = match updated {
        Some(d) => d,
        None => {
            let current: Domain =
                sqlx::query_as(&format!("SELECT {COLUMNS} FROM domains WHERE id = $1"))
                    .bind(id)
                    .fetch_optional(db)
                    .await?
                    .ok_or_else(|| ApiError::NotFound("no such sender domain".into()))?;
            if current.ownership != decision {
                return Err(ApiError::Conflict(format!(
                    "{} was already reviewed: {:?}",
                    current.name, current.ownership
                )));
            }
            current
        }
    };
    let verified = domain.ownership == Ownership::Verified;
    Ok(Success::new(Reviewed {
        verified,
        message: format!(
            "{} is {}",
            domain.name,
            if verified { "verified" } else { "rejected" }
        ),
        domain: domain.view(),
    }))
}
