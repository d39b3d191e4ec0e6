//! The TRACKING consumer: each hit the gateway published (and acknowledged before it
//! answered) becomes an `opened` or `clicked` delivery event, once however often it is
//! handed out, with its delivery's log counting the people's. A hit is a machine's for a
//! `HEAD`, an Apple Mail Privacy Protection fetch, a known scanner's agent, or a click
//! within `TRACKING_SCANNER_WINDOW_SECS` of sending with no person's open before it; the
//! first hit of each kind by a person is `first`. A delivery keeps [`MAX_ENGAGEMENTS`].

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy};
use prost::Message as _;
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::dead_letters::DeadLetters;
use postmesh_shared::jetstream::{ack_pending_for, next_batch, Stream};
use postmesh_shared::proto::{TrackingHit, TrackingHits};
use postmesh_shared::tracking::{MAX_URL, MAX_USER_AGENT};
use postmesh_shared::Runtime;

use crate::sending::events::{self, Detail, Kind, NewEvent, Outlet};

/// Hits recorded in one transaction, about (the messages pulled until they hold as many).
const BATCH: usize = 500;
/// Hits one message may hold (the gateway puts at most 200 in one).
const MAX_PER_MESSAGE: usize = 1000;
/// The durable consumer of the TRACKING stream.
const CONSUMER: &str = "sender-tracking";
/// The first pause before a batch that could not be written is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// How long a handed-out hit waits for its ack before it is handed out again.
const ACK_WAIT: Duration = Duration::from_secs(30);

/// Parts of a user agent (lower case) that only link scanners, previewers and scripts send.
const MACHINE_AGENTS: [&str; 14] = [
    "spider",
    "crawl",
    "scanner",
    "barracuda",
    "proofpoint",
    "mimecast",
    "safelinks",
    "safe links",
    "existence discovery",
    "curl/",
    "wget",
    "python",
    "go-http-client",
    "headless",
];

/// Opens and clicks recorded for one delivery at most; later hits are dropped.
const MAX_ENGAGEMENTS: i64 = 1000;

/// What the recorder needs.
pub struct Recorder {
    pub db: PgPool,
    pub outlet: Outlet,
    /// `TRACKING_SCANNER_WINDOW_SECS`.
    pub scanner_window: i64,
}

/// A hit, decoded.
pub struct Hit {
    id: Uuid,
    kind: Kind,
    delivery: Uuid,
    url: String,
    user_agent: String,
    ip: String,
    at: i64,
    head: bool,
}

impl Hit {
    /// The hits of one TRACKING message; one that can never be recorded fails it whole.
    /// They are counted before they are decoded.
    pub fn decode_all(payload: &[u8]) -> Result<Vec<Self>, String> {
        let count = hits_in(payload)?;
        if count > MAX_PER_MESSAGE {
            return Err(format!("{count} hits in one message"));
        }
        let batch = TrackingHits::decode(payload).map_err(|e| format!("undecodable: {e}"))?;
        batch.hits.into_iter().map(Self::decode).collect()
    }

    fn decode(h: TrackingHit) -> Result<Self, String> {
        let id = |raw: &str, what: &str| {
            Uuid::parse_str(raw).map_err(|_| format!("{what} {raw:?} is not a uuid"))
        };
        // What PostgreSQL stores: no NUL, and no more than the gateway sends.
        let text = |value: String, most: usize, what: &str| {
            if value.len() > most || value.contains('\0') {
                Err(format!(
                    "{what} of {} bytes, over {most} or with a NUL",
                    value.len()
                ))
            } else {
                Ok(value)
            }
        };
        let kind = match h.kind.as_str() {
            "opened" => Kind::Opened,
            "clicked" => Kind::Clicked,
            other => return Err(format!("kind {other:?} is not opened or clicked")),
        };
        if !h.client_ip.is_empty() && h.client_ip.parse::<IpAddr>().is_err() {
            return Err(format!("client_ip {:?} is not an address", h.client_ip));
        }
        Ok(Self {
            id: id(&h.hit_id, "hit_id")?,
            kind,
            delivery: id(&h.delivery_id, "delivery_id")?,
            url: text(h.url, MAX_URL, "url")?,
            user_agent: text(h.user_agent, MAX_USER_AGENT, "user_agent")?,
            ip: h.client_ip,
            at: h.occurred_at,
            head: h.head,
        })
    }
}

