//! `make bench`: eleven benchmarks of the whole stack, each against a baseline or a goal, in
//! one run (numbers are only comparable within a run; docs/benchmarks.md keeps the history).
//!
//! 1. **`GET /balance`** ([`balance`]) through the whole stack (gateway → NATS → billing →
//!    Postgres) against a baseline — one axum + sqlx process answering the same request with
//!    the same query on the same database — under the same load. Prints req/s, p50 and p99
//!    for both and their ratio, and the CPU time per request of each process.
//! 2. **Pipeline throughput**: recipients delivered per second from the first
//!    `POST /send-email` (sends of `BENCH_SEND_RECIPIENTS` distinct recipients each, one
//!    after another) until a local SMTP sink ([`postmesh_tests::fake_smtp::FakeSmtp`], no
//!    delay) holds every message: gateway → sender (task + outbox) → JetStream SEND stream →
//!    sender worker → lettre SMTP → sink. Against a baseline: one process sending the same
//!    messages (same from, subject and body, one per recipient) with lettre's pooled async
//!    SMTP transport to a sink of its own, `BENCH_SEND_CONCURRENCY` at once — by default 16,
//!    the sender's production `SEND_CONCURRENCY`, which the bench's sender runs with too, so
//!    both keep as many messages in flight.
//!    Measured twice: straight to the sinks (`BENCH_DIRECT_SENDS` sends, one round), where
//!    lettre's Nagle stall (40 ms a message, see [`quick_ack_front`]) paces both sides alike;
//!    and through a front that ACKs at once (`BENCH_PIPELINE_SENDS` sends per round,
//!    `BENCH_PIPELINE_ROUNDS` alternating rounds), where the ratio measures the pipeline's
//!    own cost. The goal (≥ 0.5) is reported for both routes. A sink check (lettre, 32 in flight) shows whether the sink
//!    sets the pace.
//! 3. **Accept latency** of one `POST /send-email` to `BENCH_SEND_RECIPIENTS` recipients
//!    (goal: p50 < 150 ms): `BENCH_SEND_REPEATS` sends one after another, after
//!    `BENCH_SEND_WARMUP` warm-up sends, `BENCH_SEND_PAUSE_MS` apart, while the worker
//!    delivers the earlier ones straight to the sink in the background (at the stall's pace;
//!    whatever is left when the bench ends is dropped with the stack). With
//!    `BENCH_SEND_DRAIN=1` each send instead waits until every earlier one was delivered
//!    (acceptance on an idle stack; far slower).
//! 4. **Inbound** ([`inbound`]): 50 KB messages ingested per second through the gateway
//!    against the ingest router called in process on the same database
//!    (`BENCH_INBOUND_CONNS` inboxes at once, default 8; `BENCH_INBOUND_SECS` per round,
//!    default 5; `BENCH_INBOUND_ROUNDS`, default 2), and the inbound service's peak RSS, as
//!    its own process, over one 10 MiB message (goal: growth under 5× the message).
//! 5. **Inbox webhooks** ([`webhooks`]): deliveries per second fanned out to 10 local
//!    receivers through the whole path (ingest → INBOUND → dispatcher → signed POST) against
//!    one process posting as many signed payloads with reqwest (goal: ratio ≥ 0.5);
//!    `BENCH_WEBHOOK_MESSAGES` per round (default 300), `BENCH_WEBHOOK_INBOXES` (default 4),
//!    `BENCH_WEBHOOK_CONCURRENCY` (the baseline's, default 64), `BENCH_WEBHOOK_ROUNDS`
//!    (default 2).
//!
//! 6. **Audience sends** ([`audiences`]): accepting sends to audiences of 10,000, 50,000 and
//!    100,000 contacts (`BENCH_AUDIENCE_CONTACTS`, default 100,000; `BENCH_AUDIENCE_ROUNDS`,
//!    default 2), with the time per 1,000 recipients (goal: linear, 100,000 under 5 s).
//! 7. **Workflow events** ([`workflows`]): events accepted per second, each starting a run
//!    (`BENCH_EVENTS`, default 2000; `BENCH_EVENT_CONCURRENCY`, default 32), and the time
//!    from an event to the delivered email of a workflow whose first step sends
//!    (`BENCH_EVENT_LATENCY_SAMPLES`, default 20).
//! 8. **Delivery-event webhooks** ([`events`]): events delivered per second to 10 local
//!    receivers for a send to `BENCH_EVENT_RECIPIENTS` (default 10,000; each recipient's
//!    `email.queued` and `email.sent`) against one process posting as many signed payloads
//!    with reqwest (`BENCH_EVENT_CONCURRENCY`, default 64; goal: ratio ≥ 0.5), and the
//!    dispatcher's peak RSS with one receiver stalled as its backlog grows over
//!    `BENCH_EVENT_STALLED_SENDS` sends of a tenth of that (default 8; goal: flat).
//! 9. **Scale-out** ([`replicas`]): sending and webhook-delivery throughput with two
//!    processes of the sender and the dispatcher (two gateways) against one, on one NATS
//!    server and on the local three-node cluster with streams at three replicas (goal:
//!    ratio ≥ 0.85, nothing lost or doubled); `BENCH_SCALE_SENDS` (default 10),
//!    `BENCH_SCALE_RECIPIENTS` (default 1000), `BENCH_SCALE_RECEIVERS` (default 4).
//! 10. **SMTP submission** ([`smtp`]): 20 KB one-recipient messages accepted per second over
//!     8 pipelined SMTP connections against the same messages through `POST /send-email`
//!     (goal: ratio ≥ 0.8), and the time from the end of DATA to its `250`;
//!     `BENCH_SMTP_CONNS` (default 8), `BENCH_SMTP_SECS` (default 4), `BENCH_SMTP_ROUNDS`
//!     (default 2).
//! 11. **Engagement** ([`tracking`]): the click redirect against a bare axum redirect (goal:
//!     ≥ 0.7 × throughput, p99 ≤ 2×), rewriting 10,000 links of 1 MiB of HTML (goal: under
//!     50 ms), and the message log searched at `BENCH_LOG_DELIVERIES` (default 1,000,000)
//!     deliveries (goal: a tag filter under 100 ms), with its query plan.
//!
//! Settings: `BENCH_SECS` (per `/balance` round, default 5), `BENCH_CONNS` (concurrent
//! keep-alive connections, default 32), `BENCH_ROUNDS` (alternating `/balance` and hostile
//! load rounds, default 3), `BENCH_HOSTILE_KINDS` (which of `html,links,csv,json` the
//! hostile load sends, default all), `BENCH_SEND_RECIPIENTS` (per send, default 1000), `BENCH_DIRECT_SENDS`
//! (default 1), `BENCH_PIPELINE_SENDS` (default 5), `BENCH_PIPELINE_ROUNDS` (default 2),
//! `BENCH_SEND_CONCURRENCY` (default 16), `BENCH_SEND_REPEATS` (default 30),
//! `BENCH_SEND_WARMUP` (default 3), `BENCH_SEND_PAUSE_MS` (default 200), `BENCH_SEND_DRAIN`
//! (default 0), `BENCH_ONLY` (comma-separated subset of
//! `balance,pipeline,accept,smtp,tracking,audience,workflows,webhooks,events,scale,inbound,rss,hostile`;
//! default all).

