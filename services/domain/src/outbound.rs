//! Outbound mail through Amazon SES: `setup-outbound` creates (or finds) the domain's email
//! identity with Easy DKIM and a custom MAIL FROM and answers the records to publish;
//! `verify-outbound` reads the identity's status back and stores it.

use axum::extract::State;
use serde::{Deserialize, Serialize};

use postmesh_ses::{EmailIdentity, SesError};
use postmesh_shared::db::now_unix;
use postmesh_shared::{ApiError, Success};

use crate::domains::{OutboundStatus, VerifiedDomain};
use crate::records::{self, DnsRecord};
use crate::AppState;

/// `setup-outbound` and `verify-outbound` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainOutboundSetup)]
#[serde(rename_all = "camelCase")]
pub struct OutboundSetup {
    pub ready: bool,
    pub domain: String,
    pub outbound_status: OutboundStatus,
    /// SES's DKIM status (`PENDING`, `SUCCESS`, `FAILED`, ...).
    pub dkim_status: String,
    /// SES's MAIL FROM status, once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mail_from_status: Option<String>,
    /// The records to publish: three DKIM CNAMEs, the MAIL FROM MX and its SPF TXT.
    pub records: Vec<DnsRecord>,
}

/// Our status of an identity as SES reports it.
pub fn status_of(identity: &EmailIdentity) -> OutboundStatus {
    let dkim = identity
        .dkim_attributes
        .as_ref()
        .map(|d| d.status.as_str())
        .unwrap_or("");
    if identity.verified_for_sending_status && dkim == "SUCCESS" {
        OutboundStatus::Verified
    } else if dkim == "FAILED" || identity.verification_status.as_deref() == Some("FAILED") {
        OutboundStatus::Failed
    } else {
        OutboundStatus::Pending
    }
}

pub(crate) async fn setup(
    State(state): State<AppState>, VerifiedDomain(domain): VerifiedDomain,
) -> Result<Success<OutboundSetup>, ApiError> {
    let ses = state.ses()?;
    let identity = match ses.get_identity(&domain.name).await {
        Ok(identity) => identity,
        Err(SesError::NotFound) => ses.create_identity(&domain.name).await?,
        Err(e) => return Err(e.into()),
    };
    let mail_from = records::mail_from(&domain.name);
    let current_mail_from = identity
        .mail_from_attributes
        .as_ref()
        .map(|m| m.mail_from_domain.as_str());
    if current_mail_from != Some(mail_from.as_str()) {
        ses.put_mail_from(&domain.name, &mail_from).await?;
    }
    store(&state, domain.id, &identity).await?;
    Ok(Success::new(answer(&state, &domain.name, &identity)))
}

pub(crate) async fn verify(
    State(state): State<AppState>, VerifiedDomain(domain): VerifiedDomain,
) -> Result<Success<OutboundSetup>, ApiError> {
    if domain.outbound_status == OutboundStatus::NotStarted {
        return Err(ApiError::Conflict(format!(
            "sending is not enabled for {}: call setup-outbound first",
            domain.name
        )));
    }
    let identity = match state.ses()?.get_identity(&domain.name).await {
        Err(SesError::NotFound) => {
            return Err(ApiError::Conflict(format!(
                "the provider has no identity for {}: call setup-outbound again",
                domain.name
            )))
        }
        other => other?,
    };
    store(&state, domain.id, &identity).await?;
    Ok(Success::new(answer(&state, &domain.name, &identity)))
}

/// Stores the identity's status and DKIM tokens.
async fn store(state: &AppState, id: uuid::Uuid, identity: &EmailIdentity) -> Result<(), ApiError> {
    let tokens = identity
        .dkim_attributes
        .as_ref()
        .map(|d| d.tokens.clone())
        .unwrap_or_default();
    sqlx::query(
        "UPDATE domains SET outbound_status = $2, dkim_tokens = $3, outbound_checked_at = $4
         WHERE id = $1",
    )
    .bind(id)
    .bind(status_of(identity))
    .bind(&tokens)
    .bind(now_unix())
    .execute(&state.db)
    .await?;
    Ok(())
}

fn answer(state: &AppState, domain: &str, identity: &EmailIdentity) -> OutboundSetup {
    let dkim = identity.dkim_attributes.clone().unwrap_or_default();
    let status = status_of(identity);
    OutboundSetup {
        ready: status == OutboundStatus::Verified,
        domain: domain.to_owned(),
        outbound_status: status,
        dkim_status: dkim.status,
        mail_from_status: identity
            .mail_from_attributes
            .as_ref()
            .map(|m| m.mail_from_domain_status.clone())
            .filter(|s| !s.is_empty()),
        records: records::outbound(domain, &dkim.tokens, &state.settings.ses_region),
    }
}
