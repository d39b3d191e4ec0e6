//! A send's tags and metadata, checked at the edge — `/send-email`'s `tags` and `metadata`,
//! a raw message's `X-Postmesh-Tags: name=value, …` and `X-Postmesh-Metadata: {json}` —
//! stored with its task and carried by each of its events.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use utoipa::openapi::schema::{ObjectBuilder, Type};

use postmesh_shared::ApiError;

pub use postmesh_contracts::answers::sender::Tag;

/// Tags of one send at most.
pub const MAX_TAGS: usize = 10;
/// Characters of a tag's name or value at most.
const MAX_TAG_LEN: usize = 50;
/// Bytes of a send's metadata at most, serialised as JSON.
pub const MAX_METADATA_BYTES: usize = 2048;
/// A raw message's tags (`name=value, …`); taken out before delivery.
pub const TAGS_FIELD: &str = "X-Postmesh-Tags";
/// A raw message's metadata (a JSON object of strings); taken out before delivery.
pub const METADATA_FIELD: &str = "X-Postmesh-Metadata";

/// A send's metadata: names to strings.
pub type Metadata = BTreeMap<String, String>;

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// Whether `s` can be a tag's name or value: 1-50 of `A-Za-z0-9_-`.
fn tag_part(s: &str) -> bool {
    (1..=MAX_TAG_LEN).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tags` checked: at most [`MAX_TAGS`], each name and value 1-50 of `A-Za-z0-9_-`, no
/// name twice.
pub fn check_tags(tags: Option<Vec<Tag>>) -> Result<Vec<Tag>, ApiError> {
    let tags = tags.unwrap_or_default();
    if tags.len() > MAX_TAGS {
        return Err(bad(format!("at most {MAX_TAGS} tags are allowed")));
    }
    for (i, t) in tags.iter().enumerate() {
        if !tag_part(&t.name) || !tag_part(&t.value) {
            return Err(bad(format!(
                "tags[{i}]: name and value must each be 1-{MAX_TAG_LEN} of A-Za-z0-9_-"
            )));
        }
        if tags[..i].iter().any(|o| o.name == t.name) {
            return Err(bad(format!("tags: {:?} is given twice", t.name)));
        }
    }
    Ok(tags)
}

/// `metadata` checked: an object of strings, at most [`MAX_METADATA_BYTES`] as JSON.
pub fn check_metadata(metadata: Option<Map<String, Value>>) -> Result<Metadata, ApiError> {
    let Some(map) = metadata else {
        return Ok(Metadata::new());
    };
    let size = serde_json::to_vec(&map).map_or(usize::MAX, |v| v.len());
    if size > MAX_METADATA_BYTES {
        return Err(bad(format!(
            "metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES} are allowed"
        )));
    }
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) if !k.is_empty() => Ok((k, s)),
            Value::String(_) => Err(bad("metadata: a name is empty")),
            _ => Err(bad(format!("metadata.{k} must be a string"))),
        })
        .collect()
}

/// What `metadata` takes.
pub fn metadata_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(ObjectBuilder::new().schema_type(Type::String)))
        .description(Some(format!(
            "Names to strings, at most {MAX_METADATA_BYTES} bytes as JSON; carried in every \
             event of the send."
        )))
}

/// The tags of an `X-Postmesh-Tags` field: `name=value` pairs separated by commas.
pub fn tags_of_field(raw: &str) -> Result<Vec<Tag>, ApiError> {
    // Longer than ten of the longest tags could be cannot be valid: refused before it is split.
    if raw.len() > MAX_TAGS * (2 * MAX_TAG_LEN + 3) {
        return Err(bad(format!("{TAGS_FIELD} is too long")));
    }
    raw.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| bad(format!("{TAGS_FIELD}: {pair:?} is not name=value")))?;
            Ok(Tag {
                name: name.trim().to_owned(),
                value: value.trim().to_owned(),
            })
        })
        .collect()
}

/// The metadata of an `X-Postmesh-Metadata` field: a JSON object.
pub fn metadata_of_field(raw: &str) -> Result<Map<String, Value>, ApiError> {
    if raw.len() > 2 * MAX_METADATA_BYTES {
        return Err(bad(format!("{METADATA_FIELD} is too long")));
    }
    serde_json::from_str(raw).map_err(|_| bad(format!("{METADATA_FIELD} is not a JSON object")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(name: &str, value: &str) -> Tag {
        Tag {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn tags_are_ten_pairs_of_plain_words_at_most() {
        assert_eq!(
            check_tags(Some(vec![tag("plan", "pro")])).unwrap(),
            [tag("plan", "pro")]
        );
        let eleven: Vec<Tag> = (0..11).map(|i| tag(&format!("t{i}"), "v")).collect();
        assert!(check_tags(Some(eleven)).is_err());
        for (n, v) in [("", "v"), ("a b", "v"), ("n", &"x".repeat(51)), ("é", "v")] {
            assert!(check_tags(Some(vec![tag(n, v)])).is_err(), "{n:?}={v:?}");
        }
        assert!(check_tags(Some(vec![tag("a", "1"), tag("a", "2")])).is_err());
    }

    #[test]
    fn metadata_is_strings_within_two_kib() {
        let m = |v: Value| v.as_object().cloned();
        assert_eq!(
            check_metadata(m(serde_json::json!({"user": "42"}))).unwrap(),
            Metadata::from([("user".into(), "42".into())])
        );
        assert!(check_metadata(m(serde_json::json!({"n": 1}))).is_err());
        assert!(check_metadata(m(serde_json::json!({"big": "x".repeat(2100)}))).is_err());
    }

    #[test]
    fn header_fields_read_as_the_api_takes_them() {
        assert_eq!(
            tags_of_field(" plan=pro, region = eu ,").unwrap(),
            [tag("plan", "pro"), tag("region", "eu")]
        );
        assert!(tags_of_field("plan").is_err());
        // Hostile: a field far longer than any valid one is refused before it is split.
        assert!(tags_of_field(&"a=b,".repeat(100_000)).is_err());
        assert_eq!(metadata_of_field(r#"{"user":"42"}"#).unwrap()["user"], "42");
        assert!(metadata_of_field("[1]").is_err());
        assert!(metadata_of_field(&"[".repeat(10_000)).is_err());
    }
}
