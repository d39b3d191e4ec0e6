//! A fake Cloudflare v4 API (zones and DNS records), as strict as the real one where Postmesh
//! touches it: a bearer token that can see the zone, Cloudflare's `{success, errors,
//! messages, result}` envelope and error codes, record validation (types, names inside the
//! zone, TTL, MX priority), no duplicate and no record beside a CNAME.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

/// One DNS record in a zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CfRecord {
    pub id: String,
    pub kind: String,
    pub name: String,
    pub content: String,
    pub priority: Option<u16>,
    pub proxied: bool,
}

struct Zone {
    name: String,
    /// Tokens that may read and edit it.
    tokens: Vec<String>,
    records: Vec<CfRecord>,
}

/// What the fake holds.
#[derive(Default)]
pub struct Books {
    zones: HashMap<String, Zone>,
    down: bool,
    /// Creates still to find their record made just before them, by a request that raced.
    beaten: usize,
}

/// The fake: its `base` is the `CLOUDFLARE_API_BASE`.
pub type FakeCloudflare = crate::Fake<Books>;

/// A Cloudflare error answer.
struct CfFailure(StatusCode, i64, String);

impl IntoResponse for CfFailure {
    fn into_response(self) -> Response {
        let CfFailure(status, code, message) = self;
        (
            status,
            axum::Json(json!({
                "success": false,
                "errors": [{ "code": code, "message": message }],
                "messages": [],
                "result": null
            })),
        )
            .into_response()
    }
}

fn bad(code: i64, message: impl Into<String>) -> CfFailure {
    CfFailure(StatusCode::BAD_REQUEST, code, message.into())
}

fn ok(result: Value) -> axum::Json<Value> {
    axum::Json(json!({ "success": true, "errors": [], "messages": [], "result": result }))
}

/// Page `page` (from 1) of `items`, `per_page` a page, with Cloudflare's `result_info`.
fn ok_paged(items: Vec<Value>, page: Option<u32>, per_page: u32) -> Answer {
    let page = page.unwrap_or(1);
    if page == 0 {
        return Err(bad(1004, "page must be at least 1"));
    }
    let total = items.len();
    let per = per_page as usize;
    let shown: Vec<Value> = items
        .into_iter()
        .skip((page as usize - 1).saturating_mul(per))
        .take(per)
        .collect();
    let info = json!({
        "page": page, "per_page": per_page, "count": shown.len(),
        "total_count": total, "total_pages": total.div_ceil(per),
    });
    let mut body = ok(Value::Array(shown)).0;
    body["result_info"] = info;
    Ok(axum::Json(body))
}

type Answer = Result<axum::Json<Value>, CfFailure>;

fn record_json(zone_id: &str, zone: &str, r: &CfRecord) -> Value {
    let mut v = json!({
        "id": r.id, "zone_id": zone_id, "zone_name": zone, "name": r.name, "type": r.kind,
        "content": r.content, "proxiable": r.kind == "CNAME", "proxied": r.proxied, "ttl": 1,
        "settings": {}, "meta": {}, "comment": null, "tags": [],
        "created_on": "2026-11-24T00:00:00Z", "modified_on": "2026-11-24T00:00:00Z"
    });
    if let Some(p) = r.priority {
        v["priority"] = json!(p);
    }
    v
}

impl FakeCloudflare {
    /// Starts the fake on a free local port.
    pub async fn start() -> Self {
        Self::serve("/client/v4", |fake| {
            Router::new()
                .route("/client/v4/zones", get(list_zones))
                .route(
                    "/client/v4/zones/{zone}/dns_records",
                    get(list_records).post(create_record),
                )
                .fallback(|method: Method, uri: Uri| async move {
                    CfFailure(
                        StatusCode::NOT_FOUND,
                        7003,
                        format!(
                            "Could not route to {}, perhaps your object identifier is invalid? ({method})",
                            uri.path()
                        ),
                    )
                })
                .with_state(fake)
        })
        .await
    }

    /// Adds the zone `name` that `token` can edit; returns its id.
    pub fn add_zone(&self, name: &str, token: &str) -> String {
        let id = format!("{:032x}", rand::random::<u128>());
        self.books().zones.insert(
            id.clone(),
            Zone {
                name: name.into(),
                tokens: vec![token.into()],
                records: Vec::new(),
            },
        );
        id
    }

