//! Mail a test stack wrote to its file outbox, and what the API says of a send's recipients
//! and suppressions.

use std::time::{Duration, SystemTime};

use postmesh_contracts::answers::sender::{RecipientStatus, TaskProgress};
use postmesh_shared::{Success, TaskId};
use reqwest::StatusCode;
use sender::audience::suppressions::{Reason, SuppressionPage};
use sender::sending::send::SendAnswer;

use super::Stack;
use crate::wait::eventually;

impl Stack {
    /// `POST /send-email` of `body` with `key`, which must be accepted: its answer.
    pub async fn sent(&self, key: &str, body: &serde_json::Value) -> SendAnswer {
        let answer: Success<SendAnswer> = self
            .client(key)
            .post("/send-email", body, StatusCode::OK)
            .await;
        answer.body
    }

    /// Delivered messages addressed to `to` (compared without regard to case), oldest
    /// first.
    pub fn messages_to(&self, to: &str) -> Vec<String> {
        self.written_to(to)
            .into_iter()
            .map(|(_, text)| text)
            .collect()
    }

    /// Delivered messages addressed to `to`, each with the time its file was written, oldest
    /// first.
    pub fn written_to(&self, to: &str) -> Vec<(SystemTime, String)> {
        let to = to.to_lowercase();
        let addressed = |l: &str| l.starts_with("To:") && l.to_lowercase().contains(&to);
        let mut found = Vec::new();
        for entry in std::fs::read_dir(self.outbox())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "eml") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if text.lines().any(addressed) {
                    let written = entry.metadata().and_then(|m| m.modified());
                    found.push((written.expect("an outbox file's write time"), text));
                }
            }
        }
        found.sort_by_key(|(written, _)| *written);
        found
    }

    /// Delivered messages whose envelope went to `to` (the file transport's `X-Original-To`,
    /// which a blind copy has too), oldest first.
    pub fn delivered_to(&self, to: &str) -> Vec<String> {
        let line = format!("x-original-to: {}", to.to_lowercase());
        let mut found: Vec<(SystemTime, String)> = std::fs::read_dir(self.outbox())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "eml"))
            .filter_map(|e| {
                let text = std::fs::read_to_string(e.path()).ok()?;
                let first = text.lines().next()?.to_lowercase();
                let written = e.metadata().and_then(|m| m.modified()).ok()?;
                (first == line).then_some((written, text))
            })
            .collect();
        found.sort_by_key(|(written, _)| *written);
        found.into_iter().map(|(_, text)| text).collect()
    }

    /// Waits until `count` messages to `to` were delivered; returns them. Fails the test
    /// when fewer arrive within `timeout`.
    pub async fn wait_for_messages(
        &self, to: &str, count: usize, timeout: Duration,
    ) -> Vec<String> {
        eventually(timeout, || async move {
            let found = self.messages_to(to);
            if found.len() >= count {
                Ok(found)
            } else {
                Err(format!("{} of {count} emails to {to}", found.len()))
            }
        })
        .await
    }

    /// The code in the latest of `count` delivered code emails to `to`.
    pub async fn code_sent_to(&self, to: &str, count: usize) -> String {
        let messages = self
            .wait_for_messages(to, count, Duration::from_secs(30))
            .await;
        let codes: Vec<String> = messages.iter().filter_map(|m| extract_code(m)).collect();
        assert_eq!(
            codes.len(),
            messages.len(),
            "every code email carries a code"
        );
        codes.last().cloned().expect("a code")
    }

    /// The task's first recipient as `GET /email-status/{task}` shows it, once `done` holds
    /// for it.
    pub async fn first_recipient(
        &self, key: &str, task: TaskId, done: impl Fn(&RecipientStatus) -> bool,
    ) -> RecipientStatus {
        let done = &done;
        eventually(Duration::from_secs(20), || async move {
            let progress: Success<TaskProgress> = self
                .client(key)
                .get(&format!("/email-status/{task}"), StatusCode::OK)
                .await;
            let r = progress.body.recipients.into_iter().next().unwrap();
            if done(&r) {
                Ok(r)
            } else {
                Err(format!(
                    "{:?}",
                    r.events.iter().map(|e| e.kind).collect::<Vec<_>>()
                ))
            }
        })
        .await
    }

    /// The suppressions of `email` as `GET /suppressions` lists them: reason and topic.
    pub async fn suppressions(&self, key: &str, email: &str) -> Vec<(Reason, Option<String>)> {
        let page: Success<SuppressionPage> = self
            .client(key)
            .get(
                &format!(
                    "/suppressions?{}",
                    serde_urlencoded::to_string([("email", email)]).expect("a query")
                ),
                StatusCode::OK,
            )
            .await;
        page.body
            .suppressions
            .iter()
            .map(|s| (s.reason, s.topic.clone()))
            .collect()
    }
}

/// The 6-digit code in a delivered code email (verification or login).
pub fn extract_code(eml: &str) -> Option<String> {
    let at = eml.find(" code is ")? + " code is ".len();
    let code: String = eml[at..].chars().take(6).collect();
    (code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit())).then_some(code)
}

/// The HTML part of a delivered message.
pub fn html_part(eml: &str) -> String {
    mail_parser::MessageParser::default()
        .parse(eml.as_bytes())
        .and_then(|m| m.body_html(0).map(|h| h.into_owned()))
        .expect("an HTML part")
}

/// A client that does not follow redirects (to see a tracked link's 302).
pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}
