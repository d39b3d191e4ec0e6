//! Typed RPCs: each request message names its service, method and reply type once, so a
//! call (`nats::call(&client, &ns, &req)`) cannot pair a request with the wrong method and
//! needs no annotation, and a server registers the request type it answers.

use prost::Message;

use crate::namespace::Namespace;
use crate::proto::{
    ChargeReply, ChargeRequest, ConfirmReply, ConfirmRequest, DeadLettersReply, DeadLettersRequest,
    EntitlementsReply, EntitlementsRequest, GrantReply, GrantRequest, InboundDomainReply,
    InboundDomainRequest, InboundMessageReply, InboundMessageRequest, InboxAddressReply,
    InboxAddressRequest, OverviewReply, OverviewRequest, RefundReply, RefundRequest,
    RequeueDeadLetterReply, RequeueDeadLetterRequest, SendableReply, SendableRequest, UsageReply,
    UsageRequest,
};
use crate::service::Service;

/// A request message of an RPC method on `{ns}.rpc.{service}.{method}`.
pub trait Method: Message + Default + Send + Sync + 'static {
    /// The method name in its subject.
    const METHOD: &'static str;
    /// What a successful call returns.
    type Reply: Message + Default + Send + 'static;
}

/// A method one service answers: a call needs no service named.
pub trait Rpc: Method {
    /// The service that answers it.
    const SERVICE: Service;

    /// The subject the request travels on.
    fn rpc_subject(ns: &Namespace) -> String {
        Self::SERVICE.rpc_subject(ns, Self::METHOD)
    }
}

/// `service "method": Request => Reply;` rows of the RPC table; `* "method"` is a method
/// every owning service answers (`nats::call_on` names the service).
macro_rules! rpcs {
    ($($service:tt $method:literal: $req:ty => $reply:ty;)*) => {$(
        impl Method for $req {
            const METHOD: &'static str = $method;
            type Reply = $reply;
        }
        rpcs!(@owner $service $req);
    )*};
    (@owner * $req:ty) => {};
    (@owner $service:ident $req:ty) => {
        impl Rpc for $req {
            const SERVICE: Service = Service::$service;
        }
    };
}

// Every RPC of the system (proto/postmesh/v1 holds the messages).
rpcs! {
    Billing "charge": ChargeRequest => ChargeReply;
    Billing "refund": RefundRequest => RefundReply;
    Billing "confirm": ConfirmRequest => ConfirmReply;
    Billing "grant": GrantRequest => GrantReply;
    Billing "entitlements": EntitlementsRequest => EntitlementsReply;
    Domain "sendable": SendableRequest => SendableReply;
    Domain "inbound_domain": InboundDomainRequest => InboundDomainReply;
    InboundIngest "address": InboxAddressRequest => InboxAddressReply;
    InboundIngest "message": InboundMessageRequest => InboundMessageReply;
    * "usage": UsageRequest => UsageReply;
    * "overview": OverviewRequest => OverviewReply;
    * "dead_letters": DeadLettersRequest => DeadLettersReply;
    * "requeue_dead_letter": RequeueDeadLetterRequest => RequeueDeadLetterReply;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_knows_its_subject() {
        let ns = Namespace::parse("pm").unwrap();
        assert_eq!(ChargeRequest::rpc_subject(&ns), "pm.rpc.billing.charge");
        assert_eq!(RefundRequest::rpc_subject(&ns), "pm.rpc.billing.refund");
        assert_eq!(ConfirmRequest::rpc_subject(&ns), "pm.rpc.billing.confirm");
        assert_eq!(GrantRequest::rpc_subject(&ns), "pm.rpc.billing.grant");
        assert_eq!(
            EntitlementsRequest::rpc_subject(&ns),
            "pm.rpc.billing.entitlements"
        );
        assert_eq!(SendableRequest::rpc_subject(&ns), "pm.rpc.domain.sendable");
        assert_eq!(
            InboundDomainRequest::rpc_subject(&ns),
            "pm.rpc.domain.inbound_domain"
        );
        assert_eq!(
            InboxAddressRequest::rpc_subject(&ns),
            "pm.rpc.inbound-ingest.address"
        );
        assert_eq!(
            InboundMessageRequest::rpc_subject(&ns),
            "pm.rpc.inbound-ingest.message"
        );
        assert_eq!(
            Service::Domain.rpc_subject(&ns, UsageRequest::METHOD),
            "pm.rpc.domain.usage"
        );
    }
}
