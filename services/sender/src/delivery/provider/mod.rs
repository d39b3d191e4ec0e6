//! `POST /provider-events/esp`: Amazon SES notifications, delivered by SNS. The gateway
//! has checked the provider secret. The SNS envelope (JSON, or the same as `text/plain`) is
//! verified — its signing certificate's URL must match `SNS_URL_PATTERN` before anything
//! is fetched, and the signature (SignatureVersion 1: SHA1withRSA, 2: SHA256withRSA) over
//! SNS's canonical string must hold — and its topic must be one of `SNS_TOPIC_ARNS` (when
//! set). A `SubscriptionConfirmation` is confirmed by fetching its `SubscribeURL` (same
//! pattern). A `Notification`'s SES event is matched to our message by the SES message id
//! recorded at delivery (one SES accepted in the last 15 minutes and not known yet is a 503,
//! so SNS delivers it again once the worker has recorded the id): each is a delivery event
//! of its recipient, and permanent bounces,
//! complaints and unsubscribes write suppressions; an SNS message seen before is counted as
//! a duplicate and changes nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use base64::Engine as _;
use regex::Regex;
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::signature::Verifier;
use rsa::RsaPublicKey;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use uuid::Uuid;
use x509_cert::der::referenced::OwnedToRef;
use x509_cert::der::DecodePem;
use x509_cert::Certificate;

use postmesh_shared::db::now_unix;
use postmesh_shared::outside::read_capped;
use postmesh_shared::{ApiError, EmailAddress, Success, WorkspaceId};

use crate::audience::suppressions;
use crate::sending::events::{self, NewEvent};
use crate::AppState;
use ses::{effects, Effect, SesEvent};

/// How long after SES accepted a message a notification of it that matches none of ours is
/// answered 503, so SNS delivers it again once the worker has recorded the SES id.
const UNKNOWN_RETRY_WINDOW: Duration = Duration::from_secs(15 * 60);
/// How long fetching a certificate or confirming a subscription may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Certificates kept at most.
const MAX_CERTS: usize = 64;
/// The largest signing certificate read (SNS's are about 2 KiB of PEM).
const MAX_CERT_BYTES: usize = 64 * 1024;

/// Where notifications may come from, and the certificates already fetched.
#[derive(Clone)]
pub struct Sns {
    pattern: Regex,
    topics: Vec<String>,
    http: reqwest::Client,
    certs: Arc<Mutex<HashMap<String, RsaPublicKey>>>,
}

impl std::fmt::Debug for Sns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sns")
            .field("pattern", &self.pattern.as_str())
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

impl Sns {
    /// Accepts URLs matching `pattern` and notifications of `topics` (empty: any).
    pub fn new(pattern: &str, topics: Vec<String>) -> anyhow::Result<Self> {
        postmesh_shared::tls::install_provider();
        Ok(Self {
            pattern: Regex::new(pattern)
                .map_err(|e| anyhow::anyhow!("SNS_URL_PATTERN is not a regex: {e}"))?,
            topics,
            http: reqwest::Client::builder()
                .timeout(FETCH_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
            certs: Arc::default(),
        })
    }

    /// The public key of the certificate at `url`, fetched once.
    async fn key(&self, url: &str) -> Result<RsaPublicKey, ApiError> {
        if let Some(key) = self.certs.lock().expect("certs lock").get(url) {
            return Ok(key.clone());
        }
        let unavailable =
            |e: String| ApiError::Unavailable(format!("fetching the signing certificate: {e}"));
        let res = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        if !res.status().is_success() {
            return Err(unavailable(format!("HTTP {}", res.status().as_u16())));
        }
        let (pem, longer) = read_capped(res, MAX_CERT_BYTES)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        if longer {
            return Err(ApiError::BadRequest(format!(
                "the signing certificate is over {MAX_CERT_BYTES} bytes"
            )));
        }
        let cert = Certificate::from_pem(&pem)
            .map_err(|e| ApiError::BadRequest(format!("the signing certificate: {e}")))?;
        let spki = cert.tbs_certificate.subject_public_key_info.owned_to_ref();
        let key = RsaPublicKey::try_from(spki).map_err(|e| {
            ApiError::BadRequest(format!("the signing certificate's key is not RSA: {e}"))
        })?;
        let mut certs = self.certs.lock().expect("certs lock");
        if certs.len() >= MAX_CERTS {
            certs.clear();
        }
        certs.insert(url.to_owned(), key.clone());
        Ok(key)
    }
}

/// An SNS message as posted.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Envelope {
    #[serde(rename = "Type")]
    pub kind: String,
    pub message_id: String,
    pub topic_arn: String,
    pub message: String,
    pub timestamp: String,
    pub signature_version: String,
    pub signature: String,
    #[serde(rename = "SigningCertURL")]
    pub signing_cert_url: String,
    pub subject: Option<String>,
    #[serde(rename = "SubscribeURL")]
    pub subscribe_url: Option<String>,
    pub token: Option<String>,
}

