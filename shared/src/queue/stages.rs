//! What a service plugs into the queue worker: its [`Stages`], and the words they answer in
//! (failures, admissions, standings, verdicts, outcomes).

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

use crate::batch::Keyed;

use super::MAX_RETRY_DELAY;

/// Why an item's work failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Will never succeed: the item fails for good.
    #[error("permanent failure: {0}")]
    Permanent(String),
    /// May succeed later: the item is tried again (until `max_deliver`).
    #[error("temporary failure: {0}")]
    Transient(String),
    /// May succeed after this pause (a receiver's `Retry-After`), until `max_deliver`.
    #[error("temporary failure: {0}")]
    Later(String, Duration),
}

/// Why a stage's step outside the work failed (decode, prepare, claim, standing, record,
/// renew).
#[derive(Clone, Debug, thiserror::Error)]
pub enum StageError {
    /// The message can never make a job: it goes aside as a dead letter at once.
    #[error("undecodable: {0}")]
    Undecodable(String),
    /// The database or a service was out of reach (connection lost, pool exhausted, timed
    /// out): the job is tried again.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The database refused the statement (a bad query, a broken constraint): a defect,
    /// logged as an error; the job is tried again.
    #[error("refused: {0}")]
    Refused(String),
}

impl From<sqlx::Error> for StageError {
    fn from(e: sqlx::Error) -> Self {
        match crate::error::database_unreachable(&e) {
            true => Self::Unavailable(e.to_string()),
            false => Self::Refused(e.to_string()),
        }
    }
}

impl From<crate::batch::Stopped> for StageError {
    fn from(e: crate::batch::Stopped) -> Self {
        Self::Unavailable(e.to_string())
    }
}

/// Whether an item of a job is worked by this run of it.
pub enum Admission {
    /// Now: claim it and do the work.
    Now,
    /// The stage handed it to another job of its own: nothing to do here.
    Elsewhere,
    /// Not now: the job is tried again later, this item with it.
    Later(String),
}

/// Where an item stands when a claim did not take it.
pub enum Standing {
    /// Finished before: nothing to do.
    Finished,
    /// Another claim holds a live lease for about this long.
    Held(Duration),
}

/// A claim to write: the item, this claim's lease token and the service's own columns.
pub struct ClaimRow<D> {
    pub item: Uuid,
    pub lease: Uuid,
    pub data: D,
}

impl<D> Keyed for ClaimRow<D> {
    fn key(&self) -> Option<Uuid> {
        Some(self.item)
    }
}

/// What an item's work means for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Done; the work's detail (a provider's message id).
    Done(String),
    /// Failed for good.
    Failed(String),
    /// Failed for now; the item stays claimable and is tried again after the pause.
    Retry(String, Duration),
}

impl Verdict {
    /// The verdict on a piece of work; a transient failure of the `last` attempt is final,
    /// another is retried after the pause it asked for, else after `backoff`. Its text holds
    /// no NUL (an outside system's error may), which PostgreSQL text cannot store: one such
    /// text would fail the write of every outcome batched with it.
    pub fn of(result: Result<String, Failure>, last: bool, backoff: Duration) -> Self {
        let text = |e: String| match e.contains('\0') {
            true => e.replace('\0', "\u{FFFD}"),
            false => e,
        };
        match result {
            Ok(detail) => Self::Done(text(detail)),
            Err(Failure::Permanent(e)) => Self::Failed(text(e)),
            Err(Failure::Transient(e) | Failure::Later(e, _)) if last => Self::Failed(text(e)),
            Err(Failure::Transient(e)) => Self::Retry(text(e), backoff),
            Err(Failure::Later(e, after)) => Self::Retry(text(e), after),
        }
    }
}

/// An outcome to write, by the claim that holds the item.
#[derive(Clone, Debug)]
pub struct RecordRow {
    pub item: Uuid,
    pub lease: Uuid,
    pub verdict: Verdict,
    /// When the try that reached the verdict began (Unix seconds): what it handed over went
    /// no later.
    pub tried_at: i64,
}

impl Keyed for RecordRow {
    fn key(&self) -> Option<Uuid> {
        Some(self.item)
    }
}

