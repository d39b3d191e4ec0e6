//! A send's binding to an idempotency key: an `Idempotency-Key` header bound to the digest of
//! its body for ever, or a raw message's Message-ID bound to whatever send it made for a day.
//! A repeat finds the stored send's answer.

use sha2::{Digest, Sha256};
use sqlx::types::Json;

use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, IdempotencyKey};
use postmesh_shared::ApiError;

use crate::sending::request::SendBody;
use crate::AppState;

use postmesh_contracts::answers::sender::SendAnswer;

/// A send's `Idempotency-Key` with the digest of its body in canonical form.
pub(crate) struct Keyed {
    pub(crate) key: IdempotencyKey,
    pub(crate) digest: Vec<u8>,
    /// How long the key binds, in seconds; none: for ever.
    window: Option<i64>,
}

impl Keyed {
    pub(crate) fn new(key: IdempotencyKey, body: &SendBody) -> Self {
        let canonical = serde_json::to_vec(body).unwrap_or_default();
        Self {
            key,
            digest: Sha256::digest(canonical).to_vec(),
            window: None,
        }
    }

    /// A key bound for `secs` to whatever send is stored under it first (a raw message's
    /// Message-ID: a repeat of it is the same message, however its bytes differ).
    pub(crate) fn within(key: IdempotencyKey, secs: i64) -> Self {
        Self {
            key,
            digest: Vec::new(),
            window: Some(secs),
        }
    }

    /// The answer of the send stored under this key, if any; 409 when it was made with
    /// another body.
    pub(crate) async fn stored(
        &self, state: &AppState, caller: &Caller,
    ) -> Result<Option<SendAnswer>, ApiError> {
        if let Some(secs) = self.window {
            // A key past its window binds nothing: the send it was stored with lets go of it.
            sqlx::query(
                "UPDATE tasks SET idempotency_key = NULL
                 WHERE workspace_id = $1 AND idempotency_key = $2 AND created_at <= $3",
            )
            .bind(caller.workspace)
            .bind(self.key.as_str())
            .bind(now_unix() - secs)
            .execute(&state.db)
            .await?;
        }
        let row: Option<(Vec<u8>, Json<SendAnswer>)> = sqlx::query_as(
            "SELECT request_digest, answer FROM tasks
             WHERE workspace_id = $1 AND idempotency_key = $2",
        )
        .bind(caller.workspace)
        .bind(self.key.as_str())
        .fetch_optional(&state.db)
        .await?;
        match row {
            None => Ok(None),
            Some((digest, Json(answer))) if digest == self.digest => Ok(Some(answer)),
            Some(_) => Err(ApiError::Conflict(
                "this Idempotency-Key was used for another send; use a new key".into(),
            )),
        }
    }
}