impl Envelope {
    /// What SNS signs: the named fields as `Name\nvalue\n`, in its order.
    pub fn canonical(&self) -> Result<String, ApiError> {
        let mut out = String::new();
        let mut field = |name: &str, value: Option<&str>| {
            if let Some(v) = value {
                out.push_str(name);
                out.push('\n');
                out.push_str(v);
                out.push('\n');
            }
        };
        match self.kind.as_str() {
            "Notification" => {
                field("Message", Some(&self.message));
                field("MessageId", Some(&self.message_id));
                field("Subject", self.subject.as_deref());
                field("Timestamp", Some(&self.timestamp));
                field("TopicArn", Some(&self.topic_arn));
                field("Type", Some(&self.kind));
            }
            "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
                field("Message", Some(&self.message));
                field("MessageId", Some(&self.message_id));
                field("SubscribeURL", self.subscribe_url.as_deref());
                field("Timestamp", Some(&self.timestamp));
                field("Token", self.token.as_deref());
                field("TopicArn", Some(&self.topic_arn));
                field("Type", Some(&self.kind));
            }
            other => {
                return Err(ApiError::BadRequest(format!(
                    "unknown SNS message type {other:?}"
                )))
            }
        }
        Ok(out)
    }
}

/// The answer.
#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ProviderEventsHandled)]
pub struct Handled {
    pub matched: u64,
    pub duplicates: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub confirmed: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub ignored: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn ignored(reason: impl Into<String>) -> Handled {
    Handled {
        ignored: true,
        reason: Some(reason.into()),
        ..Handled::default()
    }
}

/// Checks the envelope's URLs, topic and signature.
async fn verify(sns: &Sns, env: &Envelope) -> Result<(), ApiError> {
    if !sns.pattern.is_match(&env.signing_cert_url) {
        return Err(ApiError::BadRequest(
            "SigningCertURL is not an SNS certificate URL".into(),
        ));
    }
    if let Some(url) = &env.subscribe_url {
        if !sns.pattern.is_match(url) {
            return Err(ApiError::BadRequest(
                "SubscribeURL is not an SNS URL".into(),
            ));
        }
    }
    if !sns.topics.is_empty() && !sns.topics.contains(&env.topic_arn) {
        return Err(ApiError::BadRequest(format!(
            "topic {} is not accepted (SNS_TOPIC_ARNS)",
            env.topic_arn
        )));
    }
    let canonical = env.canonical()?;
    let signature = base64::engine::general_purpose::STANDARD
        .decode(env.signature.trim())
        .ok()
        .and_then(|s| Signature::try_from(s.as_slice()).ok())
        .ok_or_else(|| ApiError::BadRequest("Signature is not base64".into()))?;
    let key = sns.key(&env.signing_cert_url).await?;
    let valid = match env.signature_version.as_str() {
        "1" => VerifyingKey::<sha1::Sha1>::new(key).verify(canonical.as_bytes(), &signature),
        "2" => VerifyingKey::<sha2::Sha256>::new(key).verify(canonical.as_bytes(), &signature),
        other => {
            return Err(ApiError::BadRequest(format!(
                "SignatureVersion {other:?} is not 1 or 2"
            )))
        }
    };
    valid.map_err(|_| ApiError::BadRequest("the SNS signature does not verify".into()))
}

pub(crate) async fn receive(
    State(state): State<AppState>, body: Bytes,
) -> Result<Success<Handled>, ApiError> {
    let Some(sns) = &state.sns else {
        return Err(ApiError::Unavailable(
            "provider notifications are not configured".into(),
        ));
    };
    // JSON, whether sent as application/json or as SNS's text/plain.
    let env: Envelope = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("not an SNS message: {e}")))?;
    verify(sns, &env).await?;
    let handled = match env.kind.as_str() {
        "SubscriptionConfirmation" => {
            let url = env
                .subscribe_url
                .as_deref()
                .ok_or_else(|| ApiError::BadRequest("no SubscribeURL".into()))?;
            let res = sns.http.get(url).send().await;
            match res {
                Ok(r) if r.status().is_success() => Handled {
                    confirmed: true,
                    ..Handled::default()
                },
                Ok(r) => {
                    return Err(ApiError::BadGateway(format!(
                        "confirming the subscription: HTTP {}",
                        r.status().as_u16()
                    )))
                }
                Err(e) => {
                    return Err(ApiError::BadGateway(format!(
                        "confirming the subscription: {e}"
                    )))
                }
            }
        }
        "UnsubscribeConfirmation" => ignored("an unsubscribe confirmation needs no action"),
        _ => notification(&state, &env).await?,
    };
    Ok(Success::new(handled))
}

/// One of our messages, by its SES message id.
#[derive(sqlx::FromRow)]
struct Ours {
    delivery_id: Uuid,
    /// None for a sign-in code's message, which belongs to no workspace.
    workspace_id: Option<Uuid>,
    task_id: Option<Uuid>,
    email: String,
}

