//! `api-gateway create-key --email E [--credits N] [--role admin] [--mode test]`: an operator's way to
//! make an API key (the account is created if needed; billing must be running). The key is
//! printed alone on the last line of standard output.

use anyhow::{bail, Context};
use tokio_util::task::TaskTracker;

use postmesh_contracts::answers::gateway::KeyMode;
use postmesh_shared::clients::billing::BillingClient;
use postmesh_shared::proto::Role;
use postmesh_shared::{db, Common, EmailAddress};

use crate::{keys, MIGRATIONS, SERVICE};

/// The command's options, parsed.
#[derive(Debug, PartialEq)]
pub struct CreateKey {
    pub email: EmailAddress,
    pub credits: i64,
    pub role: Role,
    /// A `test` key delivers and charges nothing.
    pub mode: KeyMode,
}

const USAGE: &str =
    "usage: api-gateway create-key --email E [--credits N] [--role admin] [--mode test]";

impl CreateKey {
    /// Parses the options that follow `create-key`.
    pub fn parse(args: &[String]) -> anyhow::Result<Self> {
        let (mut email, mut credits, mut role, mut mode) =
            (None, 0i64, Role::Member, KeyMode::Live);
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let value = it.next().with_context(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--email" => {
                    email = Some(
                        EmailAddress::parse(value)
                            .with_context(|| format!("invalid email address {value:?}"))?,
                    )
                }
                "--credits" => {
                    credits = value.parse().context("--credits must be a whole number")?
                }
                "--role" => role = Role::parse(value).context("--role must be member or admin")?,
                "--mode" => {
                    mode = match value.as_str() {
                        "live" => KeyMode::Live,
                        "test" => KeyMode::Test,
                        _ => bail!("--mode must be live or test"),
                    }
                }
                other => bail!("unknown option {other}; {USAGE}"),
            }
        }
        Ok(Self {
            email: email.context(USAGE)?,
            credits,
            role,
            mode,
        })
    }

    /// Creates the account if needed and the key; returns the key text.
    pub async fn create(&self, common: &Common) -> anyhow::Result<String> {
        let db = db::connect(common, SERVICE, &MIGRATIONS).await?;
        let nats = postmesh_shared::nats::connect(common, SERVICE, common.upstream_timeout).await?;
        let billing = BillingClient::new(nats, common.namespace.clone(), TaskTracker::new());
        keys::create_key(
            &db,
            &billing,
            &self.email,
            self.role,
            self.credits,
            "create-key",
            self.mode,
        )
        .await
    }

    /// Creates the key and prints it.
    pub async fn run(self, common: &Common) -> anyhow::Result<()> {
        let key = self.create(common).await?;
        eprintln!(
            "created a {} API key ({}) for {} with {} credits",
            self.mode.as_str(),
            self.role.name(),
            self.email,
            self.credits
        );
        println!("{key}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_are_parsed_and_checked() {
        let parsed = CreateKey::parse(&args(&[
            "--email",
            "A@Example.com",
            "--credits",
            "7",
            "--role",
            "admin",
        ]))
        .unwrap();
        assert_eq!(parsed.email.as_str(), "A@example.com");
        assert_eq!((parsed.credits, parsed.role), (7, Role::Admin));
        let member = CreateKey::parse(&args(&["--email", "a@example.com"])).unwrap();
        assert_eq!((member.credits, member.role), (0, Role::Member));
        assert_eq!(member.mode, KeyMode::Live);
        let test = CreateKey::parse(&args(&["--email", "a@example.com", "--mode", "test"]));
        assert_eq!(test.unwrap().mode, KeyMode::Test);
        for bad in [
            &["--credits", "7"][..],
            &["--email", "nope"],
            &["--email", "a@example.com", "--role", "owner"],
            &["--email", "a@example.com", "--credits", "x"],
            &["--email", "a@example.com", "--mode", "demo"],
            &["--email"],
            &["--bogus", "1"],
        ] {
            assert!(CreateKey::parse(&args(bad)).is_err(), "{bad:?} accepted");
        }
    }
}
