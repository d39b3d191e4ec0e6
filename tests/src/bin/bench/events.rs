//! Delivery-event webhooks: a send to an audience of `BENCH_EVENT_RECIPIENTS` contacts
//! (default 10,000) with 10 workspace webhooks, each on its own local receiver taking
//! `email.queued` and `email.sent`, so every recipient yields 2 × 10 signed deliveries.
//!
//! **Throughput**, measured as the inbox bench's backlog round: the send is accepted and
//! delivered (to an SMTP sink behind a quick-ACK front) while the dispatcher is stopped, so
//! its events wait on DELIVERY; then the dispatcher starts as its own process (release
//! build), and events delivered per second are counted from its first delivery to its last:
//! DELIVERY → events and attempts → WEBHOOK → signed POST. Against a baseline: one process
//! posting as many signed payloads of the same shape with reqwest to the same receivers,
//! `BENCH_EVENT_CONCURRENCY` at once (default 64). Receivers verify every signature.
//!
//! **Memory with one receiver stalled**: a fresh dispatcher process, warmed up by one send
//! to a tenth of the audience; then receiver 0 answers nothing (its POSTs time out) during
//! `BENCH_EVENT_STALLED_SENDS` sends (default 8) to a tenth of the audience, one
//! after another. Once the other nine receivers hold all of a send's deliveries, the
//! stalled webhook's backlog (pending attempts) and the dispatcher's peak RSS (VmHWM) are
//! read. Each send is the same burst, so what grows is the backlog alone. Goal: flat, the
//! peak after the last send within 1.1× of that halfway, where the backlog was half as
//! large (the first sends still grow the process to its working size).

use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use postmesh_shared::proto::DeliveryEvent;
use postmesh_shared::Success;
use postmesh_tests::fake_smtp::{Behaviour, FakeSmtp};
use postmesh_tests::receiver::{Receiver, Reply};
use postmesh_tests::{peek, Stack};
use sender::sending::send::SendAnswer;
use webhook_dispatcher::content::payload::Envelope;
use webhook_dispatcher::routes::webhooks::Created;

/// Receivers, one webhook each.
const RECEIVERS: usize = 10;
/// The types every webhook takes.
const TYPES: [&str; 2] = ["email.queued", "email.sent"];
/// The longest wait for a round's deliveries.
const PATIENCE: Duration = Duration::from_secs(600);

/// Settings of the benchmark.
pub struct Settings {
    /// Recipients of the measured send (`BENCH_EVENT_RECIPIENTS`).
    pub recipients: usize,
    /// The baseline's POSTs in flight (`BENCH_EVENT_CONCURRENCY`).
    pub concurrency: usize,
    /// Sends made while a receiver is stalled (`BENCH_EVENT_STALLED_SENDS`).
    pub stalled_sends: usize,
}

/// A webhook on `receiver` taking [`TYPES`]: its id and signing key.
pub(super) async fn webhook(
    stack: &Stack, key: &str, receiver: &Receiver,
) -> anyhow::Result<(Uuid, Vec<u8>)> {
    let res = stack
        .http
        .post(format!("{}/webhooks", stack.base))
        .bearer_auth(key)
        .json(&json!({ "url": receiver.url("/events"), "events": TYPES }))
        .send()
        .await?;
    anyhow::ensure!(
        res.status() == StatusCode::CREATED,
        "webhook: {}",
        res.status()
    );
    let created: Success<Created> = res.json().await?;
    receiver.trust(&created.body.signing_secret);
    let secret = created.body.signing_secret.trim_start_matches("whsec_");
    let signing = base64::engine::general_purpose::STANDARD.decode(secret)?;
    Ok((created.body.webhook.id, signing))
}

