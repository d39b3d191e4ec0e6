//! The command line: global options, the commands and their arguments, parsed at the edge
//! (ids as uuids, the API URL as a URL, event properties as a JSON object).

use clap::{Args, Parser, Subcommand};
use serde_json::{Map, Value};
use uuid::Uuid;

use postmesh_contracts::TaskId;

use crate::api::BaseUrl;

/// The Postmesh command-line client.
#[derive(Debug, Parser)]
#[command(name = "postmesh", version)]
pub struct Cli {
    /// Base URL of the Postmesh API.
    #[arg(
        long,
        global = true,
        env = "POSTMESH_API_URL",
        default_value = "http://127.0.0.1:8080",
        value_name = "URL"
    )]
    pub api_url: BaseUrl,

    /// Print the server's JSON answer as is (for scripts).
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Log in through the web app and store an API key for this machine.
    Login {
        /// Print the address to open instead of opening a browser.
        #[arg(long)]
        no_browser: bool,
    },
    /// Delete the stored API key.
    Logout,
    /// Show whom the API key belongs to.
    Whoami,
    /// Show the credit balance.
    Balance,
    /// Show the consumption log, newest first.
    Logs(LogsArgs),
    /// Send an email.
    Send(SendArgs),
    /// Show a send's progress.
    Status(StatusArgs),
    /// Manage sender domains.
    Domains {
        #[command(subcommand)]
        command: DomainsCommand,
    },
    /// Report workflow events.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
}

/// `logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Entries to show (the server's default is 50).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=100))]
    pub limit: Option<u16>,

    /// Print CSV with a header row instead of a table.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
}

/// `send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// A recipient's address (repeat for more).
    #[arg(long, required = true, value_name = "ADDR")]
    pub to: Vec<String>,

    /// The subject (a template has its own; this overrides it).
    #[arg(long, required_unless_present = "template", value_name = "S")]
    pub subject: Option<String>,

    #[command(flatten)]
    pub content: ContentArgs,

    /// The sender's address, on a verified sender domain.
    #[arg(long, value_name = "ADDR")]
    pub from: Option<String>,

    /// Price the send without sending or charging.
    #[arg(long)]
    pub dry_run: bool,
}

/// The body of a send: exactly one of these.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ContentArgs {
    /// The HTML body.
    #[arg(long, value_name = "H")]
    pub html: Option<String>,

    /// The plain-text body.
    #[arg(long, value_name = "T")]
    pub text: Option<String>,

    /// The key of a stored template.
    #[arg(long, value_name = "KEY")]
    pub template: Option<String>,
}

/// `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The task id `send` printed.
    #[arg(value_name = "TASK_ID")]
    pub task_id: TaskId,

    /// Wait until the send is finished, showing its progress.
    #[arg(long)]
    pub wait: bool,
}

/// `domains ...`.
#[derive(Debug, Subcommand)]
pub enum DomainsCommand {
    /// List the workspace's sender domains, verified or not, and the platform's.
    List,
    /// Submit a domain; prints the TXT record that proves ownership.
    Add {
        /// The domain name (example.com).
        domain: String,
    },
    /// Check a domain's ownership TXT record now.
    Verify {
        /// The domain's id, as `domains list` shows it.
        id: Uuid,
    },
}

/// `events ...`.
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Report one event.
    Send(EventArgs),
}

/// `events send`.
#[derive(Debug, Args)]
pub struct EventArgs {
    /// The event's name, matched against workflow triggers and exits.
    #[arg(long)]
    pub name: String,

    /// The contact's email address.
    #[arg(long, value_name = "E", required_unless_present = "external_id")]
    pub email: Option<String>,

    /// The contact's id in your own system.
    #[arg(long, value_name = "ID")]
    pub external_id: Option<String>,

    /// The event's id, its idempotency key (a new one when omitted; reuse it to retry).
    #[arg(long = "id", value_name = "EVENT_ID")]
    pub event_id: Option<String>,

