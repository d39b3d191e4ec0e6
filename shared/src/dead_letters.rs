//! Dead letters: a stream message that can never be decoded, or whose handling panicked or
//! failed `MAX_DELIVER` times, is kept aside in the consuming service's `dead_letters` table
//! (stream, subject, payload, last error, count) and acknowledged, so its consumer goes on.
//! An operator lists them (`GET /admin/dead-letters`) and puts one back on its subject
//! (`POST /admin/dead-letters/{id}/requeue`); `postmesh_dead_letters_total` counts them.

use std::any::Any;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use sqlx::migrate::Migrator;
use sqlx::PgPool;
use uuid::Uuid;

use crate::db::now_unix;
use crate::error::ApiError;
use crate::nats::ServiceHost;
use crate::proto::{
    DeadLetter, DeadLettersReply, DeadLettersRequest, RequeueDeadLetterReply,
    RequeueDeadLetterRequest,
};
use crate::service::Service;

/// The `dead_letters` table, for services that consume streams (versions 9101 on).
pub static DEAD_LETTER_MIGRATIONS: Migrator = sqlx::migrate!("./migrations-dead-letters");

/// How much of each letter's payload a listing carries: a page of the most letters (100),
/// each with its error, stays well within NATS's 1 MiB `max_payload`.
pub const PAYLOAD_PREVIEW: i32 = 4096;

/// The pause before a message whose failure could not be counted is tried again.
pub const UNCOUNTED_RETRY: Duration = Duration::from_secs(2);

/// A consuming service's dead letters.
#[derive(Clone)]
pub struct DeadLetters {
    db: PgPool,
    js: jetstream::Context,
    service: Service,
    /// Failures after which a message is dead (`MAX_DELIVER`).
    max_deliver: u32,
}

/// What became of a failed message.
#[derive(Debug, PartialEq, Eq)]
pub enum Fate {
    /// Tried again after this pause.
    Retry(Duration),
    /// Kept aside as a dead letter: acknowledge it.
    Dead,
}

impl DeadLetters {
    /// The dead letters of `service`, dead after `max_deliver` failures.
    pub fn new(db: PgPool, js: jetstream::Context, service: Service, max_deliver: u32) -> Self {
        Self {
            db,
            js,
            service,
            max_deliver: max_deliver.max(1),
        }
    }

    /// Counts a failure of `msg` (`error`); at the `max_deliver`th it is dead, before that
    /// it is tried again after a pause doubling from `retry_base`. `None` when the count
    /// could not be written (the message is then simply tried again).
    pub async fn failed(
        &self, msg: &jetstream::Message, error: &str, retry_base: Duration,
    ) -> Option<Fate> {
        let (count, dead) = self.write(msg, error, None).await?;
        if dead {
            return Some(Fate::Dead);
        }
        let doublings = u32::try_from(count.clamp(1, 10) - 1).unwrap_or(0);
        Some(Fate::Retry(retry_base * 2u32.pow(doublings)))
    }

    /// Keeps `msg` aside at once after `tries` failures (1 for one that can never be
    /// decoded); `error` says why.
    pub async fn dead(&self, msg: &jetstream::Message, error: &str, tries: i32) -> Option<Fate> {
        self.write(msg, error, Some(tries))
            .await
            .map(|_| Fate::Dead)
    }

    /// Acknowledges `msg` as its `fate` says: dead ones acked, others handed back after their
    /// pause; a failure that could not be counted is handed back after [`UNCOUNTED_RETRY`].
    pub async fn settle(msg: &jetstream::Message, fate: Option<Fate>) {
        let _ = match fate {
            Some(Fate::Dead) => msg.ack().await,
            Some(Fate::Retry(after)) => msg.ack_with(AckKind::Nak(Some(after))).await,
            None => msg.ack_with(AckKind::Nak(Some(UNCOUNTED_RETRY))).await,
        };
    }

