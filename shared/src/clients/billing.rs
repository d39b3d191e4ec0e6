//! Billing as other services use it: charges (held until confirmed, or refunded), grants,
//! and the policy around them — a charge whose outcome is unknown is refunded or voided
//! before the error is returned, and a confirm or refund that billing does not answer is
//! retried in the background. Policy: docs/decisions.md, "Credits (billing)".

use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::error::ApiError;
use crate::nats;
use crate::proto::{
    ChargeReply, ChargeRequest, ConfirmRequest, GrantReply, GrantRequest, RefundRequest,
};
use crate::rpc::Rpc;
use crate::Namespace;

/// How long a held charge waits for its confirm before billing refunds it.
pub const HOLD: Duration = Duration::from_secs(60);
/// Pauses before the retries of a confirm or refund whose first attempt failed.
const SETTLE_RETRIES: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
];

/// The billing service's RPCs, with their failure policy.
#[derive(Clone)]
pub struct BillingClient {
    nats: async_nats::Client,
    ns: Namespace,
    /// Background retries run here, so a graceful stop waits for them.
    retries: TaskTracker,
}

impl BillingClient {
    /// A client on `nats` in namespace `ns`; background retries are tracked by `retries`.
    pub fn new(nats: async_nats::Client, ns: Namespace, retries: TaskTracker) -> Self {
        Self { nats, ns, retries }
    }

    /// Takes `req.cost` credits, once per idempotency key. When billing's answer is lost
    /// (timeout, bad reply: any 5xx) the charge may still commit later, so its key is
    /// refunded or voided before the error is returned.
    pub async fn charge(&self, req: ChargeRequest) -> Result<ChargeReply, ApiError> {
        match nats::call(&self.nats, &self.ns, &req).await {
            Err(e) if e.status().is_server_error() => {
                self.refund(
                    &req.api_key_id,
                    &req.idempotency_key,
                    "charge outcome unknown",
                )
                .await;
                Err(e)
            }
            other => other,
        }
    }

    /// Whether the balance covers `req.cost`, taking nothing (a dry run's charge): 402 when
    /// it does not.
    pub async fn covers(&self, mut req: ChargeRequest) -> Result<ChargeReply, ApiError> {
        req.dry_run = true;
        nats::call(&self.nats, &self.ns, &req).await
    }

    /// Takes `req.cost` credits held for [`HOLD`]: unless confirmed by then, billing gives
    /// them back, so a caller that dies before its paid work is queued costs nothing.
    pub async fn hold(&self, mut req: ChargeRequest) -> Result<HeldCharge, ApiError> {
        req.hold_secs = HOLD.as_secs() as i64;
        self.charge(req.clone()).await?;
        Ok(HeldCharge {
            client: self.clone(),
            api_key_id: req.api_key_id,
            key: req.idempotency_key,
        })
    }

    /// Adds credits, once per idempotency key.
    pub async fn grant(&self, req: &GrantRequest) -> Result<GrantReply, ApiError> {
        nats::call(&self.nats, &self.ns, req).await
    }

    /// Gives the charge `key` back, or voids the key if the charge has not happened yet.
    pub async fn refund(&self, api_key_id: &str, key: &str, reason: &str) {
        let req = RefundRequest {
            api_key_id: api_key_id.to_owned(),
            charge_idempotency_key: key.to_owned(),
            reason: reason.to_owned(),
            credits: 0,
        };
        self.settle(key, req).await;
    }

    /// Makes the held charge `key` final.
    pub async fn confirm(&self, api_key_id: &str, key: &str) {
        let req = ConfirmRequest {
            api_key_id: api_key_id.to_owned(),
            charge_idempotency_key: key.to_owned(),
        };
        self.settle(key, req).await;
    }

    /// Calls the idempotent RPC `req` about the charge `key`: the first attempt is awaited,
    /// retries after a failure go on in the background.
    async fn settle<R: Rpc + Clone>(&self, key: &str, req: R) {
        if self.attempt(key, &req).await {
            return;
        }
        let (client, key) = (self.clone(), key.to_owned());
        let retries = async move {
            for pause in SETTLE_RETRIES {
                tokio::time::sleep(pause).await;
                if client.attempt(&key, &req).await {
                    return;
                }
            }
            tracing::error!(charge = %key, method = R::METHOD, "billing call abandoned after retries");
        };
        self.retries
            .spawn(tracing::Instrument::in_current_span(retries));
    }

    async fn attempt<R: Rpc>(&self, key: &str, req: &R) -> bool {
        match nats::call(&self.nats, &self.ns, req).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, charge = %key, method = R::METHOD, "billing call failed");
                false
            }
        }
    }
}

/// A held charge: confirm it once the work it pays for is done or safely queued, or refund
/// it when that work cannot happen.
#[must_use = "a held charge is refunded unless confirmed"]
pub struct HeldCharge {
    client: BillingClient,
    api_key_id: String,
    key: String,
}

impl HeldCharge {
    /// Makes the charge final.
    pub async fn confirm(self) {
        self.client.confirm(&self.api_key_id, &self.key).await;
    }

    /// Gives the charge back.
    pub async fn refund(self, reason: &str) {
        self.client
            .refund(&self.api_key_id, &self.key, reason)
            .await;
    }
}
