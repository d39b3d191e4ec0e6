//! SMTP submission: 20 KB one-recipient messages accepted per second over
//! `BENCH_SMTP_CONNS` (default 8) pipelined SMTP connections (MAIL, RCPT and DATA in one
//! write, then the message) against the same messages through `POST /send-email` from as
//! many HTTP clients, `BENCH_SMTP_SECS` (default 4) per round, `BENCH_SMTP_ROUNDS` (default
//! 2) alternating rounds, same stack (goal: SMTP ≥ 0.8 × HTTP); and the time from the end of
//! DATA to its `250` (p50, p99).

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use postmesh_tests::smtp::{SmtpConn, SmtpServer};
use postmesh_tests::Stack;

use super::Run;

/// What the SMTP bench runs.
pub struct Settings {
    pub conns: usize,
    pub secs: u64,
    pub rounds: usize,
}

/// The message body: 20 KB of text lines.
fn body() -> String {
    let line = "Postmesh SMTP benchmark text, the same for every message of both paths.\r\n";
    line.repeat(20 * 1024 / line.len())
}

/// Runs the rounds; prints the table.
pub async fn run(stack: &Stack, s: &Settings) -> anyhow::Result<()> {
    let key = stack.key(100_000_000).await;
    let user = stack.account_email(&key).await;
    let server = SmtpServer::start(stack, |c| {
        c.allow_plaintext_auth = true;
        c.max_connections_per_ip = 1000;
        c.max_connections = 10_000;
        c.max_commands = usize::MAX;
    })
    .await;
    let text = body();
    println!("\n### SMTP submission against POST /send-email\n");
    println!(
        "{} connections each way, 20 KB one-recipient messages, {} s per round.\n",
        s.conns, s.secs
    );
    println!("| round | HTTP msg/s | SMTP msg/s | SMTP / HTTP | HTTP p50 ms | end of DATA → 250 p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let (mut http_total, mut smtp_total) = (0.0, 0.0);
    for round in 0..s.rounds {
        let http = http_round(stack, &key, &text, s, round).await?;
        let smtp = smtp_round(&server, &user, &key, &text, s, round).await?;
        anyhow::ensure!(http.errors == 0 && smtp.errors == 0, "refused messages");
        let ratio = smtp.rps() / http.rps();
        http_total += http.rps();
        smtp_total += smtp.rps();
        println!(
            "| {} | {:.0} | {:.0} | {ratio:.2} | {:.1} | {:.1} | {:.1} |",
            round + 1,
            http.rps(),
            smtp.rps(),
            http.percentile_ms(0.5),
            smtp.percentile_ms(0.5),
            smtp.percentile_ms(0.99),
        );
    }
    let ratio = smtp_total / http_total;
    println!(
        "\nSMTP / HTTP over all rounds: {ratio:.2} (goal ≥ 0.8: {})\n",
        if ratio >= 0.8 { "met" } else { "missed" }
    );
    server.stop().await;
    Ok(())
}

/// `conns` clients posting sends until the round's time is up.
async fn http_round(
    stack: &Stack, key: &str, text: &str, s: &Settings, round: usize,
) -> anyhow::Result<Run> {
    let until = Instant::now() + Duration::from_secs(s.secs);
    let started = Instant::now();
    let clients = (0..s.conns).map(|c| {
        let (http, url) = (stack.http.clone(), format!("{}/send-email", stack.base));
        async move {
            let mut run = Run::default();
            let mut i = 0;
            while Instant::now() < until {
                i += 1;
                let body = json!({
                    "to": format!("h{round}-{c}-{i}@bench.example"),
                    "fromEmail": "bench@postmesh.localhost",
                    "subject": "Bench",
                    "text": text,
                });
                let sent = Instant::now();
                let answer = http.post(&url).bearer_auth(key).json(&body).send().await?;
                if answer.status() == StatusCode::OK {
                    run.requests += 1;
                    run.latencies_us.push(sent.elapsed().as_micros() as u64);
                } else {
                    run.errors += 1;
                }
            }
            anyhow::Ok(run)
        }
    });
    merge(futures::future::join_all(clients).await, started)
}

/// `conns` SMTP connections, each signed in once, sending until the round's time is up.
async fn smtp_round(
    server: &SmtpServer, user: &str, key: &str, text: &str, s: &Settings, round: usize,
) -> anyhow::Result<Run> {
    let until = Instant::now() + Duration::from_secs(s.secs);
    let started = Instant::now();
    let conns = (0..s.conns).map(|c| async move {
        let mut conn = server.connect().await;
        conn.login(user, key).await;
        let mut run = Run::default();
        let mut i = 0;
        while Instant::now() < until {
            i += 1;
            let to = format!("s{round}-{c}-{i}@bench.example");
            let envelope =
                format!("MAIL FROM:<bench@postmesh.localhost>\r\nRCPT TO:<{to}>\r\nDATA\r\n");
            conn.write(envelope.as_bytes()).await;
            let replies = [conn.reply().await, conn.reply().await, conn.reply().await];
            if replies.iter().map(|r| r.0).collect::<Vec<_>>() != [250, 250, 354] {
                run.errors += 1;
                let _ = reset(&mut conn).await;
                continue;
            }
            let message = format!(
                "From: bench@postmesh.localhost\r\nTo: {to}\r\nSubject: Bench\r\n\r\n{text}.\r\n"
            );
            conn.write(message.as_bytes()).await;
            let sent = Instant::now();
            let reply = conn.reply().await;
            if reply.0 == 250 {
                run.requests += 1;
                run.latencies_us.push(sent.elapsed().as_micros() as u64);
            } else {
                run.errors += 1;
            }
        }
        anyhow::Ok(run)
    });
    merge(futures::future::join_all(conns).await, started)
}

/// After a refused envelope: `RSET`.
async fn reset(conn: &mut SmtpConn) -> u16 {
    conn.send("RSET").await.0
}

/// The clients' runs as one, timed from `started`.
fn merge(runs: Vec<anyhow::Result<Run>>, started: Instant) -> anyhow::Result<Run> {
    let mut all = Run {
        elapsed: started.elapsed(),
        ..Run::default()
    };
    for run in runs {
        let run = run?;
        all.requests += run.requests;
        all.errors += run.errors;
        all.latencies_us.extend(run.latencies_us);
    }
    all.latencies_us.sort_unstable();
    Ok(all)
}
