//! The `DomainName` domain type: a registrable-looking DNS name in ASCII form. It cannot
//! exist invalid.

use std::fmt;

/// A lower-cased ASCII (IDNA) domain name: at least two labels of 1-63 letters, digits or
/// hyphens (not at either end), at most 253 chars, not an IP literal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DomainName(String);

impl DomainName {
    /// Parses user input (Unicode names become their `xn--` form); `Err` says why not.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let trimmed = raw.trim();
        let trimmed = trimmed.strip_suffix('.').unwrap_or(trimmed);
        if trimmed.is_empty() {
            return Err("domain is empty".into());
        }
        if trimmed.parse::<std::net::IpAddr>().is_ok()
            || trimmed.starts_with('[')
            || trimmed
                .split('.')
                .all(|l| l.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(format!("{trimmed} is an IP address, not a domain name"));
        }
        let ascii = idna::domain_to_ascii(trimmed)
            .map_err(|_| format!("{trimmed} is not a valid internationalized domain name"))?;
        if ascii.len() > 253 {
            return Err("domain is longer than 253 characters".into());
        }
        let labels: Vec<&str> = ascii.split('.').collect();
        if labels.len() < 2 {
            return Err(format!(
                "{ascii} needs at least two labels (like example.com)"
            ));
        }
        for label in &labels {
            let ok = (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if !ok {
                return Err(format!(
                    "{ascii}: label {label:?} must be 1-63 letters, digits or inner hyphens"
                ));
            }
        }
        if labels
            .last()
            .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(format!("{ascii} has a numeric top-level label"));
        }
        Ok(Self(ascii))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is `other` or a subdomain of it.
    pub fn is_within(&self, other: &DomainName) -> bool {
        self.0 == other.0 || self.0.ends_with(&format!(".{}", other.0))
    }

    /// `label.<this name>`.
    pub fn child(&self, label: &str) -> String {
        format!("{label}.{}", self.0)
    }
}

impl fmt::Display for DomainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::DomainName;

    #[test]
    fn names_are_lowercased_and_idna_encoded() {
        let ok = |raw: &str| DomainName::parse(raw).map(|d| d.0);
        assert_eq!(ok("Example.COM").unwrap(), "example.com");
        assert_eq!(ok(" mail.example.com. ").unwrap(), "mail.example.com");
        assert_eq!(ok("bücher.example").unwrap(), "xn--bcher-kva.example");
        assert_eq!(ok("a-b.c0.io").unwrap(), "a-b.c0.io");
        assert_eq!(ok(&format!("{}.com", "a".repeat(63))).unwrap().len(), 67);
    }

    #[test]
    fn everything_else_is_refused() {
        let long_label = format!("{}.com", "a".repeat(64));
        let long_name = format!("{}com", "abcdefghi.".repeat(26));
        for bad in [
            "",
            ".",
            "localhost",
            "com",
            "-a.com",
            "a-.com",
            "a..com",
            "a_b.com",
            "exa mple.com",
            "user@example.com",
            "127.0.0.1",
            "[::1]",
            "::1",
            "10.0.0.1.5",
            "example.123",
            "http://example.com",
            &long_label,
            &long_name,
        ] {
            assert!(DomainName::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn subdomains_are_within_their_parent_only() {
        let p = |s| DomainName::parse(s).unwrap();
        assert!(p("postmesh.localhost").is_within(&p("postmesh.localhost")));
        assert!(p("a.postmesh.localhost").is_within(&p("postmesh.localhost")));
        assert!(!p("xpostmesh.localhost").is_within(&p("postmesh.localhost")));
    }
}