/// Why an `unsubscribed` event happened, in words.
pub fn unsubscribed_from(topic: Option<&str>, how: &str) -> String {
    match topic {
        Some(topic) => format!("unsubscribed from topic {topic} {how}"),
        None => format!("unsubscribed from all mail {how}"),
    }
}

/// A `Notification`: its SES event applied to our message, once per SNS message.
async fn notification(state: &AppState, env: &Envelope) -> Result<Handled, ApiError> {
    let event: SesEvent = serde_json::from_str(&env.message)
        .map_err(|e| ApiError::BadRequest(format!("the notification's Message: {e}")))?;
    let Some(kind) = event
        .event_type
        .clone()
        .or_else(|| event.notification_type.clone())
    else {
        return Ok(ignored(
            "not an SES event (no eventType or notificationType)",
        ));
    };
    let Some(mail) = &event.mail else {
        return Err(ApiError::BadRequest("an SES event without mail".into()));
    };
    let effects = effects(&event, &kind).map_err(ApiError::BadRequest)?;
    let unavailable = |e: sqlx::Error| {
        tracing::warn!(error = %e, "storing a provider notification failed");
        ApiError::Unavailable("storage is unavailable; retry".into())
    };
    let mut tx = state.db.begin().await.map_err(unavailable)?;
    let ours: Option<Ours> = sqlx::query_as(
        "SELECT delivery_id, workspace_id, task_id, recipients[1] AS email FROM deliveries
         WHERE provider_message_id = $1 LIMIT 1",
    )
    .bind(&mail.message_id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(unavailable)?;
    let Some(ours) = ours else {
        if mail.is_recent() {
            return Err(ApiError::Unavailable(format!(
                "no message of ours has SES id {} yet; deliver the notification again",
                mail.message_id
            )));
        }
        return Ok(ignored(format!(
            "no message of ours has SES id {}",
            mail.message_id
        )));
    };
    let Some(workspace) = ours.workspace_id else {
        return Ok(Handled {
            matched: 1,
            ..ignored("a sign-in code's message belongs to no workspace")
        });
    };
    let first: Option<String> = sqlx::query_scalar(
        "INSERT INTO provider_notifications (message_id, received_at) VALUES ($1, $2)
         ON CONFLICT DO NOTHING RETURNING message_id",
    )
    .bind(&env.message_id)
    .bind(now_unix())
    .fetch_optional(&mut *tx)
    .await
    .map_err(unavailable)?;
    if first.is_none() {
        return Ok(Handled {
            matched: 1,
            duplicates: 1,
            ..Handled::default()
        });
    }
    if effects.is_empty() {
        tx.commit().await.map_err(unavailable)?;
        return Ok(Handled {
            matched: 1,
            ..ignored(format!("{kind} events are not acted on"))
        });
    }
    apply(&mut tx, state, &ours, workspace, env, &effects)
        .await
        .map_err(unavailable)?;
    tx.commit().await.map_err(unavailable)?;
    crate::sending::send::publish_soon(state);
    Ok(Handled {
        matched: 1,
        ..Handled::default()
    })
}

/// Writes the effects' events and suppressions for our message's recipient, and for the
/// copies an event lists without the recipient an event of the send, not of the delivery.
async fn apply(
    tx: &mut PgConnection, state: &AppState, ours: &Ours, workspace: Uuid, env: &Envelope,
    effects: &[Effect],
) -> Result<(), sqlx::Error> {
    let now = now_unix();
    let mut events = Vec::with_capacity(effects.len());
    let recipient = EmailAddress::parse(&ours.email).map(|e| e.key());
    for (i, effect) in effects.iter().enumerate() {
        let listed: Vec<EmailAddress> = effect
            .addresses
            .iter()
            .filter_map(|e| EmailAddress::parse(e))
            .collect();
        if let Some((reason, topic)) = &effect.suppress {
            let whom = match listed.is_empty() {
                true => EmailAddress::parse(&ours.email).into_iter().collect(),
                false => listed.clone(),
            };
            for email in &whom {
                let at = WorkspaceId::from(workspace);
                suppressions::add(&mut *tx, at, email, *reason, topic.as_deref()).await?;
            }
        }
        let event = |delivery, email: String, source_key| NewEvent {
            workspace,
            task: ours.task_id,
            delivery,
            email,
            kind: effect.kind,
            detail: effect.detail.clone(),
            occurred_at: now,
            source_key,
        };
        let copies_only = !listed.is_empty() && listed.iter().all(|e| Some(e.key()) != recipient);
        if !copies_only {
            let key = format!("sns:{}:{i}", env.message_id);
            events.push(event(Some(ours.delivery_id), ours.email.clone(), key));
            continue;
        }
        for (j, copy) in listed.iter().enumerate() {
            let key = format!("sns:{}:{i}:{j}", env.message_id);
            events.push(event(None, copy.to_string(), key));
        }
    }
    events::record(tx, &state.events, &events).await.map(drop)
}

mod ses;
#[cfg(test)]
mod tests;
