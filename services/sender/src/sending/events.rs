//! Delivery events: what happened to a recipient's message once accepted (`queued`,
//! `scheduled`, `sent`, `delivered`, `bounced`, `complained`, `rejected`, `delayed`,
//! `unsubscribed`, `failed`, `cancelled`, `opened`, `clicked`). Each is a `DeliveryEvent` on the DELIVERY stream
//! (`{ns}.delivery.<kind>`, up to 1,000 to a message) with its send's labels and a
//! per-delivery `sequence`, written to the outbox in the transaction that makes it true;
//! each but `queued` and `scheduled` is also a `delivery_events` row, shown in
//! `/email-status`.

use prost::Message as _;
use serde::Serialize;
use serde_json::Value;
use sqlx::types::Json;
use sqlx::PgConnection;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::jetstream::outbox;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::{DeliveryEvent, DeliveryEvents};
use postmesh_shared::Namespace;

pub use postmesh_contracts::answers::sender::EventKind as Kind;

/// What a delivery event says beyond its kind: `detail` in `/email-status` and on the
/// DELIVERY stream (each variant its own JSON object, field names in camelCase).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged, rename_all_fields = "camelCase")]
pub enum Detail {
    /// Nothing more: `{}`.
    Empty {},
    /// Why it failed or was rejected.
    Reason { reason: Option<String> },
    /// The provider's id of the message it took.
    Sent { provider_message_id: Option<String> },
    /// A bounce as the provider reported it, and the addresses it names.
    Bounce {
        reason: String,
        bounce_type: Option<String>,
        bounce_sub_type: Option<String>,
        recipients: Vec<String>,
    },
    /// A complaint as the provider reported it, and the addresses it names.
    Complaint {
        reason: String,
        feedback_type: Option<String>,
        recipients: Vec<String>,
    },
    /// An unsubscribe from a topic, or from all mail (`topic: null`); `source` is
    /// `provider` when the provider reported it.
    Unsubscribed {
        topic: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        source: Option<&'static str>,
        reason: String,
    },
    /// An open or a click: the link followed, the client, whether it was the delivery's
    /// first by a person, and whether a machine made it.
    Engagement {
        #[serde(skip_serializing_if = "Option::is_none")]
        url: Option<String>,
        user_agent: Option<String>,
        ip: Option<String>,
        first: bool,
        machine: bool,
    },
    /// The provider's own account of the event (SES's `delivery`, `reject` or
    /// `deliveryDelay` object), or `null`.
    Provider(Option<Value>),
}

/// An event to record.
#[derive(Clone, Debug)]
pub struct NewEvent {
    pub workspace: Uuid,
    pub task: Option<Uuid>,
    pub delivery: Option<Uuid>,
    pub email: String,
    pub kind: Kind,
    pub detail: Detail,
    pub occurred_at: i64,
    /// What makes it one event however often it is reported (`sent:<delivery>`,
    /// `sns:<MessageId>`, ...).
    pub source_key: String,
}

/// An outbox message: its id and payload.
type Outgoing = (Uuid, Vec<u8>);

/// Where events go: the namespace's DELIVERY subjects. A message without a `Message-ID` of
/// its own has `<delivery id@message_id_domain>`, as the worker makes it.
#[derive(Clone, Debug)]
pub struct Outlet {
    pub ns: Namespace,
    pub message_id_domain: String,
}

/// Events in one DELIVERY message at most.
const PER_MESSAGE: usize = 1000;
/// Encoded bytes of one DELIVERY message at most (NATS refuses more than 1 MiB).
const MESSAGE_BYTES: usize = 256 * 1024;

/// A new event's row and what its send says of it.
#[derive(sqlx::FromRow)]
struct Written {
    id: Uuid,
    sequence: i64,
    #[sqlx(flatten)]
    labels: Labels,
}

/// What a send says of each of its events (all `None` for an event of no send).
#[derive(Clone, Debug, Default, sqlx::FromRow)]
struct Labels {
    from_email: Option<String>,
    from_name: Option<String>,
    subject: Option<String>,
    email_type: Option<String>,
    topic: Option<String>,
    campaign_key: Option<String>,
    source_app: Option<String>,
    business_goal: Option<String>,
    message_id: Option<String>,
    provider_message_id: Option<String>,
    /// The send was a test key's.
    test: Option<bool>,
    /// The send's tags and metadata as JSON text.
    tags: Option<String>,
    metadata: Option<String>,
}

