//! `balance` and `logs`: the credit balance and the consumption log (spec §4.3).

use postmesh_contracts::answers::billing::{Balance, LogEntry, LogPage, LOG_FIELDS};
use postmesh_contracts::routes::billing;

use super::Context;
use crate::api::Call;
use crate::cli::LogsArgs;
use crate::output::{self, or_dash};

/// Characters of a subject shown in the table at most.
const SUBJECT_WIDTH: usize = 40;

/// The CSV columns: the spec's fields, in its order (the download's, without `kind`).
const CSV_HEADER: &[&str] = LOG_FIELDS.split_last().expect("fields").1;

/// `postmesh balance`.
pub async fn balance(ctx: &Context) -> anyhow::Result<()> {
    ctx.show(&Call::to(billing::BALANCE), |b: Balance| {
        Ok(format!("Balance: {}", output::credits(b.balance)))
    })
    .await
}

/// `postmesh logs`.
pub async fn logs(ctx: &Context, args: LogsArgs) -> anyhow::Result<()> {
    let mut call = Call::to(billing::LOGS);
    if let Some(limit) = args.limit {
        call = call.query("limit", limit);
    }
    if args.csv {
        ctx.show(&call, |page: LogPage| csv(&page.logs)).await
    } else {
        ctx.show(&call, |page: LogPage| Ok(table(&page.logs))).await
    }
}

/// The entries as a table for a person.
fn table(logs: &[LogEntry]) -> String {
    if logs.is_empty() {
        return "No log entries.".to_owned();
    }
    let rows: Vec<Vec<String>> = logs
        .iter()
        .map(|e| {
            vec![
                e.timestamp.clone(),
                e.amount_deducted.to_string(),
                or_dash(e.target_email.as_deref()),
                output::clip(&or_dash(e.subject.as_deref()), SUBJECT_WIDTH),
                or_dash(e.send_mode.as_deref()),
                e.recipient_count
                    .map_or_else(|| "-".to_owned(), |n| n.to_string()),
                or_dash(e.task_id.as_deref()),
            ]
        })
        .collect();
    output::table(
        &[
            "TIME",
            "CREDITS",
            "TO",
            "SUBJECT",
            "MODE",
            "RECIPIENTS",
            "TASK",
        ],
        &rows,
    )
}

/// The entries as CSV with a header row; empty fields for absent values.
fn csv(logs: &[LogEntry]) -> anyhow::Result<String> {
    let mut out = csv::Writer::from_writer(Vec::new());
    out.write_record(CSV_HEADER)?;
    for e in logs {
        let text = |v: &Option<String>| v.clone().unwrap_or_default();
        out.write_record([
            e.log_id.clone(),
            e.timestamp.clone(),
            e.amount_deducted.to_string(),
            e.caller_email.clone(),
            text(&e.target_email),
            text(&e.from_email),
            text(&e.subject),
            text(&e.send_mode),
            e.recipient_count.map(|n| n.to_string()).unwrap_or_default(),
            text(&e.task_id),
        ])?;
    }
    Ok(String::from_utf8(out.into_inner()?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/logs` answer: a send, a code email and a refund.
    const SAMPLE: &str = r#"{"success":true,"limit":50,"offset":0,"logs":[
        {"log_id":"l1","timestamp":"2025-03-01T10:00:00Z","amount_deducted":2.0,
         "caller_email":"ann@example.com","target_email":null,"from_email":"news@example.com",
         "subject":"Hello, \"friends\"","send_mode":"transactional","recipient_count":2.0,
         "task_id":"t-1","kind":"charge"},
        {"log_id":"l2","timestamp":"2025-03-01T09:00:00Z","amount_deducted":1,
         "caller_email":"ann@example.com","target_email":"bo@example.com","from_email":null,
         "subject":null,"send_mode":null,"recipient_count":null,"task_id":null,"kind":"charge"},
        {"log_id":"l3","timestamp":"2025-03-01T08:00:00Z","amount_deducted":-2,
         "caller_email":"ann@example.com","target_email":null,"from_email":null,
         "subject":null,"send_mode":null,"recipient_count":2,"task_id":"t-0","kind":"refund"}
    ]}"#;

    fn sample() -> Vec<LogEntry> {
        serde_json::from_str::<LogPage>(SAMPLE).unwrap().logs
    }

    #[test]
    fn logs_print_as_a_table() {
        assert_eq!(
            table(&sample()),
            "\
TIME                  CREDITS  TO              SUBJECT           MODE           RECIPIENTS  TASK
2025-03-01T10:00:00Z  2        -               Hello, \"friends\"  transactional  2           t-1
2025-03-01T09:00:00Z  1        bo@example.com  -                 -              -           -
2025-03-01T08:00:00Z  -2       -               -                 -              2           t-0
"
        );
        assert_eq!(table(&[]), "No log entries.");
    }

    #[test]
    fn logs_print_as_csv_with_a_header_row() {
        assert_eq!(
            csv(&sample()).unwrap(),
            "\
log_id,timestamp,amount_deducted,caller_email,target_email,from_email,subject,send_mode,recipient_count,task_id
l1,2025-03-01T10:00:00Z,2,ann@example.com,,news@example.com,\"Hello, \"\"friends\"\"\",transactional,2,t-1
l2,2025-03-01T09:00:00Z,1,ann@example.com,bo@example.com,,,,,
l3,2025-03-01T08:00:00Z,-2,ann@example.com,,,,,2,t-0
"
        );
        assert_eq!(csv(&[]).unwrap(), format!("{}\n", CSV_HEADER.join(",")));
    }
}
