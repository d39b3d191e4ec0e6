//! Many items' statements as one: an item (a claim, an outcome, a balance read) is handed
//! to a [`Batcher`], whose task runs whatever has queued up meanwhile as one statement and
//! answers each item its own result. Under load this turns one round trip (and commit) per
//! item into one per batch; alone, an item waits for nothing. One statement is in flight at
//! a time, so what arrives while it runs goes together in the next.

use std::collections::HashSet;
use std::future::Future;

use tokio::sync::{mpsc, oneshot};
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// Items written by one statement at most.
const MAX_BATCH: usize = 64;

/// A row and the item it writes: one statement takes each item once (`None`: a row that
/// may share its statement with others of its item, such as a read).
pub trait Keyed {
    /// The item, for rows a statement may take only once.
    fn key(&self) -> Option<Uuid>;
}

type Reply<O, E> = oneshot::Sender<Result<O, E>>;

/// The batching task is gone (the service is stopping).
#[derive(Debug, thiserror::Error)]
#[error("the batcher has stopped")]
pub struct Stopped;

impl From<Stopped> for String {
    fn from(e: Stopped) -> Self {
        e.to_string()
    }
}

/// Batches rows of type `I` into statements answering `O` per row, or an error `E` for
/// all of them.
pub struct Batcher<I, O, E = String> {
    tx: mpsc::UnboundedSender<(I, Reply<O, E>)>,
}

impl<I: Keyed + Send + 'static, O: Send + 'static, E: Clone + From<Stopped> + Send + 'static>
    Batcher<I, O, E>
{
    /// Starts the batching task on `tracker`; `run` writes a batch (distinct items) and
    /// answers one output per row, in order. The task ends when the batcher is dropped.
    pub fn spawn<F, Fut>(tracker: &TaskTracker, run: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<O>, E>> + Send,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<(I, Reply<O, E>)>();
        tracker.spawn(async move {
            let mut waiting: Vec<(I, Reply<O, E>)> = Vec::new();
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
                // An item met twice (two claims of one item) waits for the next statement.
                let mut seen = HashSet::new();
                let (batch, later): (Vec<_>, Vec<_>) = waiting
                    .drain(..)
                    .partition(|(item, _)| item.key().is_none_or(|key| seen.insert(key)));
                waiting = later;
                let (items, replies): (Vec<I>, Vec<Reply<O, E>>) = batch.into_iter().unzip();
                match run(items).await {
                    Ok(outputs) => {
                        for (reply, out) in replies.into_iter().zip(outputs) {
                            let _ = reply.send(Ok(out));
                        }
                    }
                    Err(e) => {
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
    pub async fn call(&self, item: I) -> Result<O, E> {
        let (reply, answer) = oneshot::channel();
        self.tx.send((item, reply)).map_err(|_| Stopped)?;
        answer.await.map_err(|_| Stopped)?
    }
}
