//! The commands, one module per group, and the [`Context`] they share: the API client with
//! the key to present, and whether to print JSON as sent or for a person.

mod account;
mod billing;
mod domains;
mod events;
mod login;
mod send;

use serde::de::DeserializeOwned;

use crate::api::{BaseUrl, Call, Client};
use crate::cli::{Cli, Command, EventsCommand};
use crate::config::CredentialsStore;
use crate::output;

/// The environment variable whose key, when set, is used instead of the stored one.
const API_KEY_ENV: &str = "POSTMESH_API_KEY";

/// What a command works with.
pub struct Context {
    pub client: Client,
    /// `--json`: print the server's answers as sent.
    pub json: bool,
}

impl Context {
    /// A context presenting `POSTMESH_API_KEY`, else the stored key (none: not logged in,
    /// which the first call that needs a key reports).
    fn keyed(api_url: BaseUrl, json: bool) -> anyhow::Result<Self> {
        let key = api_key(&api_url)?;
        Ok(Self {
            client: Client::new(api_url, key)?,
            json,
        })
    }

    /// Makes `call` and prints its answer: as sent with `--json`, else `human` of it parsed
    /// as `T`.
    pub async fn show<T: DeserializeOwned>(
        &self, call: &Call, human: impl FnOnce(T) -> anyhow::Result<String>,
    ) -> anyhow::Result<()> {
        if self.json {
            let answer = self.client.exchange(call).await?.into_success()?;
            output::print(&answer.raw)
        } else {
            let answer = self.client.call::<T>(call).await?;
            output::print(&human(answer.body)?)
        }
    }
}

/// The key to present to `api_url`: `POSTMESH_API_KEY` when set, else the stored one, if
/// any; a stored key is never sent to another API than the one that issued it.
fn api_key(api_url: &BaseUrl) -> anyhow::Result<Option<String>> {
    let from_env = std::env::var(API_KEY_ENV)
        .ok()
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty());
    if from_env.is_some() {
        return Ok(from_env);
    }
    // No config directory means nothing was stored: not logged in.
    let Ok(store) = CredentialsStore::locate() else {
        return Ok(None);
    };
    let Some(stored) = store.load()? else {
        return Ok(None);
    };
    match stored.api_url {
        Some(issuer) if issuer != api_url.to_string() => anyhow::bail!(
            "the stored key is for {issuer}, not {api_url}; run postmesh login --api-url \
             {api_url}, or set POSTMESH_API_KEY"
        ),
        _ => Ok(Some(stored.api_key)),
    }
}

/// Runs the command `cli` names.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let (api_url, json) = (cli.api_url, cli.json);
    match cli.command {
        Command::Login { no_browser } => {
            let client = Client::new(api_url, None)?;
            login::login(&client, &CredentialsStore::locate()?, no_browser, json).await
        }
        Command::Logout => login::logout(&CredentialsStore::locate()?, json),
        Command::Whoami => account::whoami(&Context::keyed(api_url, json)?).await,
        Command::Balance => billing::balance(&Context::keyed(api_url, json)?).await,
        Command::Logs(args) => billing::logs(&Context::keyed(api_url, json)?, args).await,
        Command::Send(args) => send::send(&Context::keyed(api_url, json)?, args).await,
        Command::Status(args) => send::status(&Context::keyed(api_url, json)?, args).await,
        Command::Domains { command } => {
            domains::run(&Context::keyed(api_url, json)?, command).await
        }
        Command::Events {
            command: EventsCommand::Send(args),
        } => events::send(&Context::keyed(api_url, json)?, args).await,
    }
}