/// The `hits` (field 1) an encoded `TrackingHits` holds, counted without decoding one.
fn hits_in(mut payload: &[u8]) -> Result<usize, String> {
    use prost::encoding::{decode_key, decode_varint, WireType};
    let undecodable = |e: prost::DecodeError| format!("undecodable: {e}");
    let mut hits = 0;
    while !payload.is_empty() {
        let (tag, wire) = decode_key(&mut payload).map_err(undecodable)?;
        let len = match wire {
            WireType::Varint => decode_varint(&mut payload)
                .map(|_| 0)
                .map_err(undecodable)?,
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => {
                let len = decode_varint(&mut payload).map_err(undecodable)?;
                usize::try_from(len).unwrap_or(usize::MAX)
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err("undecodable: a group".into());
            }
        };
        payload = payload
            .get(len..)
            .ok_or_else(|| "undecodable: a field past the end".to_owned())?;
        hits += usize::from(tag == 1);
    }
    Ok(hits)
}

/// Whether a client with `agent` at `ip` is a machine by what it says of itself.
pub fn machine_agent(agent: &str, ip: &str) -> bool {
    let lower = agent.to_ascii_lowercase();
    // Apple Mail Privacy Protection fetches through Apple's proxies (17.0.0.0/8) as a bare
    // `Mozilla/5.0`.
    agent.trim() == "Mozilla/5.0"
        || ip.starts_with("17.")
        || agent.trim().is_empty()
        || MACHINE_AGENTS.iter().any(|m| lower.contains(m))
        || names_a_bot(&lower)
        // Office fetching a link to see what it is; Outlook showing a message is a reader.
        || (lower.contains("microsoft office") && !lower.contains("outlook"))
}

/// Whether a (lower-case) agent names itself a bot: `Googlebot/2.1`, `Slackbot-…`,
/// `bingbot;`, a last word `…bot` — not a device that merely ends in it (`CUBOT X19`).
fn names_a_bot(lower: &str) -> bool {
    lower.match_indices("bot").any(|(at, _)| {
        matches!(
            lower.as_bytes().get(at + 3),
            None | Some(b'/' | b'-' | b'_' | b';' | b')' | b'+')
        )
    })
}

/// A delivery the hits name, as its log row has it.
#[derive(sqlx::FromRow)]
struct Target {
    delivery_id: Uuid,
    workspace_id: Uuid,
    task_id: Uuid,
    email: String,
    opens: i32,
    clicks: i32,
    sent_at: Option<i64>,
    /// When a person first opened it.
    opened_at: Option<i64>,
    /// Its opens and clicks recorded, people's and machines'.
    engagements: i64,
}

