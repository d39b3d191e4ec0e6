//! An audience's conditions: parsed from the API's JSON, with their JSON Schema, and written as one
//! SQL condition over the contacts' indexes.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{Postgres, QueryBuilder};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, SchemaType, Type};
use utoipa::openapi::{Ref, RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};
use uuid::Uuid;

use postmesh_shared::EmailAddress;

use crate::audience::contacts::{name, name_schema, MAX_NAME_LEN};
use crate::model::schema::{self, component};

/// Conditions in an include or exclude list at most.
const MAX_CONDITIONS: usize = 50;

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
    pub(super) fn saved_ids(&self) -> Vec<Uuid> {
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

/// `{field, op, value}`: a comparison of the named `field` by `op` with `value`, any value
/// (and optional) when `None`.
pub(crate) fn compared(
    field: &str, op: ObjectBuilder, value: Option<RefOr<Schema>>,
) -> ObjectBuilder {
    let condition = schema::closed()
        .property(field, name_schema())
        .required(field)
        .property("op", op);
    match value {
        Some(value) => condition.property("value", value).required("value"),
        None => condition.property(
            "value",
            ObjectBuilder::new().schema_type(SchemaType::AnyValue),
        ),
    }
}

/// A condition on the contact's own fields, as the API gives it: every form
/// `Condition::parse` takes but `{audienceId}`, which [`Audience`] adds where it may be.
impl PartialSchema for Condition {
    fn schema() -> RefOr<Schema> {
        let only = |field: &str, value: ObjectBuilder| {
            schema::closed().property(field, value).required(field)
        };
        let attribute = |op, value| compared("attribute", op, value);
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

component!(Condition as "ContactCondition");

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

component!(Audience as "Audience" refers Condition);

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
pub(super) fn push_audience(
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