/// Sends to the contacts tagged `first-<size>`; waits until the sink holds every message
/// and the sender's outbox has published every event.
async fn send(stack: &Stack, key: &str, sink: &FakeSmtp, size: usize) -> anyhow::Result<()> {
    let before = sink.received_count();
    let answer: Success<SendAnswer> = stack
        .client(key)
        .post(
            "/send-email",
            &json!({"audience": {"include": [{"tag": format!("first-{size}")}]},
                    "subject": "Hello", "text": "Hi", "emailType": "marketing"}),
            StatusCode::OK,
        )
        .await;
    anyhow::ensure!(answer.body.recipients.accepted == size, "accepted");
    let sender_db = stack.sender_db().await;
    let deadline = Instant::now() + PATIENCE;
    while sink.received_count() < before + size || peek::kit::unpublished(&sender_db).await > 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the send was not delivered in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn delivered(receivers: &[Receiver]) -> usize {
    receivers.iter().map(Receiver::count).sum()
}

/// Waits until `receivers` hold `expected` deliveries in all.
async fn all_delivered(receivers: &[Receiver], expected: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    while delivered(receivers) < expected {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} of {expected} deliveries",
            delivered(receivers)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Pending attempts of webhook `id`: its backlog.
async fn pending(stack: &Stack, id: Uuid) -> anyhow::Result<i64> {
    let db = stack.service_db(webhook_dispatcher::SERVICE).await;
    let count = sqlx::query_scalar(
        "SELECT count(*) FROM attempts WHERE webhook_id = $1 AND status = 'pending'",
    )
    .bind(id)
    .fetch_one(&db)
    .await?;
    Ok(count)
}

/// The dispatcher process's (RSS, peak RSS).
fn memory(stack: &Stack) -> anyhow::Result<(u64, u64)> {
    let pid = stack
        .dispatcher_pid()
        .ok_or_else(|| anyhow::anyhow!("the dispatcher runs in this process"))?;
    super::inbound::memory_of(pid)
}

/// The `email.sent` event of recipient `n`, as the sender publishes it.
fn sample(n: usize) -> DeliveryEvent {
    DeliveryEvent {
        event_id: Uuid::now_v7().to_string(),
        task_id: Uuid::now_v7().to_string(),
        delivery_id: Uuid::now_v7().to_string(),
        email: format!("c{n}@bench.example"),
        kind: "sent".into(),
        occurred_at: postmesh_shared::db::now_unix(),
        detail: "{}".into(),
        sequence: n as i64,
        from_address: "hello@postmesh.localhost".into(),
        subject: "Hello".into(),
        email_type: "marketing".into(),
        message_id: format!("<{n}@postmesh.localhost>"),
        provider_message_id: format!("<{n}@postmesh.localhost>"),
        ..Default::default()
    }
}

/// The baseline: as many signed POSTs of the same shape, `concurrency` at once.
async fn baseline(
    receivers: &[Receiver], keys: &[Vec<u8>], posts: usize, concurrency: usize,
) -> anyhow::Result<f64> {
    super::signed_posts(receivers, posts, concurrency, |i| {
        let r = i % RECEIVERS;
        let event = sample(i / RECEIVERS);
        let data = webhook_dispatcher::delivery::events::data(&event);
        let body = serde_json::to_vec(&Envelope::new(
            TYPES[i / RECEIVERS % 2],
            webhook_dispatcher::delivery::worker::now_rfc3339(),
            &data,
        ))
        .expect("JSON");
        (receivers[r].url("/events"), keys[r].clone(), body)
    })
    .await
}

/// Runs both measurements; prints the tables.
pub async fn run(stack: &mut Stack, s: &Settings) -> anyhow::Result<()> {
    let n = s.recipients;
    let tenth = n / 10;
    let sink = FakeSmtp::start(Behaviour::Accept {
        accept_delay: Duration::ZERO,
    })
    .await;
    let front = super::quick_ack_front(sink.addr).await?;
    stack.deliver_by_smtp(&format!("smtp://{front}")).await;
    let key = stack.key(10 * n as i64).await;
    let workspace = stack.workspace_of(&key).await;
    peek::sender::insert_contacts(&stack.sender_db().await, workspace, n, &[tenth, n]).await;
    let mut receivers = Vec::new();
    let mut keys = Vec::new();
    let mut hooks = Vec::new();
    for _ in 0..RECEIVERS {
        let receiver = Receiver::start().await;
        let (id, signing) = webhook(stack, &key, &receiver).await?;
        receivers.push(receiver);
        keys.push(signing);
        hooks.push(id);
    }
    let config = stack.dispatcher_config();

    // Throughput: the whole send's events wait on DELIVERY, then a dispatcher starts.
    stack.kill_dispatcher().await;
    send(stack, &key, &sink, n).await?;
    let events = 2 * n * RECEIVERS;
    stack.spawn_dispatcher(config.clone()).await;
    all_delivered(&receivers, events).await?;
    let (_, drain_peak) = memory(stack)?;
    let pipeline = super::arrival_rate(&receivers, events);
    let base = baseline(&receivers, &keys, events, s.concurrency).await?;

    // Memory: a fresh process, warmed up, then receiver 0 stalled while the backlog grows.
    stack.spawn_dispatcher(config).await;
    let expected = delivered(&receivers) + 2 * tenth * RECEIVERS;
    send(stack, &key, &sink, tenth).await?;
    all_delivered(&receivers, expected).await?;
    let (start_rss, _) = memory(stack)?;
    receivers[0].answer(Reply::Slow(Duration::from_secs(3600), 200));
    let healthy = &receivers[1..];
    let mut rows = Vec::new();
    for _ in 0..s.stalled_sends.max(1) {
        let expected = delivered(healthy) + 2 * tenth * (RECEIVERS - 1);
        send(stack, &key, &sink, tenth).await?;
        all_delivered(healthy, expected).await?;
        let (rss, peak) = memory(stack)?;
        rows.push((pending(stack, hooks[0]).await?, rss, peak));
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "Delivery-event webhooks: a send to {n} recipients, {RECEIVERS} webhooks taking \
         email.queued and email.sent, each on a local receiver verifying signatures\n"
    );
    println!("| path | events delivered/s |");
    println!("|---|---:|");
    println!(
        "| baseline: one process, reqwest, signed, {} in flight | {base:.0} |",
        s.concurrency
    );
    println!(
        "| postmesh backlog: DELIVERY → dispatcher (own process) → signed POST | {pipeline:.0} |"
    );
    let ratio = pipeline / base;
    let met = if ratio >= 0.5 { "met" } else { "missed" };
    println!("| ratio (goal ≥ 0.5: {met}) | {ratio:.2} |");
    println!(
        "| dispatcher peak RSS over the {events} deliveries, MiB | {:.1} |\n",
        mib(drain_peak)
    );
    println!(
        "Dispatcher with receiver 0 stalled (a fresh process, RSS {:.1} MiB after a warm-up \
         send), sends of {tenth} recipients\n",
        mib(start_rss)
    );
    println!("| after send | stalled webhook's pending attempts | RSS, MiB | peak RSS, MiB |");
    println!("|---:|---:|---:|---:|");
    for (i, (pending, rss, peak)) in rows.iter().enumerate() {
        println!(
            "| {} | {pending} | {:.1} | {:.1} |",
            i + 1,
            mib(*rss),
            mib(*peak)
        );
    }
    // Over every send, and over the second half, once the process reached its working
    // size (the goal: the backlog doubles there, the peak does not follow).
    let growth = |from: usize| {
        let (first, last) = (rows[from], rows[rows.len() - 1]);
        let backlog = last.0 as f64 / first.0.max(1) as f64;
        (backlog, last.2 as f64 / first.2 as f64)
    };
    let (backlog, all) = growth(0);
    println!("| peak growth over every send, the backlog {backlog:.1}× | | | {all:.2}× |");
    let (backlog, half) = growth((rows.len() - 1) / 2);
    let flat = if half < 1.1 { "met" } else { "missed" };
    println!(
        "| peak growth over the second half, the backlog {backlog:.1}× (goal: flat, < 1.1×: \
         {flat}) | | | {half:.2}× |\n"
    );
    stack.kill_dispatcher().await;
    Ok(())
}
