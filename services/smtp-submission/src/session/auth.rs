//! `AUTH PLAIN` and `AUTH LOGIN` (RFC 4954, 4616): the exchange up to the user name and
//! key; whether they go together is the API's to say.

use base64::Engine as _;
use smtp_proto::request::receiver::LineReceiver;
use smtp_proto::{AUTH_LOGIN, AUTH_PLAIN};

use crate::reply::Reply;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mechanism {
    Plain,
    Login,
}

/// An exchange waiting for the client's next line.
pub struct AuthIn {
    mechanism: Mechanism,
    /// `LOGIN`'s user name, once given.
    username: Option<String>,
    line: LineReceiver<()>,
}

/// Where an exchange stands after the client's response.
pub enum Step {
    /// Send this `334` prompt and read the next line.
    Prompt(AuthIn, &'static str),
    /// The user name and key, to check.
    Credentials { username: String, key: String },
    /// The exchange ends with this reply (a failure to count when `failed`).
    Refused { reply: Reply, failed: bool },
}

/// `334` prompts of `LOGIN`: "Username:" and "Password:" in base64.
const USERNAME: &str = "VXNlcm5hbWU6";
const PASSWORD: &str = "UGFzc3dvcmQ6";

/// Starts an exchange of `mechanism` with the command's `initial` response.
pub fn start(mechanism: u64, initial: &str) -> Step {
    let mechanism = match mechanism {
        AUTH_PLAIN => Mechanism::Plain,
        AUTH_LOGIN => Mechanism::Login,
        _ => {
            let reply = Reply::new(
                504,
                "5.5.4",
                "unrecognized authentication type; use PLAIN or LOGIN",
            );
            return Step::Refused {
                reply,
                failed: false,
            };
        }
    };
    let auth = AuthIn {
        mechanism,
        username: None,
        line: LineReceiver::new(()),
    };
    match initial {
        "" if mechanism == Mechanism::Login => Step::Prompt(auth, USERNAME),
        "" => Step::Prompt(auth, ""),
        // `=` is an empty initial response.
        "=" => auth.respond(b""),
        initial => auth.respond(initial.as_bytes()),
    }
}

impl AuthIn {
    /// Reads from `bytes`; the next step once a whole line is in.
    pub fn ingest(mut self, bytes: &mut std::slice::Iter<'_, u8>) -> Result<Step, Self> {
        if !self.line.ingest(bytes) {
            return Err(self);
        }
        let line = std::mem::take(&mut self.line.buf);
        if line == b"*" {
            let reply = Reply::new(501, "5.7.0", "authentication cancelled");
            return Ok(Step::Refused {
                reply,
                failed: false,
            });
        }
        Ok(self.respond(&line))
    }

    /// One base64 response: the next prompt, or the credentials.
    fn respond(mut self, response: &[u8]) -> Step {
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(response.trim_ascii())
        else {
            let reply = Reply::new(501, "5.5.2", "cannot decode the response");
            return Step::Refused {
                reply,
                failed: false,
            };
        };
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match self.mechanism {
            Mechanism::Login => match self.username.take() {
                None => {
                    self.username = Some(text(&decoded));
                    Step::Prompt(self, PASSWORD)
                }
                Some(username) => Step::Credentials {
                    username,
                    key: text(&decoded),
                },
            },
            Mechanism::Plain => {
                // authzid NUL authcid NUL password; an authzid, if any, must be the user.
                let parts: Vec<&[u8]> = decoded.splitn(4, |&b| b == 0).collect();
                match parts[..] {
                    [authz, user, key] if authz.is_empty() || authz == user => Step::Credentials {
                        username: text(user),
                        key: text(key),
                    },
                    [_, _, _] => Step::Refused {
                        reply: Reply::new(535, "5.7.8", "authentication credentials invalid"),
                        failed: true,
                    },
                    _ => Step::Refused {
                        reply: Reply::new(
                            501,
                            "5.5.2",
                            "PLAIN takes an authzid, a user and a password",
                        ),
                        failed: false,
                    },
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(text: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    fn credentials(step: Step) -> (String, String) {
        match step {
            Step::Credentials { username, key } => (username, key),
            _ => panic!("no credentials"),
        }
    }

    #[test]
    fn plain_gives_the_user_and_key_at_once_or_after_a_prompt() {
        let initial = b64(b"\0ann@example.com\0pm_key");
        let (user, key) = credentials(start(AUTH_PLAIN, &initial));
        assert_eq!((user.as_str(), key.as_str()), ("ann@example.com", "pm_key"));
        let Step::Prompt(auth, "") = start(AUTH_PLAIN, "") else {
            panic!("no prompt")
        };
        let line = format!("{}\r\n", b64(b"ann@example.com\0ann@example.com\0k"));
        let Ok(step) = auth.ingest(&mut line.as_bytes().iter()) else {
            panic!("no line")
        };
        assert_eq!(credentials(step).1, "k");
        let other = b64(b"bob@example.com\0ann@example.com\0k");
        assert!(matches!(
            start(AUTH_PLAIN, &other),
            Step::Refused { failed: true, .. }
        ));
        let short = b64(b"ann@example.com\0k");
        assert!(matches!(
            start(AUTH_PLAIN, &short),
            Step::Refused { failed: false, .. }
        ));
        assert!(matches!(
            start(AUTH_PLAIN, "%%%"),
            Step::Refused { failed: false, .. }
        ));
    }

    #[test]
    fn login_asks_for_the_user_then_the_key_and_can_be_cancelled() {
        let Step::Prompt(auth, USERNAME) = start(AUTH_LOGIN, "") else {
            panic!("no prompt")
        };
        let user = format!("{}\r\n", b64(b"ann@example.com"));
        let Ok(Step::Prompt(auth, PASSWORD)) = auth.ingest(&mut user.as_bytes().iter()) else {
            panic!("no password prompt")
        };
        // A line split over reads.
        let key = format!("{}\r\n", b64(b"pm_key"));
        let (head, tail) = key.as_bytes().split_at(3);
        let Err(auth) = auth.ingest(&mut head.iter()) else {
            panic!("a whole line")
        };
        let Ok(step) = auth.ingest(&mut tail.iter()) else {
            panic!("no line")
        };
        assert_eq!(
            credentials(step),
            ("ann@example.com".into(), "pm_key".into())
        );
        let Step::Prompt(auth, _) = start(AUTH_LOGIN, &b64(b"ann@example.com")) else {
            panic!("no prompt")
        };
        assert!(matches!(
            auth.ingest(&mut b"*\r\n".iter()),
            Ok(Step::Refused { .. })
        ));
        assert!(matches!(start(1 << 37, ""), Step::Refused { .. }));
    }
}
