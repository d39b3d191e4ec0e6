//! A local Stripe for tests, as strict as the real API on what billing sends: bearer secret
//! key, form-encoded bodies in Stripe's bracket notation, unknown parameters refused, prices
//! and customers that must exist, `Idempotency-Key` replays (and `idempotency_error` when a
//! key comes back with other parameters), Stripe's error body. Checkout Sessions, Billing
//! Portal sessions and Subscriptions; the test drives payments and sends signed webhooks.

use std::collections::{BTreeMap, HashMap};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rand::Rng;
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// The test secret key billing must present.
pub const SECRET_KEY: &str = "sk_test_postmesh_fake";
/// The webhook signing secret of the test endpoint.
pub const WEBHOOK_SECRET: &str = "whsec_postmesh_fake_secret";
/// Recurring prices the fake knows (those of `deploy/catalog.json`).
pub const PRICES: [&str; 2] = [
    "price_postmesh_starter_monthly",
    "price_postmesh_pro_monthly",
];
/// Length of a subscription period in the fake.
const PERIOD_SECS: i64 = 30 * 24 * 3600;

/// One request as the fake received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub idempotency_key: Option<String>,
    pub form: Vec<(String, String)>,
}

/// Parameters, status and answer of an idempotent request.
type Saved = (Vec<(String, String)>, StatusCode, Value);

/// What the fake holds.
#[derive(Default)]
pub struct Books {
    sessions: HashMap<String, Value>,
    /// `subscription_data[metadata]` of subscription-mode sessions.
    subscription_metadata: HashMap<String, Value>,
    subscriptions: HashMap<String, Value>,
    customers: Vec<String>,
    /// Idempotency key → the first request's parameters and answer.
    idempotent: HashMap<String, Saved>,
    requests: Vec<Recorded>,
    down: bool,
    /// How long creating a checkout session takes (Stripe answers in a few hundred ms).
    session_latency: std::time::Duration,
    /// The next subscription read's signal that it has been read, and its release.
    held_read: Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>,
}

/// A subscription read held back: `arrived` fires once it has read the subscription, and its
/// answer (the subscription as it was then) goes out when `release` is sent or dropped.
pub struct HeldRead {
    pub arrived: oneshot::Receiver<()>,
    pub release: oneshot::Sender<()>,
}

/// The fake: its `base` is billing's `STRIPE_API_BASE`.
pub type FakeStripe = crate::Fake<Books>;

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

fn random_id(prefix: &str) -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let tail: String = (0..24)
        .map(|_| CHARS[rng.gen_range(0..CHARS.len())] as char)
        .collect();
    format!("{prefix}_{tail}")
}

/// Stripe's error answer: a status and `{error: {type, message, param}}`.
struct Failure {
    status: StatusCode,
    body: Value,
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

fn stripe_error(status: StatusCode, kind: &str, message: &str, param: Option<&str>) -> Failure {
    let mut error = json!({ "type": kind, "message": message });
    if let Some(param) = param {
        error["param"] = json!(param);
    }
    Failure {
        status,
        body: json!({ "error": error }),
    }
}

fn invalid(message: &str, param: Option<&str>) -> Failure {
    stripe_error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        message,
        param,
    )
}

impl FakeStripe {
    /// Starts the fake on a free local port.
    pub async fn start() -> Self {
        Self::serve("", |fake| {
            Router::new()
                .route("/v1/checkout/sessions", post(create_session))
                .route("/v1/checkout/sessions/{id}", get(retrieve_session))
                .route("/v1/checkout/sessions/{id}/expire", post(expire_session))
                .route("/v1/subscriptions/{id}", get(retrieve_subscription))
                .route("/v1/billing_portal/sessions", post(create_portal_session))
                .fallback(|method: Method, uri: Uri| async move {
                    stripe_error(
                        StatusCode::NOT_FOUND,
                        "invalid_request_error",
                        &format!("Unrecognized request URL ({method}: {}).", uri.path()),
                        None,
                    )
                })
                .with_state(fake)
        })
        .await
    }

