//! The sender's vocabulary shared by its concerns (sending, contacts, audiences, campaigns,
//! templates), below all of them: a recipient, and the key of a template or a campaign.

pub(crate) mod schema;

use utoipa::openapi::schema::ObjectBuilder;

use postmesh_shared::EmailAddress;

/// Longest template or campaign key.
pub const MAX_KEY_LEN: usize = 100;

/// One recipient to deliver to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipient {
    pub email: EmailAddress,
    pub external_id: Option<String>,
}

/// An email address as a request gives it, where blank text names none: the route parses
/// it with `EmailAddress::parse` once trimmed; its schema says the same.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(transparent)]
pub struct EmailOrBlank(String);

impl From<&str> for EmailOrBlank {
    fn from(text: &str) -> Self {
        Self(text.to_owned())
    }
}

impl std::ops::Deref for EmailOrBlank {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl utoipa::PartialSchema for EmailOrBlank {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        schema::email_or_blank().into()
    }
}

impl utoipa::ToSchema for EmailOrBlank {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("EmailOrBlank")
    }
}

/// A template's or a campaign's key (`what` names which in the error): 1-100 letters,
/// digits, `_`, `-`, `.` once trimmed.
pub fn parse_key(what: &str, raw: &str) -> Result<String, String> {
    let key = raw.trim();
    if key.is_empty()
        || key.len() > MAX_KEY_LEN
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(format!(
            "{what} key must be 1-{MAX_KEY_LEN} letters, digits, _, - or ."
        ));
    }
    Ok(key.to_owned())
}

/// What [`parse_key`] takes.
pub fn key_schema() -> ObjectBuilder {
    schema::key(MAX_KEY_LEN)
}

/// A template's or a campaign's key as a request gives it, before [`parse_key`] checks it;
/// its schema is what the check takes.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(transparent)]
pub struct Key(String);

impl From<String> for Key {
    fn from(key: String) -> Self {
        Self(key)
    }
}

impl std::ops::Deref for Key {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl utoipa::PartialSchema for Key {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        key_schema().into()
    }
}

impl utoipa::ToSchema for Key {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("Key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_trimmed_and_checked() {
        assert_eq!(
            parse_key("campaign", " spring-sale.2 "),
            Ok("spring-sale.2".into())
        );
        for bad in ["", "  ", "spring sale", "ü", &"k".repeat(MAX_KEY_LEN + 1)] {
            let err = parse_key("template", bad).unwrap_err();
            assert!(err.starts_with("template key must be"), "{bad:?}: {err}");
        }
        assert!(parse_key("campaign", &"k".repeat(MAX_KEY_LEN)).is_ok());
    }
}
