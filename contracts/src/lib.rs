//! What crosses a Postmesh process boundary, and nothing else: the protobuf messages, typed
//! ids, the namespace, the service list, the RPC table and each service's HTTP route
//! manifest. Services, the gateway and the CLI share it; it pulls in no web framework,
//! database driver or telemetry.

pub mod answers;
pub mod ids;
mod names;
pub mod namespace;
pub mod routes;
pub mod rpc;
pub mod service;

/// Messages compiled from `proto/` (package `postmesh.v1`).
pub mod proto {
    #![allow(missing_docs, clippy::doc_lazy_continuation)]
    include!(concat!(env!("OUT_DIR"), "/postmesh.v1.rs"));
}

pub use ids::{
    AccountId, AddressId, ApiKeyId, DeliveryId, InboundMessageId, JobId, TaskId, ThreadId,
    WorkspaceId,
};
pub use namespace::Namespace;
pub use routes::{HttpMethod, Policy, RouteSpec};
pub use rpc::{Method, Rpc};
pub use service::Service;