    /// Subscribes the workspace of `key` to `plan` as a buyer does: a subscription checkout,
    /// its session paid, the signed `checkout.session.completed` delivered.
    pub async fn subscribe(&self, stack: &crate::Stack, key: &str, plan: &str) {
        let idem = format!("subscribe_{}", uuid::Uuid::new_v4().simple());
        let opened: Value = stack
            .client(key)
            .with_header("idempotency-key", &idem)
            .post(
                "/billing/subscription/checkout",
                &json!({ "plan_id": plan }),
                StatusCode::OK,
            )
            .await;
        let session = self.session_by_url(opened["url"].as_str().expect("a checkout url"));
        let completed = self.complete(&session, true);
        assert_eq!(Self::deliver(&stack.base, &completed).await, StatusCode::OK);
    }

    /// Billing's Stripe settings pointing at this fake.
    pub fn config(&self) -> billing::StripeConfig {
        billing::StripeConfig {
            api_base: self.base.clone(),
            secret_key: Some(SECRET_KEY.into()),
            webhook_secret: Some(WEBHOOK_SECRET.into()),
        }
    }

    /// While down, every API call answers 500 `api_error`, as during a Stripe outage.
    pub fn set_down(&self, down: bool) {
        self.books().down = down;
    }

    /// Makes each checkout session's creation take `latency` before it is made.
    pub fn set_session_latency(&self, latency: std::time::Duration) {
        self.books().session_latency = latency;
    }

    /// Holds back the answer of the next subscription read, as a slow network would.
    pub fn hold_next_subscription_read(&self) -> HeldRead {
        let (arrived_tx, arrived) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        self.books().held_read = Some((arrived_tx, release_rx));
        HeldRead { arrived, release }
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.books().requests.clone()
    }

    /// The session `id` as Stripe holds it.
    pub fn session(&self, id: &str) -> Value {
        self.books().sessions[id].clone()
    }

    /// The subscription `id` as Stripe holds it.
    pub fn subscription(&self, id: &str) -> Value {
        self.books().subscriptions[id].clone()
    }

    /// The id of the session whose `url` is `url`.
    pub fn session_by_url(&self, url: &str) -> String {
        let books = self.books();
        books
            .sessions
            .values()
            .find(|s| s["url"] == url)
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .expect("a session with that url")
    }

    /// The buyer finishes checkout: paid (card) or awaiting an async payment (`paid` false).
    /// A subscription-mode session creates its customer and active subscription. Returns
    /// the `checkout.session.completed` event.
    pub fn complete(&self, session_id: &str, paid: bool) -> Value {
        let mut books = self.books();
        let books = &mut *books;
        let session = books.sessions.get_mut(session_id).expect("session exists");
        assert_eq!(session["status"], "open", "only an open session completes");
        session["status"] = json!("complete");
        session["payment_status"] = json!(if paid { "paid" } else { "unpaid" });
        if session["mode"] == "payment" {
            // The payment's intent exists once the buyer confirms; its charge is what
            // refunds and disputes name.
            session["payment_intent"] = json!(random_id("pi"));
        }
        if session["mode"] == "subscription" {
            let customer = match session["customer"].as_str() {
                Some(c) => c.to_owned(),
                None => {
                    let c = random_id("cus");
                    books.customers.push(c.clone());
                    c
                }
            };
            let sub_id = random_id("sub");
            let start = now();
            let metadata = books
                .subscription_metadata
                .get(session_id)
                .cloned()
                .unwrap_or(json!({}));
            // Since API version 2025-03-31 the period lives on the items.
            let sub = json!({
                "id": sub_id,
                "object": "subscription",
                "customer": customer,
                "status": "active",
                "cancel_at_period_end": false,
                "canceled_at": null,
                "created": start,
                "metadata": metadata,
                "items": { "object": "list", "data": [{
                    "id": random_id("si"),
                    "object": "subscription_item",
                    "price": { "id": session["price"].clone(), "object": "price" },
                    "quantity": 1,
                    "current_period_start": start,
                    "current_period_end": start + PERIOD_SECS,
                }]},
                "livemode": false,
            });
            session["customer"] = json!(customer);
            session["subscription"] = json!(sub_id);
            books.subscriptions.insert(sub_id, sub);
        }
        event("checkout.session.completed", public_session(session))
    }

    /// An async payment of a completed session settles. Returns its event.
    pub fn settle_async(&self, session_id: &str, succeeded: bool) -> Value {
        let mut books = self.books();
        let session = books.sessions.get_mut(session_id).expect("session exists");
        assert_eq!(session["status"], "complete");
        if succeeded {
            session["payment_status"] = json!("paid");
            event(
                "checkout.session.async_payment_succeeded",
                public_session(session),
            )
        } else {
            event(
                "checkout.session.async_payment_failed",
                public_session(session),
            )
        }
    }

