//! A fake Amazon SES v2 API, as strict as the real one where Postmesh touches it: every
//! request must carry a valid SigV4 signature (recomputed here with the fake's secret key,
//! service `ses`, the configured region, at most 15 minutes off), JSON bodies with only the
//! documented fields, and errors come back as SES sends them (`x-amzn-ErrorType` and
//! `{"message"}`). Identities: create, get, custom MAIL FROM, delete. Sending: `SendEmail`
//! with raw content only, from verified identities only, recorded for [`FakeSes::sent`].

use base64::Engine as _;
use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use postmesh_ses::SesConfig;

/// The access key the fake knows.
pub const ACCESS_KEY_ID: &str = "AKIAPOSTMESHTEST0001";
/// Its secret.
pub const SECRET_ACCESS_KEY: &str = "fake-ses-secret-key-for-tests-only";
/// The region it serves.
pub const REGION: &str = "eu-west-1";

/// SES v2's largest message: 40 MB after base64 (the SES quotas page), counted in decimal
/// megabytes, the stricter reading.
pub const MAX_RAW_MESSAGE: usize = 40_000_000;
/// The largest request body read: a largest message plus room for the rest of the JSON.
const MAX_BODY: usize = MAX_RAW_MESSAGE + (8 << 20);
/// SES's limit of recipients per message (To, Cc and Bcc together).
const MAX_RECIPIENTS: usize = 50;

/// One message SES accepted (`SendEmail`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentEmail {
    /// `FromEmailAddress`, or the message's `From:` address when that was not given.
    pub from: String,
    /// The envelope recipients: `Destination`'s To, Cc then Bcc addresses, or when it has
    /// none, the addresses of the message's `To:`, `Cc:` and `Bcc:` headers.
    pub destinations: Vec<String>,
    /// The MIME message, decoded.
    pub raw: Vec<u8>,
    /// The `MessageId` answered.
    pub message_id: String,
}

/// One identity as SES holds it.
#[derive(Clone, Debug)]
pub struct Identity {
    pub tokens: Vec<String>,
    /// `PENDING`, `SUCCESS`, `FAILED`.
    pub dkim_status: String,
    pub verified: bool,
    pub mail_from: Option<String>,
}

/// What the fake holds.
#[derive(Default)]
pub struct Account {
    identities: HashMap<String, Identity>,
    /// Each request that passed authentication: method and path.
    requests: Vec<(String, String)>,
    down: bool,
    /// The next request fails with this status, error type and message.
    fail_next: Option<(StatusCode, String, String)>,
    /// Messages accepted, in order.
    sent: Vec<SentEmail>,
}

/// The fake: its `base` is the `SES_ENDPOINT`.
pub type FakeSes = crate::Fake<Account>;

/// An SES error answer.
struct SesFailure(StatusCode, String, String);

impl IntoResponse for SesFailure {
    fn into_response(self) -> Response {
        let SesFailure(status, kind, message) = self;
        (
            status,
            [
                ("x-amzn-ErrorType", kind.clone()),
                ("content-type", "application/json".into()),
            ],
            json!({ "message": message }).to_string(),
        )
            .into_response()
    }
}

fn failure(status: StatusCode, kind: &str, message: impl Into<String>) -> SesFailure {
    SesFailure(status, kind.into(), message.into())
}

fn bad_request(message: impl Into<String>) -> SesFailure {
    failure(StatusCode::BAD_REQUEST, "BadRequestException", message)
}

type Answer = Result<axum::Json<Value>, SesFailure>;

impl FakeSes {
    /// Starts the fake on a free local port.
    pub async fn start() -> Self {
        Self::serve("", |fake| {
            Router::new()
                .route("/v2/email/identities", post(create_identity))
                .route(
                    "/v2/email/identities/{identity}",
                    get(get_identity).delete(delete_identity),
                )
                .route(
                    "/v2/email/identities/{identity}/mail-from",
                    put(put_mail_from),
                )
                .route("/v2/email/outbound-emails", post(send_email))
                .fallback(|method: Method, uri: Uri| async move {
                    failure(
                        StatusCode::NOT_FOUND,
                        "UnknownOperationException",
                        format!("no operation at {method} {}", uri.path()),
                    )
                })
                // `authenticate` bounds every body already (`MAX_BODY`).
                .layer(DefaultBodyLimit::disable())
                .layer(axum::middleware::from_fn_with_state(
                    fake.clone(),
                    authenticate,
                ))
                .with_state(fake)
        })
        .await
    }

