//! Audiences: `{include: [...], exclude: [...]}` selects the workspace's contacts matching
//! any include condition and no exclude condition. A condition is `{tag}`, `{topic}`
//! (subscribed to it), `{attribute, op, value}` (`eq`, `neq`, `in`, `exists`, `gt`, `lt`),
//! `{email}` or `{audienceId}` (a saved audience). An audience is resolved in one SQL
//! statement over the contacts' indexes, never by loading the workspace's contacts.
//! Saved audiences: `POST /audiences`, `GET /audiences`, `GET/DELETE /audiences/{id}`.

use std::borrow::Cow;
use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, QueryBuilder};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, SchemaType, Type};
use utoipa::openapi::{Ref, RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, IdPath, JsonBody, PageQuery, QueryParams};
use postmesh_shared::{ApiError, EmailAddress, Success, WorkspaceId};

use crate::contacts::{name, name_schema, MAX_NAME_LEN};
use crate::request::Recipient;
use crate::{schema, AppState, Quotas};

/// Conditions in an include or exclude list at most.
const MAX_CONDITIONS: usize = 50;
/// A page of audiences when no limit is given.
const DEFAULT_PAGE: i64 = 50;

/// An audience as the API gives it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AudienceBody {
    #[serde(default)]
    pub include: Vec<Value>,
    #[serde(default)]
    pub exclude: Vec<Value>,
}

/// How an attribute is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Neq,
    In,
    Exists,
    Gt,
    Lt,
}

/// One condition on a contact.
#[derive(Clone, Debug, PartialEq)]
pub enum Condition {
    Tag(String),
    /// Subscribed to the topic.
    Topic(String),
    Attribute {
        name: String,
        op: Op,
        value: Value,
    },
    Email(String),
    /// A saved audience: its include and not its exclude.
    Saved(Uuid),
}

/// A checked audience.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Audience {
    pub include: Vec<Condition>,
    pub exclude: Vec<Condition>,
}

impl Condition {
    /// Parses one condition; `saved` tells whether `{audienceId}` may appear.
    pub(crate) fn parse(raw: &Value, saved: bool) -> Result<Self, String> {
        let obj = raw
            .as_object()
            .ok_or_else(|| format!("a condition must be an object, not {raw}"))?;
        let text = |key: &str| -> Result<String, String> {
            let v = obj[key]
                .as_str()
                .ok_or_else(|| format!("{key} must be a string"))?;
            name(key, v)
        };
        let only = |keys: &[&str]| -> Result<(), String> {
            match obj.keys().find(|k| !keys.contains(&k.as_str())) {
                Some(k) => Err(format!("unknown field {k:?} in a condition")),
                None => Ok(()),
            }
        };
        if obj.contains_key("tag") {
            only(&["tag"])?;
            return Ok(Self::Tag(text("tag")?));
        }
        if obj.contains_key("topic") {
            only(&["topic"])?;
            return Ok(Self::Topic(text("topic")?));
        }
        if obj.contains_key("email") {
            only(&["email"])?;
            let raw = text("email")?;
            let email = EmailAddress::parse(&raw)
                .ok_or_else(|| format!("invalid email address {raw:?}"))?;
            return Ok(Self::Email(email.key()));
        }
        if obj.contains_key("audienceId") {
            only(&["audienceId"])?;
            if !saved {
                return Err("a saved audience cannot name another one".into());
            }
            let id = text("audienceId")?;
            return Uuid::parse_str(&id)
                .map(Self::Saved)
                .map_err(|_| format!("audienceId {id:?} is not an id"));
        }
        if obj.contains_key("attribute") {
            only(&["attribute", "op", "value"])?;
            let attribute = text("attribute")?;
            let op = match obj.get("op").and_then(Value::as_str).unwrap_or("eq") {
                "eq" => Op::Eq,
                "neq" => Op::Neq,
                "in" => Op::In,
                "exists" => Op::Exists,
                "gt" => Op::Gt,
                "lt" => Op::Lt,
                other => {
                    return Err(format!(
                        "op {other:?} is not one of eq, neq, in, exists, gt, lt"
                    ))
                }
            };
            let value = obj.get("value").cloned().unwrap_or(Value::Null);
            let fits = match op {
                Op::Exists => true,
                Op::Eq | Op::Neq => !value.is_null(),
                Op::In => value.as_array().is_some_and(|a| !a.is_empty()),
                Op::Gt | Op::Lt => value.is_number() || value.is_string(),
            };
            if !fits {
                return Err(format!(
                    "attribute {attribute:?}: op {op:?} needs {}",
                    match op {
                        Op::In => "a non-empty array value",
                        Op::Gt | Op::Lt => "a number or string value",
                        _ => "a value",
                    }
                )
                .to_lowercase());
            }
            return Ok(Self::Attribute {
                name: attribute,
                op,
                value,
            });
        }
        Err(format!(
            "a condition needs tag, topic, attribute, email or audienceId: {raw}"
        ))
    }
}

