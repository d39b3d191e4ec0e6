//! Dead letters: a job whose work panics on every try goes aside after `max_deliver` tries
//! while the queue's other jobs flow on (the kit's worker, with stages made to panic on
//! one payload); messages the services can never decode are kept aside at once, listed for
//! admin keys and put back by `POST /admin/dead-letters/{id}/requeue`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use postmesh_shared::dead_letters::DEAD_LETTER_MIGRATIONS;
use postmesh_shared::jetstream::{publish, Stream};
use postmesh_shared::queue::{
    self, ClaimRow, Failure, QueueConfig, RecordRow, StageError, Stages, Standing, Timers, Verdict,
};
use postmesh_shared::{Runtime, Service};
use postmesh_tests::{common, eventually, fresh_namespace, remove_namespace, Stack};

/// Stages over payloads held in memory; the work of payload `poison` panics.
#[derive(Default, Clone)]
struct Book {
    /// Per item: its attempts, and whether it is finished.
    items: Arc<Mutex<HashMap<Uuid, (i32, bool)>>>,
    done: Arc<Mutex<HashSet<String>>>,
    /// Outcome writes still to fail as with the database out of reach.
    record_outage: Arc<std::sync::atomic::AtomicUsize>,
}

fn item_of(payload: &str) -> Uuid {
    let digest = Sha256::digest(payload.as_bytes());
    Uuid::from_slice(&digest[..16]).expect("16 bytes")
}

impl Stages for Book {
    type Job = String;
    type Shared = ();
    type ClaimData = ();

    fn decode(&self, payload: &[u8]) -> Result<String, StageError> {
        String::from_utf8(payload.to_vec()).map_err(|e| StageError::Undecodable(e.to_string()))
    }

    fn items(&self, job: &String) -> Vec<Uuid> {
        vec![item_of(job)]
    }

    async fn prepare(&self, _job: &String) -> Result<(), StageError> {
        Ok(())
    }

    fn claim_data(&self, _job: &String, _shared: &(), _index: usize) {}

    async fn claim(
        &self, rows: Vec<ClaimRow<()>>, _lease_ms: i64,
    ) -> Result<Vec<Option<i32>>, StageError> {
        let mut items = self.items.lock().unwrap();
        Ok(rows
            .iter()
            .map(|row| {
                let (attempts, finished) = items.entry(row.item).or_default();
                (!*finished).then(|| {
                    *attempts += 1;
                    *attempts
                })
            })
            .collect())
    }

    async fn standing(&self, _item: Uuid) -> Result<Standing, StageError> {
        Ok(Standing::Finished)
    }

    async fn work(&self, job: &String, _shared: &(), _index: usize) -> Result<String, Failure> {
        assert_ne!(job, "poison", "poison pill");
        self.done.lock().unwrap().insert(job.clone());
        Ok(String::new())
    }

    async fn record(&self, rows: Vec<RecordRow>) -> Result<Vec<bool>, StageError> {
        use std::sync::atomic::Ordering;
        let down = self.record_outage.load(Ordering::SeqCst);
        if down > 0 {
            self.record_outage.store(down - 1, Ordering::SeqCst);
            return Err(StageError::Unavailable(
                "the database is failing over".into(),
            ));
        }
        let mut items = self.items.lock().unwrap();
        for row in &rows {
            let finished = !matches!(row.verdict, Verdict::Retry(..));
            items.entry(row.item).or_default().1 = finished;
        }
        Ok(vec![true; rows.len()])
    }

    async fn renew(&self, _items: &[Uuid], _lease: Uuid, _lease_ms: i64) -> Result<(), StageError> {
        Ok(())
    }
}

/// The kit's worker over `book` on the SEND stream, as queue `name`: five tries a job.
async fn worker(rt: &Runtime, book: &Book, name: &'static str, ack_wait: Duration) {
    let config = QueueConfig {
        name,
        ack_wait,
        max_deliver: 5,
        retry_base: Duration::from_millis(50),
        concurrency: 4,
        claim_ahead: 8,
        timers: Timers::Redelivery,
    };
    queue::spawn(rt, Stream::Send, config, book.clone())
        .await
        .expect("worker");
}

