//! Sending: a send request parsed and checked (`request`, `governance`), charged and
//! stored as tasks (`send`, `settle`, `tasks`), scheduled (`schedule`), rendered from
//! templates (`templates`, `render`), campaigns, the ledger of each message's delivery
//! events (`events`) and what a task's status shows (`status`).

pub mod campaigns;
pub mod events;
pub mod governance;
pub mod render;
pub mod request;
pub mod schedule;
pub mod send;
pub mod settle;
pub mod smtp_auth;
pub mod status;
pub mod tasks;
pub mod templates;
pub mod usage;

use postmesh_contracts::routes::sender as api;
use postmesh_shared::extract::PageQuery;
use postmesh_shared::{Routes, Success};

use crate::AppState;

/// The routes of sending, templates, campaigns and SMTP credential checks.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::SEND_EMAIL, send::send)
        .takes::<request::SendBody>()
        .answers::<Success<send::SendAnswer>>()
        .at(api::SEND_CANCEL, send::cancel)
        .answers::<Success<send::Cancelled>>()
        .at(api::EMAIL_STATUS, status::status)
        .query::<status::Page>()
        .answers::<Success<status::TaskProgress>>()
        .at(api::TEMPLATE_CREATE, templates::create)
        .takes::<templates::NewTemplate>()
        .answers::<Success<templates::Template>>()
        .at(api::TEMPLATES, templates::list)
        .query::<PageQuery>()
        .answers::<Success<templates::TemplateList>>()
        .at(api::TEMPLATE, templates::read)
        .query::<templates::VersionQuery>()
        .answers::<Success<templates::Template>>()
        .at(api::TEMPLATE_DELETE, templates::remove)
        .answers::<Success<templates::Deleted>>()
        .at(api::SMTP_AUTH, smtp_auth::check)
        .takes::<smtp_auth::Body>()
        .answers::<smtp_auth::SmtpAuth>()
        .at(api::CAMPAIGNS, campaigns::list)
        .query::<PageQuery>()
        .answers::<Success<campaigns::CampaignList>>()
        .at(api::CAMPAIGN_CREATE, campaigns::create)
        .takes::<campaigns::NewCampaign>()
        .answers::<Success<campaigns::One>>()
        .at(api::CAMPAIGN, campaigns::read)
        .answers::<Success<campaigns::One>>()
}
