//! `make bench`: authenticated `GET /balance` through the whole stack (gateway → NATS →
//! billing → Postgres) against a baseline — one axum + sqlx process answering the same
//! request with the same query on the same database — under the same load, in the same run.
//! Prints req/s, p50 and p99 for both and their ratio.
//!
//! Settings: `BENCH_SECS` (per round, default 5), `BENCH_CONNS` (concurrent keep-alive
//! connections, default 32), `BENCH_ROUNDS` (alternating rounds, default 3).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::config::env_parse;
use postmesh_tests::{Options, Stack};

/// The baseline's whole state: known keys and the billing database.
#[derive(Clone)]
struct Baseline {
    keys: Arc<HashMap<String, Uuid>>,
    db: PgPool,
}

async fn baseline_balance(
    State(b): State<Baseline>,
    headers: HeaderMap,
) -> Result<Json<Value>, StatusCode> {
    let key_id = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|k| b.keys.get(k))
        .ok_or(StatusCode::UNAUTHORIZED)?;
    let balance: Option<i64> =
        sqlx::query_scalar("SELECT balance FROM balances WHERE api_key_id = $1")
            .bind(key_id)
            .fetch_optional(&b.db)
            .await
            .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    Ok(Json(
        json!({ "success": true, "balance": balance.unwrap_or(0) }),
    ))
}

async fn start_baseline(stack: &Stack, key: &str) -> anyhow::Result<SocketAddr> {
    let server = &stack.common.database_url;
    let gateway_db = PgPoolOptions::new()
        .max_connections(1)
        .connect(&format!(
            "{server}/{}",
            api_gateway::SERVICE.database(stack.ns())
        ))
        .await?;
    let prefix = key.split('_').nth(1).unwrap_or_default();
    let key_id: Uuid = sqlx::query_scalar("SELECT id FROM api_keys WHERE prefix = $1")
        .bind(prefix)
        .fetch_one(&gateway_db)
        .await?;
    let db = PgPoolOptions::new()
        .max_connections(stack.common.db_max_connections)
        .connect(&format!(
            "{server}/{}",
            billing::SERVICE.database(stack.ns())
        ))
        .await?;
    let state = Baseline {
        keys: Arc::new(HashMap::from([(key.to_owned(), key_id)])),
        db,
    };
    let app = Router::new()
        .route("/balance", get(baseline_balance))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
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

/// `conns` connections each sending `GET url` back to back for `secs`.
async fn load(url: &str, key: &str, conns: usize, secs: u64) -> Run {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let (url, key) = (url.to_owned(), key.to_owned());
            tokio::spawn(async move {
                // One client per task: one keep-alive connection each.
                postmesh_shared::tls::install_provider();
                let client = reqwest::Client::builder()
                    .pool_max_idle_per_host(1)
                    .build()
                    .expect("client");
                let (mut lat, mut errors) = (Vec::new(), 0usize);
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let ok = match client.get(&url).bearer_auth(&key).send().await {
                        Ok(res) => res.status().is_success() && res.bytes().await.is_ok(),
                        Err(_) => false,
                    };
                    if ok {
                        lat.push(t.elapsed().as_micros() as u64);
                    } else {
                        errors += 1;
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let mut run = Run::default();
    for t in tasks {
        let (lat, errors) = t.await.expect("load task");
        run.requests += lat.len();
        run.errors += errors;
        run.latencies_us.extend(lat);
    }
    run.elapsed = started.elapsed();
    run.latencies_us.sort_unstable();
    run
}

/// Merges rounds of one target.
fn merge(runs: Vec<Run>) -> Run {
    let mut all = Run::default();
    for r in runs {
        all.requests += r.requests;
        all.errors += r.errors;
        all.elapsed += r.elapsed;
        all.latencies_us.extend(r.latencies_us);
    }
    all.latencies_us.sort_unstable();
    all
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let secs: u64 = env_parse("BENCH_SECS", 5)?;
    let conns: usize = env_parse("BENCH_CONNS", 32)?;
    let rounds: usize = env_parse("BENCH_ROUNDS", 3)?;
    // The per-key limiter runs on every request (its cost is measured) but never throttles.
    let stack = Stack::start_opts(Options::with_rate(10_000_000, 10_000_000)).await;
    let key = stack.key(1).await;
    let baseline = start_baseline(&stack, &key).await?;
    let targets = [
        (
            "baseline (axum + sqlx, one process)",
            format!("http://{baseline}/balance"),
        ),
        (
            "postmesh gateway → NATS → billing",
            format!("{}/balance", stack.base),
        ),
    ];
    for (_, url) in &targets {
        load(url, &key, conns, 1).await; // warm-up: connections, caches, prepared statements
    }
    let mut results: Vec<Vec<Run>> = vec![Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (i, (_, url)) in targets.iter().enumerate() {
            results[i].push(load(url, &key, conns, secs).await);
        }
    }
    let [base, gw]: [Run; 2] = results
        .into_iter()
        .map(merge)
        .collect::<Vec<_>>()
        .try_into()
        .map_err(|_| anyhow::anyhow!("two targets"))?;
    println!(
        "GET /balance, {conns} connections, {rounds} alternating rounds of {secs}s each, {} cores\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("| target | req/s | p50 ms | p99 ms | errors |");
    println!("|---|---:|---:|---:|---:|");
    for ((name, _), r) in targets.iter().zip([&base, &gw]) {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {} |",
            r.rps(),
            r.percentile_ms(0.50),
            r.percentile_ms(0.99),
            r.errors
        );
    }
    println!(
        "| ratio gateway / baseline | {:.2} | {:.2} | {:.2} | |",
        gw.rps() / base.rps(),
        gw.percentile_ms(0.50) / base.percentile_ms(0.50),
        gw.percentile_ms(0.99) / base.percentile_ms(0.99)
    );
    stack.shutdown().await;
    Ok(())
}
