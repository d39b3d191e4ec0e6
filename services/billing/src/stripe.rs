//! The payment processor: Stripe's REST API (form-encoded requests, bearer secret key,
//! `Idempotency-Key` on creates) behind the small [`PaymentProvider`] trait, and the
//! `Stripe-Signature` check of its webhooks.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::BoxFuture;
use hmac::{Hmac, Mac};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use sha2::Sha256;

use postmesh_contracts::answers::billing::SubscriptionStatus;
use postmesh_shared::db::now_micros;
use postmesh_shared::{outside, ApiError};

/// How far a webhook's signed timestamp may be from our clock (Stripe's default tolerance).
pub const SIGNATURE_TOLERANCE_SECS: i64 = 300;

/// Why a Stripe call failed.
#[derive(Debug, thiserror::Error)]
pub enum StripeError {
    /// Stripe could not be reached, timed out, rate-limited us or failed on its side: retry later.
    #[error("payment processor unavailable: {0}")]
    Unavailable(String),
    /// Stripe refused the request (a 4xx other than 429), with its error type and message.
    #[error("payment processor refused the request ({status} {kind}): {message}")]
    Rejected {
        status: u16,
        kind: String,
        message: String,
    },
}

impl From<StripeError> for ApiError {
    fn from(e: StripeError) -> Self {
        match e {
            StripeError::Unavailable(_) => {
                tracing::warn!(error = %e, "stripe unavailable");
                ApiError::Unavailable(
                    "the payment processor cannot be reached now; retry later".into(),
                )
            }
            StripeError::Rejected { .. } => {
                tracing::error!(error = %e, "stripe rejected a request");
                ApiError::BadGateway("the payment processor refused the request".into())
            }
        }
    }
}

/// What a Checkout Session is for (`mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A one-time payment (top-ups).
    Payment,
    /// A recurring plan.
    Subscription,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Payment => "payment",
            Self::Subscription => "subscription",
        }
    }
}

/// The one line item of a checkout.
#[derive(Clone, Debug)]
pub enum LineItem {
    /// An ad-hoc price: `amount` minor units of `currency` for `name`.
    Custom {
        name: String,
        amount: i64,
        currency: String,
    },
    /// A recurring price configured in Stripe.
    Price(String),
}

