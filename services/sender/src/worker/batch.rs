//! Many jobs' writes as one statement: a job's claim or outcome is handed to a [`Batcher`],
//! whose task writes whatever has queued up meanwhile in one statement and answers each job
//! its own result. Under load this turns one commit per job into one per batch; alone, a
//! job waits for nothing.

use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;

use tokio::sync::{mpsc, oneshot};
use tokio_util::task::TaskTracker;

/// Items written by one statement at most.
const MAX_BATCH: usize = 64;

/// An item keyed by its job: one statement takes each job once.
pub(super) trait Keyed {
    type Key: Eq + Hash + Send;
    fn key(&self) -> Self::Key;
}

type Reply<O> = oneshot::Sender<Result<O, String>>;

/// Batches items of type `I` into statements answering `O` per item.
pub(super) struct Batcher<I, O> {
    tx: mpsc::UnboundedSender<(I, Reply<O>)>,
}

impl<I: Keyed + Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the batching task on `tracker`; `run` writes a batch (distinct jobs) and
    /// answers one output per item, in order. The task ends when the batcher is dropped.
    pub fn spawn<F, Fut>(tracker: &TaskTracker, run: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<O>, sqlx::Error>> + Send,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<(I, Reply<O>)>();
        tracker.spawn(async move {
            let mut waiting: Vec<(I, Reply<O>)> = Vec::new();
            loop {
                if waiting.is_empty() {
                    match rx.recv().await {
                        Some(item) => waiting.push(item),
                        None => return,
                    }
                }
                while waiting.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(item) => waiting.push(item),
                        Err(_) => break,
                    }
                }
                // A job met twice (two claims of one job) waits for the next statement.
                let mut seen = HashSet::new();
                let (batch, later): (Vec<_>, Vec<_>) = waiting
                    .drain(..)
                    .partition(|(item, _)| seen.insert(item.key()));
                waiting = later;
                let (items, replies): (Vec<I>, Vec<Reply<O>>) = batch.into_iter().unzip();
                match run(items).await {
                    Ok(outputs) => {
                        for (reply, out) in replies.into_iter().zip(outputs) {
                            let _ = reply.send(Ok(out));
                        }
                    }
                    Err(e) => {
                        let e = e.to_string();
                        for reply in replies {
                            let _ = reply.send(Err(e.clone()));
                        }
                    }
                }
            }
        });
        Self { tx }
    }

    /// Writes `item` with whatever else is waiting; its own result.
    pub async fn call(&self, item: I) -> Result<O, String> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((item, reply))
            .map_err(|_| "the batcher has stopped".to_owned())?;
        answer
            .await
            .map_err(|_| "the batcher has stopped".to_owned())?
    }
}
