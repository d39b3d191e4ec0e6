//! apply-dns: writes a domain's records into its zone at the DNS host (Cloudflare), creating
//! only what is missing, leaving identical records alone and never touching a conflicting
//! one (it is reported instead). The workspace's saved token is sealed at rest.

use axum::body::Bytes;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ObjectBuilder, Type};

use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, JsonBody};
use postmesh_shared::{ApiError, Success, WorkspaceId};

use crate::cloudflare::{CloudflareError, Record};
use crate::dns::host_name;
use crate::domains::{TrackingStatus, VerifiedDomain};
use crate::records::{self, DnsRecord};
use crate::AppState;

/// The one supported DNS host.
pub const PROVIDER: &str = "cloudflare";
/// Longest API token accepted.
const MAX_TOKEN_LEN: usize = 1000;

/// Which records apply-dns writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainDnsScope)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Outbound,
    Inbound,
    Tracking,
    All,
}

/// The body of `POST /sender-domains/{id}/apply-dns` (it may be left out): each field
/// defaults (`cloudflare`, `all`, the saved token).
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[schema(as = SenderDomainApplyDnsRequest)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ApplyRequest {
    provider: Option<ProviderName>,
    scope: Option<Scope>,
    api_token: Option<String>,
}

/// A record left alone because the zone holds something else there.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainDnsConflict)]
pub struct Conflict {
    pub record: DnsRecord,
    pub existing: Vec<DnsRecord>,
}

/// `apply-dns` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainDnsApplied)]
pub struct Applied {
    pub provider: String,
    pub zone: String,
    pub created: Vec<DnsRecord>,
    pub unchanged: Vec<DnsRecord>,
    pub conflicts: Vec<Conflict>,
}

/// The body of `PUT /sender-domains/dns-provider`: the DNS host's API token to keep.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = DnsProviderToken)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SaveToken {
    provider: ProviderName,
    /// 1 to 1,000 bytes once trimmed.
    #[schema(min_length = 1)]
    api_token: String,
}

/// `PUT /sender-domains/dns-provider` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = DnsProviderSaved)]
pub struct Saved {
    pub provider: String,
    pub saved: bool,
}

/// The one provider [`ProviderName::check`] takes.
fn provider_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some([PROVIDER]))
}

postmesh_shared::text_input! {
    /// A DNS host's name as a body gives it, which [`ProviderName::check`] takes only as
    /// [`PROVIDER`]; its schema says the same.
    #[derive(Debug)]
    pub struct ProviderName as "DnsProvider" = provider_schema();
}

impl ProviderName {
    /// Whether the host is one Postmesh drives; 400 otherwise.
    fn check(provider: Option<&Self>) -> Result<(), ApiError> {
        let provider = provider.map_or(PROVIDER, |p| p.0.as_str());
        if provider == PROVIDER {
            Ok(())
        } else {
            Err(ApiError::BadRequest(format!(
                "unsupported DNS provider {provider:?}: only \"{PROVIDER}\" is supported"
            )))
        }
    }
}

/// `raw` trimmed, if it is a token an `Authorization` header can carry: 1 to
/// [`MAX_TOKEN_LEN`] visible ASCII characters; else a 400.
fn checked_token(raw: &str) -> Result<&str, ApiError> {
    let token = raw.trim();
    if token.is_empty()
        || token.len() > MAX_TOKEN_LEN
        || !token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(ApiError::BadRequest(format!(
            "apiToken must be 1-{MAX_TOKEN_LEN} visible ASCII characters"
        )));
    }
    Ok(token)
}

pub(crate) async fn save_token(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<SaveToken>,
) -> Result<Success<Saved>, ApiError> {
    ProviderName::check(Some(&body.provider))?;
    let token = checked_token(&body.api_token)?;
    let sealed = state
        .secrets
        .seal(caller.workspace.as_uuid().as_bytes(), token.as_bytes());
    sqlx::query(
        "INSERT INTO dns_providers (workspace_id, provider, sealed_token, updated_at)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (workspace_id, provider)
         DO UPDATE SET sealed_token = EXCLUDED.sealed_token, updated_at = EXCLUDED.updated_at",
    )
    .bind(caller.workspace.as_uuid())
    .bind(PROVIDER)
    .bind(sealed)
    .bind(now_unix())
    .execute(&state.db)
    .await?;
    Ok(Success::new(Saved {
        provider: PROVIDER.into(),
        saved: true,
    }))
}

