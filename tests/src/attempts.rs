//! A target's delivery attempts as the API lists them, and waiting for them to settle.

use std::collections::HashSet;
use std::time::Duration;

use prost::Message as _;
use reqwest::StatusCode;
use uuid::Uuid;

use postmesh_shared::jetstream::{self, Stream};
use postmesh_shared::proto::WebhookJob;
use postmesh_shared::Success;
use webhook_dispatcher::attempt::Status;
use webhook_dispatcher::routes::attempts::{AttemptList, AttemptView};

use crate::receiver::Delivery;
use crate::{eventually, peek, Stack};

/// Whose attempts: an inbox endpoint's or a workspace webhook's.
#[derive(Clone, Copy, Debug)]
pub enum Of {
    Endpoint(Uuid),
    Webhook(Uuid),
}

/// The target's attempts (the newest 100), newest first.
pub async fn list(stack: &Stack, key: &str, of: Of) -> Vec<AttemptView> {
    let path = match of {
        Of::Endpoint(id) => format!("/inbox/webhook/endpoints/{id}/attempts?limit=100"),
        Of::Webhook(id) => format!("/webhooks/{id}/attempts?limit=100"),
    };
    let list: Success<AttemptList> = stack.client(key).get(&path, StatusCode::OK).await;
    list.body.attempts
}

/// Waits until the target's attempts are `count`, all with `status`.
pub async fn settled(
    stack: &Stack, key: &str, of: Of, count: usize, status: Status,
) -> Vec<AttemptView> {
    eventually(Duration::from_secs(30), || async move {
        let list = list(stack, key, of).await;
        if list.len() == count && list.iter().all(|a| a.status == status) {
            Ok(list)
        } else {
            Err(format!("{list:?}"))
        }
    })
    .await
}

/// Waits until the target has `count` attempts, whatever their status.
pub async fn counted(stack: &Stack, key: &str, of: Of, count: usize) -> Vec<AttemptView> {
    eventually(Duration::from_secs(3), || async move {
        let list = list(stack, key, of).await;
        if list.len() == count {
            Ok(list)
        } else {
            Err(list.len())
        }
    })
    .await
}

/// Waits until some of the target's attempts succeeded; their ids.
pub async fn some_succeeded(stack: &Stack, key: &str, of: Of) -> HashSet<Uuid> {
    eventually(Duration::from_secs(20), || async move {
        let done: HashSet<Uuid> = list(stack, key, of)
            .await
            .into_iter()
            .filter(|a| a.status == Status::Succeeded)
            .map(|a| a.id)
            .collect();
        (!done.is_empty())
            .then_some(done)
            .ok_or("none succeeded yet")
    })
    .await
}

/// Publishes every attempt's job on WEBHOOK again, as JetStream would redeliver them had a
/// kill beaten each ack.
pub async fn publish_every_job_again(stack: &Stack) {
    let js = stack.jetstream().await;
    let db = stack.service_db(webhook_dispatcher::SERVICE).await;
    for id in peek::dispatcher::attempt_ids(&db).await {
        let job = WebhookJob {
            attempt_ids: vec![id.to_string()],
        };
        let subject = Stream::Webhook.subject(stack.ns());
        jetstream::publish(
            &js,
            subject,
            &format!("{id}:again"),
            job.encode_to_vec().into(),
        )
        .await
        .expect("published");
    }
}

/// Asserts that `got` holds a delivery for each of the attempts `all` and nothing else, and
/// each of `before` (those that had their 2xx before a kill) once.
pub fn delivered_once(got: &[Delivery], all: &[AttemptView], before: &HashSet<Uuid>) {
    let ids: HashSet<&str> = got.iter().map(|d| d.id.as_str()).collect();
    let expected: Vec<String> = all
        .iter()
        .map(|a| format!("msg_{}", a.id.simple()))
        .collect();
    let expected: HashSet<&str> = expected.iter().map(String::as_str).collect();
    assert_eq!(ids, expected, "every attempt delivered");
    for done in before {
        let id = format!("msg_{}", done.simple());
        let times = got.iter().filter(|d| d.id == id).count();
        assert_eq!(
            times, 1,
            "{id} got a 2xx before the kill and was not sent again"
        );
    }
}