    /// Adds a record directly, as if the user made it in the dashboard.
    pub fn add_record(
        &self, zone: &str, kind: &str, name: &str, content: &str, priority: Option<u16>,
    ) {
        let mut books = self.books();
        let zone = books.zones.get_mut(zone).expect("zone exists");
        zone.records.push(CfRecord {
            id: format!("{:032x}", rand::random::<u128>()),
            kind: kind.into(),
            name: name.into(),
            content: content.into(),
            priority,
            proxied: false,
        });
    }

    /// The next `n` creates find their record made just before them, as when two apply-dns
    /// of one domain run at once: each is refused as an identical record (81058).
    pub fn beat_next_creates(&self, n: usize) {
        self.books().beaten = n;
    }

    /// Adds a proxied CNAME directly, as the dashboard makes one by default.
    pub fn add_proxied_cname(&self, zone: &str, name: &str, content: &str) {
        self.add_record(zone, "CNAME", name, content, None);
        let mut books = self.books();
        let zone = books.zones.get_mut(zone).expect("zone exists");
        zone.records.last_mut().expect("just added").proxied = true;
    }

    /// The zone's records.
    pub fn records(&self, zone: &str) -> Vec<CfRecord> {
        self.books().zones[zone].records.clone()
    }

    /// While down, every request answers 503.
    pub fn set_down(&self, down: bool) {
        self.books().down = down;
    }
}

/// The bearer token, checked for shape; a missing or malformed header is Cloudflare's 6003.
fn token(headers: &HeaderMap) -> Result<String, CfFailure> {
    let value = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| bad(6003, "Invalid request headers"))?;
    Ok(value.to_owned())
}

fn outage(books: &Books) -> Result<(), CfFailure> {
    if books.down {
        Err(CfFailure(
            StatusCode::SERVICE_UNAVAILABLE,
            10000,
            "Service temporarily unavailable".into(),
        ))
    } else {
        Ok(())
    }
}

