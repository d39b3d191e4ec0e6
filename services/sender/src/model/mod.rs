//! The sender's vocabulary shared by its concerns (sending, contacts, audiences, campaigns,
//! templates), below all of them: a recipient, the key of a template or a campaign, and the
//! sandbox addresses.

pub mod sandbox;
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

postmesh_shared::text_input! {
    /// An email address as a request gives it, where blank text names none: the route parses
    /// it with `EmailAddress::parse` once trimmed; its schema says the same.
    #[derive(Debug)]
    pub struct EmailOrBlank as "EmailOrBlank" = schema::email_or_blank();
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

postmesh_shared::text_input! {
    /// A template's or a campaign's key as a request gives it, before [`parse_key`] checks it;
    /// its schema is what the check takes.
    #[derive(Debug)]
    pub struct Key as "Key" = key_schema();
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
