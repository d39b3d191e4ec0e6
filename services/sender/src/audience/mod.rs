//! The audience: contacts (and their imports), saved audiences with their conditions, and
//! suppressions.

pub mod audiences;
pub mod contacts;
pub mod suppressions;

use postmesh_contracts::routes::sender as api;
use postmesh_shared::extract::PageQuery;
use postmesh_shared::{Routes, Success};

use crate::AppState;

/// The routes of contacts, suppressions and audiences.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::CONTACTS, contacts::list)
        .query::<contacts::ListQuery>()
        .answers::<Success<contacts::ContactPage>>()
        .at(api::CONTACT_UPSERT, contacts::create)
        .takes::<contacts::ContactInput>()
        .answers::<Success<contacts::Upserted>>()
        // A JSON array of contacts or a CSV file: the body is left undescribed.
        .at(api::CONTACT_IMPORT, contacts::import)
        .answers::<Success<contacts::Imported>>()
        .at(api::CONTACT, contacts::read)
        .answers::<Success<contacts::One>>()
        .at(api::CONTACT_UPDATE, contacts::change)
        .takes::<contacts::ContactBody>()
        .answers::<Success<contacts::One>>()
        .at(api::CONTACT_DELETE, contacts::remove)
        .answers::<Success<contacts::Deleted>>()
        .at(api::SUPPRESSIONS, suppressions::list)
        .query::<suppressions::ListQuery>()
        .answers::<Success<suppressions::SuppressionPage>>()
        .at(api::SUPPRESSION_CREATE, suppressions::create)
        .takes::<suppressions::NewSuppression>()
        .answers::<Success<suppressions::Added>>()
        .at(api::SUPPRESSION_DELETE, suppressions::remove)
        .query::<suppressions::TopicQuery>()
        .answers::<Success<suppressions::Removed>>()
        .at(api::AUDIENCES, audiences::list)
        .query::<PageQuery>()
        .answers::<Success<audiences::AudienceList>>()
        .at(api::AUDIENCE_CREATE, audiences::create)
        .takes::<audiences::NewAudience>()
        .answers::<Success<audiences::One>>()
        .at(api::AUDIENCE, audiences::read)
        .answers::<Success<audiences::One>>()
        .at(api::AUDIENCE_DELETE, audiences::remove)
        .answers::<Success<audiences::Deleted>>()
}