impl Audience {
    /// Checks `body`; `saved` tells whether it may name saved audiences (a send's may, a
    /// saved one's may not).
    pub fn parse(body: &AudienceBody, saved: bool) -> Result<Self, String> {
        if body.include.is_empty() {
            return Err("an audience needs at least one include condition".into());
        }
        if body.include.len() > MAX_CONDITIONS || body.exclude.len() > MAX_CONDITIONS {
            return Err(format!(
                "at most {MAX_CONDITIONS} include and {MAX_CONDITIONS} exclude conditions"
            ));
        }
        let list = |raw: &[Value]| {
            raw.iter()
                .map(|c| Condition::parse(c, saved))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            include: list(&body.include)?,
            exclude: list(&body.exclude)?,
        })
    }

    /// The saved audiences it names.
    fn saved_ids(&self) -> Vec<Uuid> {
        self.include
            .iter()
            .chain(&self.exclude)
            .filter_map(|c| match c {
                Condition::Saved(id) => Some(*id),
                _ => None,
            })
            .collect()
    }
}

/// A condition on the contact's own fields, as the API gives it: every form
/// `Condition::parse` takes but `{audienceId}`, which [`Audience`] adds where it may be.
impl PartialSchema for Condition {
    fn schema() -> RefOr<Schema> {
        let only = |field: &str, value: ObjectBuilder| {
            schema::closed().property(field, value).required(field)
        };
        let attribute = |op: ObjectBuilder, value: Option<RefOr<Schema>>| {
            let condition = only("attribute", name_schema()).property("op", op);
            match value {
                Some(value) => condition.property("value", value).required("value"),
                None => condition.property(
                    "value",
                    ObjectBuilder::new().schema_type(SchemaType::AnyValue),
                ),
            }
        };
        OneOfBuilder::new()
            .description(Some(
                "One condition on a contact: `{tag}`, `{topic}` (subscribed to it), `{email}` or \
                 `{attribute, op, value}`: `op` `eq` (the default) or `neq` a value, `exists`, \
                 `in` a non-empty array, `gt` or `lt` a number or string.",
            ))
            .item(only("tag", name_schema()))
            .item(only("topic", name_schema()))
            .item(only(
                "email",
                schema::email().max_length(Some(MAX_NAME_LEN)),
            ))
            .item(attribute(
                schema::unless_string("^(?:eq|neq)$"),
                Some(schema::not_null().into()),
            ))
            .item(attribute(schema::one_of_strings(&["exists"]), None).required("op"))
            .item(
                attribute(
                    schema::one_of_strings(&["in"]),
                    Some(ArrayBuilder::new().min_items(Some(1)).into()),
                )
                .required("op"),
            )
            .item(
                attribute(
                    schema::one_of_strings(&["gt", "lt"]),
                    Some(
                        ObjectBuilder::new()
                            .schema_type(SchemaType::from_iter([Type::Number, Type::String]))
                            .into(),
                    ),
                )
                .required("op"),
            )
            .into()
    }
}

impl ToSchema for Condition {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ContactCondition")
    }
}