mod audiences;
mod balance;
mod compare;
mod events;
mod hostile;
mod inbound;
mod replicas;
mod smtp;
mod tracking;
mod webhooks;
mod workflows;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::header;
use futures::StreamExt;
use lettre::message::SinglePart;
use lettre::transport::smtp::PoolConfig;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

use inbound_ingest::budget::ByteBudget;
use postmesh_shared::config::{env_or, env_parse};
use postmesh_tests::fake_smtp::{Behaviour, FakeSmtp};
use postmesh_tests::receiver::Receiver;
use postmesh_tests::{Options, Stack};

/// The webhook baselines: `posts` POSTs signed as the dispatcher signs them (a fresh
/// `webhook-id` each), `concurrency` at once, the `i`th to `post(i)` = (URL, signing key,
/// body); every one must be answered 2xx and verified by a receiver of `receivers`. Answers
/// POSTs per second.
async fn signed_posts(
    receivers: &[Receiver], posts: usize, concurrency: usize,
    post: impl Fn(usize) -> (String, Vec<u8>, Vec<u8>),
) -> anyhow::Result<f64> {
    let verified = || receivers.iter().map(Receiver::count).sum::<usize>();
    let client = reqwest::Client::new();
    let before = verified();
    let started = Instant::now();
    let sent = futures::stream::iter(0..posts).map(|i| {
        let (url, key, body) = post(i);
        let id = webhook_dispatcher::content::payload::webhook_id(Uuid::now_v7());
        let timestamp = postmesh_shared::db::now_unix();
        let signature = webhook_dispatcher::content::payload::sign(&[&key], &id, timestamp, &body);
        let req = client
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body);
        async move { req.send().await.map(|r| r.status().is_success()) }
    });
    let ok = sent
        .buffer_unordered(concurrency)
        .filter(|r| futures::future::ready(matches!(r, Ok(true))))
        .count()
        .await;
    anyhow::ensure!(ok == posts, "{ok} of {posts} posts answered 2xx");
    anyhow::ensure!(verified() - before == ok, "receivers verified every post");
    Ok(ok as f64 / started.elapsed().as_secs_f64())
}

