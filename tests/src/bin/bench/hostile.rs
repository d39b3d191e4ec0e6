//! Hostile load: ordinary traffic (10 clients asking `GET /balance` one request after
//! another) alone, then with 2 clients sending the hostile corpus at the same time (a
//! 50,000-deep HTML message through the MTA's route, a dry-run send of 200,000 links with
//! UTM parameters, a 16 MiB CSV of one-character rows, 1,000-deep JSON) as fast as they
//! are let (waiting out a 429's `Retry-After`), all through the gateway, billing, sender,
//! inbound-ingest and webhook-dispatcher running as processes of their own, in alternating
//! rounds whose latencies are pooled. Ordinary traffic's p99 should stay within 2× of the
//! run without them.

use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::sync::Mutex;

use postmesh_tests::hostile::{deep_html, deep_json, html_message, links_html, one_character_rows};
use postmesh_tests::mta::{ingest_body, key_with_inbox};
use postmesh_tests::{Stack, TestClient, INBOUND_DOMAIN, INBOUND_SECRET};

use crate::Run;

/// Ordinary clients.
const CLIENTS: usize = 10;
/// Clients sending the corpus.
const HOSTILE: usize = 2;
/// What they send, in turn (`BENCH_HOSTILE_KINDS` picks some): the deep HTML message, the
/// links, the CSV, the deep JSON.
const KINDS: &str = "html,links,csv,json";

/// Runs `rounds` of both phases, `secs` each, alternating, and prints the table of their
/// pooled latencies.
pub async fn run(stack: &mut Stack, secs: u64, rounds: usize) -> anyhow::Result<()> {
    let key = stack.key(0).await;
    let (inbox_key, _) = key_with_inbox(stack, "hostile-bench").await;
    let corpus = Corpus::new();
    // Every service the load reaches as a process of its own, as deployed: the load's
    // clients (and the corpus) share no runtime with them.
    stack.stop_billing().await;
    let (billing, gateway, base) = stack.spawn_gateway_and_billing().await;
    // Inbound mail spends the budget a deployment has by default.
    let unbounded = std::mem::take(&mut stack.inbound_budget);
    let (sender, inbound) = stack.spawn_sender_and_inbound().await;
    stack.inbound_budget = unbounded;
    let dispatcher = stack.dispatcher_config();
    stack.spawn_dispatcher(dispatcher.clone()).await;
    let measured = async {
        let (mut quiet, mut loud) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            quiet.push(phase(&base, &key, &inbox_key, &corpus, secs, 0).await?);
            loud.push(phase(&base, &key, &inbox_key, &corpus, secs, HOSTILE).await?);
        }
        anyhow::Ok((pooled(quiet), pooled(loud)))
    }
    .await;
    drop((billing, gateway, sender, inbound));
    stack.start_billing().await;
    stack.start_sender_and_inbound().await;
    stack.restart_dispatcher(dispatcher).await;
    let (quiet, loud) = measured?;
    let ratio = loud.0.percentile_ms(0.99) / quiet.0.percentile_ms(0.99);
    println!(
        "Hostile load: {CLIENTS} clients of GET /balance, alone and beside {HOSTILE} clients \
         sending the hostile corpus, {rounds} rounds of {secs} s each ({} corpus requests \
         answered, {} of them refused over the account's rates)\n",
        loud.1 .0, loud.1 .1
    );
    println!("| run | requests/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|");
    for (name, (run, _)) in [("ordinary alone", &quiet), ("beside the corpus", &loud)] {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} |",
            run.rps(),
            run.percentile_ms(0.5),
            run.percentile_ms(0.99)
        );
    }
    println!(
        "| p99 ratio (goal ≤ 2: {}) | | | {ratio:.2} |\n",
        if ratio <= 2.0 { "met" } else { "missed" }
    );
    Ok(())
}

/// The hostile corpus as request bodies, made before a phase starts so that the clients
/// only send them (shared, never copied).
struct Corpus {
    /// `POST /inbound-email/ingest` of a 50,000-deep HTML message.
    deep_message: Bytes,
    /// A dry-run send of 200,000 links with UTM parameters.
    links: Bytes,
    /// A 16 MiB CSV of one-character rows.
    csv: Bytes,
    /// 1,000-deep JSON.
    deep_json: Bytes,
}

impl Corpus {
    fn new() -> Self {
        let to = format!("hostile-bench@{INBOUND_DOMAIN}");
        let message = html_message(&to, &deep_html(50_000));
        let links = json!({ "to": "a@example.com", "subject": "s", "html": links_html(200_000),
                            "utm": { "utm_source": "news" }, "dryRun": true });
        Self {
            deep_message: serde_json::to_vec(&ingest_body(&message, &[&to]))
                .unwrap()
                .into(),
            links: serde_json::to_vec(&links).unwrap().into(),
            csv: one_character_rows(16 * 1024 * 1024 - 1024).into(),
            deep_json: deep_json(1_000).into(),
        }
    }
}