    /// `amount` more cents of a paid session's charge are refunded (from the dashboard).
    /// Returns the `charge.refunded` event, its charge's `amount_refunded` the running total.
    pub fn refund(&self, session_id: &str, amount: i64) -> Value {
        let mut books = self.books();
        let session = books.sessions.get_mut(session_id).expect("session exists");
        assert_eq!(
            session["payment_status"], "paid",
            "only a paid session refunds"
        );
        // Stripe refuses it (`charge_disputed`) once the charge has been charged back.
        assert!(
            session.get("dispute").is_none(),
            "a disputed charge is not refunded"
        );
        let refunded = session["amount_refunded"].as_i64().unwrap_or(0) + amount;
        let total = session["amount_total"].as_i64().expect("an amount");
        assert!(refunded <= total, "a refund takes at most what was paid");
        session["amount_refunded"] = json!(refunded);
        let charge = json!({
            "id": charge_of(session),
            "object": "charge",
            "amount": total,
            "amount_captured": total,
            "amount_refunded": refunded,
            "currency": session["currency"].clone(),
            "paid": true,
            "payment_intent": session["payment_intent"].clone(),
            "refunded": refunded == total,
            "status": "succeeded",
            "livemode": false,
        });
        event("charge.refunded", charge)
    }

    /// The buyer's bank disputes `cents` of a paid session's charge (a chargeback), at most
    /// what was not refunded. Returns the `charge.dispute.created` event.
    pub fn dispute(&self, session_id: &str, cents: i64) -> Value {
        self.open_dispute(session_id, cents, "needs_response")
    }

    /// The buyer's bank asks about `cents` of a paid session's charge (an inquiry: no money
    /// moves yet). Returns the `charge.dispute.created` event, status
    /// `warning_needs_response`.
    pub fn inquiry(&self, session_id: &str, cents: i64) -> Value {
        self.open_dispute(session_id, cents, "warning_needs_response")
    }

    fn open_dispute(&self, session_id: &str, cents: i64, status: &str) -> Value {
        let mut books = self.books();
        let session = books.sessions.get_mut(session_id).expect("session exists");
        assert_eq!(
            session["payment_status"], "paid",
            "only a paid session is disputed"
        );
        assert!(
            session.get("dispute").is_none(),
            "a charge is disputed once"
        );
        let total = session["amount_total"].as_i64().expect("an amount");
        let refunded = session["amount_refunded"].as_i64().unwrap_or(0);
        assert!(
            (1..=total - refunded).contains(&cents),
            "a dispute takes at most what was paid and not refunded"
        );
        let dispute = json!({
            "id": random_id("dp"),
            "object": "dispute",
            "amount": cents,
            "charge": charge_of(session),
            "currency": session["currency"].clone(),
            "payment_intent": session["payment_intent"].clone(),
            "reason": "fraudulent",
            "status": status,
            "livemode": false,
        });
        session["dispute"] = dispute.clone();
        event("charge.dispute.created", dispute)
    }

    /// The seller wins a session's chargeback: its money comes back. Returns the
    /// `charge.dispute.funds_reinstated` and `charge.dispute.closed` events (status `won`).
    pub fn win_dispute(&self, session_id: &str) -> (Value, Value) {
        let mut books = self.books();
        let session = books.sessions.get_mut(session_id).expect("session exists");
        let dispute = &mut session["dispute"];
        assert_eq!(
            dispute["status"], "needs_response",
            "an open chargeback is won"
        );
        dispute["status"] = json!("won");
        (
            event("charge.dispute.funds_reinstated", dispute.clone()),
            event("charge.dispute.closed", dispute.clone()),
        )
    }

    /// The session runs out unpaid. Returns the `checkout.session.expired` event.
    pub fn expire(&self, session_id: &str) -> Value {
        let mut books = self.books();
        let session = books.sessions.get_mut(session_id).expect("session exists");
        assert_eq!(session["status"], "open", "only an open session expires");
        session["status"] = json!("expired");
        event("checkout.session.expired", public_session(session))
    }

    /// The customer sets the subscription to cancel at the end of its period (in the portal).
    /// Returns the `customer.subscription.updated` event.
    pub fn cancel_at_period_end(&self, sub_id: &str) -> Value {
        self.change_subscription(sub_id, |sub| {
            sub["cancel_at_period_end"] = json!(true);
            event("customer.subscription.updated", sub.clone())
        })
    }

