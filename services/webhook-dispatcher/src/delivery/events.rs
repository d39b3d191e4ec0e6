//! The DELIVERY fan-out: each delivery event the sender publishes (up to 1,000 to a message)
//! of a workspace that has webhooks becomes an `email.<kind>` event, stored once (its
//! deliveries carry it, a replay sends it again), and one attempt per active webhook of its
//! workspace that takes its type — each tried once directly (`crate::delivery::direct`), then written
//! with its outcome, [`PER_STATEMENT`] events at a time, then one WEBHOOK job per event of
//! those left to the worker. Events of workspaces without webhooks cost one lookup per
//! batch, and no rendering.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use prost::Message as _;
use serde::Serialize;
use serde_json::value::to_raw_value;
use serde_json::Value;
use sqlx::types::Json;
use uuid::Uuid;

use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::{DeliveryEvent, DeliveryEvents};

use crate::attempt::{target_of, AttemptRow};
use crate::delivery::direct::{attempt_id, Direct};
use crate::delivery::fanout::{unfinished, Source};
use crate::delivery::worker::Content;

/// The DELIVERY fan-out: what it needs.
pub struct Deliveries {
    pub direct: Arc<Direct>,
}

/// A delivery event, parsed.
pub struct Event {
    id: Uuid,
    workspace: Uuid,
    /// `email.<kind>`.
    kind: String,
    /// As published, with its message's common fields.
    raw: DeliveryEvent,
}

/// `e` with each empty field (zero number) taken from `common`, and without a message id
/// `<delivery_id@domain>`.
fn inherit(mut e: DeliveryEvent, common: &DeliveryEvent, domain: &str) -> DeliveryEvent {
    let fill = |field: &mut String, from: &String| {
        if field.is_empty() {
            field.clone_from(from);
        }
    };
    fill(&mut e.workspace_id, &common.workspace_id);
    fill(&mut e.task_id, &common.task_id);
    fill(&mut e.delivery_id, &common.delivery_id);
    fill(&mut e.email, &common.email);
    fill(&mut e.kind, &common.kind);
    fill(&mut e.detail, &common.detail);
    fill(&mut e.from_address, &common.from_address);
    fill(&mut e.from_name, &common.from_name);
    fill(&mut e.subject, &common.subject);
    fill(&mut e.email_type, &common.email_type);
    fill(&mut e.topic, &common.topic);
    fill(&mut e.campaign_key, &common.campaign_key);
    fill(&mut e.source_app, &common.source_app);
    fill(&mut e.business_goal, &common.business_goal);
    fill(&mut e.message_id, &common.message_id);
    fill(&mut e.provider_message_id, &common.provider_message_id);
    fill(&mut e.tags, &common.tags);
    fill(&mut e.metadata, &common.metadata);
    if e.occurred_at == 0 {
        e.occurred_at = common.occurred_at;
    }
    if e.sequence == 0 {
        e.sequence = common.sequence;
    }
    e.test |= common.test;
    if e.message_id.is_empty() && !domain.is_empty() && !e.delivery_id.is_empty() {
        e.message_id = format!("<{}@{domain}>", e.delivery_id);
    }
    e
}

/// `Some(s)` unless `s` is empty.
fn given(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

impl Event {
    /// The events of a DELIVERY message; one that can never be delivered is logged and
    /// left out (not the rest of its message with it).
    pub fn parse_all(payload: &[u8]) -> Result<Vec<Self>, String> {
        let batch = DeliveryEvents::decode(payload).map_err(|e| format!("undecodable: {e}"))?;
        let common = batch.common.unwrap_or_default();
        Ok(batch
            .events
            .into_iter()
            .filter_map(|e| {
                Self::parse(inherit(e, &common, &batch.message_id_domain))
                    .map_err(|reason| tracing::error!(%reason, "a delivery event left out"))
                    .ok()
            })
            .collect())
    }

    /// Parses a `DeliveryEvent`.
    pub fn parse(e: DeliveryEvent) -> Result<Self, String> {
        let id = |raw: &str, what: &str| {
            Uuid::parse_str(raw).map_err(|_| format!("{what} {raw:?} is not a uuid"))
        };
        if e.kind.is_empty() || !e.kind.bytes().all(|b| b.is_ascii_lowercase()) {
            return Err(format!("kind {:?} is not an event kind", e.kind));
        }
        Ok(Self {
            id: id(&e.event_id, "event_id")?,
            workspace: id(&e.workspace_id, "workspace_id")?,
            kind: format!("email.{}", e.kind),
            raw: e,
        })
    }
}

/// The sender of a delivery event's message, as its webhook shows it.
#[derive(Debug, Serialize)]
pub struct FromAddress<'e> {
    pub address: &'e str,
    pub name: Option<&'e str>,
}

