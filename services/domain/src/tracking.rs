//! A domain's own tracking host: `setup-tracking` answers the CNAME to publish
//! (`track.<domain>` → `TRACKING_HOST`), `verify-tracking` looks it up and stores the
//! result. Once verified, mail from the domain links through `https://track.<domain>`
//! (the `sendable` RPC tells the sender), so its links are its own, not a shared host's.

use axum::extract::State;
use serde::{Deserialize, Serialize};

use postmesh_shared::db::now_unix;
use postmesh_shared::{ApiError, Success};

use crate::dns::host_name;
use crate::domains::{TrackingStatus, VerifiedDomain};
use crate::records::{self, DnsRecord};
use crate::AppState;

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

/// Stores `status` for domain `id`.
async fn store(state: &AppState, id: uuid::Uuid, status: TrackingStatus) -> Result<(), ApiError> {
    sqlx::query("UPDATE domains SET tracking_status = $2, tracking_checked_at = $3 WHERE id = $1")
        .bind(id)
        .bind(status)
        .bind(now_unix())
        .execute(&state.db)
        .await?;
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
    store(&state, domain.id, status).await?;
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
    let found = state.dns.cname(&host).await?;
    let ready = found.as_deref() == Some(target.as_str());
    let status = if ready {
        TrackingStatus::Verified
    } else {
        TrackingStatus::Pending
    };
    store(&state, domain.id, status).await?;
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
