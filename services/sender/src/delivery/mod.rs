//! Delivery: the SEND queue's workers putting each task's message through the transport
//! (`worker`, `transport`), the provider's notifications about it (`provider`) and the
//! recipient's one-click unsubscribe (`unsubscribe`), and the sandbox addresses that never
//! reach a transport (`sandbox`).

pub mod provider;
pub mod sandbox;
pub mod transport;
pub mod unsubscribe;
pub mod worker;

use postmesh_contracts::routes::sender as api;
use postmesh_shared::Routes;

use crate::AppState;

/// The routes the outside reaches about delivered mail: unsubscribe pages and provider
/// notifications.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        // Both answer HTML pages; the token may also come in a form or the query.
        .at(api::UNSUBSCRIBE_PAGE, unsubscribe::confirm_page)
        .at(api::UNSUBSCRIBE, unsubscribe::unsubscribe)
        .takes_optional::<unsubscribe::TokenQuery>()
        // SNS posts its envelope as JSON or as text/plain.
        .at(api::PROVIDER_EVENTS, provider::receive)
}