/// Phases' runs as one, with their corpus requests (answered, 429).
fn pooled(phases: Vec<(Run, (usize, usize))>) -> (Run, (usize, usize)) {
    let mut all = Run {
        requests: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
    };
    let mut corpus = (0, 0);
    for (run, (answered, limited)) in phases {
        all.requests += run.requests;
        all.errors += run.errors;
        all.elapsed += run.elapsed;
        all.latencies_us.extend(run.latencies_us);
        corpus.0 += answered;
        corpus.1 += limited;
    }
    all.latencies_us.sort_unstable();
    (all, corpus)
}

/// One phase: the ordinary clients' latencies, and how many corpus requests were answered
/// (and how many of them 429, over the account's rates).
async fn phase(
    base: &str, key: &str, inbox_key: &str, corpus: &Corpus, secs: u64, hostile: usize,
) -> anyhow::Result<(Run, (usize, usize))> {
    let kinds = std::env::var("BENCH_HOSTILE_KINDS").unwrap_or_else(|_| KINDS.into());
    let kinds: &Vec<&str> = &kinds.split(',').map(str::trim).collect();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let latencies = Mutex::new(Vec::new());
    let errors = Mutex::new(0usize);
    let ordinary = (0..CLIENTS).map(|_| async {
        let client = TestClient::http(base, Some(key));
        let mut mine = Vec::new();
        let mut failed = 0;
        while Instant::now() < deadline {
            let started = Instant::now();
            let answer = client.request(Method::GET, "/balance", &json!({})).await;
            mine.push(started.elapsed().as_micros() as u64);
            if answer.status != StatusCode::OK {
                failed += 1;
            }
        }
        latencies.lock().await.extend(mine);
        *errors.lock().await += failed;
    });
    let corpus = (0..hostile).map(|i| async move {
        let http = reqwest::Client::new();
        let (mut n, mut limited) = (0, 0);
        let mut round = i;
        while Instant::now() < deadline {
            let request = match kinds[round % kinds.len()] {
                "html" => http
                    .post(format!("{base}/inbound-email/ingest"))
                    .header("x-service-inbound-secret", INBOUND_SECRET)
                    .header("content-type", "application/json")
                    .body(corpus.deep_message.clone()),
                "links" => http
                    .post(format!("{base}/send-email"))
                    .bearer_auth(inbox_key)
                    .header("content-type", "application/json")
                    .body(corpus.links.clone()),
                "csv" => http
                    .post(format!("{base}/contacts/import"))
                    .bearer_auth(inbox_key)
                    .header("content-type", "text/csv")
                    .body(corpus.csv.clone()),
                "json" => http
                    .post(format!("{base}/send-email"))
                    .bearer_auth(inbox_key)
                    .header("content-type", "application/json")
                    .body(corpus.deep_json.clone()),
                other => panic!("BENCH_HOSTILE_KINDS: no kind {other:?}"),
            };
            // A body over the account's byte budget is refused before it is read: the
            // gateway answers 429 and closes, which a client still writing sees as an error.
            // The clients wait as told (`Retry-After`; 1 s when the answer was lost), as any
            // client that keeps its key does; one that floods past refusals is a
            // connection-level attack, for the ingress in front of the gateway.
            let refused = match request.send().await {
                Ok(answer) if answer.status() == StatusCode::TOO_MANY_REQUESTS => {
                    let wait = answer
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1);
                    Some(wait)
                }
                Ok(_) => None,
                Err(e) if e.is_request() => Some(1),
                Err(e) => return Err(anyhow::anyhow!("the gateway did not answer: {e}")),
            };
            if let Some(wait) = refused {
                let until = (Instant::now() + Duration::from_secs(wait)).min(deadline);
                tokio::time::sleep_until(until.into()).await;
            }
            n += 1;
            limited += usize::from(refused.is_some());
            round += 1;
        }
        anyhow::Ok((n, limited))
    });
    let (_, counts) = tokio::join!(
        futures::future::join_all(ordinary),
        futures::future::join_all(corpus)
    );
    let mut latencies_us = latencies.into_inner();
    latencies_us.sort_unstable();
    let errors = errors.into_inner();
    anyhow::ensure!(errors == 0, "{errors} ordinary requests failed");
    let run = Run {
        requests: latencies_us.len(),
        errors,
        elapsed: Duration::from_secs(secs),
        latencies_us,
    };
    let counts = counts.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let answered = counts.iter().map(|c| c.0).sum();
    let limited = counts.iter().map(|c| c.1).sum();
    Ok((run, (answered, limited)))
}
