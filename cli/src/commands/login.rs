//! `login`: the device authorization of spec §3 — register a fresh device token, let the
//! person approve it in the web app, poll until the new API key comes, store it. `logout`
//! forgets the stored key.

use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use rand::RngCore;
use reqwest::StatusCode;
use serde::Serialize;
use tokio::time::Instant;

use postmesh_contracts::answers::gateway::{Initiated, PollAnswer, PollStatus};
use postmesh_contracts::routes::gateway;

use crate::api::{ApiError, Call, Client, Reply};
use crate::config::{Credentials, CredentialsStore};
use crate::{output, progress};

/// Random bytes in a device token (64 hex characters; the API takes 32-128).
const DEVICE_TOKEN_BYTES: usize = 32;
/// Seconds added to the poll interval each time the API says `slow_down` (RFC 8628 §3.5).
const SLOW_DOWN_STEP: Duration = Duration::from_secs(5);
/// Bounds on the poll interval the API may ask for.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
const MAX_INTERVAL: Duration = Duration::from_secs(60);
/// The longest a login waits for approval, whatever the API says.
const MAX_EXPIRY: Duration = Duration::from_secs(3600);

/// Characters of the host name sent as the device name at most (the API keeps 80).
const DEVICE_NAME_MAX: usize = 80;

/// `POST /cli/auth/init` and `/cli/auth/poll` bodies.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeviceBody<'a> {
    device_token: &'a str,
    /// This machine's name, for init only: the new key is named `CLI: <deviceName>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    device_name: Option<String>,
}

/// What `--json` prints after a login: never the key itself.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LoggedIn<'a> {
    success: bool,
    email: &'a str,
    credentials_file: String,
}

/// What `--json` prints after a logout.
#[derive(Serialize)]
struct LoggedOut {
    success: bool,
    removed: bool,
}

/// What one poll said.
#[derive(Debug, PartialEq, Eq)]
enum Poll {
    /// Not approved yet (202).
    Pending,
    /// Polling too fast (429): wait longer.
    SlowDown,
    /// The API could not answer now (5xx): try again at the next poll.
    Unavailable(String),
    /// Approved (200): the new key, handed over this once.
    Approved(Credentials),
}

/// The error for a request that is gone.
fn expired() -> anyhow::Error {
    anyhow!("the login request expired; run postmesh login again")
}

/// Reads a poll's answer.
fn read_poll(reply: Reply) -> anyhow::Result<Poll> {
    let answer: Option<PollAnswer> = serde_json::from_str(&reply.raw).ok();
    match reply.status {
        StatusCode::ACCEPTED => Ok(Poll::Pending),
        StatusCode::TOO_MANY_REQUESTS => Ok(Poll::SlowDown),
        StatusCode::GONE if answer.as_ref().map(|a| a.status) == Some(PollStatus::Denied) => {
            bail!("the login request was denied in the web app; run postmesh login again")
        }
        StatusCode::GONE => Err(expired()),
        status if status.is_server_error() => Ok(Poll::Unavailable(reply.error().to_string())),
        status if status.is_success() => match answer.map(|a| (a.api_key, a.email)) {
            Some((Some(api_key), Some(email))) if !api_key.is_empty() => {
                Ok(Poll::Approved(Credentials {
                    api_key,
                    email,
                    api_url: None,
                }))
            }
            _ => bail!("the API approved the login but sent no API key and email ({status})"),
        },
        _ => Err(reply.error().into()),
    }
}

/// A new random device token: 64 hex characters.
fn new_device_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; DEVICE_TOKEN_BYTES];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .context("cannot get random bytes for the device token")?;
    Ok(hex::encode(bytes))
}

/// This machine's host name, if it can be found (it only names the new key).
async fn host_name() -> Option<String> {
    let name = match tokio::fs::read_to_string("/proc/sys/kernel/hostname").await {
        Ok(name) => name,
        Err(_) => {
            let out = tokio::process::Command::new("hostname")
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .await
                .ok()?;
            String::from_utf8(out.stdout).ok()?
        }
    };
    let name: String = name.trim().chars().take(DEVICE_NAME_MAX).collect();
    (!name.is_empty() && !name.contains(char::is_control)).then_some(name)
}

/// `seconds` as a duration within `min..=max`.
fn seconds(seconds: u64, min: Duration, max: Duration) -> Duration {
    Duration::from_secs(seconds).clamp(min, max)
}

/// Opens `url` in the browser, if this system has an opener; a failure is ignored (the
/// address is printed anyway).
fn open_browser(url: &str) {
    // Only a web address goes to the opener, never something it could take as an option.
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return;
    }
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else if cfg!(target_os = "linux") {
        "xdg-open"
    } else {
        return;
    };
    let spawned = tokio::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Ok(mut child) = spawned {
        // Reaped in the background while the login polls.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
    }
}

