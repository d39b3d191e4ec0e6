//! A contact as a request gives it, checked at the edge into a [`ContactInput`], with its JSON
//! Schema.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::openapi::schema::{
    AllOfBuilder, AnyOfBuilder, ArrayBuilder, ObjectBuilder, SchemaType, Type,
};
use utoipa::openapi::{Ref, RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use postmesh_shared::EmailAddress;

use crate::model::schema::{self, component};
use crate::model::EmailOrBlank;

use super::{Subscription, MAX_ATTRIBUTES, MAX_ATTRIBUTES_BYTES, MAX_NAME_LEN, MAX_TAGS};

/// The fields of a contact as a request gives them; all optional.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContactBody {
    pub email: Option<EmailOrBlank>,
    pub external_id: Option<Name>,
    #[schema(schema_with = attributes_schema)]
    pub attributes: Option<Map<String, Value>>,
    #[schema(schema_with = tags_schema)]
    pub tags: Option<Vec<String>>,
    #[schema(schema_with = topics_schema)]
    pub topics: Option<BTreeMap<String, Subscription>>,
}

postmesh_shared::text_input! {
    /// A name as a request gives it, before [`name`] checks it (1-200 characters on one line,
    /// trimmed); its schema is what the check takes.
    #[derive(Debug)]
    pub struct Name as "Name" = name_schema();
}

/// `attributes`: at most 100, named with nothing to trim, or null.
fn attributes_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .max_properties(Some(MAX_ATTRIBUTES))
        .property_names(Some(exact_name_schema()))
}

/// `tags`: at most 100 names, or null.
fn tags_schema() -> ArrayBuilder {
    ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(name_schema())
        .max_items(Some(MAX_TAGS))
}

/// `topics`: at most 100, by name, or null.
fn topics_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .max_properties(Some(MAX_TAGS))
        .property_names(Some(name_schema()))
        .additional_properties(Some(Subscription::schema()))
}

/// A contact's fields, checked: what an upsert or a change writes.
#[derive(Debug, Default)]
pub struct ContactInput {
    pub email: Option<EmailAddress>,
    pub external_id: Option<String>,
    /// Merged into the stored ones; a `null` removes the attribute.
    pub attributes: Option<Map<String, Value>>,
    /// Replace the stored ones.
    pub tags: Option<Vec<String>>,
    /// Merged into the stored ones.
    pub topics: Option<BTreeMap<String, Subscription>>,
}

/// A name (tag, topic, attribute, external id): one line, 1-200 characters once trimmed.
pub fn name(field: &str, raw: &str) -> Result<String, String> {
    let v = raw.trim();
    if v.is_empty() || v.chars().count() > MAX_NAME_LEN || v.chars().any(char::is_control) {
        return Err(format!(
            "{field} must be 1-{MAX_NAME_LEN} characters on one line"
        ));
    }
    Ok(v.to_owned())
}

/// What [`name`] takes, once trimmed: 1-200 characters, none a control character, the
/// first and last not white space.
fn trimmed_name() -> String {
    let (control, space) = (schema::CONTROL, schema::SPACE);
    let end = format!("[^{control}{space}]");
    format!("{end}(?:[^{control}]{{0,{}}}{end})?", MAX_NAME_LEN - 2)
}

/// What [`name`] takes.
pub(crate) fn name_schema() -> ObjectBuilder {
    let space = schema::WHITE_SPACE;
    schema::string(format!("^[{space}]*{}[{space}]*$", trimmed_name()))
        .description(Some(format!("1-{MAX_NAME_LEN} characters on one line")))
}

/// `raw` quoted for an error, its first 64 characters at most: an answer never repeats a
/// whole field of a 16 MiB import back.
pub(crate) fn shown(raw: &str) -> String {
    let head: String = raw.chars().take(64).collect();
    if head.len() < raw.len() {
        format!("{head:?}…")
    } else {
        format!("{head:?}")
    }
}

/// What [`name`] takes and leaves as it is: with no white space around it.
fn exact_name_schema() -> ObjectBuilder {
    schema::string(format!("^{}$", trimmed_name()))
}

impl ContactInput {
    /// Checks `body`; the error names the field at fault.
    pub fn parse(body: ContactBody) -> Result<Self, String> {
        let email = match body.email.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(raw) => Some(
                EmailAddress::parse(raw)
                    .ok_or_else(|| format!("invalid email address {}", shown(raw)))?,
            ),
        };
        let external_id = body
            .external_id
            .as_deref()
            .map(|raw| name("externalId", raw))
            .transpose()?;
        if let Some(attributes) = &body.attributes {
            if attributes.len() > MAX_ATTRIBUTES {
                return Err(format!("at most {MAX_ATTRIBUTES} attributes"));
            }
            for key in attributes.keys() {
                if name("attribute name", key)? != *key {
                    return Err(format!("attribute name {key:?} has spaces around it"));
                }
            }
            if Value::Object(attributes.clone()).to_string().len() > MAX_ATTRIBUTES_BYTES {
                return Err(format!(
                    "attributes are larger than {} KiB",
                    MAX_ATTRIBUTES_BYTES / 1024
                ));
            }
        }
        let tags = match body.tags {
            None => None,
            Some(list) => {
                if list.len() > MAX_TAGS {
                    return Err(format!("at most {MAX_TAGS} tags"));
                }
                let mut tags = list
                    .iter()
                    .map(|t| name("tag", t))
                    .collect::<Result<Vec<_>, _>>()?;
                tags.sort();
                tags.dedup();
                Some(tags)
            }
        };
        let topics = match body.topics {
            None => None,
            Some(map) if map.len() > MAX_TAGS => return Err(format!("at most {MAX_TAGS} topics")),
            Some(map) => Some(
                map.into_iter()
                    .map(|(k, v)| Ok((name("topic", &k)?, v)))
                    .collect::<Result<_, String>>()?,
            ),
        };
        Ok(Self {
            email,
            external_id,
            attributes: body.attributes,
            tags,
            topics,
        })
    }
}

/// The `POST /contacts` body: a [`ContactBody`] that names the contact to create or update
/// by its email or its `externalId` ([`upsert`] refuses one that names neither).
impl PartialSchema for ContactInput {
    fn schema() -> RefOr<Schema> {
        let given = |field: &str, schema: ObjectBuilder| {
            ObjectBuilder::new().property(field, schema).required(field)
        };
        AllOfBuilder::new()
            .description(Some(
                "A contact's fields, with its email or externalId to find it by (or to create \
                 it with its email).",
            ))
            .item(Ref::from_schema_name(ContactBody::name()))
            .item(
                AnyOfBuilder::new()
                    .item(given("email", schema::not_blank()))
                    .item(given(
                        "externalId",
                        ObjectBuilder::new().schema_type(Type::String),
                    )),
            )
            .into()
    }
}

component!(ContactInput as "ContactUpsert" refers ContactBody);
