//! The gateway's route table: every route of every service, from the owners' manifests,
//! with where it is served. The router (`routes`) and the API's document (`openapi`) both
//! read it.

use postmesh_contracts::RouteSpec;
use postmesh_shared::Service;

/// Where a route is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A handler in the gateway.
    Gateway,
    /// The service's own router, over NATS.
    Service(Service),
}

/// One row of the gateway's route table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub spec: RouteSpec,
    pub target: Target,
}

/// The whole route table: the gateway's own routes and every service's, from the manifests.
pub fn table() -> Vec<Entry> {
    Service::ALL
        .into_iter()
        .flat_map(|service| {
            let target = match service {
                Service::ApiGateway => Target::Gateway,
                other => Target::Service(other),
            };
            service
                .routes()
                .iter()
                .map(move |&spec| Entry { spec, target })
        })
        .collect()
}