/// The service's part of a queue worker. Each stage takes only what it needs.
pub trait Stages: Send + Sync + 'static {
    /// A decoded job.
    type Job: Send + Sync + 'static;
    /// What a job's items share, read once per run of the job (the sender's task).
    type Shared: Send + Sync + 'static;
    /// What a claim writes besides the lease: the item's own columns.
    type ClaimData: Send + 'static;

    /// Parses a message; the error says why the job can never run (it is dropped).
    fn decode(&self, payload: &[u8]) -> Result<Self::Job, StageError>;

    /// The ids of the job's items, each claimed, worked and recorded on its own.
    fn items(&self, job: &Self::Job) -> Vec<Uuid>;

    /// Reads what the job's items share; an error retries the job.
    fn prepare(
        &self, job: &Self::Job,
    ) -> impl Future<Output = Result<Self::Shared, StageError>> + Send;

    /// Whether the item at `index` is worked now (before its claim; by default, yes): a
    /// stage that limits work per destination hands a busy one elsewhere.
    fn admit(
        &self, _job: &Self::Job, _shared: &Self::Shared, _index: usize,
    ) -> impl Future<Output = Admission> + Send {
        async { Admission::Now }
    }

    /// What the claim of the item at `index` writes.
    fn claim_data(&self, job: &Self::Job, shared: &Self::Shared, index: usize) -> Self::ClaimData;

    /// Writes claims of distinct items in one statement: each takes its item's lease
    /// (`lease_ms` from now on the database clock) unless the item is finished or another
    /// claim's lease is live; answers each taken claim's attempt number.
    fn claim(
        &self, rows: Vec<ClaimRow<Self::ClaimData>>, lease_ms: i64,
    ) -> impl Future<Output = Result<Vec<Option<i32>>, StageError>> + Send;

    /// Where an item stands that a claim did not take.
    fn standing(&self, item: Uuid) -> impl Future<Output = Result<Standing, StageError>> + Send;

    /// The item's work; `Ok` carries a detail to record.
    fn work(
        &self, job: &Self::Job, shared: &Self::Shared, index: usize,
    ) -> impl Future<Output = Result<String, Failure>> + Send;

    /// Writes outcomes of distinct items in one statement; answers whether each was written.
    /// `Done` always stands (the work happened); a failure or a retry only while its claim
    /// still holds the item.
    fn record(
        &self, rows: Vec<RecordRow>,
    ) -> impl Future<Output = Result<Vec<bool>, StageError>> + Send;

    /// Extends the leases `lease` holds on `items` to `lease_ms` from now.
    fn renew(
        &self, items: &[Uuid], lease: Uuid, lease_ms: i64,
    ) -> impl Future<Output = Result<(), StageError>> + Send;

    /// The pause after failed attempt number `attempt` of an item; `None`: the queue's
    /// doubling backoff from `retry_base`.
    fn retry_delay(&self, _attempt: i64) -> Option<Duration> {
        None
    }
}

/// How handling an item, or a whole job, ended; decides how the job is acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done now, or before (a redelivery of a finished item).
    Done,
    /// Another claim holds a live lease for about this long.
    Leased(Duration),
    /// Another claim took the item over while this one worked: the job is its business.
    Superseded,
    /// A transient failure: try again later (after the pause, when the item chose one).
    Retry(String, Option<Duration>),
    /// Not admitted now (its destination is busy): try again later, no failure.
    NotNow(String),
    /// Failed for good (recorded as such).
    Park(String),
    /// Not started: the worker is stopping.
    Stopped,
    /// The job's handling panicked outside an item's work: counted toward a dead letter.
    Panicked(String),
}

impl Outcome {
    /// How pressing an outcome is for the job it belongs to.
    fn rank(&self) -> u8 {
        match self {
            Self::Done => 0,
            Self::Park(_) => 1,
            Self::Superseded => 2,
            Self::Stopped => 3,
            Self::Leased(_) => 4,
            Self::Retry(_, Some(_)) => 5,
            // Unrecorded: only a redelivery of the job tries it again.
            Self::Retry(_, None) | Self::NotNow(_) => 6,
            Self::Panicked(_) => 7,
        }
    }

    /// The outcome of a job from those of its items: any retry retries the job (its
    /// finished items are skipped then), a held or handed-back one hands it back, one taken
    /// over leaves it to the other claim; otherwise every item is finished, and the job is
    /// parked only when each of them failed for good.
    pub fn of_job(outcomes: Vec<Outcome>) -> Outcome {
        let all_parked = outcomes.iter().all(|o| matches!(o, Self::Park(_)));
        let job = outcomes
            .into_iter()
            .fold(Self::Done, |job, outcome| match (job, outcome) {
                (Self::Leased(a), Self::Leased(b)) => Self::Leased(a.max(b)),
                (job, outcome) if outcome.rank() > job.rank() => outcome,
                (job, _) => job,
            });
        match job {
            Self::Park(_) if !all_parked => Self::Done,
            job => job,
        }
    }
}

/// The pause before retry number `delivered`: doubling from `base`, at most 15 minutes.
/// Deliveries are not capped, so a long outage must not push the next try days away.
pub fn retry_delay(base: Duration, delivered: i64) -> Duration {
    let doublings = u32::try_from((delivered - 1).clamp(0, 16)).unwrap_or(16);
    (base * 2u32.pow(doublings)).min(MAX_RETRY_DELAY)
}
