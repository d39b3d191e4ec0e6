//! The `/send-email` body, parsed at the edge into a [`SendRequest`] that cannot be invalid:
//! addresses parsed, recipients deduplicated, content chosen, attachments decoded, the
//! schedule in range. Each refusal is a 400 that names what is wrong.

use std::collections::{BTreeMap, HashSet};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use postmesh_shared::proto::JobKind;
use postmesh_shared::{ApiError, EmailAddress};

use crate::audience::audiences::{Audience, AudienceBody};
use crate::model::{self, Recipient};
use crate::sending::tags::{self, Metadata, Tag};

mod body;

pub use body::{
    Addresses, AttachmentBody, Base64Text, EmailTypeText, HeaderText, MessageIdText, SendBody,
    TemplateKeyText, To, ToItem,
};

/// Recipients of one send at most (DESIGN §6).
pub const MAX_RECIPIENTS: usize = 1000;
/// Total decoded size of a send's attachments at most.
pub const MAX_ATTACHMENT_BYTES: usize = 10 * 1024 * 1024;
/// Attachments of one send at most.
pub const MAX_ATTACHMENTS: usize = 100;
/// Addresses in `cc` and `bcc` together at most: a message goes to at most 50 addresses,
/// its recipient included (SES's limit).
pub const MAX_COPIES: usize = 49;
/// How far ahead a send may be scheduled.
pub const MAX_SCHEDULE_AHEAD_SECS: i64 = 30 * 24 * 3600;
/// Longest header value accepted (RFC 5322's line limit).
const MAX_HEADER_LEN: usize = 998;

/// What a message is for.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum EmailType {
    Transactional,
    Lifecycle,
    Marketing,
}

impl EmailType {
    /// The type named `name` in a request (`transactional` when none is given).
    pub fn parse(name: Option<&str>) -> Option<Self> {
        match name.map(str::trim) {
            None | Some("") | Some("transactional") => Some(Self::Transactional),
            Some("lifecycle") => Some(Self::Lifecycle),
            Some("marketing") => Some(Self::Marketing),
            Some(_) => None,
        }
    }

    /// The kind of the SEND jobs that carry it.
    pub fn job_kind(self) -> JobKind {
        match self {
            Self::Transactional => JobKind::Transactional,
            Self::Lifecycle => JobKind::Lifecycle,
            Self::Marketing => JobKind::Marketing,
        }
    }

    /// The name the API and the database use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transactional => "transactional",
            Self::Lifecycle => "lifecycle",
            Self::Marketing => "marketing",
        }
    }
}

/// A recipient left out of the send, with the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rejected {
    pub email: String,
    pub reason: String,
}

/// Where the message's content comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// Given in the request.
    Inline {
        subject: String,
        html: String,
        text: String,
    },
    /// A stored template (its latest version unless pinned); `subject` overrides its own.
    Template {
        key: String,
        version: Option<i32>,
        subject: Option<String>,
    },
}

/// A decoded attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub filename: String,
    pub content_type: String,
    pub content: Vec<u8>,
}

