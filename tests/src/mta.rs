//! The upstream MTA as tests play it: the gateway's ingest route with the inbound secret,
//! fixture messages, and the authentication results a well-configured MTA reports.

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{json, Value};

use inbound_ingest::addresses::Created;
use inbound_ingest::ingest::Ingested;
use postmesh_shared::{AddressId, Success};

use crate::{Stack, TestClient, INBOUND_DOMAIN, INBOUND_SECRET};

/// A fixture message from `tests/fixtures/inbound/`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/fixtures/inbound/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(path).expect("fixture")
}

/// The upstream MTA: the gateway with the inbound secret.
pub fn mta(stack: &Stack) -> TestClient {
    TestClient::http(&stack.base, None).with_header("x-service-inbound-secret", INBOUND_SECRET)
}

/// What a well-configured MTA says about a message's origin.
pub fn authentication() -> Value {
    json!({
        "sourceIp": "203.0.113.7", "helo": "mail.customer.example",
        "spf": "pass", "dkim": "pass", "dmarc": "none", "policy": "accept",
        "results": {"spf": "pass (sender SPF authorized)"}
    })
}

/// The body of `POST /inbound-email/ingest` for `raw` to `to`.
pub fn ingest_body(raw: &[u8], to: &[&str]) -> Value {
    json!({
        "from": "ann@customer.example",
        "to": to,
        "rawBase64": base64::engine::general_purpose::STANDARD.encode(raw),
        "authentication": authentication(),
    })
}

/// Ingests `raw` to `to` through the gateway, expecting 200; the counts.
pub async fn ingest(stack: &Stack, raw: &[u8], to: &[&str]) -> Ingested {
    ingest_to(&mta(stack), raw, to).await
}

/// Ingests `raw` to `to` as `mta`, expecting 200; the counts.
pub async fn ingest_to(mta: &TestClient, raw: &[u8], to: &[&str]) -> Ingested {
    let answer: Success<Ingested> = mta
        .post(
            "/inbound-email/ingest",
            &ingest_body(raw, to),
            StatusCode::OK,
        )
        .await;
    answer.body
}

/// A plain message to `support@` the platform's inbound domain.
pub fn message(
    message_id: Option<&str>, subject: &str, extra_headers: &str, body: &str,
) -> Vec<u8> {
    let id = message_id
        .map(|id| format!("Message-ID: <{id}>\r\n"))
        .unwrap_or_default();
    format!(
        "From: Ann <ann@customer.example>\r\nTo: support@{INBOUND_DOMAIN}\r\n{id}\
         Subject: {subject}\r\n{extra_headers}MIME-Version: 1.0\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n"
    )
    .into_bytes()
}

/// A new key with one inbox address, `{local}@` the platform's inbound domain; the key and
/// the address id.
pub async fn key_with_inbox(stack: &Stack, local: &str) -> (String, AddressId) {
    let key = stack.key(0).await;
    let address = inbox(stack, &key, local).await;
    (key, address)
}

/// Creates the inbox `{local}@` the platform's inbound domain for `key`; its id.
pub async fn inbox(stack: &Stack, key: &str, local: &str) -> AddressId {
    let created: Success<Created> = stack
        .client(key)
        .post(
            "/inbox/addresses",
            &json!({ "address": format!("{local}@{INBOUND_DOMAIN}") }),
            StatusCode::CREATED,
        )
        .await;
    created.body.address.id
}
