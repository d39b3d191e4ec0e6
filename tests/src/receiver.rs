//! A local webhook receiver that checks every delivery as Standard Webhooks says: the
//! `webhook-id`, `webhook-timestamp` (within five minutes) and `webhook-signature` headers,
//! each `v1,<base64>` signature an HMAC-SHA256 of `id.timestamp.body` under a key it
//! trusts. A delivery no trusted key signed is refused with 401 and kept apart. It answers
//! as its script says, then 200.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::Fake;

/// How far a delivery's timestamp may be from now.
const TOLERANCE_SECS: i64 = 300;

/// How the receiver answers one delivery.
#[derive(Clone, Debug)]
pub enum Reply {
    /// This status at once.
    Status(u16),
    /// This status with `Retry-After: <secs>`.
    RetryAfter(u16, u64),
    /// This status after a pause.
    Slow(Duration, u16),
    /// 302 to this URL.
    Redirect(String),
    /// This status with a body that never ends.
    Endless(u16),
}

/// A delivery that passed the checks.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub id: String,
    pub timestamp: i64,
    /// The signatures of the header, as sent.
    pub signatures: Vec<String>,
    /// Which trusted keys (by the order they were trusted) signed it.
    pub signed_by: Vec<usize>,
    pub body: Value,
    pub arrived: Instant,
    /// The status it was answered with.
    pub answered: u16,
}

/// What the receiver got and how it answers.
#[derive(Default)]
pub struct Books {
    keys: Vec<Vec<u8>>,
    script: VecDeque<Reply>,
    default: Option<Reply>,
    deliveries: Vec<Delivery>,
    /// Why each refused request was refused.
    refused: Vec<String>,
}

/// The receiver. Cloning shares it.
pub type Receiver = Fake<Books>;

impl Fake<Books> {
    /// Starts a receiver on a free local port.
    pub async fn start() -> Self {
        Fake::serve("", |fake| Router::new().fallback(receive).with_state(fake)).await
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Trusts the signing secret `whsec_<base64>`.
    pub fn trust(&self, secret: &str) {
        let key = STANDARD
            .decode(secret.strip_prefix("whsec_").expect("a whsec_ secret"))
            .expect("base64");
        self.books().keys.push(key);
    }

    /// Subscribes `/events` here to the delivery events `events` of `key`'s workspace
    /// (none: all) through `POST /webhooks`, trusting the webhook's secret: its id.
    pub async fn subscribe(&self, stack: &crate::Stack, key: &str, events: &[&str]) -> uuid::Uuid {
        let created: postmesh_shared::Success<webhook_dispatcher::routes::webhooks::Created> =
            stack
                .client(key)
                .post(
                    "/webhooks",
                    &serde_json::json!({ "url": self.url("/events"), "events": events }),
                    StatusCode::CREATED,
                )
                .await;
        self.trust(&created.body.signing_secret);
        created.body.webhook.id
    }

    /// Answers the next deliveries with `replies`, in order.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.books().script.extend(replies);
    }

    /// Answers every delivery past the script with `reply` (200 until set).
    pub fn answer(&self, reply: Reply) {
        self.books().default = Some(reply);
    }

    /// Deliveries that passed the checks, in arrival order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.books().deliveries.clone()
    }

    /// How many deliveries passed the checks.
    pub fn count(&self) -> usize {
        self.books().deliveries.len()
    }

    /// Why each refused request was refused.
    pub fn refused(&self) -> Vec<String> {
        self.books().refused.clone()
    }
}

/// The trusted keys (by index) that signed `id.timestamp.body` among `signatures`.
fn signers(
    keys: &[Vec<u8>], id: &str, timestamp: &str, body: &[u8], signatures: &[String],
) -> Vec<usize> {
    let decoded: Vec<Vec<u8>> = signatures
        .iter()
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|b64| STANDARD.decode(b64).ok())
        .collect();
    keys.iter()
        .enumerate()
        .filter(|(_, key)| {
            decoded.iter().any(|sig| {
                let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key");
                mac.update(format!("{id}.{timestamp}.").as_bytes());
                mac.update(body);
                mac.verify_slice(sig).is_ok()
            })
        })
        .map(|(i, _)| i)
        .collect()
}

/// Checks a delivery; the reason it is refused.
fn check(books: &Books, headers: &HeaderMap, body: &[u8]) -> Result<Delivery, String> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(format!("no {name} header"))
    };
    let (id, stamp, signature) = (
        header("webhook-id")?,
        header("webhook-timestamp")?,
        header("webhook-signature")?,
    );
    let timestamp: i64 = stamp
        .parse()
        .map_err(|_| "webhook-timestamp is not a number")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    if (now - timestamp).abs() > TOLERANCE_SECS {
        return Err(format!("webhook-timestamp {timestamp} is too far from now"));
    }
    if header("content-type")? != "application/json" {
        return Err("content-type is not application/json".into());
    }
    let signatures: Vec<String> = signature.split(' ').map(str::to_owned).collect();
    let signed_by = signers(&books.keys, &id, &stamp, body, &signatures);
    if signed_by.is_empty() {
        return Err(format!("no trusted key signed {id}"));
    }
    Ok(Delivery {
        id,
        timestamp,
        signatures,
        signed_by,
        body: serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?,
        arrived: Instant::now(),
        answered: 0,
    })
}

async fn receive(State(fake): State<Receiver>, headers: HeaderMap, body: Bytes) -> Response {
    let reply = {
        let mut books = fake.books();
        let mut delivery = match check(&books, &headers, &body) {
            Ok(delivery) => delivery,
            Err(reason) => {
                books.refused.push(reason.clone());
                return (StatusCode::UNAUTHORIZED, reason).into_response();
            }
        };
        let reply = books
            .script
            .pop_front()
            .or_else(|| books.default.clone())
            .unwrap_or(Reply::Status(200));
        delivery.answered = match &reply {
            Reply::Status(s) | Reply::RetryAfter(s, _) | Reply::Slow(_, s) | Reply::Endless(s) => {
                *s
            }
            Reply::Redirect(_) => 302,
        };
        books.deliveries.push(delivery);
        reply
    };
    let status = |s: u16| StatusCode::from_u16(s).expect("a status");
    match reply {
        Reply::Status(s) => status(s).into_response(),
        Reply::RetryAfter(s, secs) => {
            (status(s), [("retry-after", secs.to_string())]).into_response()
        }
        Reply::Slow(pause, s) => {
            tokio::time::sleep(pause).await;
            status(s).into_response()
        }
        Reply::Redirect(to) => (StatusCode::FOUND, [("location", to)]).into_response(),
        Reply::Endless(s) => {
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let body = futures::stream::repeat_with(move || Ok::<_, Infallible>(chunk.clone()));
            (status(s), axum::body::Body::from_stream(body)).into_response()
        }
    }
}

/// Waits until `receiver` has `count` deliveries; they.
pub async fn received(receiver: &Receiver, count: usize, within: Duration) -> Vec<Delivery> {
    crate::eventually(within, || async move {
        let got = receiver.deliveries();
        if got.len() >= count {
            Ok(got)
        } else {
            Err((got.len(), receiver.refused()))
        }
    })
    .await
}