/// The parameters of a new Checkout Session.
#[derive(Clone, Debug)]
pub struct NewCheckoutSession {
    pub mode: Mode,
    pub line_item: LineItem,
    pub client_reference_id: String,
    pub metadata: Vec<(&'static str, String)>,
    /// `subscription_data[metadata]` (subscription mode only).
    pub subscription_metadata: Vec<(&'static str, String)>,
    /// An existing Stripe customer to attach the checkout to.
    pub customer: Option<String>,
    pub success_url: String,
    pub cancel_url: String,
}

impl NewCheckoutSession {
    /// The form fields, as Stripe's bracket notation spells them.
    pub fn form(&self) -> Vec<(String, String)> {
        let mut form = vec![
            ("mode".to_owned(), self.mode.as_str().to_owned()),
            (
                "client_reference_id".to_owned(),
                self.client_reference_id.clone(),
            ),
            ("success_url".to_owned(), self.success_url.clone()),
            ("cancel_url".to_owned(), self.cancel_url.clone()),
            ("line_items[0][quantity]".to_owned(), "1".to_owned()),
        ];
        match &self.line_item {
            LineItem::Custom {
                name,
                amount,
                currency,
            } => form.extend([
                (
                    "line_items[0][price_data][currency]".to_owned(),
                    currency.clone(),
                ),
                (
                    "line_items[0][price_data][unit_amount]".to_owned(),
                    amount.to_string(),
                ),
                (
                    "line_items[0][price_data][product_data][name]".to_owned(),
                    name.clone(),
                ),
            ]),
            LineItem::Price(price) => form.push(("line_items[0][price]".to_owned(), price.clone())),
        }
        for (k, v) in &self.metadata {
            form.push((format!("metadata[{k}]"), v.clone()));
        }
        for (k, v) in &self.subscription_metadata {
            form.push((format!("subscription_data[metadata][{k}]"), v.clone()));
        }
        if let Some(customer) = &self.customer {
            form.push(("customer".to_owned(), customer.clone()));
        }
        form
    }
}

/// A Checkout Session, as much of it as billing reads.
#[derive(Clone, Debug, Deserialize)]
pub struct CheckoutSession {
    pub id: String,
    pub url: Option<String>,
    /// `open`, `complete` or `expired`.
    pub status: Option<String>,
    /// `paid`, `unpaid` or `no_payment_required`.
    pub payment_status: String,
    pub mode: String,
    pub client_reference_id: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    pub amount_total: Option<i64>,
    pub currency: Option<String>,
    pub subscription: Option<String>,
    pub customer: Option<String>,
    /// The payment (mode `payment`, once confirmed), which refunds and disputes name.
    #[serde(default)]
    pub payment_intent: Option<String>,
}

impl CheckoutSession {
    /// Whether the money has arrived.
    pub fn is_paid(&self) -> bool {
        matches!(self.payment_status.as_str(), "paid" | "no_payment_required")
    }

    /// Whether the session ran out unpaid.
    pub fn is_expired(&self) -> bool {
        self.status.as_deref() == Some("expired")
    }
}

/// A Stripe list (`{object: "list", data: [...]}`).
#[derive(Clone, Debug, Deserialize)]
pub struct List<T> {
    pub data: Vec<T>,
}

/// A price, by id.
#[derive(Clone, Debug, Deserialize)]
pub struct Price {
    pub id: String,
}

/// One item of a subscription.
#[derive(Clone, Debug, Deserialize)]
pub struct SubscriptionItem {
    pub price: Price,
    pub current_period_start: Option<i64>,
    pub current_period_end: Option<i64>,
}

/// A subscription, as much of it as billing reads.
#[derive(Clone, Debug, Deserialize)]
pub struct Subscription {
    pub id: String,
    pub customer: String,
    pub status: SubscriptionStatus,
    pub cancel_at_period_end: bool,
    pub current_period_start: Option<i64>,
    pub current_period_end: Option<i64>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    pub items: List<SubscriptionItem>,
    /// When billing asked Stripe for it, in µs since the epoch (0 when read from an event).
    #[serde(skip)]
    pub asked_at: i64,
}

impl Subscription {
    /// The current period: on the subscription in older API versions, on its items since
    /// 2025-03-31.
    pub fn period(&self) -> (i64, i64) {
        let item = self.items.data.first();
        let start = self
            .current_period_start
            .or_else(|| item.and_then(|i| i.current_period_start));
        let end = self
            .current_period_end
            .or_else(|| item.and_then(|i| i.current_period_end));
        (start.unwrap_or(0), end.unwrap_or(0))
    }

    /// The price of its first item.
    pub fn price_id(&self) -> Option<&str> {
        self.items.data.first().map(|i| i.price.id.as_str())
    }
}

/// A Billing Portal session.
#[derive(Clone, Debug, Deserialize)]
pub struct PortalSession {
    pub url: String,
}

/// What billing asks of the payment processor.
pub trait PaymentProvider: Send + Sync {
    /// Creates a Checkout Session; the same `idempotency_key` returns the same session.
    fn create_checkout_session<'a>(
        &'a self, params: &'a NewCheckoutSession, idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<CheckoutSession, StripeError>>;

    /// Retrieves a Checkout Session.
    fn checkout_session<'a>(
        &'a self, id: &'a str,
    ) -> BoxFuture<'a, Result<CheckoutSession, StripeError>>;

    /// Expires an open Checkout Session, so it can no longer be paid (an error when it is
    /// not open).
    fn expire_checkout_session<'a>(
        &'a self, id: &'a str,
    ) -> BoxFuture<'a, Result<CheckoutSession, StripeError>>;

