//! The gateway's HTTP API as the service uses it: `/smtp-auth` at a login, `/smtp-envelope`
//! at `MAIL FROM` and `RCPT TO`, `/send-raw` at the end of `DATA`. Each of its refusals is
//! mapped here, once, to the SMTP reply a client gets.

use std::net::IpAddr;
use std::time::Duration;

use base64::Engine as _;
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use postmesh_contracts::answers::sender::{EnvelopeCheck, SendAnswer};

use crate::reply::Reply;

/// The header that names the SMTP client to the gateway, whose limit on failed
/// authentications counts each client apart (with `GATEWAY_TRUST_FORWARDED_FOR`), not every
/// client of this service as one.
const FORWARDED_FOR: &str = "x-forwarded-for";

/// Where a call was made: the same refusal means different things at each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    MailFrom,
    RcptTo,
    Data,
}

/// A client of the gateway.
pub struct Api {
    http: reqwest::Client,
    base: String,
}

/// What `/smtp-auth` takes.
#[derive(Serialize)]
struct Login<'a> {
    username: &'a str,
}

/// What `/smtp-envelope` takes, and `/send-raw` with the message.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    mail_from: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    rcpt_to: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    raw: Option<String>,
}

/// An error answer's text.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error: String,
}

/// Why a login did not succeed.
#[derive(Debug, PartialEq, Eq)]
pub enum LoginError {
    /// The user name and key do not go together (or the key is no key).
    Refused,
    /// The API could not say: try again later.
    Unavailable,
}

impl Api {
    /// A client of the API at `base`; a call waits at most a little over `timeout` (the
    /// gateway's own limit on what it forwards).
    pub fn new(base: &str, timeout: Duration) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(timeout * 2 + Duration::from_secs(5))
            .pool_max_idle_per_host(64)
            .build()?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// Whether `key` is an API key of the account whose email is `username`, for a client
    /// at `client`. A key with a character no key has is refused without asking.
    pub async fn login(&self, client: IpAddr, username: &str, key: &str) -> Result<(), LoginError> {
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(LoginError::Refused);
        }
        let answer = self
            .http
            .post(format!("{}/smtp-auth", self.base))
            .bearer_auth(key)
            .header(FORWARDED_FOR, client.to_string())
            .json(&Login { username })
            .send()
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "checking an SMTP login");
                LoginError::Unavailable
            })?;
        match answer.status() {
            StatusCode::OK => Ok(()),
            StatusCode::BAD_REQUEST | StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                Err(LoginError::Refused)
            }
            status => {
                tracing::warn!(%status, "an SMTP login could not be checked");
                Err(LoginError::Unavailable)
            }
        }
    }

    /// Refused unless the key's workspace may send from `from`.
    pub async fn check_sender(&self, client: IpAddr, key: &str, from: &str) -> Result<(), Reply> {
        let check: EnvelopeCheck = self
            .call(
                Stage::MailFrom,
                (client, key),
                "/smtp-envelope",
                &Envelope {
                    mail_from: Some(from),
                    rcpt_to: &[],
                    raw: None,
                },
            )
            .await?;
        if check.sendable {
            Ok(())
        } else {
            Err(Reply::new(
                550,
                "5.7.1",
                format!("sender {from} cannot be used: {}", check.reason),
            ))
        }
    }

    /// Refused when no message may go to `to` (suppressed), with why.
    pub async fn check_recipient(&self, client: IpAddr, key: &str, to: &str) -> Result<(), Reply> {
        let check: EnvelopeCheck = self
            .call(
                Stage::RcptTo,
                (client, key),
                "/smtp-envelope",
                &Envelope {
                    mail_from: None,
                    rcpt_to: &[to.to_owned()],
                    raw: None,
                },
            )
            .await?;
        match check.rejected.first() {
            None => Ok(()),
            Some(r) => Err(Reply::new(
                550,
                "5.7.1",
                format!("recipient {to} refused: {}", r.reason),
            )),
        }
    }

    /// Sends `mime` from `mail_from` to `rcpt_to`; answers the send.
    pub async fn send(
        &self, client: IpAddr, key: &str, mail_from: &str, rcpt_to: &[String], mime: &[u8],
    ) -> Result<SendAnswer, Reply> {
        let raw = base64::engine::general_purpose::STANDARD.encode(mime);
        let body = Envelope {
            mail_from: Some(mail_from),
            rcpt_to,
            raw: Some(raw),
        };
        self.call(Stage::Data, (client, key), "/send-raw", &body)
            .await
    }

    /// POSTs `body` to `path` with `key` for a client at `client`; its answer, or the reply
    /// its refusal makes.
    async fn call<T: DeserializeOwned>(
        &self, stage: Stage, (client, key): (IpAddr, &str), path: &str, body: &Envelope<'_>,
    ) -> Result<T, Reply> {
        let unavailable =
            |what: &str| Reply::new(451, "4.3.0", format!("{what}; please try again later"));
        let answer = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .header(FORWARDED_FOR, client.to_string())
            .json(body)
            .send()
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, path, "calling the API");
                unavailable("the service is unavailable")
            })?;
        let status = answer.status();
        if status.is_success() {
            return answer.json::<T>().await.map_err(|e| {
                tracing::warn!(error = %e, path, "an undecodable answer");
                unavailable("the service answered unexpectedly")
            });
        }
        let error = answer
            .json::<ErrorBody>()
            .await
            .map(|b| b.error)
            .unwrap_or_default();
        Err(refusal(stage, status, error))
    }
}