    /// Counts a failure of `msg` in its row (dead at once with `dead_after` tries, else at
    /// the `max_deliver`th); answers the count and whether the message is dead.
    async fn write(
        &self, msg: &jetstream::Message, error: &str, dead_after: Option<i32>,
    ) -> Option<(i32, bool)> {
        let Ok(info) = msg.info() else {
            tracing::error!("a failed message carries no stream information");
            return None;
        };
        let now = now_unix();
        // Postgres text takes no NUL; an error is bounded like any other text.
        let (error, _) = crate::text::cut_at(error.replace('\0', ""), 2048);
        let row: Result<(i32, Option<i64>), sqlx::Error> = sqlx::query_as(
            "INSERT INTO dead_letters
                 (id, stream, stream_seq, subject, payload, last_error, count, created_at, dead_at)
             VALUES ($1, $2, $3, $4, $5, $6, COALESCE($8, 1), $7,
                     CASE WHEN $8 IS NOT NULL OR 1 >= $9 THEN $7 END)
             ON CONFLICT (stream, stream_seq) DO UPDATE SET
                 count = GREATEST(dead_letters.count + 1, COALESCE($8, 0)),
                 last_error = excluded.last_error,
                 dead_at = COALESCE(dead_letters.dead_at,
                     CASE WHEN $8 IS NOT NULL OR dead_letters.count + 1 >= $9 THEN $7 END)
             RETURNING count, dead_at",
        )
        .bind(Uuid::now_v7())
        .bind(info.stream)
        .bind(i64::try_from(info.stream_sequence).unwrap_or(i64::MAX))
        .bind(msg.subject.as_str())
        .bind(msg.payload.as_ref())
        .bind(&error)
        .bind(now)
        .bind(dead_after)
        .bind(i32::try_from(self.max_deliver).unwrap_or(i32::MAX))
        .fetch_one(&self.db)
        .await;
        match row {
            Ok((count, Some(_))) => {
                tracing::error!(stream = info.stream, seq = info.stream_sequence, %error, count, "message kept aside as a dead letter");
                let labels = [
                    ("service", self.service.name().to_owned()),
                    ("stream", info.stream.to_owned()),
                ];
                metrics::counter!("postmesh_dead_letters_total", &labels).increment(1);
                Some((count, true))
            }
            Ok((count, None)) => {
                tracing::warn!(stream = info.stream, seq = info.stream_sequence, %error, count, "message failed; will retry");
                Some((count, false))
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not count a failed message");
                None
            }
        }
    }

    /// Dead letters not requeued, newest first: `limit` from `offset`, and how many in all;
    /// each with its payload's first [`PAYLOAD_PREVIEW`] bytes and its whole size.
    pub async fn list(&self, limit: i64, offset: i64) -> Result<(Vec<DeadLetter>, i64), ApiError> {
        type Row = (Uuid, String, String, Vec<u8>, i32, String, i32, i64, i64);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, stream, subject, substring(payload FROM 1 FOR $3), length(payload),
                    last_error, count, created_at, dead_at
             FROM dead_letters WHERE dead_at IS NOT NULL AND requeued_at IS NULL
             ORDER BY dead_at DESC, id DESC LIMIT $1 OFFSET $2",
        )
        .bind(limit)
        .bind(offset)
        .bind(PAYLOAD_PREVIEW)
        .fetch_all(&self.db)
        .await?;
        let total: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM dead_letters WHERE dead_at IS NOT NULL AND requeued_at IS NULL",
        )
        .fetch_one(&self.db)
        .await?;
        let letters = rows
            .into_iter()
            .map(
                |(id, stream, subject, payload, size, last_error, count, created_at, dead_at)| {
                    DeadLetter {
                        id: id.to_string(),
                        service: self.service.name().to_owned(),
                        stream,
                        subject,
                        payload: payload.into(),
                        payload_bytes: size.into(),
                        last_error,
                        count,
                        created_at,
                        dead_at,
                    }
                },
            )
            .collect();
        Ok((letters, total))
    }

    /// Puts dead letter `id` back on its subject (a new message, handled as any other);
    /// `false` when this service has no such dead letter waiting.
    pub async fn requeue(&self, id: Uuid) -> Result<bool, ApiError> {
        let mut tx = self.db.begin().await?;
        let row: Option<(String, Vec<u8>)> = sqlx::query_as(
            "SELECT subject, payload FROM dead_letters
             WHERE id = $1 AND dead_at IS NOT NULL AND requeued_at IS NULL FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((subject, payload)) = row else {
            return Ok(false);
        };
        // Its own message id: the original's may still be in the duplicate window.
        let msg_id = format!("requeued:{id}");
        crate::jetstream::publish(&self.js, subject, &msg_id, payload.into()).await?;
        sqlx::query("UPDATE dead_letters SET requeued_at = $2 WHERE id = $1")
            .bind(id)
            .bind(now_unix())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// Adds the dead-letter methods (`dead_letters`, `requeue_dead_letter`) to `host`.
pub fn serve(host: ServiceHost, letters: DeadLetters) -> ServiceHost {
    host.method(
        letters.clone(),
        |letters: DeadLetters, req: DeadLettersRequest| async move {
            let (dead_letters, total) = letters.list(req.limit, req.offset).await?;
            Ok(DeadLettersReply {
                dead_letters,
                total,
            })
        },
    )
    .method(
        letters,
        |letters: DeadLetters, req: RequeueDeadLetterRequest| async move {
            let found = match Uuid::parse_str(&req.id) {
                Ok(id) => letters.requeue(id).await?,
                Err(_) => false,
            };
            Ok(RequeueDeadLetterReply { found })
        },
    )
}

/// How the error of a panic starts.
pub const PANICKED: &str = "panicked: ";

/// A panic's message, as `panic!` gave it, after [`PANICKED`].
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    format!("{PANICKED}{text}")
}
