//! Billing's typed RPCs (`{ns}.rpc.billing.*`), answered from the ledger.

use postmesh_shared::nats::ServiceHost;
use postmesh_shared::proto::{
    ChargeReply, ChargeRequest, ConfirmReply, ConfirmRequest, GrantReply, GrantRequest,
    RefundReply, RefundRequest,
};
use postmesh_shared::ApiError;

use crate::{entitlements, ledger, AppState};

/// Adds billing's RPCs to `host`.
pub fn register(host: ServiceHost, state: AppState) -> ServiceHost {
    host.rpc(state.clone(), charge)
        .rpc(state.clone(), refund)
        .rpc(state.clone(), confirm)
        .rpc(state.clone(), grant)
        .rpc(state, entitlements::rpc)
}

async fn charge(state: AppState, req: ChargeRequest) -> Result<ChargeReply, ApiError> {
    Ok(ledger::charge(&state.db, &req).await?)
}

async fn refund(state: AppState, req: RefundRequest) -> Result<RefundReply, ApiError> {
    Ok(ledger::refund(&state.db, &req).await?)
}

async fn confirm(state: AppState, req: ConfirmRequest) -> Result<ConfirmReply, ApiError> {
    Ok(ledger::confirm(&state.db, &req).await?)
}

async fn grant(state: AppState, req: GrantRequest) -> Result<GrantReply, ApiError> {
    Ok(ledger::grant(&mut *state.db.acquire().await?, &req).await?)
}
