//! A local stand-in for Amazon SNS's side of a subscription: it serves its signing
//! certificate (`GET /SimpleNotificationService-test.pem`) and answers `GET /?Action=
//! ConfirmSubscription&TopicArn=…&Token=…` as SNS does (an unknown token or topic is a 400
//! with SNS's XML error), and it signs envelopes as SNS does (SignatureVersion 1: SHA1withRSA,
//! 2: SHA256withRSA over the canonical string) with its own key
//! (`tests/fixtures/sns/key.pem`, whose self-signed certificate is `cert.pem`).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use base64::Engine as _;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::signature::{SignatureEncoding, Signer};
use rsa::RsaPrivateKey;
use serde_json::{json, Value};

use crate::{Fake, FAKE_SNS_TOPIC};

const KEY_PEM: &str = include_str!("../fixtures/sns/key.pem");
const CERT_PEM: &str = include_str!("../fixtures/sns/cert.pem");
/// Where the certificate is served.
const CERT_PATH: &str = "/SimpleNotificationService-test.pem";

/// What the fake saw and how it answers.
#[derive(Default)]
pub struct Books {
    /// Requests received (certificate fetches and confirmations), as paths with queries.
    pub requests: Vec<String>,
    /// Subscription tokens that were confirmed.
    pub confirmed: Vec<String>,
    /// Tokens SNS knows (a confirmation of another is refused).
    pub tokens: Vec<String>,
    /// Answer confirmations with a 500 (SNS down).
    pub failing: bool,
}

/// The fake SNS.
pub type FakeSns = Fake<Books>;

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Confirm {
    action: Option<String>,
    topic_arn: Option<String>,
    token: Option<String>,
}

fn sns_error(status: StatusCode, code: &str, message: &str) -> axum::response::Response {
    let xml = format!(
        "<ErrorResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><Error>\
         <Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>\
         <RequestId>00000000-0000-0000-0000-000000000000</RequestId></ErrorResponse>"
    );
    (status, [("content-type", "text/xml")], xml).into_response()
}

async fn confirm(
    State(fake): State<FakeSns>, uri: axum::http::Uri, Query(q): Query<Confirm>,
) -> axum::response::Response {
    let mut books = fake.books();
    books.requests.push(uri.to_string());
    if books.failing {
        return sns_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "try again",
        );
    }
    if q.action.as_deref() != Some("ConfirmSubscription") {
        return sns_error(StatusCode::BAD_REQUEST, "InvalidAction", "unknown action");
    }
    let token = q.token.unwrap_or_default();
    if q.topic_arn.as_deref() != Some(FAKE_SNS_TOPIC) || !books.tokens.contains(&token) {
        return sns_error(StatusCode::BAD_REQUEST, "InvalidParameter", "Invalid token");
    }
    books.confirmed.push(token);
    let xml = "<ConfirmSubscriptionResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\">\
               <ConfirmSubscriptionResult><SubscriptionArn>arn:sub</SubscriptionArn>\
               </ConfirmSubscriptionResult></ConfirmSubscriptionResponse>";
    (StatusCode::OK, [("content-type", "text/xml")], xml).into_response()
}

async fn cert(State(fake): State<FakeSns>, uri: axum::http::Uri) -> impl IntoResponse {
    fake.books().requests.push(uri.to_string());
    ([("content-type", "application/x-pem-file")], CERT_PEM)
}

impl FakeSns {
    /// Starts the fake on a free local port.
    pub async fn start() -> Self {
        Self::serve("", |fake| {
            Router::new()
                .route("/", get(confirm))
                .route(CERT_PATH, get(cert))
                .with_state(fake)
        })
        .await
    }

    /// Requests the fake received.
    pub fn requests(&self) -> Vec<String> {
        self.books().requests.clone()
    }

    /// Tokens confirmed.
    pub fn confirmed(&self) -> Vec<String> {
        self.books().confirmed.clone()
    }

    /// Makes confirmations fail (or work again).
    pub fn set_failing(&self, failing: bool) {
        self.books().failing = failing;
    }

    /// The certificate's URL.
    pub fn cert_url(&self) -> String {
        format!("{}{CERT_PATH}", self.base)
    }

    /// A signed `Notification` carrying `message` (an SES event), SNS id `id`.
    pub fn notification(&self, id: &str, message: &Value, version: u8) -> Value {
        let mut env = json!({
            "Type": "Notification",
            "MessageId": id,
            "TopicArn": FAKE_SNS_TOPIC,
            "Message": message.to_string(),
            "Timestamp": "2026-11-25T07:00:00.000Z",
            "SignatureVersion": version.to_string(),
            "SigningCertURL": self.cert_url(),
            "UnsubscribeURL": format!("{}/?Action=Unsubscribe", self.base),
        });
        self.sign(&mut env);
        env
    }

    /// A signed `SubscriptionConfirmation` with `token` (which the fake then knows).
    pub fn confirmation(&self, token: &str) -> Value {
        self.books().tokens.push(token.to_owned());
        let mut env = json!({
            "Type": "SubscriptionConfirmation",
            "MessageId": format!("confirm-{token}"),
            "Token": token,
            "TopicArn": FAKE_SNS_TOPIC,
            "Message": "You have chosen to subscribe to the topic. To confirm, visit the SubscribeURL.",
            "SubscribeURL": format!(
                "{}/?Action=ConfirmSubscription&TopicArn={FAKE_SNS_TOPIC}&Token={token}",
                self.base
            ),
            "Timestamp": "2026-11-25T07:00:00.000Z",
            "SignatureVersion": "2",
            "SigningCertURL": self.cert_url(),
        });
        self.sign(&mut env);
        env
    }

    /// Signs `env` in place as SNS does, by its `SignatureVersion`.
    pub fn sign(&self, env: &mut Value) {
        let fields: &[&str] = if env["Type"] == "Notification" {
            &[
                "Message",
                "MessageId",
                "Subject",
                "Timestamp",
                "TopicArn",
                "Type",
            ]
        } else {
            &[
                "Message",
                "MessageId",
                "SubscribeURL",
                "Timestamp",
                "Token",
                "TopicArn",
                "Type",
            ]
        };
        let mut canonical = String::new();
        for name in fields {
            if let Some(value) = env[*name].as_str() {
                canonical.push_str(&format!("{name}\n{value}\n"));
            }
        }
        let key = RsaPrivateKey::from_pkcs8_pem(KEY_PEM).expect("the fixture key");
        let signature = match env["SignatureVersion"].as_str() {
            Some("1") => SigningKey::<sha1::Sha1>::new(key)
                .sign(canonical.as_bytes())
                .to_vec(),
            _ => SigningKey::<sha2::Sha256>::new(key)
                .sign(canonical.as_bytes())
                .to_vec(),
        };
        env["Signature"] = json!(base64::engine::general_purpose::STANDARD.encode(signature));
    }
}
