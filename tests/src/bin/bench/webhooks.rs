//! Inbox webhooks fanned out: deliveries per second through the whole path — ingest through
//! the gateway → inbound-ingest → INBOUND → dispatcher fan-out → WEBHOOK → signed POST — to
//! 10 local receivers (each inbox has one endpoint on each), against a baseline: one process
//! posting the same number of signed payloads of the same shape with reqwest to the same
//! receivers, `BENCH_WEBHOOK_CONCURRENCY` at once. Receivers verify every signature.
//!
//! Measured two ways. **Live**: from the first ingest until the last delivery, so ingest's
//! own pace (the MTA's messages, one by one) bounds it. **Backlog**: the messages are
//! ingested while the dispatcher is stopped (they wait on INBOUND), then it starts, and the
//! rate is counted from its first delivery to its last: what the dispatcher delivers when
//! there is mail to deliver.

use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::StreamExt;
use serde_json::json;

use postmesh_shared::proto::InboundMessageReply;
use postmesh_tests::receiver::Receiver;
use postmesh_tests::{Stack, INBOUND_DOMAIN, INBOUND_SECRET};
use webhook_dispatcher::content::payload::{Event, Shape};
use webhook_dispatcher::content::quotes::BodyFormat;
use webhook_dispatcher::routes::endpoints::Created;

/// Receivers every message is fanned out to.
const RECEIVERS: usize = 10;
/// Bytes of each message's text.
const TEXT_BYTES: usize = 2000;

/// Settings of the benchmark.
pub struct Settings {
    /// Messages ingested per round (`BENCH_WEBHOOK_MESSAGES`).
    pub messages: usize,
    /// Inboxes they are spread over (`BENCH_WEBHOOK_INBOXES`).
    pub inboxes: usize,
    /// The baseline's POSTs in flight (`BENCH_WEBHOOK_CONCURRENCY`).
    pub concurrency: usize,
    /// Alternating rounds (`BENCH_WEBHOOK_ROUNDS`).
    pub rounds: usize,
}

/// An inbox with an endpoint on each receiver: its address and the endpoints' secrets.
struct Inbox {
    address: String,
    keys: Vec<Vec<u8>>,
}

async fn inbox(stack: &Stack, i: usize, receivers: &[Receiver]) -> anyhow::Result<Inbox> {
    let key = stack.key(0).await;
    let address = format!("hooks{i}@{INBOUND_DOMAIN}");
    let created: serde_json::Value = stack
        .http
        .post(format!("{}/inbox/addresses", stack.base))
        .bearer_auth(&key)
        .json(&json!({ "address": address }))
        .send()
        .await?
        .json()
        .await?;
    let id = created["address"]["id"].clone();
    let mut keys = Vec::new();
    for receiver in receivers {
        let res = stack
            .http
            .post(format!("{}/inbox/webhook/endpoints", stack.base))
            .bearer_auth(&key)
            .json(&json!({ "addressId": id, "url": receiver.url("/hook") }))
            .send()
            .await?;
        anyhow::ensure!(res.status().is_success(), "endpoint: {}", res.status());
        let created: postmesh_shared::Success<Created> = res.json().await?;
        receiver.trust(&created.body.signing_secret);
        let secret = created.body.signing_secret.trim_start_matches("whsec_");
        keys.push(base64::engine::general_purpose::STANDARD.decode(secret)?);
    }
    Ok(Inbox { address, keys })
}

/// The raw message `n` to `to`.
fn raw(n: usize, to: &str) -> Vec<u8> {
    let mut raw = format!(
        "From: Ann <ann@customer.example>\r\nTo: {to}\r\nMessage-ID: <hook-{n}@bench>\r\n\
         Subject: Hook {n}\r\nContent-Type: text/plain\r\n\r\n"
    )
    .into_bytes();
    raw.resize(raw.len() + TEXT_BYTES, b'x');
    raw
}

fn delivered(receivers: &[Receiver]) -> usize {
    receivers.iter().map(Receiver::count).sum()
}

/// Ingests `messages` messages numbered from `first`, 8 at once.
async fn ingest(
    stack: &Stack, inboxes: &[Inbox], messages: usize, first: usize,
) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let ingests = futures::stream::iter(first..first + messages).map(|n| {
        let to = &inboxes[n % inboxes.len()].address;
        let body = json!({
            "from": "ann@customer.example",
            "to": [to],
            "rawBase64": base64::engine::general_purpose::STANDARD.encode(raw(n, to)),
            "authentication": {"sourceIp": "203.0.113.7", "spf": "pass", "dkim": "pass", "dmarc": "pass"},
        });
        let req = client
            .post(format!("{}/inbound-email/ingest", stack.base))
            .header("x-service-inbound-secret", INBOUND_SECRET)
            .json(&body);
        async move { req.send().await.map(|r| r.status().is_success()) }
    });
    let stored = ingests
        .buffer_unordered(8)
        .filter(|r| futures::future::ready(matches!(r, Ok(true))))
        .count()
        .await;
    anyhow::ensure!(stored == messages, "{stored} of {messages} ingested");
    Ok(())
}