/// A delivery event's `data` as its webhook carries it: the send's labels, never the
/// message's body; a `reason` (and a bounce's `bounceType`) when the event says why.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventData<'e> {
    pub task_id: Option<&'e str>,
    pub delivery_id: Option<&'e str>,
    pub email: &'e str,
    pub from: Option<FromAddress<'e>>,
    pub subject: Option<&'e str>,
    pub email_type: Option<&'e str>,
    pub topic: Option<String>,
    pub campaign_key: Option<&'e str>,
    pub message_id: Option<&'e str>,
    pub provider_message_id: Option<String>,
    pub sequence: i64,
    pub occurred_at: i64,
    pub source_app: Option<&'e str>,
    pub business_goal: Option<&'e str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bounce_type: Option<String>,
    /// A test key's send (nothing reached a transport); absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub test: bool,
    /// The send's tags (`[]` when none) and metadata (`{}` when none).
    pub tags: Value,
    pub metadata: Value,
    /// What an `opened` or `clicked` event says: the link, the client, whether it was the
    /// delivery's first by a person, whether a machine made it.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub engagement: Option<Engagement>,
}

/// An `opened` or `clicked` event's facts, as its `detail` holds them.
#[derive(Debug, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Engagement {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    pub user_agent: Option<String>,
    pub ip: Option<String>,
    pub first: bool,
    pub machine: bool,
}

/// `json` parsed, or `empty` when it is blank or not JSON.
fn json_or(json: &str, empty: Value) -> Value {
    serde_json::from_str(json).unwrap_or(empty)
}

/// The payload's `data` of event `e`.
pub fn data(e: &DeliveryEvent) -> EventData<'_> {
    let detail: Value = serde_json::from_str(&e.detail).unwrap_or(Value::Null);
    let text = |key: &str| {
        detail[key]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    EventData {
        task_id: given(&e.task_id),
        delivery_id: given(&e.delivery_id),
        email: &e.email,
        from: given(&e.from_address).map(|address| FromAddress {
            address,
            name: given(&e.from_name),
        }),
        subject: given(&e.subject),
        email_type: given(&e.email_type),
        topic: given(&e.topic).map(str::to_owned).or_else(|| text("topic")),
        campaign_key: given(&e.campaign_key),
        message_id: given(&e.message_id),
        provider_message_id: given(&e.provider_message_id)
            .map(str::to_owned)
            .or_else(|| text("providerMessageId")),
        sequence: e.sequence,
        occurred_at: e.occurred_at,
        source_app: given(&e.source_app),
        business_goal: given(&e.business_goal),
        reason: text("reason").or_else(|| text("delayType")),
        bounce_type: text("bounceType"),
        test: e.test,
        tags: json_or(&e.tags, Value::Array(Vec::new())),
        metadata: json_or(&e.metadata, Value::Object(serde_json::Map::new())),
        engagement: matches!(e.kind.as_str(), "opened" | "clicked")
            .then(|| serde_json::from_value(detail.clone()).ok())
            .flatten(),
    }
}

/// Events written by one statement at most.
const PER_STATEMENT: usize = 500;

impl Source for Deliveries {
    type Item = Vec<Event>;
    const STREAM: Stream = Stream::Delivery;
    const CONSUMER: &'static str = "webhook-dispatcher-events";
    /// Up to 4,000 events, 8 chunks of [`PER_STATEMENT`]; the batch's messages are kept
    /// in progress while their fan-out runs.
    const BATCH: usize = 4;

