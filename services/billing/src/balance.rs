//! `GET /balance`: the calling API key's credit balance.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use postmesh_shared::extract::Caller;
use postmesh_shared::ApiError;

use crate::{key_id, AppState};

pub async fn get_balance(
    State(st): State<AppState>,
    Caller(auth): Caller,
) -> Result<Json<Value>, ApiError> {
    let balance = crate::ledger::current_balance(&st.db, key_id(&auth)?).await?;
    Ok(Json(json!({ "success": true, "balance": balance })))
}
