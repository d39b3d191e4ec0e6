//! Inbound mail: 50 KB messages ingested per second through the gateway (gateway → NATS →
//! inbound-ingest → Postgres, outbox) against the same ingest router called in process (no
//! gateway, no NATS hop) on the same database; and the inbound service's peak RSS, as its
//! own process, while it ingests one 10 MiB message.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::json;
use tower::ServiceExt;

use postmesh_shared::jetstream::outbox::Outbox;
use postmesh_shared::Service;
use postmesh_tests::{
    common, fresh_namespace, gateway_config, inbound_config, peek, remove_namespace, spawn_service,
    Stack, INBOUND_DOMAIN, INBOUND_SECRET,
};

/// Size of the throughput benchmark's messages.
const MESSAGE_BYTES: usize = 50 * 1000;
/// Size of the RSS benchmark's message.
const LARGE_BYTES: usize = 10 * 1024 * 1024;

/// The JSON body of an ingest of a `size`-byte message `id` to `to`.
fn ingest_body(id: &str, to: &str, size: usize) -> Vec<u8> {
    let mut raw = format!(
        "From: Ann <ann@customer.example>\r\nTo: {to}\r\nMessage-ID: <{id}@bench>\r\n\
         Subject: Bench {id}\r\nContent-Type: text/plain\r\n\r\n"
    )
    .into_bytes();
    raw.resize(size, b'x');
    serde_json::to_vec(&json!({
        "from": "ann@customer.example",
        "to": [to],
        "rawBase64": base64::engine::general_purpose::STANDARD.encode(&raw),
        "authentication": {"sourceIp": "203.0.113.7", "spf": "pass", "dkim": "pass", "dmarc": "pass"},
    }))
    .expect("JSON")
}

/// Where one round sends its ingests.
#[derive(Clone)]
enum Target {
    Gateway(String),
    Router(axum::Router),
}

impl Target {
    /// Sends one ingest; true when it was stored.
    async fn ingest(&self, client: &reqwest::Client, body: Vec<u8>) -> bool {
        match self {
            Target::Gateway(base) => {
                let res = client
                    .post(format!("{base}/inbound-email/ingest"))
                    .header("x-service-inbound-secret", INBOUND_SECRET)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                match res {
                    Ok(res) => res.status().is_success() && res.bytes().await.is_ok(),
                    Err(_) => false,
                }
            }
            Target::Router(router) => {
                let req = axum::http::Request::post("/inbound-email/ingest")
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(body))
                    .expect("request");
                let res = router.clone().oneshot(req).await.expect("infallible");
                res.status().is_success()
            }
        }
    }
}