impl Recorder {
    /// Records `hits` in one transaction: each new one an event, the people's counted.
    pub async fn record(&self, mut hits: Vec<Hit>) -> Result<(), sqlx::Error> {
        let (outlet, window) = (&self.outlet, self.scanner_window);
        let mut tx = self.db.begin().await?;
        let mut ids: Vec<Uuid> = hits.iter().map(|h| h.delivery).collect();
        ids.sort_unstable();
        ids.dedup();
        // Locked first: a batch recording hits of the same deliveries elsewhere (a message
        // handed out again meanwhile) commits before the statements below read, so they see
        // its events and counts.
        sqlx::query(
            "SELECT 1 FROM task_recipients WHERE delivery_id = ANY($1)
             ORDER BY delivery_id FOR UPDATE",
        )
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        let keys: Vec<String> = hits.iter().map(|h| format!("track:{}", h.id)).collect();
        let seen: HashSet<String> =
            sqlx::query_scalar("SELECT source_key FROM delivery_events WHERE source_key = ANY($1)")
                .bind(&keys)
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect();
        // A hit handed out twice within the batch counts once too.
        let mut fresh = HashSet::new();
        hits.retain(|h| !seen.contains(&format!("track:{}", h.id)) && fresh.insert(h.id));
        let mut targets: HashMap<Uuid, Target> = sqlx::query_as::<_, Target>(
            "SELECT r.delivery_id, r.workspace_id, r.task_id, r.email, r.opens, r.clicks,
                 (SELECT min(e.occurred_at) FROM delivery_events e
                  WHERE e.delivery_id = r.delivery_id AND e.kind IN ('sent', 'delivered')) AS sent_at,
                 (SELECT min(e.occurred_at) FROM delivery_events e
                  WHERE e.delivery_id = r.delivery_id AND e.kind = 'opened'
                    AND e.detail @> '{\"machine\": false}') AS opened_at,
                 (SELECT count(*) FROM delivery_events e
                  WHERE e.delivery_id = r.delivery_id AND e.kind IN ('opened', 'clicked'))
                    AS engagements
             FROM task_recipients r WHERE r.delivery_id = ANY($1)",
        )
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|t| (t.delivery_id, t))
        .collect();
        hits.sort_by_key(|h| h.at);
        let mut new = Vec::with_capacity(hits.len());
        let (mut counted, mut changed) = (Vec::new(), HashSet::new());
        for hit in hits {
            // A delivery purged since (or never ours) has nothing to record, nor one whose log
            // is full (a forwarded link fetched in a loop).
            let Some(t) = targets
                .get_mut(&hit.delivery)
                .filter(|t| t.engagements < MAX_ENGAGEMENTS)
            else {
                continue;
            };
            t.engagements += 1;
            // A click before its sending is even recorded is as soon as can be; a machine's
            // open (a proxy's, a scanner's) before it does not make it a person's.
            let scanner_click = hit.kind == Kind::Clicked
                && t.opened_at.is_none_or(|opened| opened > hit.at)
                && t.sent_at.is_none_or(|sent| hit.at - sent < window);
            let machine = hit.head || machine_agent(&hit.user_agent, &hit.ip) || scanner_click;
            let count = match hit.kind {
                Kind::Opened => &mut t.opens,
                _ => &mut t.clicks,
            };
            let first = !machine && *count == 0;
            if !machine {
                *count += 1;
                changed.insert(t.delivery_id);
            }
            if hit.kind == Kind::Opened && !machine {
                t.opened_at = Some(t.opened_at.map_or(hit.at, |at| at.min(hit.at)));
            }
            new.push(NewEvent {
                workspace: t.workspace_id,
                task: Some(t.task_id),
                delivery: Some(t.delivery_id),
                email: t.email.clone(),
                kind: hit.kind,
                detail: Detail::Engagement {
                    url: (hit.kind == Kind::Clicked).then_some(hit.url),
                    user_agent: Some(hit.user_agent).filter(|a| !a.is_empty()),
                    ip: Some(hit.ip).filter(|a| !a.is_empty()),
                    first,
                    machine,
                },
                occurred_at: hit.at,
                source_key: format!("track:{}", hit.id),
            });
        }
        for id in changed {
            let t = &targets[&id];
            counted.push((id, t.opens, t.clicks));
        }
        events::record(&mut tx, outlet, &new).await?;
        if !counted.is_empty() {
            let (ids, (opens, clicks)): (Vec<Uuid>, (Vec<i32>, Vec<i32>)) =
                counted.into_iter().map(|(d, o, c)| (d, (o, c))).unzip();
            sqlx::query(
                "UPDATE task_recipients r SET opens = u.opens, clicks = u.clicks
                 FROM UNNEST($1::uuid[], $2::integer[], $3::integer[]) AS u(delivery_id, opens, clicks)
                 WHERE r.delivery_id = u.delivery_id",
            )
            .bind(&ids)
            .bind(&opens)
            .bind(&clicks)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await
    }
}

/// Consumes the TRACKING stream until the runtime shuts down, about [`BATCH`] hits at a
/// time; a message that cannot be decoded is kept aside as a dead letter, a batch that
/// cannot be written is handed back (and, failing again and again, kept aside).
pub async fn spawn(rt: &Runtime, recorder: Recorder) -> anyhow::Result<()> {
    let stream = Stream::Tracking
        .ensure(&rt.js, &rt.common.namespace, rt.common.stream_replicas)
        .await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(CONSUMER.into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_ack_pending: ack_pending_for(BATCH),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("creating the {CONSUMER} consumer: {e}"))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(BATCH / 50)
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("pulling for {CONSUMER}: {e}"))?;
    let (shutdown, letters) = (rt.shutdown.clone(), rt.dead_letters());
    rt.tracker.spawn(async move {
        // Messages hold many hits: a few messages fill a transaction.
        while let Some(batch) = next_batch(&mut messages, BATCH / 50, &shutdown, CONSUMER).await {
            take(&recorder, &letters, batch).await;
        }
    });
    Ok(())
}