/// The zone `id` if `token` can see it; an unknown token is 403 (9109), another's zone 404.
fn zone_for<'a>(books: &'a mut Books, id: &str, token: &str) -> Result<&'a mut Zone, CfFailure> {
    if !books
        .zones
        .values()
        .any(|z| z.tokens.iter().any(|t| t == token))
    {
        return Err(CfFailure(
            StatusCode::FORBIDDEN,
            9109,
            "Invalid access token".into(),
        ));
    }
    match books.zones.get_mut(id) {
        Some(zone) if zone.tokens.iter().any(|t| t == token) => Ok(zone),
        _ => Err(CfFailure(
            StatusCode::NOT_FOUND,
            7003,
            "Could not route to zone".into(),
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ZoneQuery {
    name: Option<String>,
    page: Option<u32>,
    per_page: Option<u32>,
}

async fn list_zones(
    State(fake): State<FakeCloudflare>, headers: HeaderMap, Query(q): Query<ZoneQuery>,
) -> Answer {
    let token = token(&headers)?;
    let books = fake.books();
    outage(&books)?;
    if !books.zones.values().any(|z| z.tokens.contains(&token)) {
        return Err(CfFailure(
            StatusCode::FORBIDDEN,
            9109,
            "Invalid access token".into(),
        ));
    }
    let per_page = q.per_page.unwrap_or(20);
    if !(5..=50).contains(&per_page) {
        return Err(bad(1001, "per_page must be between 5 and 50"));
    }
    let zones: Vec<Value> = books
        .zones
        .iter()
        .filter(|(_, z)| z.tokens.contains(&token))
        .filter(|(_, z)| q.name.as_ref().is_none_or(|n| *n == z.name))
        .map(|(id, z)| json!({ "id": id, "name": z.name, "status": "active", "paused": false, "type": "full" }))
        .collect();
    ok_paged(zones, q.page, per_page)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordQuery {
    name: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    page: Option<u32>,
    per_page: Option<u32>,
}

async fn list_records(
    State(fake): State<FakeCloudflare>, Path(zone_id): Path<String>, headers: HeaderMap,
    Query(q): Query<RecordQuery>,
) -> Answer {
    let token = token(&headers)?;
    let mut books = fake.books();
    outage(&books)?;
    let per_page = q.per_page.unwrap_or(100);
    if !(5..=5_000_000).contains(&per_page) {
        return Err(bad(1004, "per_page must be between 5 and 5000000"));
    }
    let zone = zone_for(&mut books, &zone_id, &token)?;
    let records: Vec<Value> = zone
        .records
        .iter()
        .filter(|r| {
            q.name
                .as_ref()
                .is_none_or(|n| n.eq_ignore_ascii_case(&r.name))
        })
        .filter(|r| q.kind.as_ref().is_none_or(|k| *k == r.kind))
        .map(|r| record_json(&zone_id, &zone.name, r))
        .collect();
    ok_paged(records, q.page, per_page)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewRecord {
    #[serde(rename = "type")]
    kind: String,
    name: String,
    content: String,
    ttl: Option<u32>,
    priority: Option<u16>,
    proxied: Option<bool>,
    comment: Option<String>,
    tags: Option<Vec<String>>,
}

async fn create_record(
    State(fake): State<FakeCloudflare>, Path(zone_id): Path<String>, headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let token = token(&headers)?;
    let json = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json {
        return Err(bad(
            6003,
            "Invalid request headers: Content-Type must be application/json",
        ));
    }
    let req: NewRecord = serde_json::from_slice(&body)
        .map_err(|e| bad(9207, format!("Request body is invalid: {e}")))?;
    let _ = (&req.comment, &req.tags);
    let mut books = fake.books();
    outage(&books)?;
    let beaten = books.beaten > 0;
    books.beaten = books.beaten.saturating_sub(1);
    let zone = zone_for(&mut books, &zone_id, &token)?;
    let name = req.name.trim_end_matches('.').to_ascii_lowercase();
    if beaten {
        zone.records.push(CfRecord {
            id: format!("{:032x}", rand::random::<u128>()),
            kind: req.kind.clone(),
            name: name.clone(),
            content: req.content.clone(),
            priority: req.priority,
            proxied: req.proxied.unwrap_or(false),
        });
    }
    if name != zone.name && !name.ends_with(&format!(".{}", zone.name)) {
        return Err(bad(
            9005,
            format!("Record name {name} is outside the zone {}", zone.name),
        ));
    }
    if !matches!(req.kind.as_str(), "A" | "AAAA" | "CNAME" | "MX" | "TXT") {
        return Err(bad(
            9000,
            format!("DNS record type {} is invalid", req.kind),
        ));
    }
    match req.ttl {
        Some(1) | None => {}
        Some(ttl) if (60..=86_400).contains(&ttl) => {}
        Some(_) => {
            return Err(bad(
                9021,
                "Invalid TTL. Must be between 60 and 86400 seconds, or 1 for Automatic.",
            ))
        }
    }
    if req.kind == "MX" && req.priority.is_none() {
        return Err(bad(9101, "priority is required for MX records"));
    }
    if req.proxied == Some(true) && !matches!(req.kind.as_str(), "A" | "AAAA" | "CNAME") {
        return Err(bad(9004, "This record type cannot be proxied."));
    }
    if req.kind == "TXT" && req.content.len() > 2048 {
        return Err(bad(9100, "TXT content is too long"));
    }
    if req.content.trim().is_empty() {
        return Err(bad(9007, "Content for the record is invalid"));
    }
    let at_name: Vec<&CfRecord> = zone.records.iter().filter(|r| r.name == name).collect();
    if at_name
        .iter()
        .any(|r| r.kind == req.kind && r.content == req.content && r.priority == req.priority)
    {
        return Err(bad(81058, "An identical record already exists."));
    }
    if (req.kind == "CNAME" && !at_name.is_empty()) || at_name.iter().any(|r| r.kind == "CNAME") {
        return Err(bad(
            81053,
            "An A, AAAA, or CNAME record with that host already exists.",
        ));
    }
    let record = CfRecord {
        id: format!("{:032x}", rand::random::<u128>()),
        kind: req.kind,
        name,
        content: req.content,
        priority: req.priority,
        proxied: req.proxied.unwrap_or(false),
    };
    let answer = record_json(&zone_id, &zone.name, &record);
    zone.records.push(record);
    Ok(ok(answer))
}