    /// Retrieves a subscription.
    fn subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Subscription, StripeError>>;

    /// Creates a Billing Portal session for `customer`.
    fn create_portal_session<'a>(
        &'a self, customer: &'a str, return_url: &'a str,
    ) -> BoxFuture<'a, Result<PortalSession, StripeError>>;
}

/// Stripe's error body: `{error: {type, message}}`.
#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    message: String,
}

/// Stripe's REST API over HTTPS.
pub struct StripeClient {
    http: reqwest::Client,
    base: String,
    secret_key: String,
}

impl StripeClient {
    /// A client of the API at `base` (`https://api.stripe.com`) with `secret_key`; each call
    /// gives up after `timeout`.
    pub fn new(base: &str, secret_key: &str, timeout: Duration) -> anyhow::Result<Self> {
        let agent = concat!("postmesh-billing/", env!("CARGO_PKG_VERSION"));
        Ok(Self {
            http: outside::http_client(agent, timeout)?,
            base: base.trim_end_matches('/').to_owned(),
            secret_key: secret_key.to_owned(),
        })
    }

    async fn send<T: DeserializeOwned>(
        &self, req: reqwest::RequestBuilder,
    ) -> Result<T, StripeError> {
        let reply = outside::exchange(req.bearer_auth(&self.secret_key))
            .await
            .map_err(StripeError::Unavailable)?;
        let (status, body) = (reply.status, reply.body);
        if status.is_success() {
            return serde_json::from_slice(&body)
                .map_err(|e| StripeError::Unavailable(format!("unreadable answer: {e}")));
        }
        let detail = serde_json::from_slice::<ErrorEnvelope>(&body).map(|e| e.error);
        let (kind, message) = match detail {
            Ok(d) => (d.kind, d.message),
            Err(_) => (
                "unknown".into(),
                String::from_utf8_lossy(&body).into_owned(),
            ),
        };
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            Err(StripeError::Unavailable(format!(
                "{status} {kind}: {message}"
            )))
        } else {
            Err(StripeError::Rejected {
                status: status.as_u16(),
                kind,
                message,
            })
        }
    }

    /// A GET of `path` under the API base.
    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.get(format!("{}{path}", self.base))
    }

    /// A POST to `path` under the API base.
    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.post(format!("{}{path}", self.base))
    }
}

impl PaymentProvider for StripeClient {
    fn create_checkout_session<'a>(
        &'a self, params: &'a NewCheckoutSession, idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<CheckoutSession, StripeError>> {
        let req = self
            .post("/v1/checkout/sessions")
            .header("Idempotency-Key", idempotency_key);
        Box::pin(self.send(req.form(&params.form())))
    }

    fn checkout_session<'a>(
        &'a self, id: &'a str,
    ) -> BoxFuture<'a, Result<CheckoutSession, StripeError>> {
        Box::pin(self.send(self.get(&format!("/v1/checkout/sessions/{id}"))))
    }

    fn expire_checkout_session<'a>(
        &'a self, id: &'a str,
    ) -> BoxFuture<'a, Result<CheckoutSession, StripeError>> {
        let req = self.post(&format!("/v1/checkout/sessions/{id}/expire"));
        Box::pin(self.send(req.form(&[] as &[(&str, &str)])))
    }

    fn subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Subscription, StripeError>> {
        Box::pin(async move {
            let asked_at = now_micros();
            let mut sub: Subscription = self
                .send(self.get(&format!("/v1/subscriptions/{id}")))
                .await?;
            sub.asked_at = asked_at;
            Ok(sub)
        })
    }

    fn create_portal_session<'a>(
        &'a self, customer: &'a str, return_url: &'a str,
    ) -> BoxFuture<'a, Result<PortalSession, StripeError>> {
        let form = [("customer", customer), ("return_url", return_url)];
        Box::pin(self.send(self.post("/v1/billing_portal/sessions").form(&form)))
    }
}

