//! A target's delivery attempts as the API lists them, and waiting for them to settle.

use std::time::Duration;

use reqwest::StatusCode;
use uuid::Uuid;

use postmesh_shared::Success;
use webhook_dispatcher::attempt::Status;
use webhook_dispatcher::routes::attempts::{AttemptList, AttemptView};

use crate::{eventually, Stack};

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