    /// Event properties as a JSON object.
    #[arg(long, value_name = "JSON", value_parser = json_object)]
    pub properties: Option<Map<String, Value>>,
}

/// A JSON object given on the command line.
fn json_object(raw: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(raw) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("must be a JSON object, like {\"plan\":\"pro\"}".to_owned()),
        Err(e) => Err(format!("is not valid JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("postmesh").chain(args.iter().copied()))
    }

    fn send(args: &[&str]) -> Result<SendArgs, ErrorKind> {
        let base = [
            "send",
            "--to",
            "a@x.com",
            "--to",
            "b@x.com",
            "--subject",
            "Hi",
        ];
        let all: Vec<&str> = base.iter().chain(args).copied().collect();
        match parse(&all).map_err(|e| e.kind())?.command {
            Command::Send(send) => Ok(send),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn send_takes_exactly_one_of_html_text_and_template() {
        let html = send(&["--html", "<p>Hi</p>"]).unwrap();
        assert_eq!(html.to, ["a@x.com", "b@x.com"]);
        assert_eq!(html.content.html.as_deref(), Some("<p>Hi</p>"));
        assert_eq!((html.content.text, html.content.template), (None, None));
        assert_eq!(
            send(&["--text", "Hi"]).unwrap().content.text.as_deref(),
            Some("Hi")
        );
        assert_eq!(
            send(&["--template", "welcome"])
                .unwrap()
                .content
                .template
                .as_deref(),
            Some("welcome")
        );
        assert_eq!(send(&[]).unwrap_err(), ErrorKind::MissingRequiredArgument);
        assert_eq!(
            send(&["--html", "<p>", "--text", "t"]).unwrap_err(),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            send(&["--text", "t", "--template", "k"]).unwrap_err(),
            ErrorKind::ArgumentConflict
        );
    }

    #[test]
    fn send_needs_a_recipient_and_a_subject_unless_a_template_has_one() {
        let kind = |args: &[&str]| parse(args).map(|_| ()).map_err(|e| e.kind());
        assert_eq!(
            kind(&["send", "--subject", "s", "--text", "t"]),
            Err(ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            kind(&["send", "--to", "a@x.com", "--text", "t"]),
            Err(ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            kind(&["send", "--to", "a@x.com", "--template", "k"]),
            Ok(())
        );
        let from = parse(&[
            "--json",
            "send",
            "--to",
            "a@x.com",
            "--subject",
            "s",
            "--text",
            "t",
            "--from",
            "me@x.com",
            "--dry-run",
        ])
        .unwrap();
        assert!(from.json);
        let Command::Send(args) = from.command else {
            panic!("not a send")
        };
        assert_eq!(args.from.as_deref(), Some("me@x.com"));
        assert!(args.dry_run);
    }

    #[test]
    fn ids_urls_and_properties_are_parsed_at_the_edge() {
        assert_eq!(
            parse(&["status", "not-a-uuid"]).unwrap_err().kind(),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            parse(&["--api-url", "ftp://x", "balance"])
                .unwrap_err()
                .kind(),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            parse(&["events", "send", "--name", "n", "--properties", "[1]"])
                .unwrap_err()
                .kind(),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            parse(&["logs", "--limit", "0"]).unwrap_err().kind(),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            parse(&["logs", "--csv", "--json"]).unwrap_err().kind(),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            parse(&["events", "send", "--name", "signed_up"])
                .unwrap_err()
                .kind(),
            ErrorKind::MissingRequiredArgument,
            "an event names its contact"
        );
        let cli = parse(&[
            "events",
            "send",
            "--name",
            "signed_up",
            "--email",
            "ann@example.com",
            "--properties",
            r#"{"plan":"pro"}"#,
        ])
        .unwrap();
        let Command::Events {
            command: EventsCommand::Send(event),
        } = cli.command
        else {
            panic!("not an event")
        };
        assert_eq!(event.properties.unwrap()["plan"], "pro");
    }
}