#[tokio::test]
async fn a_job_that_panics_goes_aside_after_its_tries_while_the_others_flow() {
    let common = common(fresh_namespace());
    let rt = Runtime::boot(Service::Sender, &common, &[&DEAD_LETTER_MIGRATIONS])
        .await
        .expect("runtime");
    let book = Book::default();
    worker(&rt, &book, "dead-letter-test", Duration::from_secs(5)).await;
    let subject = Stream::Send.subject(&common.namespace);
    let publish_one = |payload: String| {
        let (js, subject) = (rt.js.clone(), subject.clone());
        async move {
            publish(
                &js,
                subject,
                &Uuid::now_v7().to_string(),
                payload.into_bytes().into(),
            )
            .await
            .expect("published")
        }
    };
    publish_one("poison".into()).await;
    for i in 0..20 {
        publish_one(format!("job {i}")).await;
    }
    // Not UTF-8: it can never be decoded.
    publish(&rt.js, subject.clone(), "bad", vec![0xff, 0xfe].into())
        .await
        .expect("published");
    let letters = rt.dead_letters();
    let dead = eventually(Duration::from_secs(30), || async {
        let (letters, _) = letters.list(10, 0).await.map_err(|e| e.to_string())?;
        if letters.len() == 2 {
            Ok(letters)
        } else {
            Err(format!("{} dead letters", letters.len()))
        }
    })
    .await;
    assert_eq!(
        book.done.lock().unwrap().len(),
        20,
        "the other jobs all ran"
    );
    let poison = dead
        .iter()
        .find(|l| l.payload.as_ref() == b"poison")
        .expect("the poison job");
    assert_eq!(poison.count, 5, "{poison:?}");
    assert!(poison.last_error.contains("poison pill"), "{poison:?}");
    assert_eq!(poison.subject, subject);
    let bad = dead
        .iter()
        .find(|l| l.payload.as_ref() == [0xff, 0xfe])
        .expect("the bad one");
    assert!(bad.last_error.starts_with("undecodable"), "{bad:?}");
    assert_eq!(bad.count, 1);
    // The worker is still there for new jobs.
    publish_one("after".into()).await;
    eventually(Duration::from_secs(10), || async {
        book.done
            .lock()
            .unwrap()
            .contains("after")
            .then_some(())
            .ok_or("not yet")
    })
    .await;
    rt.shutdown.cancel();
    remove_namespace(&common).await;
}

