//! `GET /balance`: the calling API key's credit balance.

use axum::extract::State;
use serde::{Deserialize, Serialize};

use postmesh_shared::extract::Caller;
use postmesh_shared::{ApiError, Success};

use crate::AppState;

/// The answer of `GET /balance`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Balance {
    pub balance: i64,
}

pub(crate) async fn get_balance(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<Balance>, ApiError> {
    let balance = crate::ledger::current_balance(&state.db, caller.key).await?;
    Ok(Success::new(Balance { balance }))
}
