//! `POST /contacts/import`: up to [`MAX_IMPORT_ROWS`] contacts as a JSON array or a CSV
//! file, read row by row and never past the cap; each row upserted, or its error listed.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header::CONTENT_TYPE, HeaderMap};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use postmesh_shared::extract::{holds_nul, Caller};
use postmesh_shared::{cpu, ApiError, Success};

use super::input::shown;
use super::{
    upsert, ContactBody, ContactError, ContactInput, Subscription, MAX_ATTRIBUTES, MAX_IMPORT_ROWS,
    MAX_TAGS,
};
use crate::AppState;

/// A row of an import that was not written.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ContactImportRowError)]
pub struct RowError {
    /// 1-based: the array's item, or the CSV's data row (the header is row 0).
    pub row: usize,
    pub error: String,
}

/// `POST /contacts/import` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ContactImported)]
pub struct Imported {
    pub created: usize,
    pub updated: usize,
    pub errors: Vec<RowError>,
}

/// Columns of a CSV import at most: `email`, `externalId`, `tags`, and as many attributes and
/// topics as a contact holds.
const MAX_COLUMNS: usize = 3 + MAX_ATTRIBUTES + MAX_TAGS;

/// The rows of a CSV file with a header row: `email`, `externalId` (or `external_id`),
/// `tags` (separated by `;`), `topic:<name>` (`subscribed` / `unsubscribed`); any other
/// column is an attribute (its text; an empty cell sets nothing).
pub fn csv_rows(body: &[u8]) -> Result<Vec<Result<ContactBody, String>>, ApiError> {
    // Spreadsheets often save a byte-order mark before the header.
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let mut reader = csv::ReaderBuilder::new().flexible(false).from_reader(body);
    let headers = reader
        .headers()
        .map_err(|e| ApiError::BadRequest(format!("the CSV header row: {e}")))?
        .clone();
    if headers.len() > MAX_COLUMNS {
        return Err(ApiError::BadRequest(format!(
            "the CSV header row has {} columns; at most {MAX_COLUMNS}",
            headers.len()
        )));
    }
    let mut rows = Vec::new();
    for record in reader.records() {
        // Read no further than one row past the cap: the rest is never parsed.
        if rows.len() == MAX_IMPORT_ROWS {
            return Err(too_many_rows());
        }
        rows.push(record.map_err(|e| e.to_string()).and_then(|record| {
            let mut body = ContactBody::default();
            for (column, cell) in headers.iter().zip(record.iter()) {
                let cell = cell.trim();
                if cell.is_empty() {
                    continue;
                }
                match column.trim() {
                    "email" => body.email = Some(cell.into()),
                    "externalId" | "external_id" => body.external_id = Some(cell.into()),
                    "tags" => {
                        // One past the cap is enough to refuse the row.
                        let tags = cell.split(';').take(MAX_TAGS + 1);
                        body.tags = Some(tags.map(str::to_owned).collect());
                    }
                    other => match other.strip_prefix("topic:") {
                        Some(topic) => {
                            let state = match cell {
                                "subscribed" => Subscription::Subscribed,
                                "unsubscribed" => Subscription::Unsubscribed,
                                _ => {
                                    return Err(format!(
                                        "{}: {} is not subscribed or unsubscribed",
                                        shown(other),
                                        shown(cell)
                                    ))
                                }
                            };
                            body.topics
                                .get_or_insert_with(BTreeMap::new)
                                .insert(topic.into(), state);
                        }
                        None => {
                            body.attributes
                                .get_or_insert_with(Map::new)
                                .insert(other.into(), Value::String(cell.into()));
                        }
                    },
                }
            }
            Ok(body)
        }));
    }
    Ok(rows)
}

/// The 400 of an import over [`MAX_IMPORT_ROWS`].
fn too_many_rows() -> ApiError {
    ApiError::BadRequest(format!(
        "more than {MAX_IMPORT_ROWS} rows; an import takes at most {MAX_IMPORT_ROWS}"
    ))
}

/// A JSON array read up to [`MAX_IMPORT_ROWS`] items: one more stops the parse.
struct CappedArray(Vec<Value>);

/// Why a [`CappedArray`] stopped.
const TOO_MANY: &str = "too many rows";

impl<'de> Deserialize<'de> for CappedArray {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Items;
        impl<'de> serde::de::Visitor<'de> for Items {
            type Value = CappedArray;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON array of contacts")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self, mut seq: A,
            ) -> Result<CappedArray, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<Value>()? {
                    if items.len() == MAX_IMPORT_ROWS {
                        return Err(serde::de::Error::custom(TOO_MANY));
                    }
                    items.push(item);
                }
                Ok(CappedArray(items))
            }
        }
        d.deserialize_seq(Items)
    }
}

