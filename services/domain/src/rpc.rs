//! The domain service's typed RPCs (`{ns}.rpc.domain.*`): `sendable`, `inbound_domain`, and
//! its answer to billing's `usage` (custom domains).

use postmesh_shared::extract::rpc_workspace;
use postmesh_shared::nats::ServiceHost;
use postmesh_shared::proto::{
    InboundDomainReply, InboundDomainRequest, OverviewReply, OverviewRequest, SendableReply,
    SendableRequest, UsageReply, UsageRequest,
};
use postmesh_shared::{ApiError, EmailAddress};
use uuid::Uuid;

use crate::domains;
use crate::name::DomainName;
use crate::AppState;

/// Adds the domain service's RPCs to `host`.
pub fn register(host: ServiceHost, state: AppState) -> ServiceHost {
    host.rpc(state.clone(), sendable)
        .rpc(state.clone(), inbound_domain)
        .method(state.clone(), usage)
        .method(state, overview)
}

/// The workspace's domains that send (outbound verified), for the operations overview.
async fn overview(state: AppState, req: OverviewRequest) -> Result<OverviewReply, ApiError> {
    let outbound_domains: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM domains WHERE workspace_id = $1 AND outbound_status = 'verified'",
    )
    .bind(rpc_workspace(&req.workspace_id)?)
    .fetch_one(&state.db)
    .await?;
    Ok(OverviewReply {
        outbound_domains,
        ..OverviewReply::default()
    })
}

/// A platform domain, or one of the workspace's whose ownership is verified.
async fn sendable(state: AppState, req: SendableRequest) -> Result<SendableReply, ApiError> {
    let workspace = rpc_workspace(&req.workspace_id)?;
    let refuse = |domain: String, reason: String| SendableReply {
        sendable: false,
        reason,
        domain,
        ..SendableReply::default()
    };
    let Some(address) = EmailAddress::parse(&req.from_address) else {
        return Ok(refuse(
            String::new(),
            format!("{:?} is not a valid email address", req.from_address),
        ));
    };
    let raw_domain = address
        .as_str()
        .rsplit_once('@')
        .map(|(_, d)| d)
        .unwrap_or("");
    let domain = match DomainName::parse(raw_domain) {
        Ok(d) => d,
        Err(reason) => return Ok(refuse(raw_domain.to_owned(), reason)),
    };
    if state.settings.platform_domains.contains(&domain) {
        return Ok(SendableReply {
            sendable: true,
            domain: domain.to_string(),
            ..SendableReply::default()
        });
    }
    let row: Option<(domains::Ownership, bool, bool, Uuid)> = sqlx::query_as(
        "SELECT ownership, outbound_status = 'verified', tracking_status = 'verified', id
         FROM domains WHERE name = $1 AND workspace_id = $2",
    )
    .bind(domain.as_str())
    .bind(workspace.as_uuid())
    .fetch_optional(&state.db)
    .await?;
    Ok(match row {
        Some((domains::Ownership::Verified, false, _, _)) if req.outbound => refuse(
            domain.to_string(),
            format!(
                "{domain} is verified for ownership but not for sending: \
                 POST /sender-domains/{{id}}/setup-outbound, then verify-outbound"
            ),
        ),
        Some((domains::Ownership::Verified, _, tracking, id)) => {
            let (tracking_host, tracking_domain_id) = if tracking {
                (crate::records::tracking_host(domain.as_str()), id.to_string())
            } else {
                Default::default()
            };
            SendableReply {
                sendable: true,
                reason: String::new(),
                tracking_host,
                tracking_domain_id,
                domain: domain.to_string(),
            }
        }
        Some(_) => refuse(
            domain.to_string(),
            format!("{domain} is not verified yet: finish its ownership review"),
        ),
        None => refuse(
            domain.to_string(),
            format!("{domain} is not one of this workspace's sender domains: add it with POST /sender-domains"),
        ),
    })
}

/// The workspace that receives mail for a domain verified for inbound.
async fn inbound_domain(
    state: AppState, req: InboundDomainRequest,
) -> Result<InboundDomainReply, ApiError> {
    let Ok(domain) = DomainName::parse(&req.domain) else {
        return Ok(InboundDomainReply::default());
    };
    let row: Option<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT id, workspace_id FROM domains
         WHERE name = $1 AND ownership = 'verified' AND inbound_status = 'verified'",
    )
    .bind(domain.as_str())
    .fetch_optional(&state.db)
    .await?;
    Ok(match row {
        Some((id, workspace)) => InboundDomainReply {
            found: true,
            workspace_id: workspace.to_string(),
            domain_id: id.to_string(),
        },
        None => InboundDomainReply::default(),
    })
}

/// The custom domains a workspace holds; other counts belong to other services.
async fn usage(state: AppState, req: UsageRequest) -> Result<UsageReply, ApiError> {
    let workspace = rpc_workspace(&req.workspace_id)?;
    Ok(UsageReply {
        custom_domains: domains::count(&state.db, workspace).await?,
        ..UsageReply::default()
    })
}