/// Deliveries per second over the last `count` arrivals at `receivers`, from the first of
/// them to the last.
fn arrival_rate(receivers: &[Receiver], count: usize) -> f64 {
    let mut arrivals: Vec<Instant> = receivers
        .iter()
        .flat_map(Receiver::deliveries)
        .map(|d| d.arrived)
        .collect();
    arrivals.sort();
    let window = arrivals[arrivals.len() - 1] - arrivals[arrivals.len() - count];
    count as f64 / window.as_secs_f64()
}

/// Results of one load run.
#[derive(Default)]
struct Run {
    requests: usize,
    errors: usize,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

impl Run {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies_us.len() as f64 * p).ceil() as usize)
            .clamp(1, self.latencies_us.len())
            - 1;
        self.latencies_us[i] as f64 / 1000.0
    }
}

/// What every benchmark message says: the sender's default from address (sends name no
/// `fromEmail`), this subject and this plain-text body.
const FROM: &str = "hello@postmesh.localhost";
const SUBJECT: &str = "Bench";
const TEXT: &str = "Hello";

/// Settings of the sending benchmarks.
struct SendSettings {
    recipients: usize,
    direct_sends: usize,
    pipeline_sends: usize,
    pipeline_rounds: usize,
    lettre_concurrency: usize,
    repeats: usize,
    warmup: usize,
    drain: bool,
    pause: Duration,
}

impl SendSettings {
    fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            recipients: env_parse("BENCH_SEND_RECIPIENTS", 1000)?,
            direct_sends: env_parse("BENCH_DIRECT_SENDS", 1)?,
            pipeline_sends: env_parse("BENCH_PIPELINE_SENDS", 5)?,
            pipeline_rounds: env_parse("BENCH_PIPELINE_ROUNDS", 2)?,
            lettre_concurrency: env_parse("BENCH_SEND_CONCURRENCY", 16)?,
            repeats: env_parse("BENCH_SEND_REPEATS", 30)?,
            warmup: env_parse("BENCH_SEND_WARMUP", 3)?,
            drain: env_parse::<u8>("BENCH_SEND_DRAIN", 0)? != 0,
            pause: Duration::from_millis(env_parse("BENCH_SEND_PAUSE_MS", 200)?),
        })
    }

    /// Credits for every send the benchmarks make, with room to spare.
    fn credits(&self) -> i64 {
        let sends = self.direct_sends
            + self.pipeline_sends * self.pipeline_rounds
            + self.warmup
            + self.repeats
            + 2;
        (sends * self.recipients) as i64 * 2
    }
}

