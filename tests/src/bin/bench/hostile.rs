//! Hostile load: ordinary traffic (10 clients asking `GET /balance` one request after
//! another) alone, then with 2 clients sending the hostile corpus at the same time (a
//! 50,000-deep HTML message through the MTA's route, a dry-run send of 200,000 links with
//! UTM parameters, a 16 MiB CSV of one-character rows, 1,000-deep JSON), all through a
//! gateway and billing running as processes of their own, in alternating rounds whose
//! latencies are pooled. Ordinary traffic's p99 should stay within 2× of the run without
//! them.

use std::time::{Duration, Instant};

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
    // The gateway and billing as processes of their own, as deployed: the load's clients
    // (and its copies of the corpus) share no runtime with them.
    stack.stop_billing().await;
    let (billing, gateway, base) = stack.spawn_gateway_and_billing().await;
    let measured = async {
        let (mut quiet, mut loud) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            quiet.push(phase(&base, &key, &inbox_key, &corpus, secs, 0).await?);
            loud.push(phase(&base, &key, &inbox_key, &corpus, secs, HOSTILE).await?);
        }
        anyhow::Ok((pooled(quiet), pooled(loud)))
    }
    .await;
    drop((billing, gateway));
    stack.start_billing().await;
    let (quiet, loud) = measured?;
    let ratio = loud.0.percentile_ms(0.99) / quiet.0.percentile_ms(0.99);
    println!(
        "Hostile load: {CLIENTS} clients of GET /balance, alone and beside {HOSTILE} clients \
         sending the hostile corpus, {rounds} rounds of {secs} s each ({} corpus requests \
         answered)\n",
        loud.1
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
/// only send them.
struct Corpus {
    /// `POST /inbound-email/ingest` of a 50,000-deep HTML message.
    deep_message: Vec<u8>,
    /// A dry-run send of 200,000 links with UTM parameters.
    links: Vec<u8>,
    /// A 16 MiB CSV of one-character rows.
    csv: Vec<u8>,
    /// 1,000-deep JSON.
    deep_json: Vec<u8>,
}

impl Corpus {
    fn new() -> Self {
        let to = format!("hostile-bench@{INBOUND_DOMAIN}");
        let message = html_message(&to, &deep_html(50_000));
        let links = json!({ "to": "a@example.com", "subject": "s", "html": links_html(200_000),
                            "utm": { "utm_source": "news" }, "dryRun": true });
        Self {
            deep_message: serde_json::to_vec(&ingest_body(&message, &[&to])).unwrap(),
            links: serde_json::to_vec(&links).unwrap(),
            csv: one_character_rows(16 * 1024 * 1024 - 1024),
            deep_json: deep_json(1_000),
        }
    }
}

/// Phases' runs as one, with their corpus requests.
fn pooled(phases: Vec<(Run, usize)>) -> (Run, usize) {
    let mut all = Run {
        requests: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
    };
    let mut corpus = 0;
    for (run, answered) in phases {
        all.requests += run.requests;
        all.errors += run.errors;
        all.elapsed += run.elapsed;
        all.latencies_us.extend(run.latencies_us);
        corpus += answered;
    }
    all.latencies_us.sort_unstable();
    (all, corpus)
}

/// One phase: the ordinary clients' latencies, and how many corpus requests were answered.
async fn phase(
    base: &str, key: &str, inbox_key: &str, corpus: &Corpus, secs: u64, hostile: usize,
) -> anyhow::Result<(Run, usize)> {
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
        let client = TestClient::http(base, Some(inbox_key));
        let mta =
            TestClient::http(base, None).with_header("x-service-inbound-secret", INBOUND_SECRET);
        let csv_client =
            TestClient::http(base, Some(inbox_key)).with_header("content-type", "text/csv");
        let mut n = 0;
        let mut round = i;
        while Instant::now() < deadline {
            match kinds[round % kinds.len()] {
                "html" => {
                    let body = Some(corpus.deep_message.clone());
                    drop(mta.send(Method::POST, "/inbound-email/ingest", body).await);
                }
                "links" => {
                    let links = Some(corpus.links.clone());
                    drop(client.send(Method::POST, "/send-email", links).await);
                }
                "csv" => {
                    let csv = Some(corpus.csv.clone());
                    drop(csv_client.send(Method::POST, "/contacts/import", csv).await);
                }
                "json" => {
                    let json = Some(corpus.deep_json.clone());
                    drop(client.send(Method::POST, "/send-email", json).await);
                }
                other => panic!("BENCH_HOSTILE_KINDS: no kind {other:?}"),
            }
            n += 1;
            round += 1;
        }
        n
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
    Ok((run, counts.iter().sum()))
}
