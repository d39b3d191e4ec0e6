//! Workflow events: events accepted per second through the gateway, each starting a run of
//! a workflow that waits (`BENCH_EVENTS`, default 2000, `BENCH_EVENT_CONCURRENCY` at once,
//! default 32); and the time from `POST /events` to the delivered email of a workflow whose
//! first step sends (`BENCH_EVENT_LATENCY_SAMPLES` one after another, default 20).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use postmesh_tests::Stack;

/// What the workflow bench runs.
pub struct Settings {
    pub events: usize,
    pub concurrency: usize,
    pub samples: usize,
}

fn event(id: &str, name: &str, email: &str) -> Value {
    json!({ "event_id": id, "event_name": name, "occurred_at": "2026-11-25T10:00:00Z",
            "contact": { "email": email } })
}

/// Runs both measurements; prints the tables.
pub async fn run(stack: &Stack, s: &Settings) -> anyhow::Result<()> {
    let key = stack.key((s.samples + 10) as i64).await;
    let client = stack.client(&key);
    let _: Value = client
        .post(
            "/templates",
            &json!({ "key": "bench", "subject": "Welcome", "text": "Hi" }),
            StatusCode::OK,
        )
        .await;
    for (name, steps) in [
        (
            "bench_joined",
            json!([{ "type": "wait", "seconds": 86400 }, { "type": "send", "templateKey": "bench" }]),
        ),
        (
            "bench_signed_up",
            json!([{ "type": "send", "templateKey": "bench" }]),
        ),
    ] {
        let body = json!({ "name": name, "trigger": { "event_name": name }, "steps": steps });
        let _: Value = client.post("/workflows", &body, StatusCode::CREATED).await;
    }

    // Throughput: distinct contacts, each event starting a run that waits.
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers = (0..s.concurrency).map(|_| {
        let (client, next, total) = (stack.client(&key), next.clone(), s.events);
        async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    return anyhow::Ok(());
                }
                let body = event(
                    &format!("t-{n}"),
                    "bench_joined",
                    &format!("c{n}@bench.example"),
                );
                let answer: Value = client.post("/events", &body, StatusCode::CREATED).await;
                anyhow::ensure!(
                    answer["runs"].as_array().map(Vec::len) == Some(1),
                    "no run: {answer}"
                );
            }
        }
    });
    for outcome in futures::future::join_all(workers).await {
        outcome?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "Workflow events: {} events, {} at once, each starting a run\n",
        s.events, s.concurrency
    );
    println!("| metric | value |");
    println!("|---|---:|");
    println!(
        "| events accepted per second | {:.0} |",
        s.events as f64 / secs
    );

    // Latency: event to delivered email, one at a time.
    let mut times = Vec::with_capacity(s.samples);
    for n in 0..s.samples {
        let email = format!("l{n}@bench.example");
        let at = Instant::now();
        let _: Value = client
            .post(
                "/events",
                &event(&format!("l-{n}"), "bench_signed_up", &email),
                StatusCode::CREATED,
            )
            .await;
        // The email is in the outbox, or the run's state says where it stopped.
        while stack.messages_to(&email).is_empty() {
            if at.elapsed() > Duration::from_secs(30) {
                let shown: Value = client.get(&format!("/events/l-{n}"), StatusCode::OK).await;
                anyhow::bail!("no email to {email} in 30 s; its run: {}", shown["runs"]);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        times.push(at.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    let pick = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!("| event to delivered email, p50 ms | {:.0} |", pick(0.5));
    println!("| event to delivered email, p99 ms | {:.0} |\n", pick(0.99));
    Ok(())
}