/// How long to wait for the sink before giving up on a measurement.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

/// A `POST /send-email` body: `n` distinct recipients `{tag}-{i}@example.com`.
fn send_body(tag: &str, n: usize) -> Vec<u8> {
    let to: Vec<String> = (0..n).map(|i| format!("{tag}-{i}@example.com")).collect();
    serde_json::to_vec(&json!({ "to": to, "subject": SUBJECT, "text": TEXT })).expect("a JSON body")
}

/// Sends a prepared `/send-email` body through the gateway at `base`; answers how long it
/// took to accept it.
async fn post_send(
    stack: &Stack, base: &str, key: &str, body: Vec<u8>, n: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let res = stack
        .http
        .post(format!("{base}/send-email"))
        .bearer_auth(key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await?;
    let status = res.status();
    let bytes = res.bytes().await?;
    let took = started.elapsed();
    let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    anyhow::ensure!(
        status.is_success() && answer["recipients"]["accepted"] == n,
        "the send was not accepted: {status} {answer}"
    );
    Ok(took)
}

/// Waits until `sink` holds at least `count` messages.
async fn wait_received(sink: &FakeSmtp, count: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + DELIVERY_TIMEOUT;
    while sink.received_count() < count {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the sink holds {} of {count} messages after {DELIVERY_TIMEOUT:?}",
            sink.received_count()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Recipients delivered in some time.
#[derive(Default, Clone, Copy)]
struct Throughput {
    messages: usize,
    elapsed: Duration,
    /// For the pipeline: until the last send was accepted.
    accepted: Duration,
}

impl Throughput {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }

    fn add(&mut self, other: Throughput) {
        self.messages += other.messages;
        self.elapsed += other.elapsed;
        self.accepted += other.accepted;
    }
}

/// One pipeline round: `sends` sends of `n` recipients, from the first POST until the sink
/// holds all of them.
async fn pipeline_round(
    stack: &Stack, key: &str, sink: &FakeSmtp, tag: &str, sends: usize, n: usize,
) -> anyhow::Result<Throughput> {
    let bodies: Vec<Vec<u8>> = (0..sends)
        .map(|s| send_body(&format!("{tag}s{s}"), n))
        .collect();
    let before = sink.received_count();
    let started = Instant::now();
    for body in bodies {
        post_send(stack, &stack.base, key, body, n).await?;
    }
    let accepted = started.elapsed();
    wait_received(sink, before + sends * n).await?;
    Ok(Throughput {
        messages: sends * n,
        elapsed: started.elapsed(),
        accepted,
    })
}

/// The message the sender's worker builds for one recipient of a bench send.
fn bench_message(to: &str) -> anyhow::Result<Message> {
    Ok(Message::builder()
        .message_id(Some(format!("<{}@postmesh.test>", Uuid::now_v7())))
        .date_now()
        .from(FROM.parse()?)
        .to(to.parse()?)
        .subject(SUBJECT)
        .singlepart(SinglePart::plain(TEXT.to_owned()))?)
}

/// lettre's pooled SMTP transport to `addr`, keeping up to `connections` connections.
fn lettre_transport(addr: SocketAddr, connections: u32) -> AsyncSmtpTransport<Tokio1Executor> {
    AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(addr.ip().to_string())
        .port(addr.port())
        .pool_config(PoolConfig::new().max_size(connections))
        .build()
}

/// One baseline round: `total` messages (built here, one per recipient), `concurrency` at
/// once through `smtp`, until the sink holds all of them.
async fn lettre_round(
    smtp: &Arc<AsyncSmtpTransport<Tokio1Executor>>, sink: &FakeSmtp, tag: &str, total: usize,
    concurrency: usize,
) -> anyhow::Result<Throughput> {
    let next = Arc::new(AtomicUsize::new(0));
    let before = sink.received_count();
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (smtp, next, tag) = (smtp.clone(), next.clone(), tag.to_owned());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return anyhow::Ok(());
                    }
                    smtp.send(bench_message(&format!("{tag}-{i}@example.com"))?)
                        .await?;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    wait_received(sink, before + total).await?;
    let elapsed = started.elapsed();
    Ok(Throughput {
        messages: total,
        elapsed,
        accepted: elapsed,
    })
}

/// Messages (for the pipeline: recipients of one send) that warm a route up first: pooled
/// connections on both sides, the worker's task cache, prepared statements.
const WARMUP_MESSAGES: usize = 100;

/// A TCP front for the SMTP server at `target` that acknowledges whatever a client sends at
/// once (`TCP_QUICKACK` after every read) and forwards it with Nagle off both ways.
///
/// lettre 0.11.23 leaves Nagle on and writes a message's body and its closing `.` in two
/// writes, so the `.` waits for the server's delayed ACK (40 ms on Linux) — on every
/// message, whatever the server ([lettre#1159], merged after 0.11.23). Through this front
/// that wait is gone, for the baseline and the pipeline alike, and what is left to compare is
/// their own work. [`FakeSmtp`] itself is unchanged behind it.
///
/// [lettre#1159]: https://github.com/lettre/lettre/pull/1159
async fn quick_ack_front(target: SocketAddr) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(target).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let up = async {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = client_read.read(&mut buf).await?;
                        if n == 0 {
                            break;
                        }
                        quick_ack(client_read.as_ref());
                        server_write.write_all(&buf[..n]).await?;
                    }
                    server_write.shutdown().await
                };
                let down = tokio::io::copy(&mut server_read, &mut client_write);
                let _ = tokio::join!(up, down);
            });
        }
    });
    Ok(addr)
}