    fn decode(&self, payload: &[u8]) -> Result<Vec<Event>, String> {
        Event::parse_all(payload)
    }

    /// Stores the events (once), writes an attempt per webhook that takes each (once), and
    /// queues each event's pending ones; [`PER_STATEMENT`] events at a time (each statement
    /// stands alone: a batch that fails half-way is done again, and finds its first half
    /// written).
    async fn fan_out(&self, batch: &[&Vec<Event>], first: bool) -> Result<(), String> {
        let workspaces: HashSet<Uuid> = batch
            .iter()
            .flat_map(|events| events.iter())
            .map(|e| e.workspace)
            .collect();
        let hooked: HashSet<Uuid> = sqlx::query_scalar(
            "SELECT DISTINCT workspace_id FROM webhooks WHERE workspace_id = ANY($1)",
        )
        .bind(workspaces.into_iter().collect::<Vec<_>>())
        .fetch_all(&self.direct.state.db)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
        let mut seen = HashSet::new();
        let events: Vec<&Event> = batch
            .iter()
            .flat_map(|events| events.iter())
            .filter(|e| hooked.contains(&e.workspace) && seen.insert(e.id))
            .collect();
        for chunk in events.chunks(PER_STATEMENT) {
            self.fan_out_chunk(chunk, first).await?;
        }
        Ok(())
    }
}

impl Deliveries {
    /// Fans out `batch`: tries each new attempt once, then writes the events and the
    /// attempts in one transaction, and queues what is left to the worker, earlier runs'
    /// unfinished attempts of the events with it.
    async fn fan_out_chunk(&self, batch: &[&Event], first: bool) -> Result<(), String> {
        let direct = &*self.direct;
        let db = &direct.state.db;
        let ids: Vec<Uuid> = batch.iter().map(|e| e.id).collect();
        let workspaces: Vec<Uuid> = batch.iter().map(|e| e.workspace).collect();
        let kinds: Vec<&str> = batch.iter().map(|e| e.kind.as_str()).collect();
        let (mut rows, pending) = tokio::try_join!(
            sqlx::query_as::<_, AttemptRow>(NEW_TARGETS)
                .bind(&ids)
                .bind(&workspaces)
                .bind(&kinds)
                .fetch_all(db),
            unfinished(db, &ids, "event"),
        )
        .map_err(|e| e.to_string())?;
        for row in &mut rows {
            row.id = attempt_id(row.message_id, target_of(row));
        }
        let mut contents = HashMap::with_capacity(batch.len());
        for e in batch {
            let data = to_raw_value(&data(&e.raw)).map_err(|e| e.to_string())?;
            contents.insert(e.id, Arc::new((e.kind.clone(), data)));
        }
        let tried = direct
            .try_all(rows, first, |row| {
                let event = contents.get(&row.message_id)?;
                Some(Content::Event(event.clone()))
            })
            .await;
        let lease = Uuid::now_v7();
        let written = async {
            let mut tx = db.begin().await?;
            sqlx::query(
                "INSERT INTO events (id, workspace_id, type, occurred_at, data)
                 SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::bigint[],
                                      $5::jsonb[])
                 ON CONFLICT DO NOTHING",
            )
            .bind(&ids)
            .bind(&workspaces)
            .bind(&kinds)
            .bind(batch.iter().map(|e| e.raw.occurred_at).collect::<Vec<_>>())
            .bind(
                batch
                    .iter()
                    .map(|e| Json(&contents[&e.id].1))
                    .collect::<Vec<_>>(),
            )
            .execute(&mut *tx)
            .await?;
            let made = direct.write(&mut tx, "event", &tried, lease).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(made)
        }
        .await;
        direct.finish(tried, written, lease, pending).await
    }
}

