//! The delivery path under failure: a worker killed mid-delivery, a relay slower than the
//! ack deadline, and the SMTP transport against a real (local) relay.

use std::time::Duration;

use postmesh_tests::fake_smtp::{Behaviour, FakeSmtp};
use postmesh_tests::{extract_code, SenderMode, Stack};

async fn delivery_status(db: &sqlx::PgPool) -> Vec<(String, i32)> {
    sqlx::query_as("SELECT status, attempts FROM deliveries")
        .fetch_all(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_worker_killed_mid_delivery_loses_nothing() {
    let mut stack = Stack::start_with(SenderMode::ChildProcess).await;
    let key = stack.key(5).await;
    // The first worker's relay hangs, so it is caught in the middle of delivering.
    let hung = FakeSmtp::start(Behaviour::Silent).await;
    stack.kill_sender().await;
    stack.use_transport("smtp", &hung.url());
    stack.start_sender().await;
    let to = "mallory@example.com";
    let (s, body) = stack.send_code(&key, to).await;
    assert_eq!(s.as_u16(), 200, "{body}");
    let db = stack.sender_db().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while delivery_status(&db).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never took the job"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(delivery_status(&db).await[0].0, "sending");
    stack.kill_sender().await; // SIGKILL while the job is in flight, unacked

    stack.use_transport("file", "");
    stack.start_sender().await;
    let code = stack.code_sent_to(to, 1).await;
    let (s, body) = stack.verify(&key, to, &code).await;
    assert_eq!(s.as_u16(), 200, "{body}");
    let rows = delivery_status(&db).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, "sent");
    assert!(rows[0].1 >= 1, "the redelivery was counted: {rows:?}");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_relay_slower_than_the_ack_deadline_gets_the_message_once() {
    let mut stack = Stack::start().await;
    let key = stack.key(5).await;
    // The test stack's ack deadline is 2 s; the relay takes 5 s to accept.
    let relay = FakeSmtp::start(Behaviour::Accept {
        accept_delay: Duration::from_secs(5),
    })
    .await;
    stack.kill_sender().await;
    stack.use_transport("smtp", &relay.url());
    stack.start_sender().await;
    let to = "niaj@example.com";
    let (s, _) = stack.send_code(&key, to).await;
    assert_eq!(s.as_u16(), 200);
    let db = stack.sender_db().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let rows = delivery_status(&db).await;
        if rows.first().is_some_and(|r| r.0 == "sent") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not delivered: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Give a would-be redelivery time to reach the relay too.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let got = relay.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].to, vec![format!("<{to}>")]);
    assert_eq!(got[0].from, "<codes@postmesh.test>");
    let code = extract_code(&got[0].data).expect("code in the message");
    let (s, _) = stack.verify(&key, to, &code).await;
    assert_eq!(s.as_u16(), 200);
    stack.shutdown().await;
}
