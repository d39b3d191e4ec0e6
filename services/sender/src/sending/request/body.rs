//! The `/send-email` body as the API takes it, with its JSON Schema: what [`super::SendRequest`] is
//! parsed from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, SchemaType, Type};
use utoipa::openapi::{Ref, RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use postmesh_shared::ApiError;

use crate::audience::audiences::Audience;
use crate::model::schema::{self, component};
use crate::model::{EmailOrBlank, Key};

use super::{MAX_HEADER_LEN, MAX_RECIPIENTS};

/// `to` as the API takes it: one address, or a list of addresses and recipient objects.
#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum To {
    One(String),
    Many(Vec<ToItem>),
}

/// What `recipients` takes.
impl PartialSchema for To {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .description(Some(
                "One address, or a list of 1-1000 addresses and recipient objects.",
            ))
            .item(schema::email())
            .item(
                ArrayBuilder::new()
                    .items(Ref::from_schema_name(ToItem::name()))
                    .min_items(Some(1))
                    .max_items(Some(MAX_RECIPIENTS)),
            )
            .into()
    }
}

component!(To as "SendTo" refers ToItem);

/// One entry of a `to` list.
#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ToItem {
    Address(String),
    Recipient {
        email: String,
        #[serde(rename = "externalId")]
        external_id: Option<String>,
    },
}

/// What `recipients` takes of one entry.
impl PartialSchema for ToItem {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .description(Some(
                "One entry of a `to` list: an address, or a recipient object.",
            ))
            .item(schema::email())
            .item(
                ObjectBuilder::new()
                    .property("email", schema::email())
                    .required("email")
                    .property("externalId", schema::or_null(HeaderText::line())),
            )
            .into()
    }
}

component!(ToItem as "SendToItem");

/// `cc` / `bcc`: one address (or a comma list), or a list of addresses.
#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Addresses {
    One(String),
    Many(Vec<String>),
}

/// What `copies` takes.
impl PartialSchema for Addresses {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .description(Some(
                "One address (or a comma list), or a list of addresses; blank entries are left \
                 out. `cc` and `bcc` hold at most 49 addresses together.",
            ))
            .item(schema::email_list())
            .item(ArrayBuilder::new().items(schema::email_or_blank()))
            .into()
    }
}

component!(Addresses as "SendAddresses");

/// One attachment as sent: `content` is base64.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = SendAttachment)]
pub struct AttachmentBody {
    #[schema(value_type = Filename, required = true)]
    pub filename: Option<Filename>,
    #[schema(value_type = Base64Text, required = true)]
    pub content: Option<Base64Text>,
    pub content_type: Option<String>,
}

postmesh_shared::text_input! {
    /// An attachment's filename as a request gives it; its schema is what [`attachments`]
    /// takes: a plain name on one line, at most 255 characters.
    #[derive(Debug)]
    pub struct Filename as "AttachmentFilename" = filename_schema()
        .description(Some("A plain name on one line (no `/` or `\\`), at most 255 characters."));
}

/// What [`attachments`] takes as a filename.
fn filename_schema() -> ObjectBuilder {
    let (control, space) = (schema::CONTROL, schema::SPACE);
    schema::string(format!(
        r"^[^{control}/\\]*[^{control}{space}/\\][^{control}/\\]*$"
    ))
    .max_length(Some(255))
}

postmesh_shared::text_input! {
    /// An attachment's content as a request gives it; its schema is what [`attachments`]
    /// decodes.
    #[derive(Debug)]
    pub struct Base64Text as "AttachmentContent" = base64_schema()
        .description(Some("Standard base64 with its padding; white space is ignored."));
}

/// Standard base64 with its padding, white space anywhere (what [`attachments`] decodes):
/// the last digit before the padding carries no bits past the data.
fn base64_schema() -> ObjectBuilder {
    let (space, digit) = (r"[\t\n\x0c\r ]*", "[A-Za-z0-9+/]");
    let digits = |n: usize| format!("(?:{digit}{space}){{{n}}}");
    let (four, one, two) = (digits(4), digits(1), digits(2));
    let end = format!("{one}[AQgw]{space}={space}={space}|{two}[AEIMQUYcgkosw048]{space}={space}");
    schema::string(format!("^{space}(?:{four})*(?:{end})?$"))
}

postmesh_shared::text_input! {
    /// Text that goes into a header, as the API takes it: one line, at most
    /// [`MAX_HEADER_LEN`] characters, blank counting as absent. Its check and its schema are
    /// both here.
    #[derive(Debug)]
    pub struct HeaderText as "HeaderText" = Self::line();
}

impl HeaderText {
    /// The text (none when absent or blank), or why `field` is refused.
    pub(crate) fn check(field: &str, value: Option<Self>) -> Result<Option<String>, ApiError> {
        let Some(Self(value)) = value else {
            return Ok(None);
        };
        if value.chars().any(|c| c.is_control()) {
            return Err(ApiError::BadRequest(format!(
                "{field} must be a single line of text"
            )));
        }
        // Characters, as the schema's `maxLength` counts them.
        if value.chars().count() > MAX_HEADER_LEN {
            return Err(ApiError::BadRequest(format!(
                "{field} is longer than {MAX_HEADER_LEN} characters"
            )));
        }
        Ok(Some(value).filter(|v| !v.trim().is_empty()))
    }

