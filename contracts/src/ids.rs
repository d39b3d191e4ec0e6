//! Identifiers parsed once at the edge: a value of these types is always valid.

use std::fmt;

use uuid::Uuid;

/// Declares a uuid identifier type, stored as a Postgres `uuid`.
macro_rules! uuid_id {
    ($(#[$doc:meta] $name:ident),* $(,)?) => {$(
        #[$doc]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
                 serde::Serialize, serde::Deserialize)]
        #[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(transparent))]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A new time-ordered (v7) id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// Parses the textual form; `None` when it is not a uuid.
            pub fn parse(raw: &str) -> Option<Self> {
                Uuid::parse_str(raw).ok().map(Self)
            }

            /// The id as a uuid.
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> Self {
                Self(id)
            }
        }

        impl From<$name> for Uuid {
            fn from(id: $name) -> Uuid {
                id.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;

            fn from_str(raw: &str) -> Result<Self, uuid::Error> {
                Uuid::parse_str(raw).map(Self)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        /// A string of format `uuid`.
        #[cfg(feature = "utoipa")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                use utoipa::openapi::{KnownFormat, ObjectBuilder, SchemaFormat, schema::Type};
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
                    .into()
            }
        }

        #[cfg(feature = "utoipa")]
        impl utoipa::ToSchema for $name {}
    )*};
}

uuid_id! {
    /// An account: the person or team behind API keys.
    AccountId,
    /// An API key's id (not the secret key text).
    ApiKeyId,
    /// A job on a work queue: a SEND job carries up to 50 of a task's recipients.
    JobId,
    /// One recipient's message of a send (or one code email): its own lease, attempts and outcome.
    DeliveryId,
    /// A send request (`/send-email`): one task, one or more jobs.
    TaskId,
    /// The scope of API keys: plans and limits belong to a workspace.
    WorkspaceId,
    /// An inbox address that receives mail.
    AddressId,
    /// A conversation in one inbox.
    ThreadId,
    /// One stored copy of a received message (one per recipient inbox).
    InboundMessageId,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_only_uuids() {
        let id = JobId::new();
        assert_eq!(JobId::parse(&id.to_string()), Some(id));
        assert_eq!(ApiKeyId::parse("not-a-uuid"), None);
    }
}
