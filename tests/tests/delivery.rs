//! The delivery path under failure: a worker killed mid-delivery, a relay slower than the
//! ack deadline, and the SMTP transport against a real (local) relay.

use std::time::Duration;

use postmesh_tests::fake_smtp::{Behaviour, FakeSmtp};
use prost::Message as _;

use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::{send_job, CodeEmail, JobKind, SendJob};
use postmesh_tests::{eventually, extract_code, peek, SenderMode, Stack};

#[tokio::test]
async fn a_worker_killed_mid_delivery_loses_nothing() {
    let mut stack = Stack::start_with(SenderMode::ChildProcess).await;
    let key = stack.key(5).await;
    // The first worker's relay hangs, so it is caught in the middle of delivering.
    let hung = FakeSmtp::start(Behaviour::Silent).await;
    stack.deliver_by_smtp(&hung.url()).await;
    let to = "mallory@example.com";
    stack.send_code_ok(&key, to).await;
    let db = stack.sender_db().await;
    let db = &db;
    let rows = eventually(Duration::from_secs(15), || async move {
        let rows = peek::sender::deliveries(db).await;
        if rows.is_empty() {
            Err("the worker never took the job")
        } else {
            Ok(rows)
        }
    })
    .await;
    assert_eq!(rows[0].0, "sending");
    stack.kill_sender().await; // SIGKILL while the job is in flight, unacked

    stack.use_file();
    stack.start_sender().await;
    let code = stack.code_sent_to(to, 1).await;
    stack.verify_ok(&key, to, &code).await;
    // The outcome is recorded just after the message is written.
    let rows = eventually(Duration::from_secs(10), || async move {
        let rows = peek::sender::deliveries(db).await;
        match rows.as_slice() {
            [(status, _)] if status == "sent" => Ok(rows),
            _ => Err(rows),
        }
    })
    .await;
    assert!(rows[0].1 >= 2, "the redelivery was counted: {rows:?}");
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
    stack.deliver_by_smtp(&relay.url()).await;
    let to = "niaj@example.com";
    let s = stack.send_code(&key, to).await.status;
    assert_eq!(s.as_u16(), 200);
    let db = stack.sender_db().await;
    let db = &db;
    eventually(Duration::from_secs(20), || async move {
        let rows = peek::sender::deliveries(db).await;
        match rows.first() {
            Some(row) if row.0 == "sent" => Ok(()),
            _ => Err(rows),
        }
    })
    .await;
    // A redelivery would have reached the relay by the time SEND's consumer has none left.
    stack.handled(&[Stream::Send]).await;
    let got = relay.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].to, vec![format!("<{to}>")]);
    assert_eq!(got[0].from, "<codes@postmesh.test>");
    let code = extract_code(&got[0].data).expect("code in the message");
    let s = stack.verify(&key, to, &code).await.status;
    assert_eq!(s.as_u16(), 200);
    stack.shutdown().await;
}

/// Records `job` as being delivered by another worker whose lease runs `ms` more.
async fn lease_to_another_worker(db: &sqlx::PgPool, job: &SendJob, ms: i64) {
    let id = uuid::Uuid::parse_str(&job.id).unwrap();
    let Some(send_job::Body::Code(email)) = &job.body else {
        panic!("a code email job");
    };
    let to = std::slice::from_ref(&email.to);
    peek::sender::lease_elsewhere(db, id, to, &email.subject, ms).await;
}

async fn publish(stack: &Stack, job: &SendJob) {
    let js = stack.jetstream().await;
    postmesh_shared::jetstream::publish(
        &js,
        Stream::Send.subject(stack.ns()),
        &job.id,
        job.encode_to_vec().into(),
    )
    .await
    .unwrap();
}