    /// Applies `change` to subscription `sub_id`; its answer.
    fn change_subscription<T>(&self, sub_id: &str, change: impl FnOnce(&mut Value) -> T) -> T {
        let mut books = self.books();
        change(
            books
                .subscriptions
                .get_mut(sub_id)
                .expect("subscription exists"),
        )
    }

    /// The subscription ends. Returns the `customer.subscription.deleted` event.
    pub fn delete_subscription(&self, sub_id: &str) -> Value {
        self.change_subscription(sub_id, |sub| {
            sub["status"] = json!("canceled");
            sub["canceled_at"] = json!(now());
            event("customer.subscription.deleted", sub.clone())
        })
    }

    /// The next period is paid: the subscription's period moves on. Returns `invoice.paid`
    /// in the shape of API version 2025-03-31 (`parent.subscription_details`).
    pub fn renew(&self, sub_id: &str) -> Value {
        let (customer, end) = self.change_subscription(sub_id, |sub| {
            let item = &mut sub["items"]["data"][0];
            let end = item["current_period_end"].as_i64().unwrap();
            item["current_period_start"] = json!(end);
            item["current_period_end"] = json!(end + PERIOD_SECS);
            (sub["customer"].clone(), end)
        });
        event(
            "invoice.paid",
            json!({
                "id": random_id("in"),
                "object": "invoice",
                "status": "paid",
                "customer": customer,
                "parent": { "type": "subscription_details",
                            "subscription_details": { "subscription": sub_id } },
                "lines": { "object": "list", "data": [{
                    "period": { "start": end, "end": end + PERIOD_SECS }
                }]},
            }),
        )
    }

    /// Posts `event` to `url` signed as Stripe does (`secret`, timestamp `at`); the status.
    pub async fn deliver_signed(url: &str, event: &Value, secret: &str, at: i64) -> StatusCode {
        let client = crate::TestClient::http(url, None);
        Self::deliver_signed_to(&client, "", event, secret, at).await
    }

    /// Posts `event` to `path` of `client`, as Stripe does, signed with `secret` at `at`.
    async fn deliver_signed_to(
        client: &crate::TestClient, path: &str, event: &Value, secret: &str, at: i64,
    ) -> StatusCode {
        let body = serde_json::to_vec(event).expect("event JSON");
        client
            .clone()
            .with_header("content-type", "application/json; charset=utf-8")
            .with_header(
                "user-agent",
                "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
            )
            .with_header(
                "stripe-signature",
                &billing::stripe::sign(secret, at, &body),
            )
            .send(reqwest::Method::POST, path, Some(body))
            .await
            .status
    }

    /// Posts `event` to billing's webhook route of `client`, signed with the test secret now.
    pub async fn deliver_to(client: &crate::TestClient, event: &Value) -> StatusCode {
        Self::deliver_signed_to(
            client,
            "/billing/webhooks/stripe",
            event,
            WEBHOOK_SECRET,
            now(),
        )
        .await
    }

    /// Posts `event` to the gateway at `base`, signed with the test secret now.
    pub async fn deliver(base: &str, event: &Value) -> StatusCode {
        let url = format!("{base}/billing/webhooks/stripe");
        Self::deliver_signed(&url, event, WEBHOOK_SECRET, now()).await
    }
}

/// The session as the API shows it (without the fake's own bookkeeping fields).
fn public_session(session: &Value) -> Value {
    let mut s = session.clone();
    let fields = s.as_object_mut().expect("object");
    fields.remove("price");
    fields.remove("amount_refunded");
    s
}

/// The id of the charge of a session's payment intent.
fn charge_of(session: &Value) -> String {
    let intent = session["payment_intent"]
        .as_str()
        .expect("a payment intent");
    format!("ch_{}", intent.trim_start_matches("pi_"))
}

/// An event wrapping `object`.
fn event(kind: &str, object: Value) -> Value {
    json!({
        "id": random_id("evt"),
        "object": "event",
        "api_version": "2025-03-31.basil",
        "created": now(),
        "livemode": false,
        "pending_webhooks": 1,
        "request": { "id": null, "idempotency_key": null },
        "type": kind,
        "data": { "object": object },
    })
}

