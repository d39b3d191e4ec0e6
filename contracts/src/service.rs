//! The Postmesh services: the six behind NATS (their names on NATS and in database names)
//! and the SMTP submission edge, with their default admin ports.

use std::fmt;

use crate::namespace::Namespace;

/// One Postmesh service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Service {
    ApiGateway,
    Billing,
    Sender,
    Domain,
    InboundIngest,
    WebhookDispatcher,
    /// The SMTP edge: a client of the gateway's HTTP API, with no database or NATS user.
    SmtpSubmission,
}

impl Service {
    /// Every service behind NATS, in start order (services before the gateway that forwards
    /// to them); the SMTP edge, a client of the gateway, is not one of them.
    pub const ALL: [Service; 6] = [
        Service::Billing,
        Service::Sender,
        Service::Domain,
        Service::InboundIngest,
        Service::WebhookDispatcher,
        Service::ApiGateway,
    ];

    /// The services that consume streams, and so keep dead letters (`shared::dead_letters`).
    pub const CONSUMERS: [Service; 2] = [Service::Sender, Service::WebhookDispatcher];

    /// The service's name: its binary, its NATS subjects and its database name.
    pub const fn name(self) -> &'static str {
        match self {
            Service::ApiGateway => "api-gateway",
            Service::Billing => "billing",
            Service::Sender => "sender",
            Service::Domain => "domain",
            Service::InboundIngest => "inbound-ingest",
            Service::WebhookDispatcher => "webhook-dispatcher",
            Service::SmtpSubmission => "smtp-submission",
        }
    }

    /// The default port of its admin server (`/healthz`, `/readyz`, `/metrics`).
    pub const fn admin_port(self) -> u16 {
        match self {
            Service::ApiGateway => 9090,
            Service::Billing => 9091,
            Service::Sender => 9092,
            Service::Domain => 9093,
            Service::InboundIngest => 9094,
            Service::WebhookDispatcher => 9095,
            Service::SmtpSubmission => 9096,
        }
    }

    /// `{ns}_{name}`: the Postgres database the service owns (dashes become `_`).
    pub fn database(self, ns: &Namespace) -> String {
        format!("{}_{}", ns.as_str(), self.name().replace('-', "_"))
    }

    /// `{ns}.svc.{name}.http`: where the gateway forwards the service's HTTP routes.
    pub fn http_subject(self, ns: &Namespace) -> String {
        ns.subject(&format!("svc.{}.http", self.name()))
    }

    /// `{ns}.rpc.{name}.{method}`: the subject of one of its typed RPCs.
    pub fn rpc_subject(self, ns: &Namespace, method: &str) -> String {
        ns.subject(&format!("rpc.{}.{method}", self.name()))
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_ports_and_databases_are_distinct() {
        let ns = Namespace::parse("t_42").unwrap();
        let names: std::collections::HashSet<_> = Service::ALL.iter().map(|s| s.name()).collect();
        let ports: std::collections::HashSet<_> =
            Service::ALL.iter().map(|s| s.admin_port()).collect();
        assert_eq!((names.len(), ports.len()), (6, 6));
        assert!(!names.contains(Service::SmtpSubmission.name()));
        assert!(!ports.contains(&Service::SmtpSubmission.admin_port()));
        assert_eq!(Service::ApiGateway.database(&ns), "t_42_api_gateway");
        assert_eq!(
            Service::Billing.rpc_subject(&ns, "charge"),
            "t_42.rpc.billing.charge"
        );
        assert_eq!(
            Service::InboundIngest.http_subject(&ns),
            "t_42.svc.inbound-ingest.http"
        );
    }
}
