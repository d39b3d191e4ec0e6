//! Engagement: the click redirect (`GET /t/c/{token}` through the gateway: the token checked,
//! the hit published to JetStream and acknowledged) against a bare axum redirect, each in a
//! process of its own, `BENCH_TRACK_CONNS` (default 32) clients, `BENCH_TRACK_SECS` (default 4) per
//! round, `BENCH_TRACK_ROUNDS` (default 2) alternating rounds (goal: ≥ 0.7 × the
//! throughput, p99 ≤ 2×); rewriting the links of a 1 MiB HTML with 10,000 links (goal:
//! under 50 ms); and the message log searched with `BENCH_LOG_DELIVERIES` (default
//! 1,000,000) deliveries in one workspace (goal: a tag filter under 100 ms), with the plans
//! of its queries.

use std::time::{Duration, Instant};

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use uuid::Uuid;

use postmesh_shared::jetstream::Stream;
use postmesh_shared::tracking::TrackingKey;
use postmesh_tests::{Stack, TRACKING_SECRET};
use sender::sending::tracking::links::Instrument;
use sender::sending::tracking::Tracker;

use super::compare::{self, Ask, Goals, Load, Measured, Target};

/// What the engagement bench runs.
pub struct Settings {
    pub load: Load,
    pub deliveries: usize,
}

/// Where the tracked link goes.
const DESTINATION: &str = "https://example.com/landing?utm_source=bench";

/// Runs the three parts; prints their tables.
pub async fn run(stack: &mut Stack, s: &Settings) -> anyhow::Result<()> {
    rewriting();
    redirects(stack, s).await?;
    log_search(stack, s.deliveries).await
}

/// Rewrites a 1 MiB document of 10,000 links five times; prints the best and the median.
fn rewriting() {
    let link = "<p>Some text before the link.</p><a href=\"https://example.com/p?id=1\">x</a>";
    let filler = "y".repeat(1024 * 1024 / 10_000 - link.len());
    let html = format!(
        "<html><body>{}</body></html>",
        format!("{link}{filler}").repeat(10_000)
    );
    let tracker = Tracker {
        key: TrackingKey::new(TRACKING_SECRET),
        base_url: "https://track.example.com".into(),
    };
    let instrument = Instrument {
        tracker: &tracker,
        bound: None,
        delivery: Uuid::now_v7(),
        opens: true,
        clicks: true,
        unsubscribe_prefix: Some("https://app.example.com/unsubscribe"),
    };
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let started = Instant::now();
            let out = instrument.apply(&html);
            let took = started.elapsed();
            assert_eq!(out.matches("/t/c/").count(), 10_000, "every link tracked");
            took
        })
        .collect();
    times.sort();
    println!("\n### Tracking: link rewriting\n");
    println!(
        "{:.2} MiB of HTML, 10,000 links and the pixel: best {:.1} ms, median {:.1} ms (goal < 50 ms: {})\n",
        html.len() as f64 / (1024.0 * 1024.0),
        times[0].as_secs_f64() * 1000.0,
        times[2].as_secs_f64() * 1000.0,
        if times[2] < Duration::from_millis(50) { "met" } else { "missed" }
    );
}

/// The baseline's bare redirect, served by the baseline process.
pub fn baseline() -> axum::Router {
    axum::Router::new().route(
        "/t/c/{token}",
        axum::routing::get(|| async {
            (
                StatusCode::FOUND,
                [
                    (header::LOCATION, DESTINATION),
                    (header::CACHE_CONTROL, "no-store"),
                ],
            )
                .into_response()
        }),
    )
}

