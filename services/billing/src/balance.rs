//! `GET /balance`: the calling API key's credit balance. Reads arriving together are
//! answered by one query (see [`BalanceReads`]).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::extract::State;

use sqlx::PgPool;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use postmesh_shared::batch::{Batcher, Keyed};
use postmesh_shared::extract::Caller;
use postmesh_shared::{ApiError, ApiKeyId, Success};

use crate::AppState;

pub use postmesh_contracts::answers::billing::Balance;

pub(crate) async fn get_balance(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<Balance>, ApiError> {
    let balance = state.balances.read(caller.key).await?;
    Ok(Success::new(Balance { balance }))
}

/// One balance read: reads of one key may share a statement.
struct Read(ApiKeyId);

impl Keyed for Read {
    fn key(&self) -> Option<Uuid> {
        None
    }
}

/// Balance reads of concurrent requests batched into one `= ANY($1)` query by the kit's
/// [`Batcher`]: a read queries at once when no query is in flight, and the reads arriving
/// while one is share the next. Each query starts after every read it answers arrived, so
/// a read sees every write committed before its request came.
#[derive(Clone)]
pub struct BalanceReads {
    db: PgPool,
    batcher: Arc<OnceLock<Batcher<Read, i64>>>,
}

impl BalanceReads {
    /// Reads over `db`; the batching task starts with the first read.
    pub fn new(db: PgPool) -> Self {
        Self {
            db,
            batcher: Arc::new(OnceLock::new()),
        }
    }

    /// The key's balance; a key that never had credits has 0. When the batch's query
    /// fails, the read is made again alone and answers its own error.
    pub async fn read(&self, key: ApiKeyId) -> Result<i64, ApiError> {
        let batcher = self.batcher.get_or_init(|| {
            let db = self.db.clone();
            Batcher::spawn(&TaskTracker::new(), move |reads| {
                let db = db.clone();
                async move { balances(&db, reads).await.map_err(|e| e.to_string()) }
            })
        });
        match batcher.call(Read(key)).await {
            Ok(balance) => Ok(balance),
            Err(_) => Ok(crate::ledger::current_balance(&self.db, key).await?),
        }
    }
}

/// The balances of `reads`, in order, in one query.
async fn balances(db: &PgPool, reads: Vec<Read>) -> Result<Vec<i64>, sqlx::Error> {
    let mut keys: Vec<Uuid> = reads.iter().map(|r| r.0.as_uuid()).collect();
    keys.sort_unstable();
    keys.dedup();
    let found: HashMap<Uuid, i64> =
        sqlx::query_as("SELECT api_key_id, balance FROM balances WHERE api_key_id = ANY($1)")
            .bind(&keys)
            .fetch_all(db)
            .await?
            .into_iter()
            .collect();
    Ok(reads
        .iter()
        .map(|r| found.get(&r.0.as_uuid()).copied().unwrap_or(0))
        .collect())
}
