//! Audience sends: a workspace of `BENCH_AUDIENCE_CONTACTS` contacts (default 100,000);
//! sends to audiences of 10,000, 50,000 and 100,000 of them (a tag each), timed from the
//! `POST /send-email` to its answer: the audience resolved in SQL, governance, the charge,
//! and the task with its recipients and jobs stored. The sends are scheduled a day ahead so
//! the timing is acceptance alone (no delivery runs meanwhile). Goal: linear growth, and
//! 100,000 accepted in under 5 s.

use std::time::Instant;

use reqwest::StatusCode;
use serde_json::json;

use postmesh_shared::Success;
use postmesh_tests::{peek, Stack};
use sender::sending::send::SendAnswer;

/// Audience sizes timed, each a tag of the first that many contacts.
const SIZES: [usize; 3] = [10_000, 50_000, 100_000];

/// Times accepting a send to each audience size; prints the table.
pub async fn accept(stack: &Stack, contacts: usize, rounds: usize) -> anyhow::Result<()> {
    let sizes: Vec<usize> = SIZES.iter().copied().filter(|s| *s <= contacts).collect();
    let key = stack
        .key((contacts * (rounds + 1) * sizes.len()) as i64)
        .await;
    let workspace = stack.workspace_of(&key).await;
    let db = stack.service_db(sender::SERVICE).await;
    peek::sender::insert_contacts(&db, workspace, contacts, &sizes).await;
    sqlx::query("ANALYZE contacts").execute(&db).await?;
    let client = stack.client(&key);
    let at = postmesh_shared::db::now_unix() + 24 * 3600;
    let mut best = vec![f64::MAX; sizes.len()];
    // A warm-up send, then rounds of each size.
    for round in 0..=rounds {
        for (i, size) in sizes.iter().enumerate() {
            let started = Instant::now();
            let answer: Success<SendAnswer> = client
                .post(
                    "/send-email",
                    &json!({"audience": {"include": [{"tag": format!("first-{size}")}]},
                            "subject": "Hello", "text": "Hi", "emailType": "marketing",
                            "scheduledAt": at}),
                    StatusCode::OK,
                )
                .await;
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            anyhow::ensure!(
                answer.body.recipients.accepted == *size,
                "{} accepted of {size}",
                answer.body.recipients.accepted
            );
            if round > 0 {
                best[i] = best[i].min(ms);
            }
        }
    }
    println!(
        "Audience sends: accepted (scheduled) in a workspace of {contacts} contacts; best of \
         {rounds} rounds\n"
    );
    println!("| audience | accept ms | ms per 1,000 |");
    println!("|---:|---:|---:|");
    for (size, ms) in sizes.iter().zip(&best) {
        println!("| {size} | {ms:.0} | {:.1} |", ms / (*size as f64 / 1000.0));
    }
    if let (Some(first), Some(last)) = (best.first(), best.last()) {
        let growth = (last / first) / (sizes[sizes.len() - 1] as f64 / sizes[0] as f64);
        let met = *last < 5000.0 && sizes.last() == Some(&100_000);
        println!(
            "| growth per contact, largest / smallest (1.0 = linear) | {growth:.2} | |\n\
             | 100,000 under 5 s | {} | |\n",
            if met { "met" } else { "missed" }
        );
    }
    Ok(())
}
