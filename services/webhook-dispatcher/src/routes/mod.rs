//! The HTTP resources: inbox endpoints, the workspace default webhook, workspace webhooks
//! and the attempts of each (list, retry, replay, test), with the scheduler of due attempts.

pub mod attempts;
pub mod defaults;
pub mod endpoints;
pub mod webhooks;

use postmesh_contracts::routes::webhooks as api;
use postmesh_shared::Routes;

use crate::AppState;
use attempts::{Endpoints, Webhooks};

/// Every route the service serves, with its handler and the JSON bodies it documents.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::ENDPOINTS, endpoints::list)
        .at(api::ENDPOINT_CREATE, endpoints::create)
        .at(api::ENDPOINT, endpoints::show)
        .at(api::ENDPOINT_UPDATE, endpoints::update)
        .at(api::ENDPOINT_DELETE, endpoints::remove)
        .at(api::ADDRESS_SUBSCRIPTION, endpoints::subscribe)
        .at(api::DEFAULT_SET, defaults::put)
        .at(api::DEFAULT, defaults::show)
        .at(api::DEFAULT_DELETE, defaults::remove)
        .at(api::ATTEMPTS, attempts::list::<Endpoints>)
        .at(api::ATTEMPT_RETRY, attempts::retry::<Endpoints>)
        .at(api::REPLAY, attempts::replay::<Endpoints>)
        .at(api::TEST, attempts::test::<Endpoints>)
        .at(api::WEBHOOKS, webhooks::list)
        .at(api::WEBHOOK_CREATE, webhooks::create)
        .at(api::EVENT_TYPES, webhooks::types)
        .at(api::WEBHOOK, webhooks::show)
        .at(api::WEBHOOK_UPDATE, webhooks::update)
        .at(api::WEBHOOK_DELETE, webhooks::remove)
        .at(api::WEBHOOK_ATTEMPTS, attempts::list::<Webhooks>)
        .at(api::WEBHOOK_ATTEMPT_RETRY, attempts::retry::<Webhooks>)
        .at(api::WEBHOOK_REPLAY, attempts::replay::<Webhooks>)
        .at(api::WEBHOOK_TEST, attempts::test::<Webhooks>)
}
