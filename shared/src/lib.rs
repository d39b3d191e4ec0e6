//! Plumbing shared by every Postmesh service: configuration, the error type mapped to the
//! spec's status codes, Postgres/Redis/NATS setup, telemetry, and the protobuf contracts.

pub mod config;
pub mod db;
pub mod email;
pub mod error;
pub mod extract;
pub mod jetstream;
pub mod lifecycle;
pub mod nats;
pub mod telemetry;

/// Messages compiled from `proto/` (package `postmesh.v1`).
pub mod proto {
    #![allow(missing_docs, clippy::doc_lazy_continuation)]
    include!(concat!(env!("OUT_DIR"), "/postmesh.v1.rs"));
}

pub use config::{Common, Namespace};
pub use email::EmailAddress;
pub use error::ApiError;
pub use lifecycle::Running;
