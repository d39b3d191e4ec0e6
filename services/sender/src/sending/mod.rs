//! Sending: a send request parsed and checked (`request`, `governance`), charged and
//! stored as tasks (`send`, `settle`, `tasks`) once under its idempotency key (`keyed`), a
//! raw message from an SMTP relay (`raw`, `raw_mime`), scheduled (`schedule`), rendered from
//! templates (`templates`, `render`), tags and metadata (`tags`), open and click tracking
//! (`tracking`), campaigns, the ledger of each message's delivery
//! events (`events`), what a task's status shows (`status`) and the message log (`log`), its daily counts
//! (`stats`) and how
//! long it is kept (`retention`).

pub mod campaigns;
pub mod events;
pub mod governance;
pub mod keyed;
pub mod log;
pub mod raw;
pub mod raw_mime;
pub mod render;
pub mod request;
pub mod retention;
pub mod schedule;
pub mod send;
pub mod sendable;
pub mod settle;
pub mod smtp_auth;
pub mod stats;
pub mod status;
pub mod tags;
pub mod tasks;
pub mod templates;
pub mod tracking;
pub mod usage;

use postmesh_contracts::routes::sender as api;
use postmesh_shared::Routes;

use crate::AppState;

/// The routes of sending, templates, campaigns and SMTP credential checks.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::SEND_EMAIL, send::send)
        .at(api::SEND_CANCEL, send::cancel)
        .at(api::EMAIL_STATUS, status::status)
        .at(api::EMAILS, log::list)
        .at(api::EMAIL, log::read)
        .at(api::EMAIL_STATS, stats::stats)
        .at(api::TEMPLATE_CREATE, templates::create)
        .at(api::TEMPLATES, templates::list)
        .at(api::TEMPLATE, templates::read)
        .at(api::TEMPLATE_DELETE, templates::remove)
        .at(api::SMTP_AUTH, smtp_auth::check)
        .takes::<smtp_auth::Body>()
        .answers::<smtp_auth::SmtpAuth>()
        .at(api::SMTP_ENVELOPE, raw::envelope)
        .at(api::SEND_RAW, raw::send_raw)
        .at(api::CAMPAIGNS, campaigns::list)
        .at(api::CAMPAIGN_CREATE, campaigns::create)
        .at(api::CAMPAIGN, campaigns::read)
}
