//! Plumbing shared by every Postmesh service: configuration, the service list, the error
//! type mapped to the spec's status codes, typed ids and answers, Postgres/Redis/NATS setup,
//! typed RPCs and the clients built on them, JetStream streams and the outbox, routers built
//! from the contracts' route manifests, the start-up runtime and telemetry. What crosses a
//! process boundary (messages, ids, the RPC table, route manifests) is `postmesh-contracts`.

pub mod batch;
pub mod clients;
pub mod config;
pub mod cpu;
pub mod db;
pub mod dead_letters;
pub mod dns;
pub mod email;
pub mod error;
pub mod extract;
pub mod http_server;
pub mod jetstream;
pub mod lifecycle;
pub mod nats;
pub mod outside;
pub mod placement;
pub mod queue;
pub mod response;
pub mod routes;
pub mod runtime;
pub mod secrets;
pub mod telemetry;
pub mod text;
pub mod tls;
pub mod tracking;
pub mod tracking_hosts;

#[doc(hidden)]
pub use mimalloc;

/// Makes mimalloc the binary's allocator (call once, in `main.rs`): its per-thread free lists
/// cost a fraction of glibc malloc's locking and consolidation under many small tasks.
/// Every service but inbound-ingest uses it (docs/decisions.md, "Service kit").
#[macro_export]
macro_rules! fast_allocator {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::mimalloc::MiMalloc = $crate::mimalloc::MiMalloc;
    };
}

/// A service binary: the fast allocator and a `main` that starts `$krate` with its settings
/// from the environment and runs it until Ctrl-C or SIGTERM, then drains in-flight work.
#[macro_export]
macro_rules! service_main {
    ($krate:ident) => {
        $crate::fast_allocator!();

        #[tokio::main]
        async fn main() -> anyhow::Result<()> {
            $krate::start($krate::Config::from_env()?)
                .await?
                .until_signal()
                .await
        }
    };
}

// The contracts, where services meet them through the kit.
pub use postmesh_contracts::{ids, proto, rpc, service};
pub use postmesh_contracts::{
    AccountId, AddressId, ApiKeyId, DeliveryId, InboundMessageId, JobId, Method, Namespace, Policy,
    Rpc, Service, TaskId, ThreadId, WorkspaceId,
};

pub use config::Common;
pub use email::EmailAddress;
pub use error::ApiError;
pub use extract::IdempotencyKey;
pub use lifecycle::Running;
pub use response::Success;
pub use routes::Routes;
pub use runtime::Runtime;
