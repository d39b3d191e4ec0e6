//! Whose deliveries a route is about: an inbox endpoint's or a workspace webhook's. Below
//! the delivery stages (`deliver`) and the attempts' routes (`attempts`), which both use it.

use postmesh_shared::ApiError;

/// Whose deliveries a route is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// An inbox endpoint's (`/inbox/webhook/endpoints/{id}/...`).
    Endpoint,
    /// A workspace webhook's (`/webhooks/{id}/...`).
    Webhook,
}

impl Owner {
    /// Its table, and the attempts' column naming it.
    pub(crate) fn table(self) -> (&'static str, &'static str) {
        match self {
            Self::Endpoint => ("endpoints", "endpoint_id"),
            Self::Webhook => ("webhooks", "webhook_id"),
        }
    }

    /// The 404 of one that does not exist.
    pub(crate) fn not_found(self) -> ApiError {
        ApiError::NotFound(match self {
            Self::Endpoint => "no such endpoint".into(),
            Self::Webhook => "no such webhook".into(),
        })
    }
}