/// Records one batch and settles each of its messages.
async fn take(
    recorder: &Recorder, letters: &DeadLetters, batch: Vec<async_nats::jetstream::Message>,
) {
    let mut hits = Vec::with_capacity(batch.len());
    let mut good = Vec::with_capacity(batch.len());
    for msg in batch {
        match Hit::decode_all(&msg.payload) {
            Ok(decoded) => {
                hits.extend(decoded);
                good.push(msg);
            }
            Err(e) => {
                tracing::error!(error = %e, "a tracking hit kept aside");
                DeadLetters::settle(&msg, letters.dead(&msg, &e, 1).await).await;
            }
        }
    }
    match recorder.record(hits).await {
        Ok(()) => {
            for msg in good {
                let _ = msg.ack().await;
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "recording tracking hits failed; handed back");
            for msg in good {
                let fate = letters.failed(&msg, &e.to_string(), RETRY).await;
                DeadLetters::settle(&msg, fate).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit() -> TrackingHit {
        TrackingHit {
            hit_id: Uuid::now_v7().to_string(),
            kind: "clicked".into(),
            delivery_id: Uuid::now_v7().to_string(),
            url: "https://example.com/x".into(),
            user_agent: "Mozilla/5.0 (X11; Linux x86_64)".into(),
            client_ip: "203.0.113.0".into(),
            occurred_at: 1_700_000_000,
            head: false,
        }
    }

    fn decoded(hits: Vec<TrackingHit>) -> Result<Vec<Hit>, String> {
        Hit::decode_all(&TrackingHits { hits }.encode_to_vec())
    }

    #[test]
    fn hits_postgresql_would_refuse_or_the_gateway_never_sends_are_refused() {
        assert_eq!(decoded(vec![hit(), hit()]).unwrap().len(), 2);
        let bad: [fn(&mut TrackingHit); 6] = [
            |h| h.user_agent.push('\0'),
            |h| h.url = "https://example.com/\0".into(),
            |h| h.user_agent = "a".repeat(MAX_USER_AGENT + 1),
            |h| h.url = format!("https://example.com/{}", "a".repeat(MAX_URL)),
            |h| h.client_ip = "203.0.113.0\0".into(),
            |h| h.client_ip = "somewhere".into(),
        ];
        for (i, spoil) in bad.into_iter().enumerate() {
            let mut one = hit();
            spoil(&mut one);
            assert!(decoded(vec![hit(), one]).is_err(), "case {i}");
        }
    }

    #[test]
    fn hits_are_counted_before_they_are_decoded() {
        // Two bytes an empty hit: a message of 1 MiB would decode into half a million.
        let empty = |n| [0x0a_u8, 0x00].repeat(n);
        assert_eq!(
            hits_in(&empty(MAX_PER_MESSAGE + 1)),
            Ok(MAX_PER_MESSAGE + 1)
        );
        let many = Hit::decode_all(&empty(500_000)).err().unwrap();
        assert_eq!(many, "500000 hits in one message");
        let real = TrackingHits {
            hits: vec![hit(), hit(), hit()],
        }
        .encode_to_vec();
        assert_eq!(hits_in(&real), Ok(3));
        for broken in [
            &real[..real.len() - 1],
            &[0x0a, 0x05, 0x00],
            &[0x0b],
            &[0x0a, 0xff],
        ] {
            assert!(hits_in(broken).is_err(), "{broken:?}");
        }
    }

    #[test]
    fn proxies_scanners_and_scripts_are_machines_and_browsers_are_not() {
        let browser = "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15";
        assert!(!machine_agent(browser, "203.0.113.0"));
        assert!(machine_agent("Mozilla/5.0", "203.0.113.0"), "Apple's proxy");
        assert!(machine_agent(browser, "17.58.0.0"), "Apple's addresses");
        assert!(machine_agent("Barracuda Sentinel (EE)", "198.51.100.0"));
        assert!(machine_agent("python-requests/2.31", "198.51.100.0"));
        assert!(machine_agent("", "198.51.100.0"));
        for bot in [
            "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
            "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
            "Mozilla/5.0 (compatible; bingbot/2.0)",
            "Microsoft Office Existence Discovery",
            "Microsoft Office/16.0 (Windows NT 10.0; Microsoft Word 16.0.4266; Pro)",
        ] {
            assert!(machine_agent(bot, "198.51.100.0"), "{bot}");
        }
        for reader in [
            "Mozilla/5.0 (Linux; Android 9; CUBOT X19) AppleWebKit/537.36 Chrome/120.0 Mobile Safari/537.36",
            "Microsoft Office/16.0 (Windows NT 10.0; Microsoft Outlook 16.0.4266; Pro)",
        ] {
            assert!(!machine_agent(reader, "198.51.100.0"), "{reader}");
        }
    }
}