/// A valid send request.
#[derive(Clone, Debug)]
pub struct SendRequest {
    pub target: Target,
    /// The recipients of a `to` (an audience or campaign is resolved by the send).
    pub recipients: Vec<Recipient>,
    pub rejected: Vec<Rejected>,
    pub content: Content,
    pub variables: Map<String, Value>,
    pub from_email: Option<EmailAddress>,
    pub from_name: Option<String>,
    pub reply_to: Option<EmailAddress>,
    pub cc: Vec<EmailAddress>,
    pub bcc: Vec<EmailAddress>,
    pub message_id: Option<String>,
    pub in_reply_to: Option<String>,
    pub references: Vec<String>,
    pub attachments: Vec<Attachment>,
    /// `utm_*` parameters for the links of the HTML body.
    pub utm: Vec<(String, String)>,
    pub email_type: EmailType,
    pub topic: Option<String>,
    pub source_app: Option<String>,
    pub business_goal: Option<String>,
    pub recipient_reason: Option<String>,
    pub campaign_name: Option<String>,
    pub dry_run: bool,
    pub test_send: bool,
    pub scheduled_at: Option<i64>,
    /// At most `.1` sends of this email type to an address in `.0` days, this one counted.
    pub frequency_cap: Option<FrequencyCap>,
    /// No mail of this topic to an address that had one in the last that many days.
    pub topic_exclusion_days: Option<i64>,
    pub tags: Vec<Tag>,
    pub metadata: Metadata,
    /// Open and click tracking as asked; unset: the workspace's defaults.
    pub track_opens: Option<bool>,
    pub track_clicks: Option<bool>,
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// A text that goes into a header (see [`HeaderText`]).
fn header_text(field: &str, value: Option<String>) -> Result<Option<String>, ApiError> {
    HeaderText::check(field, value.map(HeaderText::from))
}

fn address(field: &str, raw: &str) -> Result<EmailAddress, ApiError> {
    EmailAddress::parse(raw).ok_or_else(|| bad(format!("{field}: invalid email address {raw:?}")))
}

/// A Message-ID as RFC 5322 writes it (`<left@right>`); given with or without brackets.
pub(crate) fn msg_id(field: &str, raw: &str) -> Result<String, ApiError> {
    let inner = raw.trim();
    let inner = inner
        .strip_prefix('<')
        .and_then(|s| s.strip_suffix('>'))
        .unwrap_or(inner);
    let valid = inner.len() <= 250
        && inner
            .split_once('@')
            .is_some_and(|(l, r)| !l.is_empty() && !r.is_empty())
        && inner.chars().all(|c| {
            c.is_ascii_graphic() && !matches!(c, '<' | '>' | '"' | '(' | ')' | ',' | '\\')
        });
    if !valid {
        return Err(bad(format!(
            "{field}: {raw:?} is not a message id like <id@domain>"
        )));
    }
    Ok(format!("<{inner}>"))
}

/// A whole number of seconds or a version, given as a JSON number.
fn whole(field: &str, n: f64) -> Result<i64, ApiError> {
    if n.is_finite() && n.fract() == 0.0 && n.abs() < 1e15 {
        Ok(n as i64)
    } else {
        Err(bad(format!("{field} must be a whole number")))
    }
}

fn copies(field: &str, list: Option<Addresses>) -> Result<Vec<EmailAddress>, ApiError> {
    let raw: Vec<String> = match list {
        None => Vec::new(),
        Some(Addresses::One(s)) => s.split(',').map(str::to_owned).collect(),
        Some(Addresses::Many(v)) => v,
    };
    let list: Vec<EmailAddress> = raw
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| address(field, s))
        .collect::<Result<_, _>>()?;
    Ok(list)
}

/// The recipients, deduplicated without regard to case; duplicates are rejected.
fn recipients(to: To) -> Result<(Vec<Recipient>, Vec<Rejected>), ApiError> {
    let items = match to {
        To::One(s) => vec![ToItem::Address(s)],
        To::Many(v) => v,
    };
    if items.is_empty() {
        return Err(bad("to has no recipients"));
    }
    if items.len() > MAX_RECIPIENTS {
        return Err(bad(format!(
            "to has {} recipients; at most {MAX_RECIPIENTS} are allowed",
            items.len()
        )));
    }
    let mut seen = HashSet::with_capacity(items.len());
    let (mut accepted, mut rejected) = (Vec::with_capacity(items.len()), Vec::new());
    for item in items {
        let (raw, external_id) = match item {
            ToItem::Address(s) => (s, None),
            ToItem::Recipient { email, external_id } => (email, external_id),
        };
        let email = EmailAddress::parse(&raw)
            .ok_or_else(|| bad(format!("invalid recipient address {raw:?}")))?;
        let external_id = header_text("externalId", external_id)?;
        if seen.insert(email.key()) {
            accepted.push(Recipient { email, external_id });
        } else {
            rejected.push(Rejected {
                email: email.to_string(),
                reason: "duplicate of an earlier recipient".into(),
            });
        }
    }
    Ok((accepted, rejected))
}

fn attachments(list: Option<Vec<AttachmentBody>>) -> Result<Vec<Attachment>, ApiError> {
    let list = list.unwrap_or_default();
    if list.len() > MAX_ATTACHMENTS {
        return Err(bad(format!(
            "at most {MAX_ATTACHMENTS} attachments are allowed"
        )));
    }
    let mut total = 0usize;
    let mut out = Vec::with_capacity(list.len());
    for (i, a) in list.into_iter().enumerate() {
        let filename = header_text("attachments.filename", a.filename.map(String::from))?
            .ok_or_else(|| bad(format!("attachment {i} has no filename")))?;
        // Characters, as the schema's `maxLength` counts them.
        if filename.chars().count() > 255 || filename.contains(['/', '\\']) {
            return Err(bad(format!(
                "attachment {filename:?}: the filename must be a plain name of at most 255 \
                 characters"
            )));
        }
        let content = a
            .content
            .map(String::from)
            .ok_or_else(|| bad(format!("attachment {filename:?} has no content")))?;
        let compact: String = content
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        let content = base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|_| {
                bad(format!(
                    "attachment {filename:?}: content is not valid base64"
                ))
            })?;
        total += content.len();
        if total > MAX_ATTACHMENT_BYTES {
            return Err(bad(format!(
                "attachments are larger than {} MiB in all",
                MAX_ATTACHMENT_BYTES / (1024 * 1024)
            )));
        }
        let content_type = a
            .content_type
            .filter(|t| !t.trim().is_empty())
            .unwrap_or_else(|| "application/octet-stream".into());
        if lettre::message::header::ContentType::parse(&content_type).is_err() {
            return Err(bad(format!(
                "attachment {filename:?}: invalid contentType {content_type:?}"
            )));
        }
        out.push(Attachment {
            filename,
            content_type,
            content,
        });
    }
    Ok(out)
}