/// The rows of a JSON array of contact objects.
pub fn json_rows(body: &[u8]) -> Result<Vec<Result<ContactBody, String>>, ApiError> {
    let items = match serde_json::from_slice::<CappedArray>(body) {
        Ok(CappedArray(items)) => items,
        Err(e) if e.to_string().starts_with(TOO_MANY) => return Err(too_many_rows()),
        Err(e) => {
            return Err(ApiError::BadRequest(format!(
                "the body must be a JSON array of contacts: {e}"
            )))
        }
    };
    Ok(items
        .into_iter()
        .map(|item| serde_json::from_value(item).map_err(|e| e.to_string()))
        .collect())
}

pub(crate) async fn import(
    State(state): State<AppState>, caller: Caller, headers: HeaderMap, body: Bytes,
) -> Result<Success<Imported>, ApiError> {
    let kind = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    // PostgreSQL stores no NUL in text or jsonb.
    let nul = || ApiError::BadRequest("the body must not hold NUL characters".into());
    // Read on the CPU pool when large, off the worker other requests share.
    let rows = cpu::run_sized(body.len(), move || match kind.as_str() {
        "text/csv" if body.contains(&0) => Err(nul()),
        "application/json" if holds_nul(&body) => Err(nul()),
        "text/csv" => csv_rows(&body),
        "application/json" => json_rows(&body),
        _ => Err(ApiError::BadRequest(
            "send a JSON array (application/json) or a CSV file (text/csv)".into(),
        )),
    })
    .await?;
    let mut answer = Imported {
        created: 0,
        updated: 0,
        errors: Vec::new(),
    };
    let mut conn = state.db.acquire().await?;
    for (i, row) in rows.into_iter().enumerate() {
        let written = match row.and_then(ContactInput::parse) {
            Err(e) => Err(ContactError::Invalid(e)),
            Ok(input) => upsert(&mut conn, caller.workspace, &input).await,
        };
        match written {
            Ok((_, true)) => answer.created += 1,
            Ok((_, false)) => answer.updated += 1,
            Err(ContactError::Database(e)) => return Err(e.into()),
            Err(e) => answer.errors.push(RowError {
                row: i + 1,
                error: e.to_string(),
            }),
        }
    }
    Ok(Success::new(answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_columns_become_fields_topics_and_attributes() {
        let csv = "email,externalId,tags,topic:news,plan\n\
                   a@x.com,u1,vip; beta,subscribed,pro\n\
                   b@x.com,,,maybe,\n";
        let rows = csv_rows(csv.as_bytes()).unwrap();
        let first = rows[0].as_ref().unwrap();
        assert_eq!(first.email.as_deref(), Some("a@x.com"));
        assert_eq!(first.external_id.as_deref(), Some("u1"));
        let input = ContactInput::parse(csv_rows(csv.as_bytes()).unwrap().remove(0).unwrap());
        let input = input.unwrap();
        assert_eq!(input.tags.unwrap(), ["beta", "vip"]);
        assert_eq!(
            input.topics.unwrap().get("news"),
            Some(&Subscription::Subscribed)
        );
        assert_eq!(input.attributes.unwrap()["plan"], "pro");
        assert!(rows[1].as_ref().unwrap_err().contains("topic:news"));
        let with_bom = format!("\u{feff}{csv}");
        let rows = csv_rows(with_bom.as_bytes()).unwrap();
        assert_eq!(rows[0].as_ref().unwrap().email.as_deref(), Some("a@x.com"));
    }

    #[test]
    fn imports_stop_reading_one_row_past_the_cap() {
        // A 16 MiB file of one-character rows: refused at row 10,001, the rest unread.
        let csv = format!("email\n{}", "a\n".repeat(8 << 20));
        let Err(err) = csv_rows(csv.as_bytes()) else {
            panic!("too many rows taken")
        };
        assert!(err.to_string().contains("more than 10000 rows"), "{err}");
        let exactly = format!("email\n{}", "a\n".repeat(MAX_IMPORT_ROWS));
        assert_eq!(csv_rows(exactly.as_bytes()).unwrap().len(), MAX_IMPORT_ROWS);
        let json = format!("[{}1]", "1,".repeat(8 << 20));
        let Err(err) = json_rows(json.as_bytes()) else {
            panic!("too many rows taken")
        };
        assert!(err.to_string().contains("more than 10000 rows"), "{err}");
        let json = format!("[{}1]", "{},".repeat(MAX_IMPORT_ROWS - 1));
        assert_eq!(json_rows(json.as_bytes()).unwrap().len(), MAX_IMPORT_ROWS);
        assert!(json_rows(b"{}").is_err());
    }
}
