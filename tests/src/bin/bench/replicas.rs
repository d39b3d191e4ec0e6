//! Scale-out: what a second process of each queue-driven service costs, and what a
//! three-node NATS cluster with every stream at three replicas costs, against one process
//! on one server — on the same machine, in the same run. On two cores a second process
//! brings no speed-up; the goal is an overhead under 15 % (a ratio ≥ 0.85) and nothing lost
//! or done twice.
//!
//! Four shapes, each a fresh stack: one NATS server or the local cluster
//! (`deploy/nats-cluster.sh`), and one or two processes each of the sender and the webhook
//! dispatcher (their release binaries), with the load alternating between as many gateways.
//! In each:
//!
//! - **Sending**: `BENCH_SCALE_SENDS` sends (default 10) of `BENCH_SCALE_RECIPIENTS`
//!   distinct recipients each (default 1000), one after another, through the gateways in
//!   turn; recipients delivered per second from the first `POST /send-email` until an SMTP
//!   sink behind a quick-ACK front holds every message (after a warm-up send through each
//!   gateway). The dispatchers are stopped meanwhile, so the sends' delivery events wait on
//!   DELIVERY.
//! - **Webhook delivery**: `BENCH_SCALE_RECEIVERS` local receivers (default 4), each with a
//!   workspace webhook taking `email.queued` and `email.sent`; the dispatchers start and the
//!   events delivered per second are counted from the first delivery to the last.
//! - **Nothing lost or doubled**: once every consumer has acknowledged everything, the sink
//!   holds each recipient exactly once and each receiver each recipient's two events exactly
//!   once; otherwise the bench fails.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use postmesh_shared::jetstream::Stream;
use postmesh_shared::{Running, Service};
use postmesh_tests::cluster::ClusterGuard;
use postmesh_tests::fake_smtp::{Behaviour, FakeSmtp};
use postmesh_tests::receiver::Receiver;
use postmesh_tests::{free_port, spawn_service, Options, Stack};

/// Settings of the benchmark.
pub struct Settings {
    /// Measured sends (`BENCH_SCALE_SENDS`).
    pub sends: usize,
    /// Recipients of each (`BENCH_SCALE_RECIPIENTS`).
    pub recipients: usize,
    /// Receivers, one webhook each (`BENCH_SCALE_RECEIVERS`).
    pub receivers: usize,
    /// Jobs each sender process works on at once (`BENCH_SEND_CONCURRENCY`).
    pub send_concurrency: usize,
}

/// One way of running the stack.
#[derive(Clone, Copy)]
struct Shape {
    /// Processes of the sender and of the dispatcher, and gateways taking the load.
    replicas: usize,
    /// On the local three-node cluster, streams at three replicas (else one server).
    cluster: bool,
}

impl Shape {
    fn name(self) -> String {
        let nats = if self.cluster {
            "3-node cluster, streams R3"
        } else {
            "one NATS server, streams R1"
        };
        format!("{nats}, {} process(es) each", self.replicas)
    }
}

/// What one shape did: recipients delivered and webhook events delivered per second.
struct Figures {
    sending: f64,
    webhooks: f64,
    /// Webhook jobs published: attempts the fan-outs left to the worker.
    to_worker: u64,
}

/// Recipients of the warm-up send through each gateway.
const WARMUP: usize = 100;
/// The longest wait for the sink or the receivers.
const PATIENCE: Duration = Duration::from_secs(300);

