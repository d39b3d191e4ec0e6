//! Answers of the domain service: sender domains and their review.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

status! {
    /// Who owns a domain, as the ownership review found.
    SenderDomainOwnership Ownership {
        Pending => "pending",
        Verified => "verified",
        Rejected => "rejected",
    }
}

status! {
    /// Whether mail for the domain reaches our MX.
    SenderDomainInboundStatus InboundStatus {
        NotStarted => "not_started",
        Pending => "pending",
        Verified => "verified",
    }
}

status! {
    /// Whether the domain's own tracking host (`track.<domain>`) points at Postmesh.
    SenderDomainTrackingStatus TrackingStatus {
        NotStarted => "not_started",
        Pending => "pending",
        Verified => "verified",
    }
}

status! {
    /// Whether the provider may send as the domain.
    SenderDomainOutboundStatus OutboundStatus {
        NotStarted => "not_started",
        Pending => "pending",
        Verified => "verified",
        Failed => "failed",
    }
}

/// The ownership record to publish.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = SenderDomainVerification))]
pub struct Verification {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub value: String,
}

/// A domain record as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = SenderDomain))]
#[serde(rename_all = "camelCase")]
pub struct DomainView {
    /// None for a platform domain.
    pub id: Option<Uuid>,
    pub domain: String,
    /// A platform domain: sendable by every workspace, not deletable.
    pub platform: bool,
    pub ownership_status: Ownership,
    pub inbound_status: InboundStatus,
    pub outbound_status: OutboundStatus,
    /// Whether its links are tracked through `track.<domain>`.
    #[serde(default = "TrackingStatus::not_started")]
    pub tracking_status: TrackingStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<i64>,
}

/// `GET /sender-domains` answer.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = SenderDomainList))]
#[serde(rename_all = "camelCase")]
pub struct DomainList {
    pub inbound_mx_host: String,
    pub domains: Vec<DomainView>,
}

/// `POST /sender-domains` answer.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = SenderDomainSubmitted))]
pub struct Submitted {
    pub message: String,
    pub domain: DomainView,
}

/// The answer of a review step.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = SenderDomainReview))]
pub struct Reviewed {
    pub verified: bool,
    pub message: String,
    pub domain: DomainView,
}

impl TrackingStatus {
    /// Not set up (the default of views written before tracking domains).
    pub fn not_started() -> Self {
        Self::NotStarted
    }
}