/// Acknowledges what `socket` received now rather than after the delayed-ACK timer.
fn quick_ack(socket: &TcpStream) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: a valid socket descriptor, and an option value of the size given.
    let _ = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Where the two sides of a comparison deliver: each its own sink, reached at `*_via`.
struct Route<'a> {
    name: &'a str,
    pipeline_sink: &'a FakeSmtp,
    pipeline_via: SocketAddr,
    baseline_sink: &'a FakeSmtp,
    baseline_via: SocketAddr,
}

/// Baseline and pipeline on `route`, in `rounds` alternating rounds of `sends` sends each,
/// after a warm-up; answers (baseline, pipeline).
async fn compare(
    stack: &mut Stack, key: &str, route: &Route<'_>, sends: usize, rounds: usize, s: &SendSettings,
) -> anyhow::Result<(Throughput, Throughput)> {
    stack
        .deliver_by_smtp(&format!("smtp://{}", route.pipeline_via))
        .await;
    let c = s.lettre_concurrency;
    let smtp = Arc::new(lettre_transport(route.baseline_via, c as u32));
    let tag = route.name;
    lettre_round(
        &smtp,
        route.baseline_sink,
        &format!("{tag}lw"),
        WARMUP_MESSAGES,
        c,
    )
    .await?;
    let sink = route.pipeline_sink;
    pipeline_round(stack, key, sink, &format!("{tag}pw"), 1, WARMUP_MESSAGES).await?;
    let (mut base, mut pipe) = (Throughput::default(), Throughput::default());
    let total = sends * s.recipients;
    for round in 0..rounds {
        let tag = format!("{tag}l{round}");
        base.add(lettre_round(&smtp, route.baseline_sink, &tag, total, c).await?);
        let tag = format!("{}p{round}", route.name);
        pipe.add(pipeline_round(stack, key, sink, &tag, sends, s.recipients).await?);
    }
    Ok((base, pipe))
}