fn utm(raw: Option<BTreeMap<String, String>>) -> Result<Vec<(String, String)>, ApiError> {
    raw.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let k = k.trim().to_owned();
            if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(bad(format!("utm: invalid parameter name {k:?}")));
            }
            let k = if k.starts_with("utm_") {
                k
            } else {
                format!("utm_{k}")
            };
            Ok((k, v))
        })
        .collect()
}

fn content(body: &mut SendBody) -> Result<Content, ApiError> {
    let subject = HeaderText::check("subject", body.subject.take())?;
    let (html, text) = (body.html.take(), body.text.take());
    if let Some(key) = body.template_key.take() {
        let key = key.trim().to_owned();
        if key.is_empty() {
            return Err(bad("templateKey is empty"));
        }
        if html.is_some() || text.is_some() {
            return Err(bad("give html/text or templateKey, not both"));
        }
        let version = match body.template_version {
            None => None,
            Some(v) => Some(
                i32::try_from(whole("templateVersion", v)?)
                    .ok()
                    .filter(|v| *v >= 1)
                    .ok_or_else(|| bad("templateVersion must be 1 or more"))?,
            ),
        };
        return Ok(Content::Template {
            key,
            version,
            subject,
        });
    }
    if body.template_version.is_some() {
        return Err(bad("templateVersion needs templateKey"));
    }
    let html = html.unwrap_or_default();
    let text = text.unwrap_or_default();
    if html.trim().is_empty() && text.trim().is_empty() {
        return Err(bad(
            "the message has no content: give html, text or templateKey",
        ));
    }
    let subject = subject.ok_or_else(|| bad("subject is required"))?;
    Ok(Content::Inline {
        subject,
        html,
        text,
    })
}

/// Who a send goes to.
#[derive(Clone, Debug)]
pub enum Target {
    /// The recipients of `to` (in [`SendRequest::recipients`]).
    To,
    /// The contacts an audience selects; `raw` as given (a campaign made by the send keeps
    /// it).
    Audience { audience: Audience, raw: Value },
    /// A campaign's frozen audience, by key.
    Campaign(String),
}

/// 400 unless exactly one of `to`, `audience` and `campaignKey` selects the targets:
/// checked before anything is looked up.
pub fn one_target(body: &SendBody) -> Result<(), ApiError> {
    let targets = [
        body.to.is_some(),
        body.audience.is_some(),
        body.campaign_key.is_some(),
    ];
    match targets.iter().filter(|t| **t).count() {
        0 => Err(bad("give exactly one of to, audience or campaignKey")),
        1 => Ok(()),
        _ => Err(bad("give only one of to, audience or campaignKey")),
    }
}

/// The one target of a send, and the recipients of a `to`.
fn target(body: &mut SendBody) -> Result<(Target, Vec<Recipient>, Vec<Rejected>), ApiError> {
    one_target(body)?;
    if let Some(to) = body.to.take() {
        let (recipients, rejected) = recipients(to)?;
        return Ok((Target::To, recipients, rejected));
    }
    if let Some(raw) = body.audience.take() {
        let given: AudienceBody =
            serde_json::from_value(raw.clone()).map_err(|e| bad(format!("audience: {e}")))?;
        let audience = Audience::parse(&given, true).map_err(|e| bad(format!("audience: {e}")))?;
        return Ok((Target::Audience { audience, raw }, Vec::new(), Vec::new()));
    }
    let key = body.campaign_key.take().unwrap_or_default();
    let key = model::parse_key("campaign", &key).map_err(bad)?;
    Ok((Target::Campaign(key), Vec::new(), Vec::new()))
}

/// A frequency cap: at most `.1` sends of one email type to an address in `.0` days.
pub type FrequencyCap = (i64, i64);

/// Longest look-back of a frequency cap or a topic exclusion.
pub const MAX_GOVERNANCE_DAYS: i64 = 365;

/// A whole number in `1..=max`, or none.
fn count_in(field: &str, raw: Option<f64>, max: i64) -> Result<Option<i64>, ApiError> {
    raw.map(|n| {
        whole(field, n)
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| bad(format!("{field} must be a whole number from 1 to {max}")))
    })
    .transpose()
}