/// Checks the secret key, records the request and answers 500 while down.
fn admit(
    fake: &FakeStripe, method: &str, path: &str, headers: &HeaderMap, form: Vec<(String, String)>,
) -> Result<(), Failure> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if auth != format!("Bearer {SECRET_KEY}") {
        return Err(stripe_error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Invalid API Key provided.",
            None,
        ));
    }
    let mut books = fake.books();
    books.requests.push(Recorded {
        method: method.into(),
        path: path.into(),
        idempotency_key: headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        form,
    });
    if books.down {
        return Err(stripe_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            "An unknown error occurred",
            None,
        ));
    }
    Ok(())
}

/// Parses a form body; anything but `application/x-www-form-urlencoded` is refused.
fn form(headers: &HeaderMap, body: &Bytes) -> Result<Vec<(String, String)>, Failure> {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !content_type.starts_with("application/x-www-form-urlencoded") {
        return Err(invalid(
            "Stripe's API takes form-encoded bodies (application/x-www-form-urlencoded).",
            None,
        ));
    }
    serde_urlencoded::from_bytes(body).map_err(|_| invalid("Invalid request body.", None))
}

/// A POST's form, admitted as [`admit`] admits requests.
fn admit_post(
    fake: &FakeStripe, path: &str, headers: &HeaderMap, body: &Bytes,
) -> Result<Vec<(String, String)>, Failure> {
    let params = form(headers, body)?;
    admit(fake, "POST", path, headers, params.clone())?;
    Ok(params)
}

/// Replays an idempotent answer, or refuses a key reused with other parameters.
fn replay(fake: &FakeStripe, key: Option<&str>, params: &[(String, String)]) -> Option<Response> {
    let key = key?;
    let books = fake.books();
    let (earlier, status, answer) = books.idempotent.get(key)?;
    if earlier.as_slice() != params {
        return Some(stripe_error(
            StatusCode::BAD_REQUEST,
            "idempotency_error",
            &format!("Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '{key}' if you meant to execute a different request."),
            None,
        )
        .into_response());
    }
    let mut res = (*status, Json(answer.clone())).into_response();
    res.headers_mut()
        .insert("idempotent-replayed", "true".parse().unwrap());
    Some(res)
}

async fn create_session(
    State(fake): State<FakeStripe>, headers: HeaderMap, body: Bytes,
) -> Result<Response, Failure> {
    let params = admit_post(&fake, "/v1/checkout/sessions", &headers, &body)?;
    let latency = fake.books().session_latency;
    tokio::time::sleep(latency).await;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if key.as_ref().is_some_and(|k| k.len() > 255) {
        return Err(invalid(
            "Idempotency keys can be at most 255 characters.",
            None,
        ));
    }
    if let Some(res) = replay(&fake, key.as_deref(), &params) {
        return Ok(res);
    }
    let answer = new_session(&fake, &params)?;
    if let Some(key) = key {
        fake.books()
            .idempotent
            .insert(key, (params, StatusCode::OK, answer.clone()));
    }
    Ok(Json(answer).into_response())
}

