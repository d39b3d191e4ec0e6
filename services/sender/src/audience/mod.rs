//! The audience: contacts (and their imports), saved audiences with their conditions, and
//! suppressions.

pub mod audiences;
pub mod contacts;
pub mod suppressions;

use postmesh_contracts::routes::sender as api;
use postmesh_shared::Routes;

use crate::AppState;

/// The routes of contacts, suppressions and audiences.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::CONTACTS, contacts::list)
        .at(api::CONTACT_UPSERT, contacts::create)
        .takes::<contacts::ContactInput>()
        // A JSON array of contacts or a CSV file: the body is left undescribed.
        .at(api::CONTACT_IMPORT, contacts::import)
        .at(api::CONTACT, contacts::read)
        .at(api::CONTACT_UPDATE, contacts::change)
        .at(api::CONTACT_DELETE, contacts::remove)
        .at(api::SUPPRESSIONS, suppressions::list)
        .at(api::SUPPRESSION_CREATE, suppressions::create)
        .at(api::SUPPRESSION_DELETE, suppressions::remove)
        .at(api::AUDIENCES, audiences::list)
        .at(api::AUDIENCE_CREATE, audiences::create)
        .at(api::AUDIENCE, audiences::read)
        .at(api::AUDIENCE_DELETE, audiences::remove)
}
