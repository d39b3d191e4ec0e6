//! Inbound mail: a domain receives through us when its highest-priority MX records all
//! point at `INBOUND_MX_HOST`. The latest check's result is stored.

use axum::extract::State;
use serde::{Deserialize, Serialize};

use postmesh_shared::db::now_unix;
use postmesh_shared::{ApiError, Success};

use crate::dns::{host_name, Mx};
use crate::domains::{InboundStatus, VerifiedDomain};
use crate::records::{self, DnsRecord, MX_PRIORITY};
use crate::AppState;

/// `verify-inbound` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainInboundCheck)]
#[serde(rename_all = "camelCase")]
pub struct InboundCheck {
    pub ready: bool,
    pub domain: String,
    pub inbound_status: InboundStatus,
    pub expected_mx: DnsRecord,
    pub records: Vec<DnsRecord>,
    pub message: String,
}

/// Whether the best MX records (lowest preference) are all `expected`.
pub fn routes_to(records: &[Mx], expected: &str) -> bool {
    let Some(best) = records.iter().map(|r| r.priority).min() else {
        return false;
    };
    records
        .iter()
        .filter(|r| r.priority == best)
        .all(|r| r.host == expected)
}

pub(crate) async fn verify(
    State(state): State<AppState>, VerifiedDomain(domain): VerifiedDomain,
) -> Result<Success<InboundCheck>, ApiError> {
    let expected = host_name(&state.settings.inbound_mx_host);
    let found = state.dns.mx(&domain.name).await?;
    let ready = routes_to(&found, &expected);
    let status = if ready {
        InboundStatus::Verified
    } else {
        InboundStatus::Pending
    };
    sqlx::query("UPDATE domains SET inbound_status = $2, inbound_checked_at = $3 WHERE id = $1")
        .bind(domain.id)
        .bind(status)
        .bind(now_unix())
        .execute(&state.db)
        .await?;
    let message = if ready {
        format!("mail for {} now reaches {expected}", domain.name)
    } else if found.is_empty() {
        format!(
            "{} has no MX record: add MX {} {expected}",
            domain.name, MX_PRIORITY
        )
    } else {
        format!(
            "the highest-priority MX of {} is not {expected}: make it the only MX with the lowest preference",
            domain.name
        )
    };
    Ok(Success::new(InboundCheck {
        ready,
        inbound_status: status,
        expected_mx: records::inbound(&domain.name, &expected).remove(0),
        records: found
            .into_iter()
            .map(|r| DnsRecord {
                kind: "MX".into(),
                name: domain.name.clone(),
                value: r.host,
                priority: Some(r.priority),
                proxied: false,
            })
            .collect(),
        domain: domain.name,
        message,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mx(priority: u16, host: &str) -> Mx {
        Mx {
            priority,
            host: host.into(),
        }
    }

    #[test]
    fn only_the_best_preference_counts() {
        let ours = "mx.postmesh.localhost";
        assert!(routes_to(&[mx(10, ours)], ours));
        assert!(routes_to(&[mx(5, ours), mx(20, "other.example")], ours));
        assert!(!routes_to(&[mx(5, "other.example"), mx(10, ours)], ours));
        assert!(!routes_to(&[mx(10, ours), mx(10, "other.example")], ours));
        assert!(!routes_to(&[], ours));
    }
}