/// The body's token, else the workspace's saved one; none is a 400.
async fn token_for(
    state: &AppState, workspace: WorkspaceId, given: Option<String>,
) -> Result<String, ApiError> {
    if let Some(given) = given.filter(|t| !t.trim().is_empty()) {
        return checked_token(&given).map(str::to_owned);
    }
    let sealed: Option<Vec<u8>> = sqlx::query_scalar(
        "SELECT sealed_token FROM dns_providers WHERE workspace_id = $1 AND provider = $2",
    )
    .bind(workspace.as_uuid())
    .bind(PROVIDER)
    .fetch_optional(&state.db)
    .await?;
    let sealed = sealed.ok_or_else(|| {
        ApiError::BadRequest(
            "no DNS provider token: pass apiToken or save one with PUT /sender-domains/dns-provider"
                .into(),
        )
    })?;
    state
        .secrets
        .open(workspace.as_uuid().as_bytes(), &sealed)
        .and_then(|t| String::from_utf8(t).ok())
        .ok_or_else(|| {
            ApiError::BadRequest(
                "the saved DNS provider token cannot be read: save it again".into(),
            )
        })
}

pub(crate) async fn apply(
    State(state): State<AppState>, caller: Caller, VerifiedDomain(domain): VerifiedDomain,
    body: Bytes,
) -> Result<Success<Applied>, ApiError> {
    let req: ApplyRequest = if body.iter().all(u8::is_ascii_whitespace) {
        ApplyRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadRequest(format!("invalid body: {e}")))?
    };
    ProviderName::check(req.provider.as_ref())?;
    let scope = req.scope.unwrap_or(Scope::All);
    let token = token_for(&state, caller.workspace, req.api_token).await?;

    let mut wanted = Vec::new();
    let tracking = domain.tracking_status != TrackingStatus::NotStarted;
    if scope == Scope::Tracking && !tracking {
        return Err(ApiError::Conflict(format!(
            "tracking is not set up for {}: call setup-tracking first",
            domain.name
        )));
    }
    if (scope == Scope::Tracking || scope == Scope::All) && tracking {
        wanted.push(records::tracking(
            &domain.name,
            &host_name(&state.settings.tracking_host),
        ));
    }
    if matches!(scope, Scope::Inbound | Scope::All) {
        wanted.extend(records::inbound(
            &domain.name,
            &host_name(&state.settings.inbound_mx_host),
        ));
    }
    if matches!(scope, Scope::Outbound | Scope::All) {
        if domain.dkim_tokens.is_empty() {
            if scope == Scope::Outbound {
                return Err(ApiError::Conflict(format!(
                    "sending is not set up for {}: call setup-outbound first",
                    domain.name
                )));
            }
        } else {
            wanted.extend(records::outbound(
                &domain.name,
                &domain.dkim_tokens,
                &state.settings.ses_region,
            ));
        }
    }

    let cf = &state.cloudflare;
    let zone = cf.find_zone(&token, &domain.name).await?.ok_or_else(|| {
        ApiError::BadRequest(format!(
            "no Cloudflare zone for {} is visible to this token",
            domain.name
        ))
    })?;
    let mut applied = Applied {
        provider: PROVIDER.into(),
        zone: zone.name.clone(),
        created: Vec::new(),
        unchanged: Vec::new(),
        conflicts: Vec::new(),
    };
    for record in wanted {
        let existing: Vec<DnsRecord> = cf
            .records(&token, &zone.id, &record.name)
            .await?
            .into_iter()
            .map(from_cloudflare)
            .collect();
        match compare(&record, &existing) {
            Outcome::Present => applied.unchanged.push(record),
            Outcome::Conflict(existing) => applied.conflicts.push(Conflict { record, existing }),
            Outcome::Missing => match cf.create(&token, &zone.id, &to_cloudflare(&record)).await {
                Ok(_) => applied.created.push(record),
                // Made meanwhile by an apply-dns that raced this one (a retry, say).
                Err(CloudflareError::Exists) => applied.unchanged.push(record),
                Err(e) => return Err(e.into()),
            },
        }
    }
    Ok(Success::new(applied))
}

/// How a wanted record stands against the records already at its name.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Present,
    Missing,
    Conflict(Vec<DnsRecord>),
}

