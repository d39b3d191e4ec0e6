//! Amazon SES v2 (the cloud mail provider): its REST/JSON API at `SES_ENDPOINT`, every
//! request signed with SigV4 (`aws-sigv4`, service `ses`). Identity operations (domains,
//! Easy DKIM, custom MAIL FROM) for the domain service.

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use postmesh_shared::{outside, ApiError};

/// SES settings (their rows of `docs/configuration.md`).
pub mod settings {
    use postmesh_shared::settings;

    settings! {
        AWS_REGION = "us-east-1", "domain, sender: SES region (also in the MAIL FROM MX record)";
        SES_ENDPOINT = "" shown "`https://email.<AWS_REGION>.amazonaws.com`", "domain, sender: SES v2 API address (tests point it at a fake)";
        AWS_ACCESS_KEY_ID = "", "domain, sender: SES credentials (SigV4); unset makes setup-outbound and verify-outbound answer 503, and the sender refuses to start with `SEND_TRANSPORT=ses`";
        AWS_SECRET_ACCESS_KEY = "", "domain, sender: SES credentials (SigV4); unset makes setup-outbound and verify-outbound answer 503, and the sender refuses to start with `SEND_TRANSPORT=ses`";
    }
}

/// SES settings shared by every service that talks to it.
#[derive(Clone, Debug)]
pub struct SesConfig {
    /// `SES_ENDPOINT`, default `https://email.<AWS_REGION>.amazonaws.com`.
    pub endpoint: String,
    /// `AWS_REGION`, default `us-east-1`.
    pub region: String,
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`; without both, SES is off (503).
    pub credentials: Option<(String, String)>,
}

impl SesConfig {
    /// Reads the settings from the environment.
    pub fn from_env() -> Self {
        use settings::*;
        let region = AWS_REGION.string();
        Self {
            endpoint: SES_ENDPOINT
                .opt()
                .unwrap_or_else(|| format!("https://email.{region}.amazonaws.com")),
            credentials: AWS_ACCESS_KEY_ID.opt().zip(AWS_SECRET_ACCESS_KEY.opt()),
            region,
        }
    }
}

/// Why an SES call failed.
#[derive(Debug, thiserror::Error)]
pub enum SesError {
    /// SES could not be reached, timed out, throttled us or failed on its side: retry later.
    #[error("SES unavailable: {0}")]
    Unavailable(String),
    /// The identity does not exist in the account.
    #[error("SES: no such identity")]
    NotFound,
    /// SES refused the request, with its error type and message.
    #[error("SES refused the request ({status} {kind}): {message}")]
    Rejected {
        status: u16,
        kind: String,
        message: String,
    },
}

impl SesError {
    /// Whether trying the same request again later may succeed: SES unreachable, timing out,
    /// throttling (`TooManyRequestsException`, `ThrottlingException`) or failing on its side
    /// (5xx). Refusals (`MessageRejected`, `MailFromDomainNotVerifiedException`,
    /// `AccountSuspendedException`, `SendingPausedException`, `BadRequestException`, a bad
    /// signature, a missing identity...) are permanent.
    pub fn is_transient(&self) -> bool {
        matches!(self, SesError::Unavailable(_))
    }
}

impl From<SesError> for ApiError {
    fn from(e: SesError) -> Self {
        match e {
            SesError::Unavailable(_) => {
                tracing::warn!(error = %e, "SES unavailable");
                ApiError::Unavailable("the mail provider cannot be reached now; retry later".into())
            }
            SesError::NotFound | SesError::Rejected { .. } => {
                tracing::error!(error = %e, "SES refused a request");
                ApiError::BadGateway(format!("the mail provider refused the request: {e}"))
            }
        }
    }
}

/// `DkimAttributes` of an identity.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DkimAttributes {
    #[serde(default)]
    pub signing_enabled: bool,
    /// `PENDING`, `SUCCESS`, `FAILED`, `TEMPORARY_FAILURE` or `NOT_STARTED`.
    #[serde(default)]
    pub status: String,
    /// The Easy DKIM tokens: each is published as `<token>._domainkey.<domain>`.
    #[serde(default)]
    pub tokens: Vec<String>,
}

/// `MailFromAttributes` of an identity.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct MailFromAttributes {
    #[serde(default)]
    pub mail_from_domain: String,
    /// `PENDING`, `SUCCESS`, `FAILED` or `TEMPORARY_FAILURE`.
    #[serde(default)]
    pub mail_from_domain_status: String,
}

/// An email identity (`GetEmailIdentity`, and what `CreateEmailIdentity` answers).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct EmailIdentity {
    #[serde(default)]
    pub verified_for_sending_status: bool,
    /// `PENDING`, `SUCCESS`, `FAILED`, `TEMPORARY_FAILURE` or `NOT_STARTED`.
    #[serde(default)]
    pub verification_status: Option<String>,
    #[serde(default)]
    pub dkim_attributes: Option<DkimAttributes>,
    #[serde(default)]
    pub mail_from_attributes: Option<MailFromAttributes>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct CreateIdentity<'a> {
    email_identity: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct PutMailFrom<'a> {
    mail_from_domain: &'a str,
    behavior_on_mx_failure: &'a str,
}

/// `SendEmail`'s request, with raw content.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct SendEmail<'a> {
    from_email_address: &'a str,
    destination: Destination<'a>,
    content: EmailContent,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Destination<'a> {
    to_addresses: &'a [String],
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct EmailContent {
    raw: RawMessage,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RawMessage {
    /// The whole MIME message, base64 (standard alphabet, padded).
    data: String,
}

/// `SendEmail`'s answer.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SentEmail {
    message_id: String,
}

/// SES error types that mean "slow down" or "failed on our side", whatever the status.
const TRANSIENT_KINDS: &[&str] = &[
    "TooManyRequestsException",
    "ThrottlingException",
    "Throttling",
    "InternalServiceErrorException",
    "InternalFailure",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// SES's error body: `{"message": ...}`, its type in `x-amzn-ErrorType` (or `__type`).
#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(default, alias = "Message")]
    message: String,
    #[serde(default, rename = "__type")]
    kind: Option<String>,
}

/// The SES v2 API.
#[derive(Clone)]
pub struct SesClient {
    http: reqwest::Client,
    endpoint: String,
    region: String,
    credentials: Credentials,
}

impl SesClient {
    /// A client for `config`, or `None` when it has no credentials; each call gives up after
    /// `timeout`.
    pub fn new(config: &SesConfig, timeout: Duration) -> anyhow::Result<Option<Self>> {
        let Some((key_id, secret)) = &config.credentials else {
            return Ok(None);
        };
        let agent = concat!("postmesh/", env!("CARGO_PKG_VERSION"));
        Ok(Some(Self {
            http: outside::http_client(agent, timeout)?,
            endpoint: config.endpoint.trim_end_matches('/').to_owned(),
            region: config.region.clone(),
            credentials: Credentials::new(key_id, secret, None, None, "postmesh"),
        }))
    }

    /// `GetEmailIdentity`.
    pub async fn get_identity(&self, identity: &str) -> Result<EmailIdentity, SesError> {
        let path = format!("/v2/email/identities/{}", path_segment(identity));
        self.call("GET", &path, None).await
    }

    /// `CreateEmailIdentity` for a domain (Easy DKIM, SES's default key length).
    pub async fn create_identity(&self, identity: &str) -> Result<EmailIdentity, SesError> {
        let body = serde_json::to_vec(&CreateIdentity {
            email_identity: identity,
        })
        .map_err(|e| SesError::Unavailable(e.to_string()))?;
        self.call("POST", "/v2/email/identities", Some(body)).await
    }

    /// `PutEmailIdentityMailFromAttributes`: mail from `mail_from` (a subdomain of the
    /// identity), falling back to SES's domain while its MX is missing.
    pub async fn put_mail_from(&self, identity: &str, mail_from: &str) -> Result<(), SesError> {
        let path = format!("/v2/email/identities/{}/mail-from", path_segment(identity));
        let body = serde_json::to_vec(&PutMailFrom {
            mail_from_domain: mail_from,
            behavior_on_mx_failure: "USE_DEFAULT_VALUE",
        })
        .map_err(|e| SesError::Unavailable(e.to_string()))?;
        let _: serde_json::Value = self.call("PUT", &path, Some(body)).await?;
        Ok(())
    }

    /// `DeleteEmailIdentity`; an identity already gone is fine.
    pub async fn delete_identity(&self, identity: &str) -> Result<(), SesError> {
        let path = format!("/v2/email/identities/{}", path_segment(identity));
        match self.call::<serde_json::Value>("DELETE", &path, None).await {
            Ok(_) | Err(SesError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `SendEmail` with raw content: `raw` (a complete MIME message, headers and body) from
    /// `from` to each of `destinations`; answers SES's `MessageId`. SES v2 takes up to 40 MB
    /// per message after base64 and up to 50 recipients; neither is checked here.
    pub async fn send_raw(
        &self, from: &str, destinations: &[String], raw: &[u8],
    ) -> Result<String, SesError> {
        let body = send_raw_body(from, destinations, raw)?;
        let answer = self
            .exchange("POST", "/v2/email/outbound-emails", Some(body))
            .await?;
        // Once SES said 2xx the message is out: an unreadable answer must not make a
        // caller send it again.
        Ok(serde_json::from_slice::<SentEmail>(&answer)
            .map(|sent| sent.message_id)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "SES accepted a message but its answer was unreadable");
                "unknown".into()
            }))
    }

    /// Signs and sends one request and reads its JSON answer; maps SES's error shapes.
    async fn call<T: DeserializeOwned>(
        &self, method: &str, path: &str, body: Option<Vec<u8>>,
    ) -> Result<T, SesError> {
        let bytes = self.exchange(method, path, body).await?;
        let bytes = if bytes.is_empty() { &b"{}"[..] } else { &bytes };
        serde_json::from_slice(bytes)
            .map_err(|e| SesError::Unavailable(format!("unreadable answer: {e}")))
    }

    /// Signs and sends one request; the body of a 2xx answer (empty when it could not be
    /// read), or SES's error.
    async fn exchange(
        &self, method: &str, path: &str, body: Option<Vec<u8>>,
    ) -> Result<bytes::Bytes, SesError> {
        let url = format!("{}{path}", self.endpoint);
        let body = body.unwrap_or_default();
        let mut headers = vec![("content-type", "application/json".to_owned())];
        let signed = self
            .sign(method, &url, &headers, &body)
            .map_err(|e| SesError::Unavailable(format!("signing failed: {e}")))?;
        headers.extend(signed);
        let mut req = self.http.request(
            method
                .parse()
                .map_err(|_| SesError::Unavailable(format!("bad method {method}")))?,
            &url,
        );
        for (name, value) in headers {
            req = req.header(name, value);
        }
        let reply = outside::exchange(req.body(body))
            .await
            .map_err(SesError::Unavailable)?;
        let status = reply.status;
        let kind_header = reply
            .headers
            .get("x-amzn-errortype")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(':').next().unwrap_or(v).to_owned());
        if status.is_success() {
            return Ok(reply.body);
        }
        let bytes = reply.body;
        let detail: ErrorBody = serde_json::from_slice(&bytes).unwrap_or_default();
        let kind = kind_header
            .or(detail.kind)
            .map(|k| k.rsplit('#').next().unwrap_or(&k).to_owned())
            .unwrap_or_else(|| "Unknown".into());
        if status.is_server_error()
            || matches!(status.as_u16(), 408 | 429)
            || TRANSIENT_KINDS.contains(&kind.as_str())
        {
            Err(SesError::Unavailable(format!(
                "{status} {kind}: {}",
                detail.message
            )))
        } else if status.as_u16() == 404 || kind == "NotFoundException" {
            Err(SesError::NotFound)
        } else {
            Err(SesError::Rejected {
                status: status.as_u16(),
                kind,
                message: detail.message,
            })
        }
    }

    /// The SigV4 headers (`authorization`, `x-amz-date`, ...) for one request.
    fn sign(
        &self, method: &str, url: &str, headers: &[(&str, String)], body: &[u8],
    ) -> anyhow::Result<Vec<(&'static str, String)>> {
        let identity = self.credentials.clone().into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("ses")
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()?
            .into();
        let signable = SignableRequest::new(
            method,
            url,
            headers.iter().map(|(k, v)| (*k, v.as_str())),
            SignableBody::Bytes(body),
        )?;
        let (instructions, _) = sign(signable, &params)?.into_parts();
        let (signed, _) = instructions.into_parts();
        Ok(signed
            .into_iter()
            .map(|h| (h.name(), h.value().to_owned()))
            .collect())
    }
}

/// The JSON body of `SendEmail` for a raw message.
fn send_raw_body(from: &str, destinations: &[String], raw: &[u8]) -> Result<Vec<u8>, SesError> {
    serde_json::to_vec(&SendEmail {
        from_email_address: from,
        // With raw content SES takes Destination as the envelope only (it never rewrites the
        // message's own To/Cc headers), so every envelope recipient goes in ToAddresses.
        destination: Destination {
            to_addresses: destinations,
        },
        content: EmailContent {
            raw: RawMessage {
                data: base64::engine::general_purpose::STANDARD.encode(raw),
            },
        },
    })
    .map_err(|e| SesError::Unavailable(e.to_string()))
}

/// `s` percent-encoded as one URL path segment.
fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_raw_body_has_the_documented_shape() {
        let raw = b"From: a@example.com\r\nTo: b@example.org\r\nSubject: hi\r\n\r\nhello\r\n";
        let body = send_raw_body(
            "a@example.com",
            &["b@example.org".into(), "c@example.net".into()],
            raw,
        )
        .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "FromEmailAddress": "a@example.com",
                "Destination": { "ToAddresses": ["b@example.org", "c@example.net"] },
                "Content": { "Raw": { "Data": base64::engine::general_purpose::STANDARD.encode(raw) } }
            })
        );
    }

    #[test]
    fn transient_errors_are_told_apart() {
        assert!(SesError::Unavailable("503 ServiceUnavailable".into()).is_transient());
        assert!(!SesError::NotFound.is_transient());
        assert!(!SesError::Rejected {
            status: 400,
            kind: "MessageRejected".into(),
            message: "Email address is not verified.".into(),
        }
        .is_transient());
    }
}