/// The audience a send or a campaign names, as the API gives it (an [`AudienceBody`] that
/// [`Audience::parse`] takes with `saved`): its conditions may name saved audiences.
impl PartialSchema for Audience {
    fn schema() -> RefOr<Schema> {
        let conditions = || {
            let saved = schema::closed()
                .property("audienceId", schema::uuid())
                .required("audienceId")
                .description(Some("A saved audience: its include and not its exclude."));
            ArrayBuilder::new()
                .items(
                    OneOfBuilder::new()
                        .item(Ref::from_schema_name(Condition::name()))
                        .item(saved),
                )
                .max_items(Some(MAX_CONDITIONS))
        };
        schema::closed()
            .description(Some(
                "The contacts that match any include condition and no exclude condition.",
            ))
            .property("include", conditions().min_items(Some(1)))
            .required("include")
            .property("exclude", conditions())
            .into()
    }
}

impl ToSchema for Audience {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Audience")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((Condition::name().into_owned(), Condition::schema()));
    }
}

/// Appends `cond` as an SQL predicate on `contacts c`.
fn push_condition(
    q: &mut QueryBuilder<'_, Postgres>, cond: &Condition, saved: &HashMap<Uuid, Audience>,
) {
    match cond {
        Condition::Tag(tag) => {
            q.push("c.tags @> ARRAY[")
                .push_bind(tag.clone())
                .push("]::text[]");
        }
        Condition::Topic(topic) => {
            q.push("c.topics @> jsonb_build_object(")
                .push_bind(topic.clone())
                .push("::text, 'subscribed')");
        }
        Condition::Email(key) => {
            q.push("c.email_key = ").push_bind(key.clone());
        }
        Condition::Saved(id) => {
            let audience = &saved[id];
            push_audience(q, audience, saved);
        }
        Condition::Attribute { name, op, value } => match op {
            Op::Eq => {
                q.push("c.attributes @> jsonb_build_object(")
                    .push_bind(name.clone())
                    .push("::text, ")
                    .push_bind(Json(value.clone()))
                    .push("::jsonb)");
            }
            Op::Neq => {
                q.push("(c.attributes -> ")
                    .push_bind(name.clone())
                    .push("::text) IS DISTINCT FROM ")
                    .push_bind(Json(value.clone()))
                    .push("::jsonb");
            }
            Op::In => {
                q.push("(c.attributes -> ")
                    .push_bind(name.clone())
                    .push("::text) IN (SELECT jsonb_array_elements(")
                    .push_bind(Json(value.clone()))
                    .push("::jsonb))");
            }
            Op::Exists => {
                q.push("c.attributes ? ").push_bind(name.clone());
            }
            Op::Gt | Op::Lt => {
                let cmp = if *op == Op::Gt { " > " } else { " < " };
                let (kind, cast) = if value.is_number() {
                    ("number", "numeric")
                } else {
                    ("string", "text")
                };
                let scalar = match value {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                q.push("(jsonb_typeof(c.attributes -> ")
                    .push_bind(name.clone())
                    .push(format!("::text) = '{kind}' AND (c.attributes ->> "))
                    .push_bind(name.clone())
                    .push(format!("::text)::{cast}{cmp}"))
                    .push_bind(scalar)
                    .push(format!("::{cast})"));
            }
        },
    }
}

/// Appends `audience` as an SQL predicate: any include condition and no exclude condition.
fn push_audience(
    q: &mut QueryBuilder<'_, Postgres>, audience: &Audience, saved: &HashMap<Uuid, Audience>,
) {
    if audience.include.is_empty() {
        q.push("false");
        return;
    }
    q.push("((");
    for (i, cond) in audience.include.iter().enumerate() {
        if i > 0 {
            q.push(" OR ");
        }
        push_condition(q, cond, saved);
    }
    q.push(")");
    for cond in &audience.exclude {
        q.push(" AND NOT COALESCE(");
        push_condition(q, cond, saved);
        q.push(", false)");
    }
    q.push(")");
}

/// Why an audience could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum AudienceError {
    #[error("no saved audience {0}")]
    UnknownSaved(Uuid),
    #[error("the audience has more than {0} contacts")]
    TooLarge(usize),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl From<AudienceError> for ApiError {
    fn from(e: AudienceError) -> Self {
        match e {
            AudienceError::UnknownSaved(_) => ApiError::NotFound(e.to_string()),
            AudienceError::TooLarge(_) => ApiError::BadRequest(e.to_string()),
            AudienceError::Database(e) => e.into(),
        }
    }
}

/// The saved audiences `audience` names, parsed.
async fn saved_of(
    conn: &mut PgConnection, workspace: WorkspaceId, audience: &Audience,
) -> Result<HashMap<Uuid, Audience>, AudienceError> {
    let ids = audience.saved_ids();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<(Uuid, Json<AudienceBody>)> = sqlx::query_as(
        "SELECT id, definition FROM audiences WHERE workspace_id = $1 AND id = ANY($2)",
    )
    .bind(workspace)
    .bind(&ids)
    .fetch_all(conn)
    .await?;
    let mut saved = HashMap::new();
    for (id, body) in rows {
        // Checked when it was saved; a definition that no longer parses matches nobody.
        let parsed = Audience::parse(&body.0, false).unwrap_or_default();
        saved.insert(id, parsed);
    }
    match ids.into_iter().find(|id| !saved.contains_key(id)) {
        Some(missing) => Err(AudienceError::UnknownSaved(missing)),
        None => Ok(saved),
    }
}

/// The contacts `audience` selects as `(contact id, recipient)`, oldest contact first; more
/// than `max` is an error.
pub async fn resolve(
    conn: &mut PgConnection, workspace: WorkspaceId, audience: &Audience, max: usize,
) -> Result<Vec<(Uuid, Recipient)>, AudienceError> {
    let saved = saved_of(conn, workspace, audience).await?;
    let mut q = QueryBuilder::new(
        "SELECT c.id, c.email, c.external_id FROM contacts c WHERE c.workspace_id = ",
    );
    // A contact without an email (known by its external id alone) is no one to send to.
    q.push_bind(workspace).push(" AND c.email IS NOT NULL AND ");
    push_audience(&mut q, audience, &saved);
    q.push(" ORDER BY c.id LIMIT ").push_bind(max as i64 + 1);
    let rows: Vec<(Uuid, String, Option<String>)> =
        q.build_query_as().fetch_all(&mut *conn).await?;
    if rows.len() > max {
        return Err(AudienceError::TooLarge(max));
    }
    Ok(rows
        .into_iter()
        .filter_map(|(id, email, external_id)| {
            EmailAddress::parse(&email).map(|email| (id, Recipient { email, external_id }))
        })
        .collect())
}

/// A saved audience.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SavedAudience {
    pub id: Uuid,
    pub name: String,
    pub include: Vec<Value>,
    pub exclude: Vec<Value>,
    pub created_at: i64,
}