fn job_to(to: &str) -> SendJob {
    SendJob {
        id: uuid::Uuid::now_v7().to_string(),
        kind: JobKind::Verification.into(),
        body: Some(send_job::Body::Code(CodeEmail {
            from_email: "app@postmesh.test".into(),
            to: to.into(),
            subject: "Leased".into(),
            text: "hello".into(),
        })),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_job_leased_to_another_worker_is_not_sent_twice() {
    let stack = Stack::start().await;
    let db = stack.sender_db().await;
    // A worker whose heartbeats to NATS stalled still holds job A (lease 3 s more) and job B
    // (10 s more), and finishes B; JetStream redelivers both to the stack's worker.
    let (to_a, to_b) = ("lease-a@example.com", "lease-b@example.com");
    let (a, b) = (job_to(to_a), job_to(to_b));
    lease_to_another_worker(&db, &a, 3000).await;
    lease_to_another_worker(&db, &b, 10_000).await;
    publish(&stack, &a).await;
    publish(&stack, &b).await;
    // The stack's worker has both jobs in hand, waiting on their leases.
    let consumer: async_nats::jetstream::consumer::PullConsumer = stack
        .jetstream()
        .await
        .get_stream(stack.ns().stream("SEND"))
        .await
        .unwrap()
        .get_consumer("sender")
        .await
        .unwrap();
    eventually(Duration::from_secs(10), || async {
        match consumer.get_info().await.unwrap().num_ack_pending {
            2 => Ok(()),
            n => Err(n),
        }
    })
    .await;
    assert!(
        stack.messages_to(to_a).is_empty(),
        "sent under a live lease"
    );
    assert!(
        stack.messages_to(to_b).is_empty(),
        "sent under a live lease"
    );
    peek::sender::finish_elsewhere(&db, uuid::Uuid::parse_str(&b.id).unwrap()).await;
    // A's holder never finishes: once its lease runs out, this worker delivers A, once.
    let got = stack
        .wait_for_messages(to_a, 1, Duration::from_secs(15))
        .await;
    assert_eq!(got.len(), 1);
    // The outcome is recorded just after the message is written.
    let (db, a_id) = (&db, uuid::Uuid::parse_str(&a.id).unwrap());
    let owner = eventually(Duration::from_secs(10), || async move {
        match peek::sender::delivery_state(db, a_id).await {
            (status, owner) if status == "sent" => Ok(owner),
            (status, _) => Err(status),
        }
    })
    .await;
    assert_eq!(owner, None, "the lease is released");
    // B was finished by its holder: never sent again.
    stack.handled(&[Stream::Send]).await;
    assert!(stack.messages_to(to_b).is_empty());
    assert_eq!(stack.messages_to(to_a).len(), 1);
    stack.shutdown().await;
}

/// Status, attempts and last error of the delivery to `to`, once it is no longer `sending`.
async fn settled_delivery(db: &sqlx::PgPool, to: &str) -> (String, i32, Option<String>) {
    eventually(Duration::from_secs(30), || async move {
        match peek::sender::delivery_to(db, to).await {
            Some(row) if row.0 != "sending" => Ok(row),
            other => Err(other),
        }
    })
    .await
}

#[tokio::test]
async fn refused_deliveries_are_retried_then_parked_as_failed() {
    let mut stack = Stack::start().await;
    let key = stack.key(5).await;
    let db = stack.sender_db().await;
    // "Try again later" (451) on every attempt: retried until the last attempt, then parked.
    // "Never" (550): parked after the first attempt.
    for (code, to, attempts) in [(451, "busy@example.com", 5), (550, "gone@example.com", 1)] {
        let relay = FakeSmtp::start(Behaviour::Refuse { code }).await;
        stack.deliver_by_smtp(&relay.url()).await;
        let s = stack.send_code(&key, to).await.status;
        assert_eq!(s.as_u16(), 200);
        let (status, tried, error) = settled_delivery(&db, to).await;
        assert_eq!((status.as_str(), tried), ("failed", attempts), "{to}");
        assert!(error.is_some_and(|e| e.contains(&code.to_string())), "{to}");
        // No attempt beyond the last.
        stack.handled(&[Stream::Send]).await;
        assert_eq!(relay.refused(), attempts as usize, "{to}");
    }
    stack.shutdown().await;
}