/// Validates the parameters of a new Checkout Session as Stripe does and stores it.
fn new_session(fake: &FakeStripe, params: &[(String, String)]) -> Result<Value, Failure> {
    let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
    let mut metadata = serde_json::Map::new();
    let mut sub_metadata = serde_json::Map::new();
    for (k, v) in params {
        let bracketed = |prefix: &str| {
            k.strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(']'))
                .map(str::to_owned)
        };
        if let Some(name) = bracketed("metadata[") {
            if name.len() > 40 || v.len() > 500 {
                return Err(invalid(
                    "Metadata keys are at most 40 characters and values at most 500.",
                    Some(k),
                ));
            }
            metadata.insert(name, json!(v));
        } else if let Some(name) = bracketed("subscription_data[metadata][") {
            sub_metadata.insert(name, json!(v));
        } else if matches!(
            k.as_str(),
            "mode"
                | "success_url"
                | "cancel_url"
                | "client_reference_id"
                | "customer"
                | "customer_email"
                | "line_items[0][quantity]"
                | "line_items[0][price]"
                | "line_items[0][price_data][currency]"
                | "line_items[0][price_data][unit_amount]"
                | "line_items[0][price_data][product_data][name]"
        ) {
            if fields.insert(k.as_str(), v.as_str()).is_some() {
                return Err(invalid(
                    &format!("Received duplicate parameter: {k}"),
                    Some(k),
                ));
            }
        } else {
            return Err(invalid(
                &format!("Received unknown parameter: {k}"),
                Some(k),
            ));
        }
    }
    let mode = match fields.get("mode").copied() {
        Some(m @ ("payment" | "subscription" | "setup")) => m,
        Some(_) => {
            return Err(invalid(
                "Invalid mode: must be one of payment, setup, or subscription",
                Some("mode"),
            ))
        }
        None => return Err(invalid("Missing required param: mode.", Some("mode"))),
    };
    for url in ["success_url", "cancel_url"] {
        if let Some(u) = fields.get(url) {
            if !(u.starts_with("https://") || u.starts_with("http://")) {
                return Err(invalid(&format!("Not a valid URL: {url}"), Some(url)));
            }
        }
    }
    if fields
        .get("client_reference_id")
        .is_some_and(|c| c.len() > 200)
    {
        return Err(invalid(
            "client_reference_id is at most 200 characters.",
            Some("client_reference_id"),
        ));
    }
    if !sub_metadata.is_empty() && mode != "subscription" {
        return Err(invalid(
            "You can only specify `subscription_data` in `subscription` mode.",
            Some("subscription_data"),
        ));
    }
    let books = fake.books();
    let customer = fields.get("customer").map(|c| c.to_string());
    if let Some(c) = &customer {
        if !books.customers.contains(c) {
            return Err(invalid(
                &format!("No such customer: '{c}'"),
                Some("customer"),
            ));
        }
    }
    drop(books);
    let quantity: i64 = match fields.get("line_items[0][quantity]").map(|q| q.parse()) {
        Some(Ok(q)) if q >= 1 => q,
        Some(_) => {
            return Err(invalid(
                "Invalid integer: line_items[0][quantity]",
                Some("line_items[0][quantity]"),
            ))
        }
        None => {
            return Err(invalid(
                "Missing required param: line_items[0][quantity].",
                Some("line_items[0][quantity]"),
            ))
        }
    };
    let (price, amount, currency) = match (
        fields.get("line_items[0][price]"),
        fields.get("line_items[0][price_data][unit_amount]"),
    ) {
        (Some(price), None) => {
            if !PRICES.contains(price) {
                return Err(invalid(
                    &format!("No such price: '{price}'"),
                    Some("line_items[0][price]"),
                ));
            }
            if mode != "subscription" {
                return Err(invalid("The price specified is set to `type=recurring` but this field only accepts prices with `type=one_time`.", Some("line_items[0][price]")));
            }
            (Value::from(*price), 1500 * quantity, "usd".to_owned())
        }
        (None, Some(unit)) => {
            if mode != "payment" {
                return Err(invalid(
                    "Recurring prices need `price_data[recurring]` in subscription mode.",
                    Some("line_items[0][price_data]"),
                ));
            }
            let unit: i64 = unit.parse().map_err(|_| {
                invalid(
                    "Invalid integer: unit_amount",
                    Some("line_items[0][price_data][unit_amount]"),
                )
            })?;
            let currency = fields
                .get("line_items[0][price_data][currency]")
                .copied()
                .unwrap_or_default();
            if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_lowercase()) {
                return Err(invalid(
                    "Invalid currency.",
                    Some("line_items[0][price_data][currency]"),
                ));
            }
            if fields
                .get("line_items[0][price_data][product_data][name]")
                .is_none_or(|n| n.is_empty())
            {
                return Err(invalid(
                    "Missing required param: line_items[0][price_data][product_data][name].",
                    Some("line_items[0][price_data][product_data][name]"),
                ));
            }
            if unit < 50 {
                return Err(invalid(
                    "Amount must be at least $0.50 usd",
                    Some("line_items[0][price_data][unit_amount]"),
                ));
            }
            (Value::Null, unit * quantity, currency.to_owned())
        }
        _ => {
            return Err(invalid(
                "Each line item needs exactly one of price or price_data.",
                Some("line_items[0]"),
            ))
        }
    };
    let id = random_id("cs_test");
    let session = json!({
        "id": id,
        "object": "checkout.session",
        "mode": mode,
        "status": "open",
        "payment_status": "unpaid",
        "url": format!("https://checkout.stripe.com/c/pay/{id}"),
        "client_reference_id": fields.get("client_reference_id"),
        "metadata": metadata,
        "amount_total": amount,
        "currency": currency,
        "customer": customer,
        "subscription": null,
        "payment_intent": null,
        "success_url": fields.get("success_url"),
        "cancel_url": fields.get("cancel_url"),
        "created": now(),
        "expires_at": now() + 24 * 3600,
        "livemode": false,
        "price": price,
    });
    let mut books = fake.books();
    books.sessions.insert(id.clone(), session.clone());
    books
        .subscription_metadata
        .insert(id, Value::Object(sub_metadata));
    Ok(public_session(&session))
}