    /// SES settings pointing at this fake, with its credentials.
    pub fn config(&self) -> SesConfig {
        SesConfig {
            endpoint: self.base.clone(),
            region: REGION.into(),
            credentials: Some((ACCESS_KEY_ID.into(), SECRET_ACCESS_KEY.into())),
        }
    }

    /// While down, every request answers 503 `ServiceUnavailable`... as SES's front does.
    pub fn set_down(&self, down: bool) {
        self.books().down = down;
    }

    /// Makes the next request fail with `status` and SES error type `kind`.
    pub fn fail_next(&self, status: StatusCode, kind: &str, message: &str) {
        self.books().fail_next = Some((status, kind.into(), message.into()));
    }

    /// The identity `name`, if SES has it.
    pub fn identity(&self, name: &str) -> Option<Identity> {
        self.books().identities.get(name).cloned()
    }

    /// Marks the identity's DKIM and MAIL FROM as found in DNS: verified for sending.
    pub fn verify(&self, name: &str) {
        let mut account = self.books();
        let identity = account.identities.get_mut(name).expect("identity exists");
        identity.dkim_status = "SUCCESS".into();
        identity.verified = true;
    }

    /// Marks the identity's DKIM as failed.
    pub fn fail_dkim(&self, name: &str) {
        let mut account = self.books();
        let identity = account.identities.get_mut(name).expect("identity exists");
        identity.dkim_status = "FAILED".into();
    }

    /// Makes `domain` a verified identity (creating it if SES does not have it), so that mail
    /// from it and from its subdomains is accepted.
    pub fn verify_sender_domain(&self, domain: &str) {
        let mut account = self.books();
        let identity = account
            .identities
            .entry(domain.to_ascii_lowercase())
            .or_insert_with(new_identity);
        identity.dkim_status = "SUCCESS".into();
        identity.verified = true;
    }

    /// The messages SES accepted, oldest first.
    pub fn sent(&self) -> Vec<SentEmail> {
        self.books().sent.clone()
    }

    /// Requests that passed authentication, as `(method, path)`.
    pub fn requests(&self) -> Vec<(String, String)> {
        self.books().requests.clone()
    }
}

/// Checks the SigV4 signature of every request, then the outage switches.
async fn authenticate(
    State(fake): State<FakeSes>, req: axum::extract::Request, next: axum::middleware::Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return bad_request("body too large").into_response();
    };
    if let Err(e) = verify_signature(&parts.method, &parts.uri, &parts.headers, &body) {
        return e.into_response();
    }
    {
        let mut account = fake.books();
        if account.down {
            return failure(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "Service is unavailable. Please try again later.",
            )
            .into_response();
        }
        if let Some((status, kind, message)) = account.fail_next.take() {
            return SesFailure(status, kind, message).into_response();
        }
        account
            .requests
            .push((parts.method.to_string(), parts.uri.path().to_owned()));
    }
    next.run(axum::extract::Request::from_parts(parts, body.into()))
        .await
}