/// Waits until the receivers hold `expected` deliveries in all.
async fn all_delivered(receivers: &[Receiver], expected: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while delivered(receivers) < expected {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} of {expected} deliveries",
            delivered(receivers)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// A live round: from the first ingest until every delivery arrived.
async fn live(
    stack: &Stack, inboxes: &[Inbox], receivers: &[Receiver], messages: usize, first: usize,
) -> anyhow::Result<f64> {
    let expected = delivered(receivers) + messages * RECEIVERS;
    let started = Instant::now();
    ingest(stack, inboxes, messages, first).await?;
    all_delivered(receivers, expected).await?;
    Ok((messages * RECEIVERS) as f64 / started.elapsed().as_secs_f64())
}

/// A backlog round: ingested with the dispatcher stopped, delivered once it starts; counted
/// from its first delivery to its last.
async fn backlog(
    stack: &mut Stack, inboxes: &[Inbox], receivers: &[Receiver], messages: usize, first: usize,
) -> anyhow::Result<f64> {
    let before = delivered(receivers);
    stack.kill_dispatcher().await;
    ingest(stack, inboxes, messages, first).await?;
    stack.restart_dispatcher(stack.dispatcher_config()).await;
    all_delivered(receivers, before + messages * RECEIVERS).await?;
    Ok(super::arrival_rate(receivers, messages * RECEIVERS))
}

/// A payload of the pipeline's shape for message `n`.
fn sample_body(n: usize, to: &str) -> Vec<u8> {
    let message = InboundMessageReply {
        found: true,
        email_id: format!("hook-{n}@bench"),
        address_id: uuid::Uuid::now_v7().to_string(),
        address: to.to_owned(),
        thread_id: uuid::Uuid::now_v7().to_string(),
        from_address: "ann@customer.example".into(),
        from_name: "Ann".into(),
        to: vec![to.to_owned()],
        subject: format!("Hook {n}"),
        received_at: 1,
        text: Some("x".repeat(TEXT_BYTES)),
        spf: "pass".into(),
        dkim: "pass".into(),
        dmarc: "pass".into(),
        ..Default::default()
    };
    let shape = Shape {
        format: BodyFormat::Text,
        strip_quotes: false,
        max_body_bytes: 256 * 1024,
    };
    let event = Event::received(
        &message,
        uuid::Uuid::now_v7().to_string(),
        shape,
        "now".into(),
    );
    serde_json::to_vec(&event).expect("JSON")
}

/// One baseline round: as many signed POSTs, `concurrency` at once.
async fn baseline(
    inboxes: &[Inbox], receivers: &[Receiver], messages: usize, concurrency: usize,
) -> anyhow::Result<f64> {
    super::signed_posts(receivers, messages * RECEIVERS, concurrency, |i| {
        let (n, r) = (i / RECEIVERS, i % RECEIVERS);
        let inbox = &inboxes[n % inboxes.len()];
        let body = sample_body(n, &inbox.address);
        (receivers[r].url("/hook"), inbox.keys[r].clone(), body)
    })
    .await
}

/// Deliveries per second, pipeline against baseline; prints the table.
pub async fn fanout(stack: &mut Stack, s: &Settings) -> anyhow::Result<()> {
    let mut receivers = Vec::new();
    for _ in 0..RECEIVERS {
        receivers.push(Receiver::start().await);
    }
    let mut inboxes = Vec::new();
    for i in 0..s.inboxes {
        inboxes.push(inbox(stack, i, &receivers).await?);
    }
    // Warm-up: connections, caches, the consumers' first pulls.
    live(stack, &inboxes, &receivers, 100, 0).await?;
    // The statistics autovacuum keeps of a table in use (its first pass comes a minute
    // after the table filled; the bench would otherwise measure plans made for empty tables).
    for service in [webhook_dispatcher::SERVICE, inbound_ingest::SERVICE] {
        sqlx::query("ANALYZE")
            .execute(&stack.service_db(service).await)
            .await?;
    }
    let (mut lives, mut backlogs, mut base) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..s.rounds {
        base.push(baseline(&inboxes, &receivers, s.messages, s.concurrency).await?);
        let first = 1000 + 2 * round * s.messages;
        lives.push(live(stack, &inboxes, &receivers, s.messages, first).await?);
        let first = first + s.messages;
        backlogs.push(backlog(stack, &inboxes, &receivers, s.messages, first).await?);
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (live, pipe, base) = (best(&lives), best(&backlogs), best(&base));
    println!(
        "Inbox webhooks: {} messages per round over {} inboxes, each to {RECEIVERS} receivers \
         verifying signatures; best of {} rounds\n",
        s.messages, s.inboxes, s.rounds
    );
    println!("| path | deliveries/s |");
    println!("|---|---:|");
    println!(
        "| baseline: one process, reqwest, signed, {} in flight | {base:.0} |",
        s.concurrency
    );
    println!("| postmesh live: ingest → INBOUND → dispatcher → signed POST | {live:.0} |");
    println!("| postmesh backlog: INBOUND → dispatcher → signed POST | {pipe:.0} |");
    println!("| ratio live / baseline | {:.2} |", live / base);
    let ratio = pipe / base;
    let met = if ratio >= 0.5 { "met" } else { "missed" };
    println!("| ratio backlog / baseline (goal ≥ 0.5: {met}) | {ratio:.2} |\n");
    Ok(())
}