/// `frequencyCapDays` with `frequencyCapMax` (both or neither), and `topicExclusionDays`
/// (with a `topic`).
fn governance(
    body: &SendBody, topic: Option<&str>,
) -> Result<(Option<FrequencyCap>, Option<i64>), ApiError> {
    let days = count_in(
        "frequencyCapDays",
        body.frequency_cap_days,
        MAX_GOVERNANCE_DAYS,
    )?;
    let max = count_in(
        "frequencyCapMax",
        body.frequency_cap_max,
        MAX_RECIPIENTS as i64,
    )?;
    let cap = match (days, max) {
        (Some(d), Some(m)) => Some((d, m)),
        (None, None) => None,
        _ => return Err(bad("give frequencyCapDays and frequencyCapMax together")),
    };
    let exclusion = count_in(
        "topicExclusionDays",
        body.topic_exclusion_days,
        MAX_GOVERNANCE_DAYS,
    )?;
    if exclusion.is_some() && topic.is_none() {
        return Err(bad("topicExclusionDays needs a topic"));
    }
    Ok((cap, exclusion))
}

/// `scheduledAt`: none, or a whole Unix time in the next 30 days.
fn schedule(raw: Option<f64>, now: i64) -> Result<Option<i64>, ApiError> {
    let Some(at) = raw else {
        return Ok(None);
    };
    let at = whole("scheduledAt", at)?;
    if at <= now {
        return Err(bad("scheduledAt must be in the future (Unix seconds)"));
    }
    if at > now + MAX_SCHEDULE_AHEAD_SECS {
        return Err(bad("scheduledAt must be at most 30 days ahead"));
    }
    Ok(Some(at))
}

impl SendRequest {
    /// Parses `body`; `now` is the current Unix time.
    pub fn parse(mut body: SendBody, now: i64) -> Result<Self, ApiError> {
        let (target, recipients, rejected) = target(&mut body)?;
        let content = content(&mut body)?;
        let email_type = EmailType::parse(body.email_type.as_deref()).ok_or_else(|| {
            bad(format!(
                "emailType {:?} is not one of transactional, lifecycle, marketing",
                body.email_type.as_deref().unwrap_or_default()
            ))
        })?;
        let scheduled_at = schedule(body.scheduled_at, now)?;
        let topic = HeaderText::check("topic", body.topic.take())?;
        let (frequency_cap, topic_exclusion_days) = governance(&body, topic.as_deref())?;
        let (cc, bcc) = (copies("cc", body.cc)?, copies("bcc", body.bcc)?);
        if cc.len() + bcc.len() > MAX_COPIES {
            return Err(bad(format!(
                "cc and bcc have more than {MAX_COPIES} addresses together"
            )));
        }
        // A copy would carry the recipient's own unsubscribe link, and unsubscribe them.
        if email_type != EmailType::Transactional && !(cc.is_empty() && bcc.is_empty()) {
            return Err(bad(format!(
                "cc and bcc go only with transactional mail: {} mail goes to each recipient \
                 alone, with their own unsubscribe link",
                email_type.as_str()
            )));
        }
        if body.message_id.is_some() && (recipients.len() > 1 || !matches!(target, Target::To)) {
            return Err(bad(
                "messageId names one message: give it only on a send to one recipient",
            ));
        }
        let references = body
            .references
            .unwrap_or_default()
            .iter()
            .map(|r| msg_id("references", r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            target,
            recipients,
            rejected,
            content,
            variables: body.variables.unwrap_or_default(),
            from_email: body
                .from_email
                .filter(|f| !f.trim().is_empty())
                .map(|f| address("fromEmail", &f))
                .transpose()?,
            from_name: HeaderText::check("fromName", body.from_name)?,
            reply_to: body
                .reply_to
                .filter(|f| !f.trim().is_empty())
                .map(|f| address("replyTo", &f))
                .transpose()?,
            cc,
            bcc,
            message_id: body
                .message_id
                .map(|m| msg_id("messageId", &m))
                .transpose()?,
            in_reply_to: body
                .in_reply_to
                .map(|m| msg_id("inReplyTo", &m))
                .transpose()?,
            references,
            attachments: attachments(body.attachments)?,
            utm: utm(body.utm)?,
            email_type,
            topic,
            source_app: HeaderText::check("sourceApp", body.source_app)?,
            business_goal: HeaderText::check("businessGoal", body.business_goal)?,
            recipient_reason: HeaderText::check("recipientReason", body.recipient_reason)?,
            campaign_name: HeaderText::check("campaignName", body.campaign_name)?,
            dry_run: body.dry_run.unwrap_or(false),
            test_send: body.test_send.unwrap_or(false),
            scheduled_at,
            frequency_cap,
            topic_exclusion_days,
            tags: tags::check_tags(body.tags)?,
            metadata: tags::check_metadata(body.metadata)?,
            track_opens: body.track_opens,
            track_clicks: body.track_clicks,
        })
    }
}

#[cfg(test)]
mod tests;