/// Pipeline throughput against the lettre baseline, straight to the sinks and through
/// quick-ACK fronts; prints the table. Leaves the sender delivering straight to `sink`.
async fn pipeline_bench(
    stack: &mut Stack, key: &str, sink: &FakeSmtp, s: &SendSettings,
) -> anyhow::Result<()> {
    let base_sink = FakeSmtp::start(Behaviour::Accept {
        accept_delay: Duration::ZERO,
    })
    .await;
    let direct = Route {
        name: "d",
        pipeline_sink: sink,
        pipeline_via: sink.addr,
        baseline_sink: &base_sink,
        baseline_via: base_sink.addr,
    };
    let fronted = Route {
        name: "q",
        pipeline_via: quick_ack_front(sink.addr).await?,
        baseline_via: quick_ack_front(base_sink.addr).await?,
        ..direct
    };
    let (d_base, d_pipe) = compare(stack, key, &direct, s.direct_sends, 1, s).await?;
    let (q_base, q_pipe) =
        compare(stack, key, &fronted, s.pipeline_sends, s.pipeline_rounds, s).await?;
    // Is the sink what limits the baseline? The same messages, 32 at once.
    let wide = Arc::new(lettre_transport(fronted.baseline_via, 32));
    lettre_round(&wide, &base_sink, "cw", WARMUP_MESSAGES, 32).await?;
    let total = s.pipeline_sends * s.recipients;
    let check = lettre_round(&wide, &base_sink, "c", total, 32).await?;
    stack.deliver_by_smtp(&sink.url()).await;

    let c = s.lettre_concurrency;
    println!(
        "Pipeline throughput: recipients delivered per second to a local SMTP sink, from the \
         first POST /send-email ({} recipients each) until the sink holds every message; \
         baseline: lettre, {c} in flight (the worker's concurrency too), one process\n",
        s.recipients
    );
    println!("| route to the sink | target | recipients | seconds | recipients/s |");
    println!("|---|---|---:|---:|---:|");
    let row = |route: &str, name: &str, t: &Throughput| {
        println!(
            "| {route} | {name} | {} | {:.2} | {:.0} |",
            t.messages,
            t.elapsed.as_secs_f64(),
            t.rate()
        );
    };
    let d = "direct (lettre's 40 ms stall)";
    let q = "quick-ACK front (no stall)";
    let pipeline = format!("postmesh gateway → sender → SEND → worker ({c} in flight) → lettre");
    row(d, &format!("baseline: lettre, {c} in flight"), &d_base);
    row(d, &pipeline, &d_pipe);
    let ratio = |route: &str, goal: &str, pipe: &Throughput, base: &Throughput| {
        let ratio = pipe.rate() / base.rate();
        let met = if ratio >= 0.5 { "met" } else { "missed" };
        println!(
            "| {route} | ratio pipeline / baseline (goal ≥ 0.5 {goal}: {met}) | | | {ratio:.2} |"
        );
    };
    ratio(d, "as the issue sets it up", &d_pipe, &d_base);
    row(q, &format!("baseline: lettre, {c} in flight"), &q_base);
    row(q, &pipeline, &q_pipe);
    ratio(q, "without lettre's stall", &q_pipe, &q_base);
    row(q, "sink check: lettre, 32 in flight", &check);
    println!();
    let per_message_ms = c as f64 * 1000.0 / d_base.rate();
    println!(
        "Direct, every message of both sides waits {per_message_ms:.0} ms in flight (lettre's \
         Nagle stall): both run at {c} / that, so the direct ratio says little about the \
         pipeline's own cost; the quick-ACK ratio does."
    );
    println!(
        "Of the pipeline's {:.2} s (quick-ACK), {:.2} s went to accepting its sends.",
        q_pipe.elapsed.as_secs_f64(),
        q_pipe.accepted.as_secs_f64()
    );
    if check.rate() < q_base.rate() * 1.2 {
        println!(
            "Note: 32 in flight barely beat {c}: the sink (or the machine) is near its limit, \
             so the quick-ACK baseline is a floor and its ratio flatters the pipeline."
        );
    }
    println!();
    Ok(())
}