/// Records `events` in the caller's transaction and queues each new one for the DELIVERY
/// stream; answers how many were new (one reported before is skipped).
pub async fn record(
    tx: &mut PgConnection, outlet: &Outlet, events: &[NewEvent],
) -> Result<usize, sqlx::Error> {
    if events.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = events.iter().map(|_| Uuid::now_v7()).collect();
    // One statement: the rows (one reported before is skipped), and each new one's send.
    let new: Vec<Written> = sqlx::query_as(
        "WITH ins AS (
             INSERT INTO delivery_events (id, workspace_id, task_id, delivery_id, email, kind,
                                          detail, occurred_at, source_key)
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::uuid[], $5::text[],
                                  $6::text[], $7::jsonb[], $8::bigint[], $9::text[])
             ON CONFLICT (source_key) DO NOTHING
             RETURNING id, task_id, delivery_id, sequence
         ), labels AS MATERIALIZED (
             -- Once per task: reading the message's fields unpacks its whole stored body.
             SELECT t.id, t.message->>'from_email' AS from_email,
                 t.message->>'from_name' AS from_name, t.message->>'subject' AS subject,
                 t.email_type, t.topic, t.campaign_key, t.source_app, t.business_goal,
                 t.message->>'message_id' AS message_id, t.test_mode,
                 t.tags::text AS tags, t.metadata::text AS metadata
             FROM tasks t WHERE t.id IN (SELECT task_id FROM ins)
         )
         SELECT ins.id, ins.sequence, l.from_email, l.from_name, l.subject, l.email_type,
             l.topic, l.campaign_key, l.source_app, l.business_goal, l.test_mode AS test,
             l.tags, l.metadata,
             COALESCE(l.message_id, '<' || ins.delivery_id || '@' || $10 || '>') AS message_id,
             d.provider_message_id
         FROM ins
         LEFT JOIN labels l ON l.id = ins.task_id
         LEFT JOIN deliveries d ON d.delivery_id = ins.delivery_id",
    )
    .bind(&ids)
    .bind(events.iter().map(|e| e.workspace).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.task).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.delivery).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.email.as_str()).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.kind).collect::<Vec<_>>())
    .bind(events.iter().map(|e| Json(&e.detail)).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.occurred_at).collect::<Vec<_>>())
    .bind(
        events
            .iter()
            .map(|e| e.source_key.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(&outlet.message_id_domain)
    .fetch_all(&mut *tx)
    .await?;
    let count = new.len();
    advance_log(tx, events).await?;
    let mut new: std::collections::HashMap<Uuid, Written> =
        new.into_iter().map(|w| (w.id, w)).collect();
    let mut by_kind: Vec<(Kind, Vec<DeliveryEvent>)> = Vec::new();
    for (id, event) in ids.iter().zip(events) {
        let Some(w) = new.remove(id) else {
            continue;
        };
        let message = message(*id, event, w.sequence, w.labels);
        match by_kind.iter_mut().find(|(k, _)| *k == event.kind) {
            Some((_, list)) => list.push(message),
            None => by_kind.push((event.kind, vec![message])),
        }
    }
    for (kind, messages) in by_kind {
        publish(tx, outlet, kind, None, &messages).await?;
    }
    Ok(count)
}

/// Moves each delivery's row of the message log to the state its newest event says, never
/// back (`log_rank`); engagement events count elsewhere (`crate::sending::tracking`).
async fn advance_log(tx: &mut PgConnection, events: &[NewEvent]) -> Result<(), sqlx::Error> {
    let mut latest: std::collections::HashMap<Uuid, Kind> = std::collections::HashMap::new();
    for e in events {
        let (Some(delivery), false) = (e.delivery, matches!(e.kind, Kind::Opened | Kind::Clicked))
        else {
            continue;
        };
        let kind = latest.entry(delivery).or_insert(e.kind);
        if rank(e.kind) >= rank(*kind) {
            *kind = e.kind;
        }
    }
    if latest.is_empty() {
        return Ok(());
    }
    let (ids, kinds): (Vec<Uuid>, Vec<&str>) =
        latest.into_iter().map(|(d, k)| (d, k.as_str())).unzip();
    sqlx::query(
        "UPDATE task_recipients r SET status = u.kind
         FROM UNNEST($1::uuid[], $2::text[]) AS u(delivery_id, kind)
         WHERE r.delivery_id = u.delivery_id AND log_rank(u.kind) >= log_rank(r.status)
           AND r.status <> u.kind",
    )
    .bind(&ids)
    .bind(&kinds)
    .execute(&mut *tx)
    .await
    .map(drop)
}

/// How far along a delivery `kind` says it is, as the migration's `log_rank`.
fn rank(kind: Kind) -> u8 {
    match kind {
        Kind::Queued | Kind::Scheduled => 0,
        Kind::Sent => 1,
        Kind::Delayed => 2,
        Kind::Delivered | Kind::Unsubscribed => 3,
        _ => 4,
    }
}

/// The `DeliveryEvent` of `event`, stored as `id`.
fn message(id: Uuid, event: &NewEvent, sequence: i64, labels: Labels) -> DeliveryEvent {
    DeliveryEvent {
        event_id: id.to_string(),
        workspace_id: event.workspace.to_string(),
        task_id: event.task.map(|t| t.to_string()).unwrap_or_default(),
        delivery_id: event.delivery.map(|d| d.to_string()).unwrap_or_default(),
        email: event.email.clone(),
        kind: event.kind.as_str().into(),
        occurred_at: event.occurred_at,
        detail: serde_json::to_string(&event.detail).unwrap_or_default(),
        sequence,
        from_address: labels.from_email.unwrap_or_default(),
        from_name: labels.from_name.unwrap_or_default(),
        subject: labels.subject.unwrap_or_default(),
        email_type: labels.email_type.unwrap_or_default(),
        topic: labels.topic.unwrap_or_default(),
        campaign_key: labels.campaign_key.unwrap_or_default(),
        source_app: labels.source_app.unwrap_or_default(),
        business_goal: labels.business_goal.unwrap_or_default(),
        message_id: labels.message_id.unwrap_or_default(),
        provider_message_id: labels.provider_message_id.unwrap_or_default(),
        test: labels.test.unwrap_or(false),
        tags: labels.tags.filter(|t| t != "[]").unwrap_or_default(),
        metadata: labels.metadata.filter(|m| m != "{}").unwrap_or_default(),
    }
}

/// Queues `events` (all of `kind`) for the DELIVERY stream, [`PER_MESSAGE`] (or
/// [`MESSAGE_BYTES`]) to a message:
/// one outbox statement per kind, and a message per thousand events, not one each. Each
/// message carries `common` (what all its events share), so its events need not repeat it.
async fn publish(
    tx: &mut PgConnection, outlet: &Outlet, kind: Kind, common: Option<DeliveryEvent>,
    events: &[DeliveryEvent],
) -> Result<(), sqlx::Error> {
    let messages: Vec<Outgoing> = chunks(events)
        .into_iter()
        .map(|chunk| {
            let batch = DeliveryEvents {
                events: chunk.to_vec(),
                common: common.clone(),
                message_id_domain: outlet.message_id_domain.clone(),
            };
            (Uuid::now_v7(), batch.encode_to_vec())
        })
        .collect();
    outbox::enqueue_many(tx, &subject(&outlet.ns, kind), &messages).await
}

/// `events` cut into runs of at most [`PER_MESSAGE`] events and [`MESSAGE_BYTES`] encoded
/// bytes (a single larger event goes alone).
fn chunks(events: &[DeliveryEvent]) -> Vec<&[DeliveryEvent]> {
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, event) in events.iter().enumerate() {
        // The event, its field tag and length.
        let size = event.encoded_len() + 8;
        if i > start && (i - start == PER_MESSAGE || bytes + size > MESSAGE_BYTES) {
            chunks.push(&events[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < events.len() {
        chunks.push(&events[start..]);
    }
    chunks
}

/// Publishes a `kind` event (`queued` or `scheduled`) for each of task `task`'s
/// `recipients` (delivery id, address) in the caller's transaction — without a
/// `delivery_events` row each (the task's status says as much, and a 100,000-recipient send
/// would write 100,000 rows). The task's labels are read once and carried once per
/// message; all the events take one `sequence` from the identity of stored events (a
/// sequence orders one delivery's events, and each of these is its delivery's earliest).
pub async fn announce(
    tx: &mut PgConnection, outlet: &Outlet, task: Uuid, workspace: Uuid,
    recipients: &[(Uuid, &str)], kind: Kind,
) -> Result<(), sqlx::Error> {
    if recipients.is_empty() {
        return Ok(());
    }
    let (labels, sequence): (Labels, i64) = {
        let row: Option<LabelsWithSequence> = sqlx::query_as(
            "SELECT message->>'from_email' AS from_email, message->>'from_name' AS from_name,
                 message->>'subject' AS subject, email_type, topic, campaign_key, source_app,
                 business_goal, message->>'message_id' AS message_id,
                 NULL::text AS provider_message_id, test_mode AS test,
                 tags::text AS tags, metadata::text AS metadata,
                 nextval(pg_get_serial_sequence('delivery_events', 'sequence')) AS sequence
             FROM tasks WHERE id = $1",
        )
        .bind(task)
        .fetch_optional(&mut *tx)
        .await?;
        let row = row.ok_or(sqlx::Error::RowNotFound)?;
        (row.labels, row.sequence)
    };
    let common = NewEvent {
        workspace,
        task: Some(task),
        delivery: None,
        email: String::new(),
        kind,
        detail: Detail::Empty {},
        occurred_at: now_unix(),
        source_key: String::new(),
    };
    let common = message(Uuid::nil(), &common, sequence, labels);
    if kind == Kind::Queued {
        // A released scheduled send: its rows of the log say so.
        sqlx::query(
            "UPDATE task_recipients SET status = 'queued' WHERE task_id = $1 AND status = 'scheduled'",
        )
        .bind(task)
        .execute(&mut *tx)
        .await?;
    }
    let events: Vec<DeliveryEvent> = recipients
        .iter()
        .map(|(delivery, email)| DeliveryEvent {
            event_id: Uuid::now_v7().to_string(),
            delivery_id: delivery.to_string(),
            email: (*email).to_owned(),
            ..Default::default()
        })
        .collect();
    publish(tx, outlet, kind, Some(common), &events).await
}

/// A task's labels and a fresh sequence.
#[derive(sqlx::FromRow)]
struct LabelsWithSequence {
    #[sqlx(flatten)]
    labels: Labels,
    sequence: i64,
}

/// `{ns}.delivery.<kind>`.
pub fn subject(ns: &Namespace, kind: Kind) -> String {
    let base = Stream::Delivery.subject(ns);
    format!("{}.{}", base.trim_end_matches(".>"), kind.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_detail_has_the_json_shape_consumers_read() {
        let shape = |d: Detail| serde_json::to_value(d).unwrap();
        assert_eq!(shape(Detail::Empty {}), serde_json::json!({}));
        assert_eq!(
            shape(Detail::Reason { reason: None }),
            serde_json::json!({"reason": null})
        );
        assert_eq!(
            shape(Detail::Sent {
                provider_message_id: Some("ses-1".into())
            }),
            serde_json::json!({"providerMessageId": "ses-1"})
        );
        assert_eq!(
            shape(Detail::Bounce {
                reason: "550 no such user".into(),
                bounce_type: Some("Permanent".into()),
                bounce_sub_type: None,
                recipients: vec!["a@example.com".into()],
            }),
            serde_json::json!({"reason": "550 no such user", "bounceType": "Permanent",
                "bounceSubType": null, "recipients": ["a@example.com"]})
        );
        assert_eq!(
            shape(Detail::Complaint {
                reason: "complaint (abuse)".into(),
                feedback_type: Some("abuse".into()),
                recipients: Vec::new(),
            }),
            serde_json::json!({"reason": "complaint (abuse)", "feedbackType": "abuse",
                "recipients": []})
        );
        assert_eq!(
            shape(Detail::Unsubscribed {
                topic: None,
                source: None,
                reason: "r".into()
            }),
            serde_json::json!({"topic": null, "reason": "r"})
        );
        assert_eq!(
            shape(Detail::Unsubscribed {
                topic: Some("news".into()),
                source: Some("provider"),
                reason: "r".into()
            }),
            serde_json::json!({"topic": "news", "source": "provider", "reason": "r"})
        );
        assert_eq!(
            shape(Detail::Provider(Some(
                serde_json::json!({"smtpResponse": "250"})
            ))),
            serde_json::json!({"smtpResponse": "250"})
        );
        assert_eq!(shape(Detail::Provider(None)), Value::Null);
    }

    #[test]
    fn messages_hold_a_thousand_events_or_256_kib_at_most() {
        let small = DeliveryEvent {
            email: "a@example.com".into(),
            ..Default::default()
        };
        let many = vec![small; 2500];
        let sizes: Vec<usize> = chunks(&many).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [1000, 1000, 500]);
        let large = DeliveryEvent {
            subject: "s".repeat(1000),
            from_name: "n".repeat(1000),
            ..Default::default()
        };
        let many = vec![large; 800];
        let cut = chunks(&many);
        assert!(
            cut.len() > 1,
            "800 events of 2 KB are more than one message"
        );
        for chunk in &cut {
            let bytes = DeliveryEvents {
                events: chunk.to_vec(),
                ..Default::default()
            }
            .encoded_len();
            assert!(bytes <= MESSAGE_BYTES, "{bytes}");
        }
        assert_eq!(cut.iter().map(|c| c.len()).sum::<usize>(), 800);
        assert!(chunks(&[]).is_empty());
    }
}
