//! Each service's HTTP routes as the gateway must know them: method, path, who may call and
//! how large a body may be. The gateway builds its table from these manifests; each service
//! builds its router from them and its handlers, and refuses to start when the two disagree.

use crate::service::Service;

pub mod billing;
pub mod domain;
pub mod gateway;
pub mod sender;

/// Who may call a route; the gateway enforces it before anything else runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Anyone.
    Public,
    /// A bearer API key (`Authorization: Bearer <key>`).
    Key,
}

/// The HTTP methods routes are declared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl HttpMethod {
    /// Every method a route may be declared with.
    pub const ALL: [HttpMethod; 5] = [
        HttpMethod::Get,
        HttpMethod::Post,
        HttpMethod::Put,
        HttpMethod::Patch,
        HttpMethod::Delete,
    ];

    /// The method as it appears on the wire (`GET`).
    pub const fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Patch => "PATCH",
            HttpMethod::Delete => "DELETE",
        }
    }
}

/// One method on one path of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    pub method: HttpMethod,
    /// The path in axum's syntax (`/sender-domains/{id}`).
    pub path: &'static str,
    pub policy: Policy,
    /// The route's own largest request body in bytes; `None`: the gateway's default
    /// (`GATEWAY_BODY_LIMIT`).
    pub body_limit: Option<usize>,
}

/// A route under an API key with the default body limit.
pub(crate) const fn keyed(method: HttpMethod, path: &'static str) -> RouteSpec {
    RouteSpec {
        method,
        path,
        policy: Policy::Key,
        body_limit: None,
    }
}

/// A route anyone may call, with the default body limit.
pub(crate) const fn public(method: HttpMethod, path: &'static str) -> RouteSpec {
    RouteSpec {
        method,
        path,
        policy: Policy::Public,
        body_limit: None,
    }
}

impl Service {
    /// The HTTP routes the service serves (the gateway's own for [`Service::ApiGateway`]).
    pub const fn routes(self) -> &'static [RouteSpec] {
        match self {
            Service::ApiGateway => gateway::ROUTES,
            Service::Billing => billing::ROUTES,
            Service::Domain => domain::ROUTES,
            Service::Sender => sender::ROUTES,
            Service::InboundIngest | Service::WebhookDispatcher => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_method_and_path_is_declared_twice() {
        let mut seen = std::collections::HashSet::new();
        for service in Service::ALL {
            for r in service.routes() {
                assert!(
                    seen.insert((r.method, r.path)),
                    "{} {} is declared twice",
                    r.method.as_str(),
                    r.path
                );
            }
        }
        assert!(seen.contains(&(HttpMethod::Get, "/balance")));
        assert_eq!(sender::SEND_EMAIL.body_limit, Some(16 << 20));
    }
}