/// The SMTP reply to an API refusal of `status` at `stage`.
fn refusal(stage: Stage, status: StatusCode, error: String) -> Reply {
    match status {
        StatusCode::UNAUTHORIZED => Reply::new(
            530,
            "5.7.0",
            format!("the API key is no longer valid: {error}"),
        ),
        StatusCode::PAYMENT_REQUIRED => Reply::new(
            452,
            "4.2.1",
            format!("insufficient credit to send this message: {error}"),
        ),
        StatusCode::FORBIDDEN => Reply::new(550, "5.7.1", error),
        StatusCode::PAYLOAD_TOO_LARGE => Reply::new(552, "5.3.4", error),
        StatusCode::TOO_MANY_REQUESTS => Reply::new(
            451,
            "4.7.1",
            format!("too many requests; please try again later: {error}"),
        ),
        StatusCode::BAD_REQUEST | StatusCode::CONFLICT => match stage {
            Stage::MailFrom => Reply::new(553, "5.1.7", error),
            Stage::RcptTo => Reply::new(550, "5.1.1", error),
            Stage::Data => Reply::new(554, "5.6.0", error),
        },
        _ => {
            tracing::warn!(%status, error, "the API refused unexpectedly");
            Reply::new(451, "4.3.0", "temporary failure; please try again later")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_has_its_reply() {
        let code = |stage, status| refusal(stage, status, "why".into()).code;
        assert_eq!(code(Stage::Data, StatusCode::PAYMENT_REQUIRED), 452);
        assert_eq!(code(Stage::Data, StatusCode::FORBIDDEN), 550);
        assert_eq!(code(Stage::Data, StatusCode::PAYLOAD_TOO_LARGE), 552);
        assert_eq!(code(Stage::Data, StatusCode::BAD_REQUEST), 554);
        assert_eq!(code(Stage::RcptTo, StatusCode::BAD_REQUEST), 550);
        assert_eq!(code(Stage::MailFrom, StatusCode::BAD_REQUEST), 553);
        assert_eq!(code(Stage::Data, StatusCode::BAD_GATEWAY), 451);
        let credit = refusal(
            Stage::Data,
            StatusCode::PAYMENT_REQUIRED,
            "balance 0".into(),
        );
        assert_eq!(credit.status, "4.2.1");
        assert!(
            credit.text.contains("insufficient credit"),
            "{}",
            credit.text
        );
    }
}