/// Identical (and not proxied) → present. A CNAME excludes every other record at its name;
/// an MX, or an SPF TXT, excludes another of its kind; anything else coexists.
fn compare(wanted: &DnsRecord, existing: &[DnsRecord]) -> Outcome {
    let same = |r: &DnsRecord| {
        r.kind == wanted.kind
            && normalize(r) == normalize(wanted)
            && r.priority == wanted.priority
            && !r.proxied
    };
    if existing.iter().any(same) {
        return Outcome::Present;
    }
    let is_spf = |r: &DnsRecord| r.kind == "TXT" && normalize(r).starts_with("v=spf1");
    let clashing: Vec<DnsRecord> = existing
        .iter()
        .filter(|r| match wanted.kind.as_str() {
            "CNAME" => true,
            "MX" => r.kind == "CNAME" || r.kind == "MX",
            "TXT" if is_spf(wanted) => r.kind == "CNAME" || is_spf(r),
            _ => r.kind == "CNAME",
        })
        .cloned()
        .collect();
    if clashing.is_empty() {
        Outcome::Missing
    } else {
        Outcome::Conflict(clashing)
    }
}

/// The comparable value: host names without case or final dot, TXT without its quotes.
fn normalize(r: &DnsRecord) -> String {
    match r.kind.as_str() {
        "TXT" => r
            .value
            .split('"')
            .enumerate()
            .filter(|(i, _)| r.value.starts_with('"') == (i % 2 == 1))
            .map(|(_, part)| part)
            .collect::<String>()
            .trim()
            .to_owned(),
        _ => host_name(&r.value),
    }
}

fn from_cloudflare(r: Record) -> DnsRecord {
    DnsRecord {
        kind: r.kind,
        name: host_name(&r.name),
        value: r.content,
        priority: r.priority,
        proxied: r.proxied,
    }
}

fn to_cloudflare(r: &DnsRecord) -> Record {
    Record {
        kind: r.kind.clone(),
        name: r.name.clone(),
        content: if r.kind == "TXT" {
            format!("\"{}\"", r.value)
        } else {
            r.value.clone()
        },
        priority: r.priority,
        proxied: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: &str, value: &str, priority: Option<u16>) -> DnsRecord {
        DnsRecord {
            kind: kind.into(),
            name: "mail.example.com".into(),
            value: value.into(),
            priority,
            proxied: false,
        }
    }

    #[test]
    fn identical_records_are_present_whatever_the_spelling() {
        let mx = rec("MX", "feedback-smtp.us-east-1.amazonses.com", Some(10));
        let found = rec("MX", "Feedback-SMTP.us-east-1.amazonses.com.", Some(10));
        assert_eq!(compare(&mx, &[found]), Outcome::Present);
        let spf = rec("TXT", records::SPF, None);
        let quoted = rec("TXT", &format!("\"{}\"", records::SPF), None);
        assert_eq!(compare(&spf, &[quoted]), Outcome::Present);
        let split = rec("TXT", "\"v=spf1 include:amazonses.com\" \" ~all\"", None);
        assert_eq!(compare(&spf, &[split]), Outcome::Present);
    }

    #[test]
    fn clashes_are_conflicts_and_unrelated_records_coexist() {
        let spf = rec("TXT", records::SPF, None);
        let other_spf = rec("TXT", "v=spf1 include:_spf.google.com ~all", None);
        let verification = rec("TXT", "google-site-verification=abc", None);
        assert_eq!(
            compare(&spf, std::slice::from_ref(&verification)),
            Outcome::Missing
        );
        assert_eq!(
            compare(&spf, &[verification, other_spf.clone()]),
            Outcome::Conflict(vec![other_spf])
        );
        let mx = rec("MX", "feedback-smtp.us-east-1.amazonses.com", Some(10));
        let other_mx = rec("MX", "mx.other.example", Some(10));
        let worse_priority = rec("MX", "feedback-smtp.us-east-1.amazonses.com", Some(20));
        assert!(matches!(compare(&mx, &[other_mx]), Outcome::Conflict(_)));
        assert!(matches!(
            compare(&mx, &[worse_priority]),
            Outcome::Conflict(_)
        ));
        let cname = rec("CNAME", "abc.dkim.amazonses.com", None);
        assert!(matches!(
            compare(&cname, &[rec("TXT", "x", None)]),
            Outcome::Conflict(_)
        ));
        assert_eq!(compare(&cname, &[]), Outcome::Missing);
    }
}
