//! Sandbox addresses: recipients on `SANDBOX_DOMAIN` (default `sandbox.postmesh.test`; `.test`
//! never routes) ask by their local part for what happens to their message: `delivered@`,
//! `bounced@`, `complained@`, `delayed@`, `suppressed@`, each with an optional `+label`;
//! any other local part is a 400. Acceptance (`sending`) and delivery (`delivery::sandbox`)
//! both read them here.

use uuid::Uuid;

use postmesh_shared::ApiError;

/// What a sandbox address does with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    Bounced,
    Complained,
    Delayed,
    Suppressed,
}

impl Outcome {
    /// Every outcome, as its local part.
    const ALL: [(Outcome, &'static str); 5] = [
        (Outcome::Delivered, "delivered"),
        (Outcome::Bounced, "bounced"),
        (Outcome::Complained, "complained"),
        (Outcome::Delayed, "delayed"),
        (Outcome::Suppressed, "suppressed"),
    ];

    /// The local part that asks for this outcome.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(o, _)| *o == self)
            .map_or("delivered", |(_, name)| name)
    }

    fn of_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .find(|(_, n)| n.eq_ignore_ascii_case(name))
            .map(|(o, _)| *o)
    }
}

/// The sandbox domain and what its addresses mean.
#[derive(Clone, Debug)]
pub struct Sandbox {
    domain: String,
}

/// The provider message id a sandbox message is recorded with: `sandbox:<outcome>:<delivery>`.
const PROVIDER_PREFIX: &str = "sandbox:";
/// The provider message id of a test key's message: `test:<delivery>`.
const TEST_PREFIX: &str = "test:";

impl Sandbox {
    /// The sandbox on `domain` (compared without regard to case).
    pub fn new(domain: &str) -> Self {
        Self {
            domain: domain.trim().to_ascii_lowercase(),
        }
    }

    /// The outcome `address` asks for: none when it is not on the sandbox domain; a 400
    /// naming the valid local parts when it is and asks for none of them.
    pub fn outcome(&self, address: &str) -> Result<Option<Outcome>, ApiError> {
        let Some((local, domain)) = address.trim().rsplit_once('@') else {
            return Ok(None);
        };
        if !domain.eq_ignore_ascii_case(&self.domain) {
            return Ok(None);
        }
        let base = local.split_once('+').map_or(local, |(base, _)| base);
        Outcome::of_name(base).map(Some).ok_or_else(|| {
            let valid: Vec<&str> = Outcome::ALL.iter().map(|(_, n)| *n).collect();
            ApiError::BadRequest(format!(
                "{address} is not a sandbox address: on {} the local part is one of {} (with an optional +label)",
                self.domain,
                valid.join(", ")
            ))
        })
    }

    /// Whether `address` is a sandbox address that asks for an outcome.
    pub fn holds(&self, address: &str) -> bool {
        matches!(self.outcome(address), Ok(Some(_)))
    }

    /// The provider message id a sandbox message of `outcome` is recorded with.
    pub fn provider_id(outcome: Outcome, delivery: Uuid) -> String {
        format!("{PROVIDER_PREFIX}{}:{delivery}", outcome.name())
    }

    /// The provider message id a test key's message is recorded with: `test:<delivery>`.
    pub fn test_provider_id(delivery: Uuid) -> String {
        format!("{TEST_PREFIX}{delivery}")
    }

    /// The outcome a recorded provider message id stands for, if it is a sandbox one (a
    /// test key's message is delivered).
    pub fn recorded(provider_id: &str) -> Option<Outcome> {
        if provider_id.starts_with(TEST_PREFIX) {
            return Some(Outcome::Delivered);
        }
        let rest = provider_id.strip_prefix(PROVIDER_PREFIX)?;
        Outcome::of_name(rest.split_once(':')?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_addresses_ask_for_an_outcome_and_others_are_refused() {
        let sandbox = Sandbox::new("Sandbox.Postmesh.Test");
        let outcome = |a: &str| sandbox.outcome(a).unwrap();
        assert_eq!(outcome("a@example.com"), None);
        assert_eq!(outcome("bounced@example.com"), None);
        assert_eq!(
            outcome("delivered@sandbox.postmesh.test"),
            Some(Outcome::Delivered)
        );
        assert_eq!(
            outcome("Bounced+signup@SANDBOX.postmesh.test"),
            Some(Outcome::Bounced)
        );
        assert_eq!(
            outcome("delayed+a+b@sandbox.postmesh.test"),
            Some(Outcome::Delayed)
        );
        let refused = sandbox
            .outcome("someone@sandbox.postmesh.test")
            .unwrap_err();
        let text = refused.to_string();
        for name in [
            "delivered",
            "bounced",
            "complained",
            "delayed",
            "suppressed",
        ] {
            assert!(text.contains(name), "{text}");
        }
        assert!(sandbox.outcome("+x@sandbox.postmesh.test").is_err());
    }

    #[test]
    fn a_recorded_id_names_its_outcome() {
        let id = Uuid::now_v7();
        for (outcome, _) in Outcome::ALL {
            assert_eq!(
                Sandbox::recorded(&Sandbox::provider_id(outcome, id)),
                Some(outcome)
            );
        }
        assert_eq!(Sandbox::recorded("0100018f-ses-id"), None);
        assert_eq!(Sandbox::recorded("sandbox:nothing:x"), None);
    }
}
