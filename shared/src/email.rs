//! The `EmailAddress` domain type: it cannot exist invalid.

use std::fmt;

/// A syntactically valid address (`local@domain`), lowercased domain, at most 254 chars.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EmailAddress(String);

impl EmailAddress {
    /// Parses an address; returns `None` when it is not a plausible mailbox.
    pub fn parse(raw: &str) -> Option<Self> {
        let s = raw.trim();
        if s.len() > 254 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return None;
        }
        let (local, domain) = s.rsplit_once('@')?;
        let local_ok = !local.is_empty()
            && local.len() <= 64
            && !local.contains('@')
            && !local.starts_with('.')
            && !local.ends_with('.')
            && !local.contains("..")
            && !local.contains(['<', '>', '(', ')', '[', ']', ',', ';', ':', '\\', '"']);
        let labels: Vec<&str> = domain.split('.').collect();
        let domain_ok = labels.len() >= 2
            && labels.iter().all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
        (local_ok && domain_ok).then(|| Self(format!("{local}@{}", domain.to_ascii_lowercase())))
    }

    /// The address as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part after the `@`.
    pub fn domain(&self) -> &str {
        self.0.rsplit_once('@').map_or("", |(_, d)| d)
    }

    /// What "the same address" means: see [`key`].
    pub fn key(&self) -> String {
        key(&self.0)
    }
}

/// The key an address is stored and compared under: lowercased in full Unicode, here in
/// Rust and never by the database's `lower()` (whose result depends on its locale).
pub fn key(address: &str) -> String {
    address.trim().to_lowercase()
}

impl fmt::Display for EmailAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::{key, EmailAddress};

    #[test]
    fn keys_lower_the_whole_address_in_unicode() {
        let address = EmailAddress::parse("ΟΔΟΣ@Example.com").unwrap();
        assert_eq!(address.key(), "οδος@example.com");
        assert_eq!(key(" ÉLISE@x.org "), "élise@x.org");
    }

    #[test]
    fn accepts_plausible_and_rejects_broken_addresses() {
        assert_eq!(
            EmailAddress::parse(" Ann.Lee+x@Example.COM ")
                .unwrap()
                .as_str(),
            "Ann.Lee+x@example.com"
        );
        for bad in [
            "",
            "plain",
            "@x.com",
            "a@",
            "a@b",
            "a@@b.com",
            "a b@c.com",
            "a@-b.com",
            "a..b@c.com",
            "a@b..com",
            "<a@b.com>",
            "a@b_c.com",
        ] {
            assert!(EmailAddress::parse(bad).is_none(), "{bad:?} accepted");
        }
        assert!(EmailAddress::parse(&format!("{}@b.com", "a".repeat(65))).is_none());
    }
}
