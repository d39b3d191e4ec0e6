//! `GET /balance`: the calling API key's credit balance. Reads arriving together are
//! answered by one query (see [`BalanceReads`]).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::extract::State;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, Semaphore};
use uuid::Uuid;

use postmesh_shared::extract::Caller;
use postmesh_shared::{ApiError, ApiKeyId, Success};

use crate::AppState;

/// The answer of `GET /balance`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Balance {
    pub balance: i64,
}

pub(crate) async fn get_balance(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<Balance>, ApiError> {
    let balance = state.balances.read(caller.key).await?;
    Ok(Success::new(Balance { balance }))
}

/// Queries in flight at once; reads arriving while all are busy wait and go together in
/// the next one.
const QUERIES_IN_FLIGHT: usize = 1;
/// Keys one query reads at most.
const KEYS_PER_QUERY: usize = 128;
/// Reads waiting for a query at most; beyond it a read queries alone.
const WAITING_MAX: usize = 4096;

/// One read waiting for its query: the key and where its balance goes (`None`: the
/// query failed, so the read is made again alone and answers its own error).
struct Waiting {
    key: ApiKeyId,
    reply: oneshot::Sender<Option<i64>>,
}

/// Balance reads of concurrent requests batched into one `= ANY($1)` query, with no
/// waiting added: a read queries at once while a query slot is free, and the reads that
/// arrive while every slot is busy share the next one. Each query starts after every read
/// it answers arrived, so a read sees every write committed before its request came.
#[derive(Clone)]
pub struct BalanceReads {
    db: PgPool,
    queue: Arc<OnceLock<mpsc::Sender<Waiting>>>,
}

impl BalanceReads {
    /// Reads over `db`; the batching task starts with the first read.
    pub fn new(db: PgPool) -> Self {
        Self {
            db,
            queue: Arc::new(OnceLock::new()),
        }
    }

    /// The key's balance; a key that never had credits has 0.
    pub async fn read(&self, key: ApiKeyId) -> Result<i64, ApiError> {
        let (reply, answer) = oneshot::channel();
        let queued = self
            .queue
            .get_or_init(|| self.start())
            .try_send(Waiting { key, reply });
        if queued.is_ok() {
            if let Ok(Some(balance)) = answer.await {
                return Ok(balance);
            }
        }
        Ok(crate::ledger::current_balance(&self.db, key).await?)
    }

    /// Starts the task that gathers waiting reads into queries.
    fn start(&self) -> mpsc::Sender<Waiting> {
        let (tx, mut rx) = mpsc::channel::<Waiting>(WAITING_MAX);
        let db = self.db.clone();
        tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(QUERIES_IN_FLIGHT));
            while let Some(first) = rx.recv().await {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let mut batch = vec![first];
                while batch.len() < KEYS_PER_QUERY {
                    match rx.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let db = db.clone();
                tokio::spawn(async move {
                    answer(&db, batch).await;
                    drop(slot);
                });
            }
        });
        tx
    }
}

/// Reads the balances of `batch` in one query and answers each.
async fn answer(db: &PgPool, batch: Vec<Waiting>) {
    let mut keys: Vec<Uuid> = batch.iter().map(|w| w.key.as_uuid()).collect();
    keys.sort_unstable();
    keys.dedup();
    let rows: Result<Vec<(Uuid, i64)>, _> =
        sqlx::query_as("SELECT api_key_id, balance FROM balances WHERE api_key_id = ANY($1)")
            .bind(&keys)
            .fetch_all(db)
            .await;
    let found: Option<HashMap<Uuid, i64>> = rows.ok().map(|rows| rows.into_iter().collect());
    for w in batch {
        let balance = found
            .as_ref()
            .map(|f| f.get(&w.key.as_uuid()).copied().unwrap_or(0));
        let _ = w.reply.send(balance);
    }
}