#[tokio::test]
async fn undecodable_messages_are_kept_aside_listed_for_admins_and_requeued() {
    let stack = Stack::start().await;
    let ns = stack.ns().clone();
    let js = stack.jetstream().await;
    for stream in [Stream::Inbound, Stream::Send] {
        publish(
            &js,
            stream.subject(&ns),
            &Uuid::now_v7().to_string(),
            "garbage".into(),
        )
        .await
        .expect("published");
    }
    let admin = stack.client(&stack.admin_key().await);
    let listed: Value = eventually(Duration::from_secs(20), || async {
        let page: Value = admin.get("/admin/dead-letters", StatusCode::OK).await;
        let counts: Vec<usize> = (0..2)
            .map(|i| {
                page["services"][i]["deadLetters"]
                    .as_array()
                    .map_or(0, Vec::len)
            })
            .collect();
        if counts == [1, 1] {
            Ok(page)
        } else {
            Err(page)
        }
    })
    .await;
    let services: Vec<&str> = (0..2)
        .map(|i| listed["services"][i]["service"].as_str().unwrap())
        .collect();
    assert_eq!(services, ["sender", "webhook-dispatcher"]);
    let letter = &listed["services"][1]["deadLetters"][0];
    assert_eq!(letter["subject"], json!(Stream::Inbound.subject(&ns)));
    assert_eq!(letter["payload"], json!("Z2FyYmFnZQ=="));
    assert_eq!(letter["payloadBytes"], json!(7));
    assert!(letter["lastError"]
        .as_str()
        .unwrap()
        .starts_with("undecodable"));
    assert_eq!(listed["services"][1]["total"], json!(1));

    let member = stack.client(&stack.key(0).await);
    let _: Value = member
        .get("/admin/dead-letters", StatusCode::FORBIDDEN)
        .await;
    let _: Value = admin
        .get("/admin/dead-letters?limit=0", StatusCode::BAD_REQUEST)
        .await;
    let id = letter["id"].as_str().unwrap();
    let path = format!("/admin/dead-letters/{id}/requeue");
    let _: Value = member.act(&path, StatusCode::FORBIDDEN).await;
    let requeued: Value = admin.act(&path, StatusCode::OK).await;
    assert_eq!(requeued["service"], json!("webhook-dispatcher"));
    let _: Value = admin.act(&path, StatusCode::NOT_FOUND).await;
    // Back on its subject, it is handled again: still undecodable, a dead letter anew.
    eventually(Duration::from_secs(20), || async {
        let page: Value = admin.get("/admin/dead-letters", StatusCode::OK).await;
        let again = &page["services"][1]["deadLetters"][0];
        if again["id"].as_str().is_some_and(|again| again != id) {
            Ok(())
        } else {
            Err(page)
        }
    })
    .await;

    // Letters larger together than NATS carries in one reply are listed by their first bytes.
    let big = "garbage".repeat(60_000);
    for _ in 0..3 {
        publish(
            &js,
            Stream::Inbound.subject(&ns),
            &Uuid::now_v7().to_string(),
            big.clone().into(),
        )
        .await
        .expect("published");
    }
    let page: Value = eventually(Duration::from_secs(20), || async {
        let page: Value = admin.get("/admin/dead-letters", StatusCode::OK).await;
        if page["services"][1]["total"] == json!(4) {
            Ok(page)
        } else {
            Err(page)
        }
    })
    .await;
    // Listed by their first 4 KiB (base64) and their whole size, beside the small one.
    let letters = page["services"][1]["deadLetters"].as_array().unwrap();
    let mut shown: Vec<(i64, usize)> = letters
        .iter()
        .map(|l| {
            let size = l["payloadBytes"].as_i64().unwrap();
            (size, l["payload"].as_str().unwrap().len())
        })
        .collect();
    shown.sort_unstable();
    let big_one = (
        i64::try_from(big.len()).unwrap(),
        4096_usize.div_ceil(3) * 4,
    );
    assert_eq!(shown, [(7, 12), big_one, big_one, big_one], "{page}");
    stack.shutdown().await;
}

/// An outcome whose write meets a database out of reach for some seconds (a failover) is
/// written once it answers: the job is neither acked with its outcome lost nor done again.
#[tokio::test]
async fn an_outcome_is_written_once_the_database_answers_again() {
    let common = common(fresh_namespace());
    let rt = Runtime::boot(Service::Sender, &common, &[&DEAD_LETTER_MIGRATIONS])
        .await
        .expect("runtime");
    let book = Book::default();
    // About 6.6 s of failed writes: past the first retries (2.6 s) and the ack wait.
    book.record_outage
        .store(6, std::sync::atomic::Ordering::SeqCst);
    worker(&rt, &book, "record-outage-test", Duration::from_secs(2)).await;
    let subject = Stream::Send.subject(&common.namespace);
    publish(&rt.js, subject, "one", b"job".to_vec().into())
        .await
        .expect("published");
    let item = item_of("job");
    eventually(Duration::from_secs(20), || async {
        match book.items.lock().unwrap().get(&item) {
            Some(&(attempts, true)) => Ok(attempts),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(book.items.lock().unwrap()[&item], (1, true), "done once");
    rt.shutdown.cancel();
    remove_namespace(&common).await;
}