/// `POST /v1/checkout/sessions/{id}/expire`: takes no parameters; only an open session
/// expires, anything else is Stripe's 400.
async fn expire_session(
    State(fake): State<FakeStripe>, headers: HeaderMap, Path(id): Path<String>, body: Bytes,
) -> Result<Response, Failure> {
    let path = format!("/v1/checkout/sessions/{id}/expire");
    let params = admit_post(&fake, &path, &headers, &body)?;
    if let Some((name, _)) = params.first() {
        return Err(invalid(
            &format!("Received unknown parameter: {name}"),
            Some(name),
        ));
    }
    let mut books = fake.books();
    let Some(session) = books.sessions.get_mut(&id) else {
        return Err(stripe_error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            &format!("No such checkout.session: '{id}'"),
            Some("id"),
        ));
    };
    if session["status"] != "open" {
        return Err(invalid(
            &format!(
                "This Checkout Session is {} and cannot be expired: only an open session can.",
                session["status"].as_str().unwrap_or("not open")
            ),
            None,
        ));
    }
    session["status"] = json!("expired");
    Ok(Json(public_session(session)).into_response())
}

async fn retrieve_session(
    State(fake): State<FakeStripe>, headers: HeaderMap, Path(id): Path<String>,
) -> Response {
    let path = format!("/v1/checkout/sessions/{id}");
    retrieve(&fake, &headers, &path, "checkout.session", &id, |books| {
        books.sessions.get(&id).map(public_session)
    })
}

async fn retrieve_subscription(
    State(fake): State<FakeStripe>, headers: HeaderMap, Path(id): Path<String>,
) -> Response {
    let path = format!("/v1/subscriptions/{id}");
    let answer = retrieve(&fake, &headers, &path, "subscription", &id, |books| {
        books.subscriptions.get(&id).cloned()
    });
    let held = fake.books().held_read.take();
    if let Some((arrived, release)) = held {
        let _ = arrived.send(());
        let _ = release.await;
    }
    answer
}

/// A GET of one `object` by `id`: admitted and recorded, then found in the books or 404.
fn retrieve(
    fake: &FakeStripe, headers: &HeaderMap, path: &str, object: &str, id: &str,
    find: impl FnOnce(&Books) -> Option<Value>,
) -> Response {
    let found = admit(fake, "GET", path, headers, Vec::new()).map(|()| find(&fake.books()));
    match found {
        Ok(Some(v)) => Json(v).into_response(),
        Ok(None) => stripe_error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            &format!("No such {object}: '{id}'"),
            Some("id"),
        )
        .into_response(),
        Err(refused) => refused.into_response(),
    }
}

async fn create_portal_session(
    State(fake): State<FakeStripe>, headers: HeaderMap, body: Bytes,
) -> Result<Json<Value>, Failure> {
    let params = admit_post(&fake, "/v1/billing_portal/sessions", &headers, &body)?;
    let mut customer = None;
    let mut return_url = None;
    for (k, v) in &params {
        match k.as_str() {
            "customer" => customer = Some(v.clone()),
            "return_url" => return_url = Some(v.clone()),
            _ => {
                return Err(invalid(
                    &format!("Received unknown parameter: {k}"),
                    Some(k),
                ))
            }
        }
    }
    let Some(customer) = customer else {
        return Err(invalid(
            "Missing required param: customer.",
            Some("customer"),
        ));
    };
    if !fake.books().customers.contains(&customer) {
        return Err(invalid(
            &format!("No such customer: '{customer}'"),
            Some("customer"),
        ));
    }
    let id = random_id("bps");
    Ok(Json(json!({
        "id": id,
        "object": "billing_portal.session",
        "customer": customer,
        "return_url": return_url,
        "livemode": false,
        "created": now(),
        "url": format!("https://billing.stripe.com/p/session/test_{id}"),
    })))
}
