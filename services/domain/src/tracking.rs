//! A domain's own tracking host: `setup-tracking` answers the CNAME to publish
//! (`track.<domain>` → `TRACKING_HOST`), `verify-tracking` looks it up and stores the
//! result; a periodic sweep looks again at every host set up, so one whose CNAME went is
//! pending again. Once verified, mail from the domain links through `https://track.<domain>`
//! (the `sendable` RPC tells the sender), so its links are its own, not a shared host's.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use postmesh_shared::db::now_unix;
use postmesh_shared::{ApiError, Success};

use crate::dns::{host_name, Dns, LookupError};
use crate::domains::{claim_due, Claimed, Domain, Sweep, TrackingStatus, VerifiedDomain};
use crate::records::{self, DnsRecord};
use crate::AppState;

/// Tracking hosts one sweep pass checks at most.
pub const SWEEP_BATCH: i64 = 50;

/// `setup-tracking` and `verify-tracking` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainTrackingSetup)]
#[serde(rename_all = "camelCase")]
pub struct TrackingSetup {
    pub ready: bool,
    pub domain: String,
    pub tracking_status: TrackingStatus,
    /// The CNAME to publish.
    pub record: DnsRecord,
    /// What the tracking host's CNAME points at now, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found: Option<String>,
    pub message: String,
}

/// Stores `status` for `domain`, and tells the gateway ([`announce`]); 404 when the domain
/// was removed meanwhile.
async fn store(state: &AppState, domain: &Domain, status: TrackingStatus) -> Result<(), ApiError> {
    let stored = sqlx::query(
        "UPDATE domains SET tracking_status = $2, tracking_checked_at = $3 WHERE id = $1",
    )
    .bind(domain.id)
    .bind(status)
    .bind(now_unix())
    .execute(&state.db)
    .await?;
    if stored.rows_affected() == 0 {
        return Err(ApiError::NotFound("domain not found".into()));
    }
    announce(state, domain, status).await
}

/// Tells the gateway whether `domain` holds its tracking host, as `status` says: verified,
/// its links answer there; otherwise none do. A hold is taken back when, once made, the
/// domain's row no longer says verified: a removal, or a check that found the CNAME gone,
/// whose release may have come before the hold.
async fn announce(
    state: &AppState, domain: &Domain, status: TrackingStatus,
) -> Result<(), ApiError> {
    let Some(hosts) = &state.hosts else {
        return Ok(());
    };
    let host = domain.tracking_host();
    if status != TrackingStatus::Verified {
        return hosts.release(&host, domain.id).await;
    }
    hosts.hold(&host, domain.id).await?;
    let still: Option<TrackingStatus> =
        sqlx::query_scalar("SELECT tracking_status FROM domains WHERE id = $1")
            .bind(domain.id)
            .fetch_optional(&state.db)
            .await?;
    if still != Some(TrackingStatus::Verified) {
        hosts.release(&host, domain.id).await?;
    }
    Ok(())
}

pub(crate) async fn setup(
    State(state): State<AppState>, VerifiedDomain(domain): VerifiedDomain,
) -> Result<Success<TrackingSetup>, ApiError> {
    let target = host_name(&state.settings.tracking_host);
    let status = match domain.tracking_status {
        TrackingStatus::NotStarted => TrackingStatus::Pending,
        other => other,
    };
    store(&state, &domain, status).await?;
    let record = records::tracking(&domain.name, &target);
    Ok(Success::new(TrackingSetup {
        ready: status == TrackingStatus::Verified,
        message: format!(
            "publish CNAME {} {target}, then call verify-tracking",
            record.name
        ),
        tracking_status: status,
        record,
        found: None,
        domain: domain.name,
    }))
}

pub(crate) async fn verify(
    State(state): State<AppState>, VerifiedDomain(domain): VerifiedDomain,
) -> Result<Success<TrackingSetup>, ApiError> {
    if domain.tracking_status == TrackingStatus::NotStarted {
        return Err(ApiError::Conflict(format!(
            "tracking is not set up for {}: call setup-tracking first",
            domain.name
        )));
    }
    let target = host_name(&state.settings.tracking_host);
    let host = domain.tracking_host();
    let (found, status) = look(&state.dns, &domain, &target).await?;
    let ready = status == TrackingStatus::Verified;
    store(&state, &domain, status).await?;
    let message = match &found {
        _ if ready => format!(
            "links of mail from {} now go through https://{host}",
            domain.name
        ),
        None => format!("{host} has no CNAME: add CNAME {host} {target}"),
        Some(other) => format!("{host} is a CNAME of {other}, not {target}"),
    };
    Ok(Success::new(TrackingSetup {
        ready,
        tracking_status: status,
        record: records::tracking(&domain.name, &target),
        found,
        message,
        domain: domain.name,
    }))
}

/// What `domain`'s tracking host is a CNAME of now, and the status that makes: verified
/// when it is `target`.
async fn look(
    dns: &Dns, domain: &Domain, target: &str,
) -> Result<(Option<String>, TrackingStatus), LookupError> {
    let found = dns.cname(&domain.tracking_host()).await?;
    let status = if found.as_deref() == Some(target) {
        TrackingStatus::Verified
    } else {
        TrackingStatus::Pending
    };
    Ok((found, status))
}

/// One sweep pass: claims up to [`SWEEP_BATCH`] domains whose tracking is set up and was not
/// checked for `recheck_secs` ([`claim_due`]) and stores what DNS says now ([`settle`]) — a
/// host whose CNAME went away or elsewhere is pending again, so mail stops linking through
/// it; a lookup that fails changes nothing. What it found is told the gateway again
/// ([`announce`]), so a lost announcement is made good. How many it took.
pub async fn sweep(
    state: &AppState, target: &str, recheck_secs: i64,
) -> Result<usize, sqlx::Error> {
    let due = claim_due(&state.db, Sweep::Tracking, recheck_secs, SWEEP_BATCH).await?;
    let taken = due.len();
    for claimed in due {
        let domain = &claimed.domain;
        let status = match look(&state.dns, domain, target).await {
            Ok((found, status)) if status != domain.tracking_status => {
                let stored = settle(&state.db, &claimed, status).await?;
                tracing::info!(domain = %domain.name, ?found, ?status, stored, "tracking host re-checked");
                // Not stored: what was written meanwhile was announced with it.
                stored.then_some(status)
            }
            Ok(_) => Some(domain.tracking_status),
            Err(e) => {
                tracing::warn!(domain = %domain.name, error = %e, "tracking host check failed");
                None
            }
        };
        if let Some(status) = status {
            if let Err(e) = announce(state, domain, status).await {
                tracing::warn!(domain = %domain.name, error = %e, "tracking host not announced");
            }
        }
    }
    Ok(taken)
}

/// Stores `status`, what DNS said of `claimed`'s tracking host, unless its row was written
/// since the claim (a `verify-tracking` or `setup-tracking` meanwhile has the newer
/// answer); whether it was stored.
pub async fn settle(
    db: &PgPool, claimed: &Claimed, status: TrackingStatus,
) -> Result<bool, sqlx::Error> {
    let done =
        sqlx::query("UPDATE domains SET tracking_status = $2 WHERE id = $1 AND xmin::text = $3")
            .bind(claimed.domain.id)
            .bind(status)
            .bind(&claimed.version)
            .execute(db)
            .await?;
    Ok(done.rows_affected() == 1)
}
