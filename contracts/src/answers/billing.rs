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
