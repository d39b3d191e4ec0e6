//! `GET /balance`: the calling API key's credit balance.

use axum::extract::State;
use serde::{Deserialize, Serialize};

use postmesh_contracts::routes::billing as api;
use postmesh_shared::extract::Caller;
use postmesh_shared::{ApiError, Routes, Success};

use crate::AppState;

/// This module's routes.
pub fn routes() -> Routes<AppState> {
    Routes::new().at(api::BALANCE, get_balance)
}

/// The answer of `GET /balance`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Balance {
    pub balance: i64,
}

async fn get_balance(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Success<Balance>, ApiError> {
    let balance = crate::ledger::current_balance(&state.db, caller.key).await?;
    Ok(Success::new(Balance { balance }))
}