impl From<(Uuid, String, Json<AudienceBody>, i64)> for SavedAudience {
    fn from((id, name, body, created_at): (Uuid, String, Json<AudienceBody>, i64)) -> Self {
        Self {
            id,
            name,
            include: body.0.include,
            exclude: body.0.exclude,
            created_at,
        }
    }
}

/// `POST /audiences` body. Its conditions cannot name saved audiences.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct NewAudience {
    #[schema(schema_with = name_schema, required = true)]
    pub name: Option<String>,
    #[serde(default)]
    #[schema(value_type = Vec<Condition>, min_items = 1, max_items = 50, required = true)]
    pub include: Vec<Value>,
    #[serde(default)]
    #[schema(value_type = Vec<Condition>, max_items = 50)]
    pub exclude: Vec<Value>,
}

/// One saved audience, answered.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = AudienceOne)]
pub struct One {
    pub audience: SavedAudience,
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<NewAudience>,
) -> Result<(StatusCode, Success<One>), ApiError> {
    let name = name("name", body.name.as_deref().unwrap_or("")).map_err(ApiError::BadRequest)?;
    let definition = AudienceBody {
        include: body.include,
        exclude: body.exclude,
    };
    Audience::parse(&definition, false).map_err(ApiError::BadRequest)?;
    let mut tx = state.db.begin().await?;
    let quota = state.quotas.audiences;
    Quotas::hold(
        &mut tx,
        "audiences",
        caller.workspace,
        quota,
        "AUDIENCES_PER_WORKSPACE",
    )
    .await?;
    let row: (Uuid, String, Json<AudienceBody>, i64) = sqlx::query_as(
        "INSERT INTO audiences (id, workspace_id, name, definition, created_at)
         VALUES ($1, $2, $3, $4, $5) RETURNING id, name, definition, created_at",
    )
    .bind(Uuid::now_v7())
    .bind(caller.workspace)
    .bind(&name)
    .bind(Json(&definition))
    .bind(now_unix())
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Success::new(One {
            audience: row.into(),
        }),
    ))
}