/// Accept latency of single sends; prints the table.
async fn accept_bench(
    stack: &Stack, key: &str, sink: &FakeSmtp, s: &SendSettings,
) -> anyhow::Result<()> {
    let n = s.recipients;
    let mut latencies_us = Vec::with_capacity(s.repeats);
    let mut expected = sink.received_count();
    for i in 0..s.warmup + s.repeats {
        if s.drain {
            wait_received(sink, expected).await?;
        }
        tokio::time::sleep(s.pause).await;
        let body = send_body(&format!("a{i}"), n);
        let took = post_send(stack, &stack.base, key, body, n).await?;
        expected += n;
        if i >= s.warmup {
            latencies_us.push(took.as_micros() as u64);
        }
    }
    // What is left delivering is awaited, so the next part starts with an idle pipeline.
    let draining = Instant::now();
    wait_received(sink, expected).await?;
    let drained = draining.elapsed();
    latencies_us.sort_unstable();
    let run = Run {
        requests: latencies_us.len(),
        latencies_us,
        ..Run::default()
    };
    let how = if s.drain {
        "each after the earlier sends were delivered".to_owned()
    } else {
        format!(
            "{} ms apart, delivery of earlier sends running",
            s.pause.as_millis()
        )
    };
    println!(
        "Accept latency: POST /send-email to {n} recipients, {} sends one after another after \
         {} warm-ups, {how}\n",
        s.repeats, s.warmup
    );
    println!("| metric | ms |");
    println!("|---|---:|");
    let p50 = run.percentile_ms(0.50);
    println!(
        "| p50 (goal < 150: {}) | {p50:.1} |",
        if p50 < 150.0 { "met" } else { "missed" }
    );
    println!("| p99 | {:.1} |", run.percentile_ms(0.99));
    println!("| min | {:.1} |", run.percentile_ms(0.0));
    println!("| max | {:.1} |", run.percentile_ms(1.0));
    println!(
        "| delivering what was left after the last answer, s | {:.1} |\n",
        drained.as_secs_f64()
    );
    Ok(())
}

// The allocator of the services the baselines are compared with.
postmesh_shared::fast_allocator!();