/// Unix seconds of an `x-amz-date` (`YYYYMMDDTHHMMSSZ`).
fn unix_of_amz_date(d: &str) -> Option<i64> {
    let b = d.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| d.get(r)?.parse::<i64>().ok();
    let (y, m, day) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss) = (num(9..11)?, num(11..13)?, num(13..15)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// Percent-encodes `s` as SigV4 does (everything but unreserved characters).
fn uri_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Recomputes the request's SigV4 signature (AWS's "Create a signed AWS API request").
fn verify_signature(
    method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8],
) -> Result<(), SesFailure> {
    let forbidden = |kind: &str, message: &str| failure(StatusCode::FORBIDDEN, kind, message);
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            forbidden(
                "MissingAuthenticationTokenException",
                "Missing Authentication Token",
            )
        })?;
    let incomplete = || {
        forbidden(
            "IncompleteSignatureException",
            "Authorization header requires Credential, SignedHeaders and Signature",
        )
    };
    let rest = auth
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or_else(incomplete)?;
    let mut fields = HashMap::new();
    for part in rest.split(", ") {
        let (k, v) = part.split_once('=').ok_or_else(incomplete)?;
        fields.insert(k, v);
    }
    let (credential, signed_headers, signature) = match (
        fields.get("Credential"),
        fields.get("SignedHeaders"),
        fields.get("Signature"),
    ) {
        (Some(c), Some(h), Some(s)) => (*c, *h, *s),
        _ => return Err(incomplete()),
    };
    let scope: Vec<&str> = credential.split('/').collect();
    if scope.len() != 5 || scope[4] != "aws4_request" {
        return Err(incomplete());
    }
    if scope[0] != ACCESS_KEY_ID {
        return Err(forbidden(
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ));
    }
    if scope[2] != REGION || scope[3] != "ses" {
        return Err(forbidden(
            "InvalidSignatureException",
            "Credential should be scoped to a valid region and to the ses service.",
        ));
    }
    if signature.len() != 64 || !signature.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(incomplete());
    }
    let amz_date = headers
        .get("x-amz-date")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(incomplete)?;
    if !amz_date.starts_with(scope[1]) || amz_date.len() != 16 {
        return Err(incomplete());
    }
    let signed_at = unix_of_amz_date(amz_date).ok_or_else(incomplete)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64;
    if (now - signed_at).abs() > 15 * 60 {
        return Err(forbidden("InvalidSignatureException", "Signature expired"));
    }
    let names: Vec<&str> = signed_headers.split(';').collect();
    if !names.contains(&"host") || !names.contains(&"x-amz-date") {
        return Err(incomplete());
    }
    let mut canonical_headers = String::new();
    for name in &names {
        let value = headers
            .get(*name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| forbidden("InvalidSignatureException", "a signed header is missing"))?;
        canonical_headers.push_str(&format!("{name}:{}\n", value.trim()));
    }
    let path: String = uri
        .path()
        .split('/')
        .map(uri_encode)
        .collect::<Vec<_>>()
        .join("/");
    let mut query: Vec<(String, String)> = uri
        .query()
        .map(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).unwrap_or_default())
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (uri_encode(&k), uri_encode(&v)))
        .collect();
    query.sort();
    let query = query
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let canonical = format!(
        "{method}\n{path}\n{query}\n{canonical_headers}\n{signed_headers}\n{}",
        hex::encode(Sha256::digest(body))
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{}/{REGION}/ses/aws4_request\n{}",
        scope[1],
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let key = [scope[1], REGION, "ses", "aws4_request"].iter().fold(
        format!("AWS4{SECRET_ACCESS_KEY}").into_bytes(),
        |key, part| hmac(&key, part.as_bytes()),
    );
    let expected = hex::encode(hmac(&key, string_to_sign.as_bytes()));
    if expected != signature {
        return Err(forbidden(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        ));
    }
    Ok(())
}

/// Parses a JSON body with only the documented fields.
fn json_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap, body: &[u8],
) -> Result<T, SesFailure> {
    let json = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json {
        return Err(bad_request("Content-Type must be application/json"));
    }
    serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid request body: {e}")))
}

