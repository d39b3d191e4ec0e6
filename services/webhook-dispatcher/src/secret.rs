//! Signing secrets as Standard Webhooks writes them: `whsec_` and the base64 of 24 to 64
//! random bytes; the bytes are the HMAC key.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use utoipa::openapi::schema::{ObjectBuilder, Type};

use crate::target::TRIMMED;

/// The prefix of every signing secret.
const PREFIX: &str = "whsec_";
/// How many key bytes a secret may carry.
const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;
/// Key bytes of a generated secret.
const GENERATED_BYTES: usize = 32;

/// A signing secret's key bytes; it cannot exist with the wrong length.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(Vec<u8>);

impl SigningSecret {
    /// Parses `whsec_<base64>`; the reason when it is not one.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "signingSecret must be {PREFIX} followed by the base64 of {} to {} bytes",
                KEY_BYTES.start(),
                KEY_BYTES.end()
            )
        };
        let encoded = raw.trim().strip_prefix(PREFIX).ok_or_else(bad)?;
        let key = STANDARD.decode(encoded).map_err(|_| bad())?;
        if KEY_BYTES.contains(&key.len()) {
            Ok(Self(key))
        } else {
            Err(bad())
        }
    }

    /// A new random secret.
    pub fn generate() -> Self {
        Self((0..GENERATED_BYTES).map(|_| rand::random::<u8>()).collect())
    }

    /// The HMAC key.
    pub fn key(&self) -> &[u8] {
        &self.0
    }

    /// `whsec_<base64>`, as shown to the customer once.
    pub fn reveal(&self) -> String {
        format!("{PREFIX}{}", STANDARD.encode(&self.0))
    }
}

/// What [`SigningSecret::parse`] accepts, as an ECMA-262 pattern: [`PREFIX`] and the
/// canonical base64 ([`STANDARD`]: padded, no stray bits in the last character) of a
/// [`KEY_BYTES`] key — whole groups of 4 characters (3 bytes each), then a last group of 1
/// byte (`xx==`), of 2 (`xxx=`) or none — with what `str::trim` takes off around them.
fn secret_pattern() -> String {
    let (min, max) = (*KEY_BYTES.start(), *KEY_BYTES.end());
    // The whole groups before a last group of `tail` bytes, for a key of `min` to `max`.
    let groups = |tail: usize| {
        let least = min.saturating_sub(tail).div_ceil(3);
        format!("(?:[A-Za-z0-9+/]{{4}}){{{least},{}}}", (max - tail) / 3)
    };
    [
        "^",
        TRIMMED,
        "*",
        PREFIX,
        "(?:",
        &groups(0),
        "|",
        &groups(1),
        "[A-Za-z0-9+/][AQgw]==|",
        &groups(2),
        "[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)",
        TRIMMED,
        "*$",
    ]
    .concat()
}

/// What [`SigningSecret::parse`] takes.
fn secret_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(secret_pattern()))
}

postmesh_shared::text_input! {
    /// A `signingSecret` as a body gives it, before [`SigningSecret::parse`]; its schema is what
    /// the parse takes ([`secret_pattern`]). None: one is generated.
    pub struct GivenSecret as "SigningSecretInput" = secret_schema();
}

impl std::fmt::Debug for GivenSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GivenSecret(..)")
    }
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_whsec_and_24_to_64_bytes() {
        let ok = |n: usize| format!("whsec_{}", STANDARD.encode(vec![7u8; n]));
        assert!(SigningSecret::parse(&ok(24)).is_ok());
        assert!(SigningSecret::parse(&ok(64)).is_ok());
        for bad in [
            ok(23),
            ok(65),
            "whsec_***".into(),
            STANDARD.encode([7u8; 32]),
            String::new(),
        ] {
            assert!(SigningSecret::parse(&bad).is_err(), "{bad}");
        }
        let generated = SigningSecret::generate();
        assert_eq!(
            SigningSecret::parse(&generated.reveal()).unwrap(),
            generated
        );
        assert_ne!(SigningSecret::generate(), generated);
        assert_eq!(format!("{generated:?}"), "SigningSecret(..)");
    }
}