/// The click token of a tracked message sent to a new recipient and delivered.
async fn delivered_click(stack: &Stack) -> anyhow::Result<String> {
    let key = stack.key(1).await;
    let to = format!("clicks-{}@bench.example", Uuid::now_v7());
    let html = format!(r#"<html><body><a href="{DESTINATION}">Read</a></body></html>"#);
    let body =
        serde_json::json!({ "to": to, "subject": "Bench", "html": html, "trackClicks": true });
    stack.sent(&key, &body).await;
    let eml = stack
        .wait_for_messages(&to, 1, Duration::from_secs(30))
        .await;
    let html = postmesh_tests::html_part(&eml[0]);
    let at = html
        .find("/t/c/")
        .ok_or_else(|| anyhow::anyhow!("no tracked link"))?;
    let token = &html[at + "/t/c/".len()..];
    Ok(token[..token.find('"').unwrap_or(token.len())].to_owned())
}

/// The gateway's click redirect (a child process, publishing to NATS) against the bare one
/// (the baseline process). The sender is stopped meanwhile, so its recording of the hits
/// does not share the two cores with the path measured: they wait in TRACKING, and the
/// time it takes to record them once started again is printed after.
async fn redirects(stack: &mut Stack, s: &Settings) -> anyhow::Result<()> {
    let token = delivered_click(stack).await?;
    let (gateway, base) = stack.spawn_gateway().await;
    let (bare, baseline) = compare::spawn_baseline(Vec::new())?;
    stack.kill_sender().await;
    let before = stack.waiting(Stream::Tracking).await;
    let compared = compare::compare(
        "### Tracking: the click redirect against a bare axum redirect\n\nGET /t/c/{token}",
        Target::new(
            "bare axum redirect",
            format!("http://{bare}/t/c/{token}"),
            vec![Measured::pid("baseline", baseline.id())],
        ),
        Target::new(
            "postmesh gateway → JetStream, acknowledged",
            format!("{base}/t/c/{token}"),
            vec![
                Measured::pid("gateway", gateway.id()),
                Measured::named("nats-server"),
            ],
        ),
        &Ask {
            header: (header::USER_AGENT, "Mozilla/5.0 (bench)".into()),
            expected: StatusCode::FOUND,
        },
        &s.load,
        &Goals {
            throughput: 0.7,
            p99: 2.0,
        },
    )
    .await;
    drop((gateway, baseline));
    let stored = stack.waiting(Stream::Tracking).await - before;
    let started = Instant::now();
    stack.start_sender().await;
    let deadline = started + Duration::from_secs(600);
    while stack.waiting(Stream::Tracking).await > 0 {
        anyhow::ensure!(Instant::now() < deadline, "the recorder did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "The sender, started again, took the {stored} TRACKING messages the rounds left \
         (every answered click, of one delivery: its first 1,000 recorded as `clicked` \
         events, the rest dropped) in {:.1} s.\n",
        started.elapsed().as_secs_f64()
    );
    compared.map(|_| ())
}

/// Tasks of a hundred recipients each written per statement.
const TASKS_PER_BATCH: usize = 1000;
/// Distinct tags among the tasks (`campaign:c0` … `campaign:c49`).
const TAGS: usize = 50;

/// Fills one workspace's log with `deliveries` messages, then times its searches through the
/// gateway (20 each) and prints the plans of the tag filter's query.
async fn log_search(stack: &Stack, deliveries: usize) -> anyhow::Result<()> {
    let key = stack.key(0).await;
    let workspace = stack.workspace_of(&key).await;
    let db = stack.sender_db().await;
    let tasks = deliveries.div_ceil(100);
    let now = postmesh_shared::db::now_unix();
    let filled = Instant::now();
    for batch in (0..tasks).step_by(TASKS_PER_BATCH) {
        let n = TASKS_PER_BATCH.min(tasks - batch);
        let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
        let created: Vec<i64> = (0..n).map(|j| now - (tasks - batch - j) as i64).collect();
        let tags: Vec<String> = (0..n).map(|j| format!("c{}", (batch + j) % TAGS)).collect();
        let mut tx = db.begin().await?;
        sqlx::query(
            "WITH u AS (SELECT * FROM UNNEST($1::uuid[], $2::bigint[], $3::text[]) AS u(id, c, v)),
             t AS (
                 INSERT INTO tasks (id, workspace_id, api_key_id, account_id, status, message,
                                    email_type, cost, recipient_count, created_at, tags)
                 SELECT id, $4, $4, 'bench', 'queued', '{\"subject\": \"Bench\"}',
                        'transactional', 0, 100, c,
                        jsonb_build_array(jsonb_build_object('name', 'campaign', 'value', v))
                 FROM u
             )
             INSERT INTO task_tags (workspace_id, tag, created_at, task_id)
             SELECT $4, 'campaign:' || v, c, id FROM u",
        )
        .bind(&ids)
        .bind(&created)
        .bind(&tags)
        .bind(workspace)
        .execute(&mut *tx)
        .await?;
        let task_of: Vec<Uuid> = ids
            .iter()
            .flat_map(|t| std::iter::repeat_n(*t, 100))
            .collect();
        let at: Vec<i64> = created
            .iter()
            .flat_map(|c| std::iter::repeat_n(*c, 100))
            .collect();
        let idx: Vec<i32> = (0..n).flat_map(|_| 0..100).collect();
        let delivery: Vec<Uuid> = (0..n * 100).map(|_| Uuid::now_v7()).collect();
        sqlx::query(
            "INSERT INTO task_recipients (task_id, idx, email, delivery_id, workspace_id,
                                          created_at, status)
             SELECT t, i, 'r' || i || '-' || left(t::text, 8) || '@bench.example', d, $5, c,
                    CASE WHEN i % 20 = 0 THEN 'bounced' ELSE 'delivered' END
             FROM UNNEST($1::uuid[], $2::integer[], $3::uuid[], $4::bigint[]) AS u(t, i, d, c)",
        )
        .bind(&task_of)
        .bind(&idx)
        .bind(&delivery)
        .bind(&at)
        .bind(workspace)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
    }
    sqlx::query("ANALYZE task_recipients, task_tags, tasks")
        .execute(&db)
        .await?;
    let filled = filled.elapsed();
    println!("### Tracking: the message log at {deliveries} deliveries\n");
    println!(
        "One workspace, {tasks} sends of 100 recipients, {TAGS} tags (written in {:.0} s); 20 \
         searches each through the gateway, 50 rows a page.\n",
        filled.as_secs_f64()
    );
    println!("| search | p50 ms | p99 ms | rows |");
    println!("|---|---:|---:|---:|");
    let probe =
        format!("r7-{}", &sqlx::query_scalar::<_, String>(
        "SELECT left(task_id::text, 8) FROM task_recipients WHERE workspace_id = $1 LIMIT 1",
    )
    .bind(workspace)
    .fetch_one(&db)
    .await?);
    let mut tag_p50 = f64::NAN;
    for (label, query) in [
        ("newest first", "limit=50".to_owned()),
        ("tag", "tag=campaign:c7&limit=50".to_owned()),
        (
            "tag, second page",
            "tag=campaign:c7&limit=50&offset=50".to_owned(),
        ),
        (
            "tag and state",
            "tag=campaign:c7&status=bounced&limit=50".to_owned(),
        ),
        ("state", "status=bounced&limit=50".to_owned()),
        ("recipient", format!("to={probe}@bench.example&limit=50")),
    ] {
        let url = format!("{}/emails?{query}", stack.base);
        let mut times = Vec::new();
        let mut rows = 0;
        for _ in 0..20 {
            let started = Instant::now();
            let answer: serde_json::Value = stack
                .http
                .get(&url)
                .bearer_auth(&key)
                .send()
                .await?
                .json()
                .await?;
            times.push(started.elapsed());
            rows = answer["emails"].as_array().map_or(0, Vec::len);
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        if label == "tag" {
            tag_p50 = ms(times[10]);
        }
        println!(
            "| {label} | {:.1} | {:.1} | {rows} |",
            ms(times[10]),
            ms(times[19])
        );
    }
    println!(
        "\nA tag filter at {deliveries} deliveries: p50 {tag_p50:.1} ms (goal < 100 ms: {})\n",
        if tag_p50 < 100.0 { "met" } else { "missed" }
    );
    let columns = "r.delivery_id, r.task_id, r.email AS to, t.subject, \
                   r.status, t.tags, r.created_at, r.opens, r.clicks";
    let log = "FROM task_recipients r JOIN tasks t ON t.id = r.task_id WHERE r.workspace_id = $1";
    let newest = "ORDER BY r.created_at DESC, r.delivery_id DESC LIMIT 50";
    for (label, sql) in [
        (
            "tag",
            format!(
                "SELECT {columns} FROM task_tags g JOIN task_recipients r ON r.task_id = g.task_id \
                 JOIN tasks t ON t.id = r.task_id WHERE g.workspace_id = $1 AND g.tag = $2 \
                 ORDER BY g.created_at DESC, r.delivery_id DESC LIMIT 50"
            ),
        ),
        (
            "newest first",
            format!("SELECT {columns} {log} AND $2 <> '' {newest}"),
        ),
        (
            "state",
            format!("SELECT {columns} {log} AND r.status = 'bounced' AND $2 <> '' {newest}"),
        ),
        (
            "recipient",
            format!("SELECT {columns} {log} AND lower(r.email) = $2 {newest}"),
        ),
    ] {
        let arg = match label {
            "tag" => "campaign:c7".to_owned(),
            "recipient" => format!("{probe}@bench.example"),
            _ => "x".to_owned(),
        };
        let plan: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}"
        ))
        .bind(workspace)
        .bind(arg)
        .fetch_all(&db)
        .await?;
        println!(
            "The {label} query's plan:\n\n```\n{}\n```\n",
            plan.join("\n")
        );
    }
    Ok(())
}
