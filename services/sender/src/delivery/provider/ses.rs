//! What an SES event says and what it makes: its delivery events and suppressions.

use serde::Deserialize;
use serde_json::Value;

use super::{unsubscribed_from, UNKNOWN_RETRY_WINDOW};
use crate::audience::suppressions::Reason;
use crate::sending::events::{Detail, Kind};

/// An SES event: `eventType` (event publishing) or `notificationType` (identity
/// notifications), and the parts we read.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SesEvent {
    pub(super) event_type: Option<String>,
    pub(super) notification_type: Option<String>,
    pub(super) mail: Option<SesMail>,
    pub(super) bounce: Option<Value>,
    pub(super) complaint: Option<Value>,
    pub(super) delivery: Option<Value>,
    pub(super) reject: Option<Value>,
    pub(super) delivery_delay: Option<Value>,
    pub(super) subscription: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SesMail {
    pub(super) message_id: String,
    /// When SES accepted the message (RFC 3339).
    pub(super) timestamp: Option<String>,
}

impl SesMail {
    /// Whether SES accepted the message within [`UNKNOWN_RETRY_WINDOW`]: a notification of
    /// it may overtake our worker's record of its SES id.
    pub(super) fn is_recent(&self) -> bool {
        let Some(accepted) = self.timestamp.as_deref().and_then(|raw| {
            time::OffsetDateTime::parse(raw, &time::format_description::well_known::Rfc3339).ok()
        }) else {
            return false;
        };
        (time::OffsetDateTime::now_utc() - accepted).unsigned_abs() < UNKNOWN_RETRY_WINDOW
    }
}

/// The recipient addresses listed under `list` (`[{emailAddress}]`) of `part`.
fn addresses(part: &Value, list: &str) -> Vec<String> {
    part[list]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["emailAddress"].as_str().map(str::to_owned))
        .collect()
}

/// What a delivery event and suppression an SES event makes.
pub(super) struct Effect {
    pub(super) kind: Kind,
    pub(super) detail: Detail,
    pub(super) suppress: Option<(Reason, Option<String>)>,
    /// Whom the suppression is for: the addresses the event lists (a cc or bcc copy can
    /// bounce too); empty: the message's recipient.
    pub(super) addresses: Vec<String>,
}

pub(super) fn effects(event: &SesEvent, kind: &str) -> Result<Vec<Effect>, String> {
    let one = |kind, detail: Detail, suppress, addresses: Vec<String>| {
        vec![Effect {
            kind,
            detail,
            suppress,
            addresses,
        }]
    };
    Ok(match kind {
        "Bounce" => {
            let bounce = event.bounce.as_ref().ok_or("a Bounce without bounce")?;
            let permanent = bounce["bounceType"] == "Permanent";
            let diagnostic = bounce["bouncedRecipients"][0]["diagnosticCode"].as_str();
            let reason = diagnostic.map(str::to_owned).unwrap_or_else(|| {
                format!(
                    "{} bounce ({})",
                    bounce["bounceType"].as_str().unwrap_or("unknown"),
                    bounce["bounceSubType"].as_str().unwrap_or("unspecified")
                )
            });
            let detail = Detail::Bounce {
                reason,
                bounce_type: bounce["bounceType"].as_str().map(str::to_owned),
                bounce_sub_type: bounce["bounceSubType"].as_str().map(str::to_owned),
                recipients: addresses(bounce, "bouncedRecipients"),
            };
            one(
                Kind::Bounced,
                detail,
                permanent.then_some((Reason::Bounce, None)),
                addresses(bounce, "bouncedRecipients"),
            )
        }
        "Complaint" => {
            let complaint = event
                .complaint
                .as_ref()
                .ok_or("a Complaint without complaint")?;
            let feedback = complaint["complaintFeedbackType"].as_str();
            // The recipient said the message is not spam: no complaint at all.
            if feedback == Some("not-spam") {
                return Ok(Vec::new());
            }
            let detail = Detail::Complaint {
                reason: format!("complaint ({})", feedback.unwrap_or("unspecified")),
                feedback_type: feedback.map(str::to_owned),
                recipients: addresses(complaint, "complainedRecipients"),
            };
            one(
                Kind::Complained,
                detail,
                Some((Reason::Complaint, None)),
                addresses(complaint, "complainedRecipients"),
            )
        }
        // The provider's own object about the event is its detail.
        "Delivery" => one(
            Kind::Delivered,
            Detail::Provider(event.delivery.clone()),
            None,
            vec![],
        ),
        "Reject" => one(
            Kind::Rejected,
            Detail::Provider(event.reject.clone()),
            None,
            vec![],
        ),
        "DeliveryDelay" => {
            let detail = Detail::Provider(event.delivery_delay.clone());
            one(Kind::Delayed, detail, None, vec![])
        }
        "Subscription" => {
            let sub = event
                .subscription
                .as_ref()
                .ok_or("a Subscription without subscription")?;
            let prefs = &sub["newTopicPreferences"];
            let mut topics: Vec<Option<String>> = Vec::new();
            if prefs["unsubscribeAll"] == true {
                topics.push(None);
            }
            for t in prefs["topicSubscriptionStatus"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if t["subscriptionStatus"] == "OptOut" {
                    if let Some(name) = t["topicName"].as_str() {
                        topics.push(Some(name.to_owned()));
                    }
                }
            }
            topics
                .into_iter()
                .map(|topic| Effect {
                    kind: Kind::Unsubscribed,
                    detail: Detail::Unsubscribed {
                        reason: unsubscribed_from(topic.as_deref(), "at the provider"),
                        topic: topic.clone(),
                        source: Some("provider"),
                    },
                    suppress: Some((Reason::Unsubscribed, topic)),
                    addresses: Vec::new(),
                })
                .collect()
        }
        _ => Vec::new(),
    })
}