/// `postmesh login`.
pub async fn login(
    client: &Client, store: &CredentialsStore, no_browser: bool, json: bool,
) -> anyhow::Result<()> {
    let token = new_device_token()?;
    let init = Call::to(gateway::CLI_AUTH_INIT).json(&DeviceBody {
        device_token: &token,
        device_name: host_name().await,
    })?;
    let started: Initiated = client.call(&init).await?.body;
    let deadline = Instant::now() + seconds(started.expires_in, Duration::ZERO, MAX_EXPIRY);
    let mut interval = seconds(started.interval, MIN_INTERVAL, MAX_INTERVAL);
    output::note(&format!(
        "Open {} and check the code {}",
        started.verification_url, started.user_code
    ));
    if !no_browser {
        open_browser(&started.verification_url);
    }
    let poll = Call::to(gateway::CLI_AUTH_POLL).json(&DeviceBody {
        device_token: &token,
        device_name: None,
    })?;
    let spinner = progress::spinner("Waiting for approval in the web app…");
    let credentials = loop {
        tokio::time::sleep(interval).await;
        if Instant::now() >= deadline {
            spinner.finish_and_clear();
            return Err(expired());
        }
        let polled = match client.exchange(&poll).await {
            Ok(reply) => read_poll(reply),
            // A dropped connection is retried: giving up could lose a key already minted.
            Err(e @ ApiError::Unreachable { .. }) => Ok(Poll::Unavailable(e.to_string())),
            Err(e) => Err(e.into()),
        };
        match polled {
            Ok(Poll::Pending) => {}
            Ok(Poll::SlowDown) => interval = (interval + SLOW_DOWN_STEP).min(MAX_INTERVAL),
            Ok(Poll::Unavailable(why)) => spinner.set_message(format!(
                "Waiting for approval ({}; retrying)…",
                output::one_line(&why)
            )),
            Ok(Poll::Approved(credentials)) => break credentials,
            Err(e) => {
                spinner.finish_and_clear();
                return Err(e);
            }
        }
    };
    spinner.finish_and_clear();
    let credentials = Credentials {
        api_url: Some(client.base_url().to_string()),
        ..credentials
    };
    store.save(&credentials)?;
    if json {
        let done = LoggedIn {
            success: true,
            email: &credentials.email,
            credentials_file: store.path().display().to_string(),
        };
        output::print(&serde_json::to_string(&done)?)
    } else {
        output::print(&format!("Logged in as {}", credentials.email))
    }
}

/// `postmesh logout`.
pub fn logout(store: &CredentialsStore, json: bool) -> anyhow::Result<()> {
    let removed = store.remove()?;
    if json {
        return output::print(&serde_json::to_string(&LoggedOut {
            success: true,
            removed,
        })?);
    }
    let path = store.path().display();
    output::print(&if removed {
        format!("Logged out: removed {path}")
    } else {
        format!("Not logged in: no credentials at {path}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str) -> Reply {
        Reply::new(
            StatusCode::from_u16(status).unwrap(),
            body.to_owned(),
            false,
        )
    }

    #[test]
    fn device_tokens_are_64_random_hex_characters() {
        let (a, b) = (new_device_token().unwrap(), new_device_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn poll_answers_are_read_as_the_spec_says() {
        assert_eq!(
            read_poll(reply(202, r#"{"success":true,"status":"pending"}"#)).unwrap(),
            Poll::Pending
        );
        assert_eq!(
            read_poll(reply(
                429,
                r#"{"success":false,"status":"slow_down","error":"slow"}"#
            ))
            .unwrap(),
            Poll::SlowDown
        );
        assert_eq!(
            read_poll(reply(
                200,
                r#"{"success":true,"status":"approved","apiKey":"pm_ab_cd","email":"ann@example.com"}"#
            ))
            .unwrap(),
            Poll::Approved(Credentials {
                api_key: "pm_ab_cd".into(),
                email: "ann@example.com".into(),
                api_url: None,
            })
        );
        let gone = read_poll(reply(410, r#"{"success":false,"status":"expired"}"#)).unwrap_err();
        assert_eq!(
            gone.to_string(),
            "the login request expired; run postmesh login again"
        );
        let denied = read_poll(reply(410, r#"{"success":false,"status":"denied"}"#)).unwrap_err();
        assert!(denied.to_string().contains("denied"), "{denied}");
        assert!(matches!(
            read_poll(reply(503, r#"{"success":false,"error":"store down"}"#)).unwrap(),
            Poll::Unavailable(why) if why == "503 Service Unavailable: store down"
        ));
        let bad = read_poll(reply(
            400,
            r#"{"success":false,"error":"deviceToken must be hex"}"#,
        ))
        .unwrap_err();
        assert_eq!(bad.to_string(), "400 Bad Request: deviceToken must be hex");
    }

    #[test]
    fn intervals_stay_in_bounds() {
        assert_eq!(
            seconds(5, MIN_INTERVAL, MAX_INTERVAL),
            Duration::from_secs(5)
        );
        assert_eq!(seconds(0, MIN_INTERVAL, MAX_INTERVAL), MIN_INTERVAL);
        assert_eq!(seconds(u64::MAX, MIN_INTERVAL, MAX_INTERVAL), MAX_INTERVAL);
        assert_eq!(
            seconds(600, Duration::ZERO, MAX_EXPIRY),
            Duration::from_secs(600)
        );
    }
}