/// The active webhooks of each event's workspace (`$1` events, `$2` workspaces, `$3`
/// types) that take its type and it has no attempt for yet, as attempt rows (their ids
/// still to be made).
const NEW_TARGETS: &str = "
    WITH ev AS (
        SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[]) AS ev(id, workspace_id, type)
    )
    SELECT ev.id, ev.workspace_id, NULL::uuid AS endpoint_id, w.id AS webhook_id,
        ev.id AS message_id, NULL::text AS event_type, NULL::jsonb AS event_data, w.url,
        w.active, NULL::text AS body_format, false AS strip_quotes, w.secret_sealed,
        w.previous_secret_sealed, w.previous_secret_until
    FROM ev JOIN webhooks w ON w.workspace_id = ev.workspace_id AND w.active
        AND (w.events = '{}' OR ev.type = ANY(w.events))
    WHERE NOT EXISTS (
        SELECT 1 FROM attempts a
        WHERE a.message_id = ev.id AND a.origin IN ('inbound', 'event')
          AND COALESCE(a.endpoint_id, a.webhook_id, a.workspace_id) = w.id)";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn data_carries_labels_and_reasons_but_no_body() {
        let e = DeliveryEvent {
            event_id: Uuid::nil().to_string(),
            workspace_id: Uuid::nil().to_string(),
            kind: "bounced".into(),
            detail: r#"{"reason":"550 no such user","bounceType":"Permanent"}"#.into(),
            sequence: 7,
            email: "a@b.example".into(),
            from_address: "me@x.example".into(),
            subject: "Hi".into(),
            ..Default::default()
        };
        let d = serde_json::to_value(data(&e)).unwrap();
        assert_eq!(d["reason"], "550 no such user");
        assert_eq!(d["bounceType"], "Permanent");
        assert_eq!(d["sequence"], 7);
        assert_eq!(d["from"]["address"], "me@x.example");
        assert_eq!(d["taskId"], Value::Null);
        assert!(d.get("body").is_none() && d.get("html").is_none());
        let plain = serde_json::to_value(data(&DeliveryEvent {
            detail: "{}".into(),
            ..e
        }))
        .unwrap();
        assert!(plain.get("reason").is_none() && plain.get("bounceType").is_none());
        let bad = DeliveryEvent {
            event_id: Uuid::nil().to_string(),
            workspace_id: Uuid::nil().to_string(),
            kind: "Sent.x".into(),
            ..Default::default()
        };
        let good = DeliveryEvent {
            kind: "sent".into(),
            ..bad.clone()
        };
        let batch = DeliveryEvents {
            events: vec![bad, good],
            ..Default::default()
        };
        let parsed = Event::parse_all(&batch.encode_to_vec()).unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].kind, "email.sent");
        assert!(Event::parse_all(b"\xff\xff").is_err());
    }

    #[test]
    fn events_take_their_message_s_common_fields() {
        let delivery = Uuid::now_v7().to_string();
        let batch = DeliveryEvents {
            common: Some(DeliveryEvent {
                workspace_id: Uuid::nil().to_string(),
                kind: "queued".into(),
                subject: "Hi".into(),
                sequence: 9,
                ..Default::default()
            }),
            events: vec![
                DeliveryEvent {
                    event_id: Uuid::now_v7().to_string(),
                    delivery_id: delivery.clone(),
                    email: "a@b.example".into(),
                    ..Default::default()
                },
                DeliveryEvent {
                    event_id: Uuid::now_v7().to_string(),
                    email: "c@b.example".into(),
                    message_id: "<own@x.example>".into(),
                    subject: "Own".into(),
                    ..Default::default()
                },
            ],
            message_id_domain: "mail.example".into(),
        };
        let parsed = Event::parse_all(&batch.encode_to_vec()).unwrap();
        assert_eq!(parsed.len(), 2);
        let first = serde_json::to_value(data(&parsed[0].raw)).unwrap();
        assert_eq!(parsed[0].kind, "email.queued");
        assert_eq!(
            (&first["subject"], &first["sequence"], &first["email"]),
            (&json!("Hi"), &json!(9), &json!("a@b.example"))
        );
        assert_eq!(first["messageId"], format!("<{delivery}@mail.example>"));
        let second = serde_json::to_value(data(&parsed[1].raw)).unwrap();
        assert_eq!(second["messageId"], "<own@x.example>");
        assert_eq!(second["subject"], "Own");
    }
}
