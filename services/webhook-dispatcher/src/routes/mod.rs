//! The HTTP resources: inbox endpoints, the workspace default webhook, workspace webhooks
//! and the attempts of each (list, retry, replay, test), with the scheduler of due attempts.

pub mod attempts;
pub mod defaults;
pub mod endpoints;
pub mod webhooks;

use postmesh_contracts::routes::webhooks as api;
use postmesh_shared::{Routes, Success};

use crate::AppState;
use attempts::{Endpoints, Webhooks};

/// Every route the service serves, with its handler and the JSON bodies it documents.
pub fn routes() -> Routes<AppState> {
    use attempts::{AttemptList, Replayed, Retried, Since, Tested};
    use defaults::{DefaultPage, NewDefault, Removed};
    use endpoints::{Deleted, EndpointList, EndpointPage, NewEndpoint, Subscribed, Subscription};
    use webhooks::{EventTypes, NewWebhook, WebhookList, WebhookPage};

    Routes::new()
        .at(api::ENDPOINTS, endpoints::list)
        .query::<endpoints::ListQuery>()
        .answers::<Success<EndpointList>>()
        .at(api::ENDPOINT_CREATE, endpoints::create)
        .takes::<NewEndpoint>()
        .answers::<Success<endpoints::Created>>()
        .at(api::ENDPOINT, endpoints::show)
        .answers::<Success<EndpointPage>>()
        .at(api::ENDPOINT_UPDATE, endpoints::update)
        .takes::<endpoints::Changes>()
        .answers::<Success<EndpointPage>>()
        .at(api::ENDPOINT_DELETE, endpoints::remove)
        .answers::<Success<Deleted>>()
        .at(api::ADDRESS_SUBSCRIPTION, endpoints::subscribe)
        .takes::<Subscription>()
        .answers::<Success<Subscribed>>()
        .at(api::DEFAULT_SET, defaults::put)
        .takes::<NewDefault>()
        .answers::<Success<DefaultPage>>()
        .at(api::DEFAULT, defaults::show)
        .answers::<Success<DefaultPage>>()
        .at(api::DEFAULT_DELETE, defaults::remove)
        .answers::<Success<Removed>>()
        .at(api::ATTEMPTS, attempts::list::<Endpoints>)
        .query::<attempts::ListQuery>()
        .answers::<Success<AttemptList>>()
        .at(api::ATTEMPT_RETRY, attempts::retry::<Endpoints>)
        .answers::<Success<Retried>>()
        .at(api::REPLAY, attempts::replay::<Endpoints>)
        .takes::<Since>()
        .answers::<Success<Replayed>>()
        .at(api::TEST, attempts::test::<Endpoints>)
        .answers::<Success<Tested>>()
        .at(api::WEBHOOKS, webhooks::list)
        .answers::<Success<WebhookList>>()
        .at(api::WEBHOOK_CREATE, webhooks::create)
        .takes::<NewWebhook>()
        .answers::<Success<webhooks::Created>>()
        .at(api::EVENT_TYPES, webhooks::types)
        .answers::<Success<EventTypes>>()
        .at(api::WEBHOOK, webhooks::show)
        .answers::<Success<WebhookPage>>()
        .at(api::WEBHOOK_UPDATE, webhooks::update)
        .takes::<webhooks::Changes>()
        .answers::<Success<WebhookPage>>()
        .at(api::WEBHOOK_DELETE, webhooks::remove)
        .answers::<Success<Deleted>>()
        .at(api::WEBHOOK_ATTEMPTS, attempts::list::<Webhooks>)
        .query::<attempts::ListQuery>()
        .answers::<Success<AttemptList>>()
        .at(api::WEBHOOK_ATTEMPT_RETRY, attempts::retry::<Webhooks>)
        .answers::<Success<Retried>>()
        .at(api::WEBHOOK_REPLAY, attempts::replay::<Webhooks>)
        .takes::<Since>()
        .answers::<Success<Replayed>>()
        .at(api::WEBHOOK_TEST, attempts::test::<Webhooks>)
        .answers::<Success<Tested>>()
}