    /// What [`HeaderText::check`] takes.
    fn line() -> ObjectBuilder {
        schema::one_line()
            .max_length(Some(MAX_HEADER_LEN))
            .description(Some(format!(
                "Text for a header: one line, at most {MAX_HEADER_LEN} characters; blank counts \
                 as absent."
            )))
    }
}

/// What [`super::msg_id`] takes.
fn message_id_schema() -> ObjectBuilder {
    let space = schema::WHITE_SPACE;
    // Printable ASCII but `"(),<>\`, and no `@` before the first one.
    let left = r"[\x21\x23-\x27\x2a\x2b\x2d-\x3b\x3d\x3f\x41-\x5b\x5d-\x7e]+";
    let right = r"[\x21\x23-\x27\x2a\x2b\x2d-\x3b\x3d\x3f-\x5b\x5d-\x7e]+";
    schema::string(format!(
        "^[{space}]*(?:<{left}@{right}>|{left}@{right})[{space}]*$"
    ))
}

postmesh_shared::text_input! {
    /// A Message-ID as a request gives it, before [`super::msg_id`] checks it: `<left@right>`,
    /// with or without the brackets; its schema says the same (the 250-byte limit is left out).
    #[derive(Debug)]
    pub struct MessageIdText as "MessageId" = message_id_schema();
}

/// What [`utm`] takes: parameter names of letters, digits and `_` once trimmed, or null.
fn utm_schema() -> ObjectBuilder {
    let space = schema::WHITE_SPACE;
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .property_names(Some(schema::string(format!(
            "^[{space}]*[A-Za-z0-9_]+[{space}]*$"
        ))))
        .additional_properties(Some(ObjectBuilder::new().schema_type(Type::String)))
}

/// What `EmailType::parse` takes.
fn email_type_schema() -> ObjectBuilder {
    schema::string(schema::email_type())
        .description(Some("`transactional`, `lifecycle` or `marketing`"))
}

postmesh_shared::text_input! {
    /// An email type as a request gives it, before `EmailType::parse` reads it; its schema says
    /// what the parse takes.
    #[derive(Debug)]
    pub struct EmailTypeText as "EmailTypeInput" = email_type_schema();
}

postmesh_shared::text_input! {
    /// A template key as a request gives it, before `content` trims it: not blank.
    #[derive(Debug)]
    pub struct TemplateKeyText as "TemplateKeyInput" = schema::not_blank()
        .description(Some("A saved template's key; white space around it is ignored."));
}

/// The `/send-email` body (spec §4.4). Unknown fields are ignored. Serialized again, it is
/// the canonical form an `Idempotency-Key` is bound to.
#[derive(Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendBody {
    pub to: Option<To>,
    #[schema(value_type = Option<Audience>)]
    pub audience: Option<Value>,
    pub campaign_key: Option<Key>,
    pub campaign_name: Option<HeaderText>,
    pub subject: Option<HeaderText>,
    pub html: Option<String>,
    pub text: Option<String>,
    pub from_email: Option<EmailOrBlank>,
    pub from_name: Option<HeaderText>,
    pub reply_to: Option<EmailOrBlank>,
    /// Copies on every recipient's message; transactional mail only.
    pub cc: Option<Addresses>,
    /// Blind copies on every recipient's message; transactional mail only.
    pub bcc: Option<Addresses>,
    pub topic: Option<HeaderText>,
    pub email_type: Option<EmailTypeText>,
    pub dry_run: Option<bool>,
    pub test_send: Option<bool>,
    /// Unix seconds, in the next 30 days.
    #[schema(value_type = Option<i64>)]
    pub scheduled_at: Option<f64>,
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 365)]
    pub frequency_cap_days: Option<f64>,
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 1000)]
    pub frequency_cap_max: Option<f64>,
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 365)]
    pub topic_exclusion_days: Option<f64>,
    pub recipient_reason: Option<HeaderText>,
    pub template_key: Option<TemplateKeyText>,
    #[schema(value_type = Option<i32>, minimum = 1, maximum = 2147483647)]
    pub template_version: Option<f64>,
    pub source_app: Option<HeaderText>,
    pub business_goal: Option<HeaderText>,
    #[schema(schema_with = utm_schema)]
    pub utm: Option<BTreeMap<String, String>>,
    pub message_id: Option<MessageIdText>,
    pub in_reply_to: Option<MessageIdText>,
    pub references: Option<Vec<MessageIdText>>,
    #[schema(max_items = 100)]
    pub attachments: Option<Vec<AttachmentBody>>,
    pub variables: Option<Map<String, Value>>,
    #[schema(max_items = 10)]
    pub tags: Option<Vec<crate::sending::tags::Tag>>,
    #[schema(schema_with = crate::sending::tags::metadata_schema)]
    pub metadata: Option<Map<String, Value>>,
    /// Adds an open-tracking pixel to the HTML part; unset: the workspace's `/tracking`.
    pub track_opens: Option<bool>,
    /// Sends the HTML part's links through tracked redirects; unset: the workspace's
    /// `/tracking`.
    pub track_clicks: Option<bool>,
}
