//! Answers of the billing service: the balance and the consumption log.

use serde::{Deserialize, Serialize};

/// The answer of `GET /balance`.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Balance {
    pub balance: i64,
}

status! {
    /// What a ledger entry did to a balance.
    EntryKind EntryKind {
        /// Credits taken (negative delta).
        Charge => "charge",
        /// A charge given back.
        Refund => "refund",
        /// Credits added.
        Grant => "grant",
        /// A key refunded before its charge happened: the charge can never take credits.
        Void => "void",
    }
}

status! {
    /// A plan subscription's status as the payment processor reports it.
    SubscriptionStatus SubscriptionStatus {
        /// Created, first payment not yet made.
        Incomplete => "incomplete",
        /// The first payment never came: over.
        IncompleteExpired => "incomplete_expired",
        /// In its trial.
        Trialing => "trialing",
        /// Paid up.
        Active => "active",
        /// A renewal payment failed; retries are under way.
        PastDue => "past_due",
        /// Cancelled: over.
        Canceled => "canceled",
        /// Retries ran out unpaid.
        Unpaid => "unpaid",
        /// A trial ended without a payment method.
        Paused => "paused",
    }
}

impl SubscriptionStatus {
    /// Statuses of a subscription that is over: the workspace has no plan.
    pub const ENDED: [Self; 2] = [Self::Canceled, Self::IncompleteExpired];

    /// Whether the plan's limits apply (an unpaid or paused plan falls back to the free ones).
    pub fn limits_apply(self) -> bool {
        matches!(self, Self::Active | Self::Trialing | Self::PastDue)
    }
}

/// A log entry's fields in order: the CSV download's columns (the spec's ten, then `kind`).
pub const LOG_FIELDS: [&str; 11] = [
    "log_id",
    "timestamp",
    "amount_deducted",
    "caller_email",
    "target_email",
    "from_email",
    "subject",
    "send_mode",
    "recipient_count",
    "task_id",
    "kind",
];

/// One consumption log entry, with the spec's field names.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct LogEntry {
    pub log_id: String,
    pub timestamp: String,
    pub amount_deducted: f64,
    pub caller_email: String,
    pub target_email: Option<String>,
    pub from_email: Option<String>,
    pub subject: Option<String>,
    pub send_mode: Option<String>,
    pub recipient_count: Option<f64>,
    pub task_id: Option<String>,
    pub kind: EntryKind,
}

/// The answer of `GET /logs`: one page, newest first.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct LogPage {
    pub logs: Vec<LogEntry>,
    pub limit: i64,
    pub offset: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_fields_are_the_entrys_fields() {
        let entry = LogEntry {
            log_id: "l".into(),
            timestamp: "t".into(),
            amount_deducted: 1.0,
            caller_email: "a@x.com".into(),
            target_email: None,
            from_email: None,
            subject: None,
            send_mode: None,
            recipient_count: None,
            task_id: None,
            kind: EntryKind::Charge,
        };
        let value = serde_json::to_value(entry).unwrap();
        let mut named: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut listed = LOG_FIELDS.to_vec();
        named.sort_unstable();
        listed.sort_unstable();
        assert_eq!(named, listed);
    }

    #[test]
    fn a_subscription_status_reads_as_stripe_spells_it() {
        let read: SubscriptionStatus = serde_json::from_str("\"past_due\"").unwrap();
        assert_eq!(read, SubscriptionStatus::PastDue);
        assert_eq!(read.as_str(), "past_due");
        assert!(serde_json::from_str::<SubscriptionStatus>("\"pastdue\"").is_err());
        assert!(read.limits_apply() && !SubscriptionStatus::Unpaid.limits_apply());
    }
}