/// Measures every shape; prints the table.
pub async fn run(s: &Settings) -> anyhow::Result<()> {
    let shapes = [
        Shape {
            replicas: 1,
            cluster: false,
        },
        Shape {
            replicas: 2,
            cluster: false,
        },
        Shape {
            replicas: 1,
            cluster: true,
        },
        Shape {
            replicas: 2,
            cluster: true,
        },
    ];
    let mut cluster: Option<ClusterGuard> = None;
    let mut rows = Vec::new();
    for shape in shapes {
        if shape.cluster && cluster.is_none() {
            cluster = Some(ClusterGuard::start().await);
        }
        let url = shape
            .cluster
            .then(|| cluster.as_ref().map(|c| c.url.clone()));
        let mut stack = Stack::start_opts(Options {
            send_concurrency: s.send_concurrency,
            nats_cluster: url.flatten(),
            ..Options::with_rate(10_000_000, 10_000_000)
        })
        .await;
        let measured = measure(&mut stack, shape, s).await;
        stack.shutdown().await;
        rows.push((shape, measured?));
    }
    drop(cluster);

    println!(
        "Scale-out: {} sends of {} recipients through the gateways in turn (SMTP sink behind a \
         quick-ACK front, after a warm-up send of {WARMUP} through each), then every \
         recipient's delivery events ({} receivers × email.queued and email.sent) drained by \
         the dispatchers; each shape a fresh stack; nothing lost or doubled in any\n",
        s.sends, s.recipients, s.receivers,
    );
    println!(
        "| shape | recipients delivered/s | ratio | webhook events/s | ratio | left to the worker |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let base = &rows[0].1;
    for (shape, f) in &rows {
        let mark = |ratio: f64| {
            let met = if ratio >= 0.85 { "met" } else { "missed" };
            format!("{ratio:.2} ({met})")
        };
        println!(
            "| {} | {:.0} | {} | {:.0} | {} | {} |",
            shape.name(),
            f.sending,
            mark(f.sending / base.sending),
            f.webhooks,
            mark(f.webhooks / base.webhooks),
            f.to_worker,
        );
    }
    println!("\nRatios against the first row; goal ≥ 0.85 (overhead under 15 %).\n");
    Ok(())
}

/// One shape on `stack`: both measurements and the check that nothing was lost or doubled.
async fn measure(stack: &mut Stack, shape: Shape, s: &Settings) -> anyhow::Result<Figures> {
    let sink = FakeSmtp::start(Behaviour::Accept {
        accept_delay: Duration::ZERO,
    })
    .await;
    let front = super::quick_ack_front(sink.addr).await?;
    let total = s.sends * s.recipients;
    let key = stack
        .key(2 * (total + WARMUP * shape.replicas) as i64)
        .await;
    let mut receivers = Vec::new();
    for _ in 0..s.receivers {
        let receiver = Receiver::start().await;
        super::events::webhook(stack, &key, &receiver).await?;
        receivers.push(receiver);
    }
    // The in-process sender and dispatcher (which served the webhooks' creation) make way
    // for processes of their own.
    stack.deliver_by_smtp(&format!("smtp://{front}")).await;
    stack.kill_sender().await;
    stack.kill_dispatcher().await;
    let senders = processes(stack, sender::SERVICE, shape.replicas, |admin| {
        let mut config = stack.sender_config();
        config.common.admin_addr = admin;
        config.to_env()
    })
    .await;
    let mut gateways: Vec<Running> = Vec::new();
    let mut bases = vec![stack.base.clone()];
    for _ in 1..shape.replicas {
        let (running, base) = stack.another_gateway(|_| {}).await;
        gateways.push(running);
        bases.push(base);
    }

    // Sending, after a warm-up through each gateway.
    for (g, base) in bases.iter().enumerate() {
        let body = super::send_body(&format!("w{g}"), WARMUP);
        super::post_send(stack, base, &key, body, WARMUP).await?;
    }
    let warm = WARMUP * bases.len();
    wait_for(|| sink.received_count() >= warm, "the warm-up sends").await?;
    let bodies: Vec<Vec<u8>> = (0..s.sends)
        .map(|i| super::send_body(&format!("s{i}"), s.recipients))
        .collect();
    let started_at = Instant::now();
    for (i, body) in bodies.into_iter().enumerate() {
        super::post_send(stack, &bases[i % bases.len()], &key, body, s.recipients).await?;
    }
    wait_for(
        || sink.received_count() >= warm + total,
        "the measured sends",
    )
    .await?;
    let sending = total as f64 / started_at.elapsed().as_secs_f64();
    stack.sends_done().await;
    once_each(
        sink.received().iter().flat_map(|m| m.to.iter().cloned()),
        warm + total,
        "the sink",
    )?;

    // Webhook delivery: the dispatchers start on the waiting events.
    let dispatchers = processes(
        stack,
        webhook_dispatcher::SERVICE,
        shape.replicas,
        |admin| {
            let mut config = stack.dispatcher_config();
            config.common.admin_addr = admin;
            config.to_env()
        },
    )
    .await;
    let per_receiver = 2 * (warm + total);
    let delivered = || receivers.iter().map(Receiver::count).sum::<usize>();
    let expected = per_receiver * receivers.len();
    wait_for(|| delivered() >= expected, "the webhook events").await?;
    let webhooks = super::arrival_rate(&receivers, expected);
    stack.handled(&[Stream::Delivery, Stream::Webhook]).await;
    // Every WEBHOOK job is an attempt its fan-out left to the worker (no slot to spare).
    let to_worker = stack
        .jetstream()
        .await
        .get_stream(Stream::Webhook.name(stack.ns()))
        .await?
        .info()
        .await?
        .state
        .last_sequence;
    for (i, receiver) in receivers.iter().enumerate() {
        let events = receiver
            .deliveries()
            .into_iter()
            .map(|d| format!("{} {}", d.body["type"], d.body["data"]["email"]));
        once_each(events, per_receiver, &format!("receiver {i}"))?;
    }

    for mut child in senders.into_iter().chain(dispatchers) {
        child.kill().await?;
    }
    for gateway in gateways {
        gateway.stop().await;
    }
    Ok(Figures {
        sending,
        webhooks,
        to_worker,
    })
}

/// `n` processes of `service`'s binary, each with the settings `env` gives for its admin
/// address, once every one is ready (all are started before the first is awaited, so they
/// begin together).
async fn processes(
    stack: &Stack, service: Service, n: usize,
    env: impl Fn(SocketAddr) -> Vec<(&'static str, String)>,
) -> Vec<tokio::process::Child> {
    let spawned: Vec<_> = (0..n)
        .map(|_| {
            let admin = free_port();
            (admin, spawn_service(service, env(admin)))
        })
        .collect();
    for (admin, child) in &spawned {
        stack.wait_ready(*admin, child).await;
    }
    spawned.into_iter().map(|(_, child)| child).collect()
}

/// Fails unless `items` holds `expected` distinct items, none twice.
fn once_each(
    items: impl Iterator<Item = String>, expected: usize, what: &str,
) -> anyhow::Result<()> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for item in items {
        *counts.entry(item).or_default() += 1;
    }
    let doubled = counts.values().filter(|&&n| n > 1).count();
    anyhow::ensure!(
        counts.len() == expected && doubled == 0,
        "{what}: {} distinct of {expected} expected, {doubled} more than once",
        counts.len()
    );
    Ok(())
}

/// Waits until `done` holds, at most [`PATIENCE`].
async fn wait_for(done: impl Fn() -> bool, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what} did not arrive in {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