/// When the bench binary was started to serve the baselines (`BENCH_BASELINE_ADDR`), serves
/// them until killed; otherwise answers `false` at once.
async fn serve_baselines_if_asked() -> anyhow::Result<bool> {
    let Ok(addr) = std::env::var(compare::SERVE) else {
        return Ok(false);
    };
    let app = balance::baseline().await?.merge(tracking::baseline());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    axum::serve(listener, app).await?;
    Ok(true)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if serve_baselines_if_asked().await? {
        return Ok(());
    }
    let secs: u64 = env_parse("BENCH_SECS", 5)?;
    let conns: usize = env_parse("BENCH_CONNS", 32)?;
    let rounds: usize = env_parse("BENCH_ROUNDS", 3)?;
    let sending = SendSettings::from_env()?;
    let only = env_or(
        "BENCH_ONLY",
        "balance,pipeline,accept,smtp,tracking,audience,workflows,webhooks,events,scale,inbound,rss,hostile",
    );
    let runs = |part: &str| only.split(',').any(|p| p.trim() == part);
    // The per-key limiter and the inbound byte budget run on every request (their cost is
    // measured) but never throttle; the hostile load sets the budget's defaults.
    let mut stack = Stack::start_opts(Options {
        send_concurrency: sending.lettre_concurrency,
        inbound_budget: ByteBudget {
            bytes_per_sec: 1 << 40,
            burst_bytes: 1 << 40,
        },
        ..Options::with_rate(10_000_000, 10_000_000)
    })
    .await;
    let outcome = async {
        if runs("balance") {
            let load = compare::Load {
                conns,
                secs,
                rounds,
            };
            balance::run(&mut stack, &load).await?;
        }
        if runs("pipeline") || runs("accept") {
            let sink = FakeSmtp::start(Behaviour::Accept {
                accept_delay: Duration::ZERO,
            })
            .await;
            stack.deliver_by_smtp(&sink.url()).await;
            let key = stack.key(sending.credits()).await;
            if runs("pipeline") {
                pipeline_bench(&mut stack, &key, &sink, &sending).await?;
            }
            if runs("accept") {
                accept_bench(&stack, &key, &sink, &sending).await?;
            }
            // The parts after these watch the outbox: the sender goes back to it.
            stack.use_file();
            stack.kill_sender().await;
            stack.start_sender().await;
        }
        if runs("smtp") {
            let settings = smtp::Settings {
                conns: env_parse("BENCH_SMTP_CONNS", 8)?,
                secs: env_parse("BENCH_SMTP_SECS", 4)?,
                rounds: env_parse("BENCH_SMTP_ROUNDS", 2)?,
            };
            smtp::run(&stack, &settings).await?;
        }
        if runs("tracking") {
            let settings = tracking::Settings {
                load: compare::Load {
                    conns: env_parse("BENCH_TRACK_CONNS", 32)?,
                    secs: env_parse("BENCH_TRACK_SECS", 4)?,
                    rounds: env_parse("BENCH_TRACK_ROUNDS", 2)?,
                },
                deliveries: env_parse("BENCH_LOG_DELIVERIES", 1_000_000)?,
            };
            tracking::run(&mut stack, &settings).await?;
        }
        if runs("audience") {
            audiences::accept(
                &stack,
                env_parse("BENCH_AUDIENCE_CONTACTS", 100_000)?,
                env_parse("BENCH_AUDIENCE_ROUNDS", 2)?,
            )
            .await?;
        }
        if runs("workflows") {
            let settings = workflows::Settings {
                events: env_parse("BENCH_EVENTS", 2000)?,
                concurrency: env_parse("BENCH_EVENT_CONCURRENCY", 32)?,
                samples: env_parse("BENCH_EVENT_LATENCY_SAMPLES", 20)?,
            };
            workflows::run(&stack, &settings).await?;
        }
        if runs("webhooks") {
            let settings = webhooks::Settings {
                messages: env_parse("BENCH_WEBHOOK_MESSAGES", 300)?,
                inboxes: env_parse("BENCH_WEBHOOK_INBOXES", 4)?,
                concurrency: env_parse("BENCH_WEBHOOK_CONCURRENCY", 64)?,
                rounds: env_parse("BENCH_WEBHOOK_ROUNDS", 2)?,
            };
            webhooks::fanout(&mut stack, &settings).await?;
        }
        if runs("events") {
            let settings = events::Settings {
                recipients: env_parse("BENCH_EVENT_RECIPIENTS", 10_000)?,
                concurrency: env_parse("BENCH_EVENT_CONCURRENCY", 64)?,
                stalled_sends: env_parse("BENCH_EVENT_STALLED_SENDS", 8)?,
            };
            events::run(&mut stack, &settings).await?;
        }
        if runs("scale") {
            let settings = replicas::Settings {
                sends: env_parse("BENCH_SCALE_SENDS", 10)?,
                recipients: env_parse("BENCH_SCALE_RECIPIENTS", 1000)?,
                receivers: env_parse("BENCH_SCALE_RECEIVERS", 4)?,
                send_concurrency: sending.lettre_concurrency,
            };
            replicas::run(&settings).await?;
        }
        // Last: the inbound benchmarks write some hundred MB that Postgres then flushes,
        // which would slow whatever ran after them.
        if runs("inbound") {
            inbound::throughput(
                &stack,
                env_parse("BENCH_INBOUND_SECS", 5)?,
                env_parse("BENCH_INBOUND_CONNS", 8)?,
                env_parse("BENCH_INBOUND_ROUNDS", 2)?,
            )
            .await?;
        }
        if runs("rss") {
            inbound::peak_rss().await?;
        }
        if runs("hostile") {
            hostile::run(&mut stack, secs, rounds).await?;
        }
        anyhow::Ok(())
    }
    .await;
    stack.shutdown().await;
    outcome
}