/// Why a webhook's `Stripe-Signature` was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("Stripe-Signature header missing or malformed")]
    Malformed,
    #[error("webhook timestamp outside the tolerance")]
    Stale,
    #[error("no signature matches the payload")]
    Mismatch,
}

/// Checks `header` (`t=<unix>,v1=<hex>[,v1=...]`) against `payload` signed with `secret`:
/// HMAC-SHA256 of `"{t}.{payload}"`, compared in constant time, `t` within the tolerance of `now`.
pub fn verify_signature(
    header: &str, payload: &[u8], secret: &str, now: i64,
) -> Result<(), SignatureError> {
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", sig)) => {
                signatures.push(hex::decode(sig).map_err(|_| SignatureError::Malformed)?)
            }
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::Malformed);
    }
    // `abs_diff`: a timestamp near i64::MIN must not overflow the subtraction.
    if now.abs_diff(timestamp) > SIGNATURE_TOLERANCE_SECS.unsigned_abs() {
        return Err(SignatureError::Stale);
    }
    let signed = signer(secret, timestamp, payload);
    // `verify_slice` compares in constant time.
    if signatures
        .iter()
        .any(|sig| signed.clone().verify_slice(sig).is_ok())
    {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The HMAC over `"{timestamp}.{payload}"`, ready to finalize or verify.
fn signer(secret: &str, timestamp: i64, payload: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    mac
}

/// The `Stripe-Signature` header value Stripe would send for `payload` at `timestamp`.
pub fn sign(secret: &str, timestamp: i64, payload: &[u8]) -> String {
    let sig = signer(secret, timestamp, payload).finalize().into_bytes();
    format!("t={timestamp},v1={}", hex::encode(sig))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_test_secret";

    #[test]
    fn signatures_are_checked_for_payload_secret_and_time() {
        let body = br#"{"id":"evt_1"}"#;
        let now = 1_700_000_000;
        let header = sign(SECRET, now, body);
        assert_eq!(verify_signature(&header, body, SECRET, now + 10), Ok(()));
        // Another signature first (rolled secret) still matches on the second.
        let rolled = format!(
            "t={now},v1={},{}",
            "00".repeat(32),
            &header[header.find("v1").unwrap()..]
        );
        assert_eq!(verify_signature(&rolled, body, SECRET, now), Ok(()));
        assert_eq!(
            verify_signature(&header, br#"{"id":"evt_2"}"#, SECRET, now),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(&header, body, "whsec_other", now),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(&header, body, SECRET, now + SIGNATURE_TOLERANCE_SECS + 1),
            Err(SignatureError::Stale)
        );
        for far in [i64::MIN, i64::MAX] {
            let stale = format!("t={far},v1={}", "00".repeat(32));
            assert_eq!(
                verify_signature(&stale, body, SECRET, now),
                Err(SignatureError::Stale),
                "{far}"
            );
        }
        for bad in [
            "",
            "t=abc,v1=00",
            "v1=00",
            &format!("t={now}"),
            &format!("t={now},v1=zz"),
        ] {
            assert_eq!(
                verify_signature(bad, body, SECRET, now),
                Err(SignatureError::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn checkout_forms_use_stripe_bracket_notation() {
        let form = NewCheckoutSession {
            mode: Mode::Subscription,
            line_item: LineItem::Price("price_1".into()),
            client_reference_id: "c1".into(),
            metadata: vec![("checkout_id", "c1".into())],
            subscription_metadata: vec![("workspace_id", "w1".into())],
            customer: None,
            success_url: "https://x/s".into(),
            cancel_url: "https://x/c".into(),
        }
        .form();
        let has = |k: &str, v: &str| form.iter().any(|(a, b)| a == k && b == v);
        assert!(has("mode", "subscription"));
        assert!(has("line_items[0][price]", "price_1"));
        assert!(has("metadata[checkout_id]", "c1"));
        assert!(has("subscription_data[metadata][workspace_id]", "w1"));
        assert!(!form.iter().any(|(k, _)| k == "customer"));
    }
}
