//! Plumbing shared by every Postmesh service: configuration, the service list, the error
//! type mapped to the spec's status codes, typed ids and answers, Postgres/Redis/NATS setup,
//! typed RPCs and the clients built on them, JetStream streams and the outbox, routes with
//! their auth policy, the start-up runtime, telemetry, and the protobuf contracts.

pub mod clients;
pub mod config;
pub mod db;
pub mod email;
pub mod error;
pub mod extract;
pub mod ids;
pub mod jetstream;
pub mod lifecycle;
pub mod nats;
pub mod response;
pub mod routes;
pub mod rpc;
pub mod runtime;
pub mod service;
pub mod ses;
pub mod telemetry;
pub mod tls;

/// Messages compiled from `proto/` (package `postmesh.v1`).
pub mod proto {
    #![allow(missing_docs, clippy::doc_lazy_continuation)]
    include!(concat!(env!("OUT_DIR"), "/postmesh.v1.rs"));
}

pub use config::{Common, Namespace};
pub use email::EmailAddress;
pub use error::ApiError;
pub use ids::{ApiKeyId, IdempotencyKey, JobId, TaskId, WorkspaceId};
pub use lifecycle::Running;
pub use response::Success;
pub use routes::{Policy, Routes};
pub use rpc::{Method, Rpc};
pub use runtime::Runtime;
pub use service::Service;