fn view(identity: &Identity) -> Value {
    json!({
        "IdentityType": "DOMAIN",
        "FeedbackForwardingStatus": true,
        "VerifiedForSendingStatus": identity.verified,
        "VerificationStatus": if identity.verified { "SUCCESS" } else { identity.dkim_status.as_str() },
        "DkimAttributes": {
            "SigningEnabled": true,
            "Status": identity.dkim_status,
            "Tokens": identity.tokens,
            "SigningAttributesOrigin": "AWS_SES",
            "CurrentSigningKeyLength": "RSA_2048_BIT",
            "NextSigningKeyLength": "RSA_2048_BIT"
        },
        "MailFromAttributes": {
            "MailFromDomain": identity.mail_from.clone().unwrap_or_default(),
            "MailFromDomainStatus": if identity.mail_from.is_some() {
                if identity.verified { "SUCCESS" } else { "PENDING" }
            } else { "" },
            "BehaviorOnMxFailure": "USE_DEFAULT_VALUE"
        },
        "Policies": {},
        "Tags": []
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct CreateIdentity {
    email_identity: String,
    // Accepted as SES accepts them, never read (hence the leading underscores).
    #[serde(default)]
    _tags: Option<Value>,
    #[serde(default)]
    _dkim_signing_attributes: Option<Value>,
    #[serde(default)]
    _configuration_set_name: Option<String>,
}

async fn create_identity(State(fake): State<FakeSes>, headers: HeaderMap, body: Bytes) -> Answer {
    let req: CreateIdentity = json_body(&headers, &body)?;
    let name = req.email_identity.to_ascii_lowercase();
    if name.is_empty() || name.contains('@') || !name.contains('.') {
        return Err(bad_request("EmailIdentity must be a domain or an address"));
    }
    let mut account = fake.books();
    if account.identities.contains_key(&name) {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            "AlreadyExistsException",
            format!("Email identity {name} already exist."),
        ));
    }
    let identity = new_identity();
    let answer = json!({
        "IdentityType": "DOMAIN",
        "VerifiedForSendingStatus": false,
        "DkimAttributes": view(&identity)["DkimAttributes"].clone()
    });
    account.identities.insert(name, identity);
    Ok(axum::Json(answer))
}

/// A new domain identity: Easy DKIM pending.
fn new_identity() -> Identity {
    Identity {
        tokens: (0..3)
            .map(|_| format!("{:032x}", rand::random::<u128>()))
            .collect(),
        dkim_status: "PENDING".into(),
        verified: false,
        mail_from: None,
    }
}

fn not_found(name: &str) -> SesFailure {
    failure(
        StatusCode::NOT_FOUND,
        "NotFoundException",
        format!("Email identity {name} does not exist."),
    )
}

async fn get_identity(State(fake): State<FakeSes>, Path(name): Path<String>) -> Answer {
    let account = fake.books();
    let identity = account
        .identities
        .get(&name)
        .ok_or_else(|| not_found(&name))?;
    Ok(axum::Json(view(identity)))
}

async fn delete_identity(State(fake): State<FakeSes>, Path(name): Path<String>) -> Answer {
    let mut account = fake.books();
    account
        .identities
        .remove(&name)
        .ok_or_else(|| not_found(&name))?;
    Ok(axum::Json(json!({})))
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct PutMailFrom {
    mail_from_domain: Option<String>,
    behavior_on_mx_failure: Option<String>,
}

async fn put_mail_from(
    State(fake): State<FakeSes>, Path(name): Path<String>, headers: HeaderMap, body: Bytes,
) -> Answer {
    let req: PutMailFrom = json_body(&headers, &body)?;
    if let Some(behavior) = &req.behavior_on_mx_failure {
        if !matches!(behavior.as_str(), "USE_DEFAULT_VALUE" | "REJECT_MESSAGE") {
            return Err(bad_request(
                "BehaviorOnMxFailure must be USE_DEFAULT_VALUE or REJECT_MESSAGE",
            ));
        }
    }
    let mut account = fake.books();
    let identity = account
        .identities
        .get_mut(&name)
        .ok_or_else(|| not_found(&name))?;
    if let Some(domain) = &req.mail_from_domain {
        if !domain.ends_with(&format!(".{name}")) {
            return Err(bad_request(format!(
                "MAIL FROM domain {domain} must be a subdomain of {name}"
            )));
        }
    }
    identity.mail_from = req.mail_from_domain;
    Ok(axum::Json(json!({})))
}

/// `SendEmail`'s request: every documented field is accepted, no other.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct SendEmail {
    content: EmailContent,
    // Fields with a leading underscore are accepted as SES accepts them, never read.
    #[serde(default)]
    destination: Option<Destination>,
    #[serde(default)]
    from_email_address: Option<String>,
    #[serde(default)]
    _from_email_address_identity_arn: Option<String>,
    #[serde(default)]
    _reply_to_addresses: Option<Vec<String>>,
    #[serde(default)]
    _feedback_forwarding_email_address: Option<String>,
    #[serde(default)]
    _feedback_forwarding_email_address_identity_arn: Option<String>,
    #[serde(default)]
    _email_tags: Option<Value>,
    #[serde(default)]
    _configuration_set_name: Option<String>,
    #[serde(default)]
    _endpoint_id: Option<String>,
    #[serde(default)]
    _tenant_name: Option<String>,
    #[serde(default)]
    _list_management_options: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct EmailContent {
    #[serde(default)]
    raw: Option<RawMessage>,
    #[serde(default)]
    simple: Option<Value>,
    #[serde(default)]
    template: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct RawMessage {
    data: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct Destination {
    #[serde(default)]
    to_addresses: Vec<String>,
    #[serde(default)]
    cc_addresses: Vec<String>,
    #[serde(default)]
    bcc_addresses: Vec<String>,
}

fn message_rejected(message: impl Into<String>) -> SesFailure {
    failure(StatusCode::BAD_REQUEST, "MessageRejected", message)
}

/// `SendEmail` with raw content.
async fn send_email(State(fake): State<FakeSes>, headers: HeaderMap, body: Bytes) -> Answer {
    let req: SendEmail = json_body(&headers, &body)?;
    let raw = match (req.content.raw, req.content.simple, req.content.template) {
        (Some(raw), None, None) => raw,
        (None, None, None) => return Err(bad_request("Content must have Raw, Simple or Template")),
        (None, _, _) => {
            return Err(bad_request(
                "this fake SES only sends Raw content (Simple and Template are not supported)",
            ))
        }
        (Some(_), _, _) => {
            return Err(bad_request(
                "Content must have only one of Raw, Simple and Template",
            ))
        }
    };
    if raw.data.len() > MAX_RAW_MESSAGE {
        return Err(message_rejected(format!(
            "Message length is more than {MAX_RAW_MESSAGE} bytes long: '{}'.",
            raw.data.len()
        )));
    }
    let message = base64::engine::general_purpose::STANDARD
        .decode(&raw.data)
        .ok()
        .ok_or_else(|| bad_request("Content.Raw.Data is not valid base64"))?;
    let message_headers = parse_headers(&message).map_err(bad_request)?;
    let header = |name: &str| {
        message_headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    let header_from = header("From")
        .into_iter()
        .flat_map(addresses)
        .next()
        .ok_or_else(|| bad_request("Missing required header 'From'."))?;
    let from = req.from_email_address.map(|f| {
        // `"Name" <address>` is allowed in FromEmailAddress too.
        addresses(&f).into_iter().next().unwrap_or(f)
    });
    let destination = req.destination.unwrap_or_default();
    let mut destinations: Vec<String> = destination
        .to_addresses
        .into_iter()
        .chain(destination.cc_addresses)
        .chain(destination.bcc_addresses)
        .collect();
    if destinations.is_empty() {
        destinations = ["To", "Cc", "Bcc"]
            .into_iter()
            .flat_map(header)
            .flat_map(addresses)
            .collect();
    }
    if destinations.is_empty() {
        return Err(bad_request(
            "The message must have at least one recipient (To, Cc or Bcc).",
        ));
    }
    if destinations.len() > MAX_RECIPIENTS {
        return Err(bad_request(format!(
            "Recipient count exceeds {MAX_RECIPIENTS}."
        )));
    }
    for address in from.iter().chain([&header_from]).chain(&destinations) {
        if !valid_address(address) {
            return Err(bad_request(format!("Illegal address: {address}")));
        }
    }
    let mut account = fake.books();
    let mut unverified: Vec<&str> = from
        .iter()
        .chain([&header_from])
        .map(String::as_str)
        .filter(|address| !sender_verified(&account.identities, address))
        .collect();
    unverified.dedup();
    if !unverified.is_empty() {
        return Err(message_rejected(format!(
            "Email address is not verified. The following identities failed the check in region {}: {}",
            REGION.to_ascii_uppercase(),
            unverified.join(", ")
        )));
    }
    let message_id = format!(
        "{:016x}-{}-000000",
        rand::random::<u64>(),
        uuid::Uuid::new_v4()
    );
    account.sent.push(SentEmail {
        from: from.unwrap_or(header_from),
        destinations,
        raw: message,
        message_id: message_id.clone(),
    });
    Ok(axum::Json(json!({ "MessageId": message_id })))
}

/// Whether mail from `address` may leave: the address itself, its domain or a parent domain
/// is a verified identity.
fn sender_verified(identities: &HashMap<String, Identity>, address: &str) -> bool {
    let address = address.to_ascii_lowercase();
    let verified = |name: &str| identities.get(name).is_some_and(|i| i.verified);
    if verified(&address) {
        return true;
    }
    let Some((_, mut domain)) = address.rsplit_once('@') else {
        return false;
    };
    loop {
        if verified(domain) {
            return true;
        }
        match domain.split_once('.') {
            Some((_, parent)) if parent.contains('.') => domain = parent,
            _ => return false,
        }
    }
}

/// `local@domain.tld`, ASCII (SES does not do SMTPUTF8), no spaces or angle brackets.
fn valid_address(address: &str) -> bool {
    let Some((local, domain)) = address.rsplit_once('@') else {
        return false;
    };
    let atom = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'<' | b'>' | b'(' | b')' | b','))
    };
    atom(local)
        && atom(domain)
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !domain.contains('@')
}

/// The header fields of a message (unfolded), which must have a header and a body separated
/// by a blank line.
fn parse_headers(message: &[u8]) -> Result<Vec<(String, String)>, String> {
    let blank = (0..message.len()).find_map(|i| {
        if message[i..].starts_with(b"\r\n\r\n") {
            Some(i + 2)
        } else if message[i..].starts_with(b"\n\n") {
            Some(i + 1)
        } else {
            None
        }
    });
    let end =
        blank.ok_or("The message must have a header and a body separated by a blank line.")?;
    let mut fields: Vec<(String, String)> = Vec::new();
    for line in message[..end].split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let text = String::from_utf8_lossy(line);
        if matches!(line[0], b' ' | b'\t') {
            let (_, value) = fields
                .last_mut()
                .ok_or("The message's header starts with a continuation line.")?;
            value.push(' ');
            value.push_str(text.trim());
            continue;
        }
        let (name, value) = text
            .split_once(':')
            .filter(|(name, _)| {
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
            })
            .ok_or_else(|| format!("Illegal header line: {text}"))?;
        fields.push((name.to_owned(), value.trim().to_owned()));
    }
    if fields.is_empty() {
        return Err("The message has no header.".into());
    }
    Ok(fields)
}

/// The addresses of an address-list header value (RFC 5322, without its rarer corners):
/// `a@x`, `Name <a@x>`, `"Last, First" <a@x>`, `group: a@x, b@y;`, comments dropped.
fn addresses(value: &str) -> Vec<String> {
    let mut items = vec![String::new()];
    let (mut quoted, mut angle, mut comment) = (false, false, 0u32);
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        let item = items.last_mut().expect("one item at least");
        match c {
            '\\' if quoted || comment > 0 => {
                chars.next();
            }
            '"' if comment == 0 => {
                quoted = !quoted;
                item.push(c);
            }
            '(' if !quoted => comment += 1,
            ')' if !quoted && comment > 0 => comment -= 1,
            _ if comment > 0 => {}
            '<' if !quoted => {
                angle = true;
                item.push(c);
            }
            '>' if !quoted => {
                angle = false;
                item.push(c);
            }
            ',' | ';' if !quoted && !angle => items.push(String::new()),
            ':' if !quoted && !angle => item.clear(), // A group's display name.
            _ => item.push(c),
        }
    }
    items
        .iter()
        .filter_map(|item| {
            let address = match (item.rfind('<'), item.rfind('>')) {
                (Some(open), Some(close)) if open < close => &item[open + 1..close],
                _ => item.as_str(),
            };
            let address = address.trim();
            address.contains('@').then(|| address.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_addresses_are_found() {
        assert_eq!(
            addresses(r#""Doe, Jane" <jane@example.com>, bob@example.org (Bob)"#),
            ["jane@example.com", "bob@example.org"]
        );
        assert_eq!(
            addresses("friends: a@x.example, B <b@y.example>;, c@z.example"),
            ["a@x.example", "b@y.example", "c@z.example"]
        );
        assert!(addresses("undisclosed-recipients:;").is_empty());
    }

    #[test]
    fn messages_need_a_header_and_a_body() {
        let fields = parse_headers(b"From: a@x.example\r\nSubject: a\r\n  b\r\n\r\nbody").unwrap();
        assert_eq!(fields[1], ("Subject".into(), "a b".into()));
        assert!(parse_headers(b"From: a@x.example\r\n").is_err());
        assert!(parse_headers(b"\r\n\r\nbody").is_err());
        assert!(parse_headers(b"not a header\r\n\r\nbody").is_err());
    }

    #[test]
    fn subdomains_of_verified_domains_may_send() {
        let mut identities = HashMap::new();
        let mut identity = new_identity();
        identity.verified = true;
        identities.insert("example.com".to_owned(), identity);
        identities.insert("pending.example".to_owned(), new_identity());
        assert!(sender_verified(&identities, "a@example.com"));
        assert!(sender_verified(&identities, "a@Mail.Example.com"));
        assert!(!sender_verified(&identities, "a@example.org"));
        assert!(!sender_verified(&identities, "a@pending.example"));
        assert!(!sender_verified(&identities, "a@com"));
    }
}
