//! `POST /send-raw` and `POST /smtp-envelope`: a message as its client wrote it (what the
//! SMTP submission service relays) and the checks a relay makes before it. The message is
//! read with mail-parser for what a send needs (From, Subject, Message-ID and the
//! `X-Postmesh-*` fields), kept as written but for the fields taken out here, and sent to
//! each envelope recipient as a delivery of its own, priced and governed as `/send-email`.

use axum::extract::State;
use base64::Engine as _;
use serde::Deserialize;

use postmesh_shared::extract::{Caller, JsonBody};
use postmesh_shared::{ApiError, EmailAddress, Success};

use crate::model::sandbox::Outcome;
use crate::model::schema;
use crate::sending::governance;
use crate::sending::raw_mime::{RawMessage, MAX_RAW_BYTES, MAX_RCPT};
use crate::sending::request::{Base64Text, EmailType};
use crate::sending::send::{self, RejectedRecipient, SendAnswer};
use crate::sending::sendable;
use crate::AppState;

pub use postmesh_contracts::answers::sender::EnvelopeCheck;

postmesh_shared::text_input! {
    /// An envelope address (`MAIL FROM`, `RCPT TO`) as a request gives it: the route parses it
    /// with `EmailAddress::parse`.
    #[derive(Debug)]
    pub struct EnvelopeAddress as "EnvelopeAddress" = schema::email();
}

/// The `/send-raw` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = SendRawBody)]
pub(crate) struct RawBody {
    /// The envelope sender (`MAIL FROM`); the workspace must be able to send from it, as
    /// from the `From:` address.
    #[schema(required = true, nullable = false)]
    mail_from: Option<EnvelopeAddress>,
    /// The envelope recipients (`RCPT TO`), one message each; one not in `To:` or `Cc:`
    /// is a blind copy.
    #[schema(required = true, nullable = false, min_items = 1, max_items = 1000)]
    rcpt_to: Option<Vec<EnvelopeAddress>>,
    /// The message (RFC 5322) in base64, at most 28 MiB once decoded.
    #[schema(required = true, nullable = false)]
    raw: Option<Base64Text>,
}

/// The `/smtp-envelope` body: what to check.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = SmtpEnvelopeBody)]
pub(crate) struct EnvelopeBody {
    /// The envelope sender (`MAIL FROM`), if it is to be checked.
    #[schema(nullable = false)]
    mail_from: Option<EnvelopeAddress>,
    /// Envelope recipients (`RCPT TO`) to check.
    #[schema(nullable = false, max_items = 1000)]
    rcpt_to: Option<Vec<EnvelopeAddress>>,
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

fn envelope_address(field: &str, raw: &EnvelopeAddress) -> Result<EmailAddress, ApiError> {
    EmailAddress::parse(raw)
        .ok_or_else(|| bad(format!("{field}: invalid email address {:?}", &**raw)))
}

/// `rcptTo`, at most [`MAX_RCPT`] addresses, each parsed.
fn recipients(list: &[EnvelopeAddress]) -> Result<Vec<EmailAddress>, ApiError> {
    if list.len() > MAX_RCPT {
        return Err(bad(format!("rcptTo has more than {MAX_RCPT} addresses")));
    }
    list.iter().map(|r| envelope_address("rcptTo", r)).collect()
}

/// `POST /send-raw`: the message to each envelope recipient. A repeat of a message with the
/// same Message-ID and envelope within a day answers the first's task and sends and charges
/// nothing more.
pub(crate) async fn send_raw(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<RawBody>,
) -> Result<Success<SendAnswer>, ApiError> {
    let mail_from = body.mail_from.ok_or_else(|| bad("mailFrom is required"))?;
    let mail_from = envelope_address("mailFrom", &mail_from)?;
    let rcpt_to = body
        .rcpt_to
        .filter(|r| !r.is_empty())
        .ok_or_else(|| bad("rcptTo needs at least one address"))?;
    let rcpt_to = recipients(&rcpt_to)?;
    let encoded = body.raw.ok_or_else(|| bad("raw is required"))?;
    let compact: Vec<u8> = encoded
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    if compact.len() / 4 * 3 > MAX_RAW_BYTES + 3 {
        return Err(ApiError::PayloadTooLarge(format!(
            "the message is larger than {} MiB",
            MAX_RAW_BYTES / (1024 * 1024)
        )));
    }
    let mime = base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|_| bad("raw is not valid base64"))?;
    let message = RawMessage::parse(mail_from, mime, state.unsubscribe.is_some())?;
    let keyed = message.keyed(&rcpt_to, caller.test);
    let body = message.send_body(rcpt_to);
    send::once(&state, &caller, body, keyed, Some(&message))
        .await
        .map(Success::new)
}

/// `POST /smtp-envelope`: whether the workspace may send from `mailFrom`, and which of
/// `rcptTo` no message may go to (bounces, complaints, manual suppressions and the sandbox's
/// `suppressed@`; unsubscribes depend on the message's type and topic, known only with it).
pub(crate) async fn envelope(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<EnvelopeBody>,
) -> Result<Success<EnvelopeCheck>, ApiError> {
    let rcpt_to = recipients(&body.rcpt_to.unwrap_or_default())?;
    let reason = match &body.mail_from {
        Some(from) => {
            let from = envelope_address("mailFrom", from)?;
            sendable::refusal(&state, &caller, &from).await?
        }
        None => None,
    };
    let mut rejected = Vec::new();
    let mut keys = Vec::with_capacity(rcpt_to.len());
    for r in &rcpt_to {
        if state.sandbox.outcome(r.as_str())? == Some(Outcome::Suppressed) {
            rejected.push(RejectedRecipient {
                email: r.to_string(),
                reason: "suppressed:sandbox".into(),
            });
        }
        keys.push(r.key());
    }
    if !keys.is_empty() {
        let mut conn = state.db.acquire().await?;
        let reasons = governance::suppressed(
            &mut conn,
            caller.workspace,
            EmailType::Transactional,
            None,
            keys,
        )
        .await?;
        for (r, reason) in rcpt_to.iter().zip(reasons) {
            if let Some(reason) = reason {
                rejected.push(RejectedRecipient {
                    email: r.to_string(),
                    reason,
                });
            }
        }
    }
    Ok(Success::new(EnvelopeCheck {
        sendable: reason.is_none(),
        reason: reason.unwrap_or_default(),
        rejected,
    }))
}