/// `GET /audiences` answer: a page, oldest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AudienceList {
    pub audiences: Vec<SavedAudience>,
    pub limit: i64,
    pub offset: i64,
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<PageQuery>,
) -> Result<Success<AudienceList>, ApiError> {
    let page = q.page(DEFAULT_PAGE)?;
    let rows: Vec<(Uuid, String, Json<AudienceBody>, i64)> = sqlx::query_as(
        "SELECT id, name, definition, created_at FROM audiences WHERE workspace_id = $1
         ORDER BY id LIMIT $2 OFFSET $3",
    )
    .bind(caller.workspace)
    .bind(page.limit)
    .bind(page.offset)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(AudienceList {
        audiences: rows.into_iter().map(Into::into).collect(),
        limit: page.limit,
        offset: page.offset,
    }))
}

pub(crate) async fn read(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<One>, ApiError> {
    let row: (Uuid, String, Json<AudienceBody>, i64) = sqlx::query_as(
        "SELECT id, name, definition, created_at FROM audiences
         WHERE workspace_id = $1 AND id = $2",
    )
    .bind(caller.workspace)
    .bind(id)
    .fetch_optional(&state.db)
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("no audience {id}")))?;
    Ok(Success::new(One {
        audience: row.into(),
    }))
}

/// `DELETE /audiences/{id}` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = AudienceDeleted)]
pub struct Deleted {
    pub deleted: bool,
}

pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Deleted>, ApiError> {
    let done = sqlx::query("DELETE FROM audiences WHERE workspace_id = $1 AND id = $2")
        .bind(caller.workspace)
        .bind(id)
        .execute(&state.db)
        .await?;
    if done.rows_affected() == 0 {
        return Err(ApiError::NotFound(format!("no audience {id}")));
    }
    Ok(Success::new(Deleted { deleted: true }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value, saved: bool) -> Result<Audience, String> {
        Audience::parse(&serde_json::from_value(v).unwrap(), saved)
    }

    #[test]
    fn conditions_are_checked_at_the_edge() {
        let a = parse(
            json!({"include": [{"tag": "vip"}, {"attribute": "age", "op": "gt", "value": 30}],
                   "exclude": [{"email": "A@X.com"}]}),
            true,
        )
        .unwrap();
        assert_eq!(a.include[0], Condition::Tag("vip".into()));
        assert_eq!(a.exclude[0], Condition::Email("a@x.com".into()));
        for (bad, needle) in [
            (json!({"include": []}), "at least one"),
            (json!({"include": [{"colour": "red"}]}), "needs tag"),
            (
                json!({"include": [{"tag": "a", "topic": "b"}]}),
                "unknown field",
            ),
            (
                json!({"include": [{"attribute": "a", "op": "in", "value": 3}]}),
                "array",
            ),
            (
                json!({"include": [{"attribute": "a", "op": "like", "value": 3}]}),
                "op",
            ),
            (
                json!({"include": [{"attribute": "a", "op": "gt", "value": [1]}]}),
                "number",
            ),
            (json!({"include": [{"audienceId": "nope"}]}), "not an id"),
        ] {
            let err = parse(bad.clone(), true).unwrap_err();
            assert!(err.contains(needle), "{bad} → {err}");
        }
        let nested = json!({"include": [{"audienceId": Uuid::nil().to_string()}]});
        assert!(parse(nested, false).unwrap_err().contains("another"));
    }
}