/// `inboxes.len()` tasks, one per inbox, ingesting distinct messages back to back for
/// `secs`; messages stored per second and failures.
async fn round(
    target: &Target, inboxes: &[String], secs: u64, seq: &Arc<AtomicUsize>,
) -> (f64, usize) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = inboxes
        .iter()
        .map(|to| {
            let (target, to, seq) = (target.clone(), to.clone(), seq.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .pool_max_idle_per_host(1)
                    .build()
                    .expect("client");
                let (mut ok, mut failed) = (0usize, 0usize);
                while Instant::now() < deadline {
                    let id = seq.fetch_add(1, Ordering::Relaxed).to_string();
                    if target
                        .ingest(&client, ingest_body(&id, &to, MESSAGE_BYTES))
                        .await
                    {
                        ok += 1;
                    } else {
                        failed += 1;
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for t in tasks {
        let (o, f) = t.await.expect("load task");
        ok += o;
        failed += f;
    }
    (ok as f64 / started.elapsed().as_secs_f64(), failed)
}

/// Ingest throughput through the gateway against the router in process; prints the table.
pub async fn throughput(
    stack: &Stack, secs: u64, conns: usize, rounds: usize,
) -> anyhow::Result<()> {
    // One inbox per connection (the free tier holds one per workspace): writes into one
    // inbox take turns, as they must.
    let mut inboxes = Vec::new();
    for i in 0..conns {
        let key = stack.key(0).await;
        let address = format!("bench{i}@{INBOUND_DOMAIN}");
        let res = stack
            .http
            .post(format!("{}/inbox/addresses", stack.base))
            .bearer_auth(&key)
            .json(&json!({ "address": address }))
            .send()
            .await?;
        anyhow::ensure!(
            res.status().is_success(),
            "inbox {address}: {}",
            res.status()
        );
        inboxes.push(address);
    }
    let db = stack.service_db(Service::InboundIngest).await;
    let nats = postmesh_tests::ops_nats(&stack.common.nats_url).await?;
    let state = inbound_ingest::AppState {
        outbox: Some(Outbox::new(
            db.clone(),
            async_nats::jetstream::new(nats.clone()),
        )),
        nats: Some(nats),
        budget: stack.inbound_budget,
        ..inbound_ingest::AppState::new(db, stack.ns().clone())
    };
    let targets = [
        (
            "inbound router in process (no gateway, no NATS hop)",
            Target::Router(inbound_ingest::router(state)),
        ),
        (
            "postmesh gateway → NATS → inbound-ingest",
            Target::Gateway(stack.base.clone()),
        ),
    ];
    let seq = Arc::new(AtomicUsize::new(0));
    for (_, target) in &targets {
        round(target, &inboxes, 1, &seq).await; // warm-up
    }
    let mut rates = [Vec::new(), Vec::new()];
    let mut failures = [0, 0];
    for _ in 0..rounds {
        for (i, (_, target)) in targets.iter().enumerate() {
            let (rate, failed) = round(target, &inboxes, secs, &seq).await;
            rates[i].push(rate);
            failures[i] += failed;
        }
    }
    let mean = |r: &[f64]| r.iter().sum::<f64>() / r.len() as f64;
    println!(
        "POST /inbound-email/ingest, {} KB messages, {conns} inboxes at once, {rounds} alternating rounds of {secs}s\n",
        MESSAGE_BYTES / 1000
    );
    println!("| target | messages/s | failures |");
    println!("|---|---:|---:|");
    for (i, (name, _)) in targets.iter().enumerate() {
        println!("| {name} | {:.0} | {} |", mean(&rates[i]), failures[i]);
    }
    println!(
        "| ratio gateway / in process | {:.2} | |\n",
        mean(&rates[1]) / mean(&rates[0])
    );
    Ok(())
}

/// A process's resident set (`VmRSS`) and its peak (`VmHWM`), in bytes.
pub fn memory_of(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| anyhow::anyhow!("{name} not in /proc/{pid}/status"))?;
        let kb: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()?;
        Ok(kb * 1024)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The inbound service as its own process (release build), reached through a gateway in
/// this process, in a namespace of its own: its peak RSS while it ingests one 10 MiB
/// message, against its RSS once warmed up by small ones. Prints the table.
pub async fn peak_rss() -> anyhow::Result<()> {
    let common = common(fresh_namespace());
    let admin = postmesh_tests::free_port();
    let mut config = inbound_config(&common);
    config.common.admin_addr = admin;
    let env = config.to_env();
    let mut child = spawn_service(Service::InboundIngest, env);
    let pid = child
        .id()
        .ok_or_else(|| anyhow::anyhow!("inbound-ingest exited"))?;
    let gateway = api_gateway::start(gateway_config(
        &common,
        api_gateway::RateConfig {
            per_sec: 0,
            burst: 0,
        },
    ))
    .await?;
    let base = format!("http://{}", gateway.http_addr.expect("gateway listens"));
    let client = reqwest::Client::new();
    let outcome = async {
        postmesh_tests::eventually(Duration::from_secs(30), || async {
            match client.get(format!("http://{admin}/readyz")).send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        let db = sqlx::PgPool::connect(&format!(
            "{}/{}",
            common.database_url,
            Service::InboundIngest.database(&common.namespace)
        ))
        .await?;
        let to = format!("rss@{INBOUND_DOMAIN}");
        peek::inbound::insert_address(&db, uuid::Uuid::now_v7(), &to).await;
        let target = Target::Gateway(base.clone());
        for i in 0..20 {
            anyhow::ensure!(target.ingest(&client, ingest_body(&format!("warm{i}"), &to, MESSAGE_BYTES)).await, "warm-up ingest");
        }
        let (before, _) = memory_of(pid)?;
        let body = ingest_body("large", &to, LARGE_BYTES);
        anyhow::ensure!(target.ingest(&client, body).await, "the 10 MiB ingest");
        let (_, peak) = memory_of(pid)?;
        let growth = peak.saturating_sub(before);
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        println!("inbound-ingest (its own process, release) ingesting one 10 MiB message through the gateway\n");
        println!("| measure | MiB |");
        println!("|---|---:|");
        println!("| RSS after warm-up | {:.1} |", mib(before));
        println!("| peak RSS (VmHWM) after the 10 MiB ingest | {:.1} |", mib(peak));
        println!(
            "| growth | {:.1} ({:.1}× the message; goal < 5×) |\n",
            mib(growth),
            growth as f64 / LARGE_BYTES as f64
        );
        anyhow::Ok(())
    }
    .await;
    let _ = child.kill().await;
    gateway.stop().await;
    remove_namespace(&common).await;
    outcome
}
