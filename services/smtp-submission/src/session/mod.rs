//! One SMTP connection: the greeting, `EHLO`, `STARTTLS`, `AUTH PLAIN`/`LOGIN`, the
//! envelope and `DATA`, read by smtp-proto. Replies to pipelined commands go out together
//! before the next read (RFC 2920); a message is sent only once its last line is in, so a
//! connection cut in the middle of one leaves nothing behind. The connection's limits:
//! `SMTP_IDLE_TIMEOUT_SECS` between reads, `SMTP_MAX_COMMANDS`, the message size, and a 421
//! when the service stops.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

mod address;
pub mod auth;
pub mod data;

use smtp_proto::request::receiver::RequestReceiver;
use smtp_proto::{Error as ProtoError, Request, MAIL_SMTPUTF8};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::api::LoginError;
use crate::limits::Full;
use crate::reply::{push, refuse, send, Reply};
use crate::Shared;

use address::address_of;
use auth::{AuthIn, Step};
use data::DataIn;

/// Bytes read at once.
const READ_CHUNK: usize = 64 * 1024;

/// How a part of a session ended.
enum Next<S> {
    /// The connection is done.
    Close,
    /// The client asked for TLS: the stream, to hand to the handshake.
    StartTls(S),
}

/// What a command leads to.
enum Then {
    Continue,
    Close,
    StartTls,
    Data,
    Auth(AuthIn),
}

/// A signed-in client's API key.
struct Login {
    key: String,
}

/// What is being read.
enum Mode {
    Commands,
    /// The rest of a command line too long to read (answered once), up to its line end.
    Skip,
    Auth(AuthIn),
    Data(DataIn),
}

/// A session's state.
struct Session {
    shared: Arc<Shared>,
    ip: IpAddr,
    tls: bool,
    /// Greeted with `EHLO` (extensions on) or `HELO`.
    greeted: Option<bool>,
    login: Option<Login>,
    /// `MAIL FROM`'s address, and whether it asked for SMTPUTF8.
    mail_from: Option<(String, bool)>,
    rcpt_to: Vec<String>,
    /// The last sender the API accepted, not asked again.
    sender_ok: Option<String>,
    commands: usize,
}

/// Serves one connection from `peer` (in TLS from the start when `implicit_tls`).
pub(crate) async fn run(
    shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr, implicit_tls: bool,
) {
    let ip = peer.ip();
    let _slot = match shared.connections.take(ip) {
        Ok(slot) => slot,
        Err(full) => {
            let reply = match full {
                Full::Client => Reply::new(421, "4.7.0", "too many connections from your address"),
                Full::Service => Reply::new(421, "4.3.2", "too many connections; try again later"),
            };
            refuse(stream, reply).await;
            return;
        }
    };
    if shared.logins.locked(ip).await {
        let reply = Reply::new(
            421,
            "4.7.0",
            "too many failed logins from your address; try again later",
        );
        refuse(stream, reply).await;
        return;
    }
    let _ = stream.set_nodelay(true);
    let mut session = Session {
        shared: shared.clone(),
        ip,
        tls: false,
        greeted: None,
        login: None,
        mail_from: None,
        rcpt_to: Vec::new(),
        sender_ok: None,
        commands: 0,
    };
    let idle = shared.config.idle_timeout;
    let Some(acceptor) = shared.tls.clone() else {
        session.serve(stream, true).await;
        return;
    };
    let stream = if implicit_tls {
        stream
    } else {
        match session.serve(stream, true).await {
            Next::Close => return,
            Next::StartTls(stream) => stream,
        }
    };
    match tokio::time::timeout(idle, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => {
            // RFC 3207 §4.2: after the handshake the client starts over, with EHLO, and
            // nothing said before counts, a login least of all (one slipped in by whoever
            // sat between the client and us before TLS).
            session.tls = true;
            session.greeted = None;
            session.login = None;
            session.sender_ok = None;
            session.reset();
            session.serve(tls, implicit_tls).await;
        }
        Ok(Err(e)) => tracing::debug!(error = %e, %peer, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}

impl Session {
    /// Forgets the mail transaction (`RSET`, a new `EHLO`, the end of a message).
    fn reset(&mut self) {
        self.mail_from = None;
        self.rcpt_to.clear();
    }

    /// Reads and answers commands on `stream` (greeting first when `greet`) until the
    /// connection ends or asks for TLS.
    async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self, mut stream: S, greet: bool,
    ) -> Next<S> {
        let shared = self.shared.clone();
        let config = &shared.config;
        let mut out = Vec::new();
        if greet {
            let text = format!("{} ESMTP Postmesh submission ready", config.hostname);
            out.extend_from_slice(format!("220 {text}\r\n").as_bytes());
        }
        let mut chunk = vec![0u8; READ_CHUNK];
        let mut commands = RequestReceiver::default();
        let mut mode = Mode::Commands;
        let mut closing = false;
        // A command (a line, an AUTH answer) must be whole within the idle time of the last
        // reply, however its bytes trickle in; a message's bytes only need to keep coming.
        let mut deadline = Instant::now() + config.idle_timeout;
        loop {
            if !out.is_empty() {
                if !send(&mut stream, &out, config.idle_timeout).await {
                    return Next::Close;
                }
                out.clear();
                deadline = Instant::now() + config.idle_timeout;
            }
            if closing {
                let _ = stream.shutdown().await;
                return Next::Close;
            }
            let in_message = matches!(mode, Mode::Data(_));
            let read = tokio::select! {
                _ = shared.shutdown.cancelled(), if !in_message => {
                    push(&mut out, &Reply::new(421, "4.3.2", "the service is shutting down; try again later"));
                    closing = true;
                    continue;
                }
                read = tokio::time::timeout_at(
                    if in_message { Instant::now() + config.idle_timeout } else { deadline },
                    stream.read(&mut chunk),
                ) => read,
            };
            let n = match read {
                Err(_) => {
                    push(
                        &mut out,
                        &Reply::new(421, "4.4.2", "idle for too long; closing"),
                    );
                    closing = true;
                    continue;
                }
                Ok(Ok(0)) | Ok(Err(_)) => return Next::Close,
                Ok(Ok(n)) => n,
            };
            let mut bytes = chunk[..n].iter();
            while !bytes.as_slice().is_empty() && !closing {
                match &mut mode {
                    Mode::Data(data) => {
                        if !data.ingest(&mut bytes) {
                            if data.hopeless() {
                                let reply =
                                    Reply::new(552, "5.3.4", "the message never ends; closing");
                                push(&mut out, &reply);
                                closing = true;
                            }
                            break;
                        }
                        let Mode::Data(data) = std::mem::replace(&mut mode, Mode::Commands) else {
                            unreachable!("in a message")
                        };
                        let reply = self.message(data).await;
                        push(&mut out, &reply);
                    }
                    Mode::Auth(_) => {
                        let Mode::Auth(auth) = std::mem::replace(&mut mode, Mode::Commands) else {
                            unreachable!("in an AUTH exchange")
                        };
                        match auth.ingest(&mut bytes) {
                            Err(auth) => {
                                mode = Mode::Auth(auth);
                                break;
                            }
                            Ok(step) => match self.auth_step(step, &mut out).await {
                                Then::Auth(auth) => mode = Mode::Auth(auth),
                                Then::Close => closing = true,
                                _ => {}
                            },
                        }
                    }
                    Mode::Skip => {
                        let rest = bytes.as_slice();
                        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
                            break;
                        };
                        bytes = rest[end + 1..].iter();
                        mode = Mode::Commands;
                    }
                    Mode::Commands => {
                        let request = match commands.ingest(&mut bytes) {
                            Ok(request) => Ok(request.into_owned()),
                            Err(ProtoError::NeedsMoreData { .. }) => break,
                            Err(e) => Err(e),
                        };
                        self.commands += 1;
                        if self.commands > config.max_commands {
                            push(
                                &mut out,
                                &Reply::new(421, "4.7.0", "too many commands on one connection"),
                            );
                            closing = true;
                            break;
                        }
                        let then = match request {
                            Ok(request) => self.command(request, &mut out).await,
                            Err(e) => {
                                if matches!(e, ProtoError::ResponseTooLong) {
                                    mode = Mode::Skip;
                                }
                                push(&mut out, &Reply::syntax(e));
                                Then::Continue
                            }
                        };
                        match then {
                            Then::Continue => {}
                            Then::Close => closing = true,
                            Then::Data => {
                                let memory = self.shared.memory.clone();
                                mode = Mode::Data(DataIn::new(config.max_message_bytes, memory));
                            }
                            Then::Auth(auth) => mode = Mode::Auth(auth),
                            Then::StartTls => {
                                // Anything the client sent after STARTTLS is dropped (RFC 3207).
                                let ready = Reply::new(220, "2.0.0", "ready to start TLS");
                                push(&mut out, &ready);
                                if !send(&mut stream, &out, config.idle_timeout).await {
                                    return Next::Close;
                                }
                                return Next::StartTls(stream);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Answers one command into `out`.
    async fn command(&mut self, request: Request<String>, out: &mut Vec<u8>) -> Then {
        let reply = match request {
            Request::Ehlo { host } => {
                self.reset();
                self.greeted = Some(true);
                out.extend_from_slice(self.extensions(&host).as_bytes());
                return Then::Continue;
            }
            Request::Helo { host } => {
                self.reset();
                self.greeted = Some(false);
                Reply::new(
                    250,
                    "2.0.0",
                    format!("{} greets {host}", self.shared.config.hostname),
                )
            }
            Request::StartTls => {
                if self.tls {
                    Reply::new(503, "5.5.1", "TLS is already active")
                } else if self.shared.tls.is_none() {
                    Reply::new(454, "4.7.0", "TLS is not available")
                } else {
                    return Then::StartTls;
                }
            }
            Request::Auth {
                mechanism,
                initial_response,
            } => {
                return self.auth(mechanism, initial_response, out).await;
            }
            Request::Mail { from } => match address::offered_mail(&from) {
                Ok(()) => self.mail(from.address, from.flags, from.size).await,
                Err(reply) => reply,
            },
            Request::Rcpt { to } => match address::offered_rcpt(&to) {
                Ok(()) => self.rcpt(to.address).await,
                Err(reply) => reply,
            },
            Request::Data => {
                if self.mail_from.is_none() {
                    Reply::new(503, "5.5.1", "MAIL FROM first")
                } else if self.rcpt_to.is_empty() {
                    Reply::new(554, "5.5.1", "no valid recipients")
                } else {
                    push(
                        out,
                        &Reply::new(354, "2.0.0", "start mail input; end with <CRLF>.<CRLF>"),
                    );
                    return Then::Data;
                }
            }
            Request::Rset => {
                self.reset();
                Reply::new(250, "2.0.0", "reset")
            }
            Request::Noop { .. } => Reply::new(250, "2.0.0", "ok"),
            Request::Quit => {
                push(out, &Reply::new(221, "2.0.0", "bye"));
                return Then::Close;
            }
            Request::Vrfy { .. } => Reply::new(252, "2.5.0", "cannot verify users; send and see"),
            other => Reply::new(502, "5.5.1", format!("{} is not implemented", other.name())),
        };
        push(out, &reply);
        if reply.closes() {
            Then::Close
        } else {
            Then::Continue
        }
    }

    /// The `EHLO` answer: the extensions this connection offers.
    fn extensions(&self, host: &str) -> String {
        let config = &self.shared.config;
        let mut lines = vec![
            format!("{} greets {host}", config.hostname),
            "PIPELINING".to_owned(),
            format!("SIZE {}", config.max_message_bytes),
            "8BITMIME".to_owned(),
            "SMTPUTF8".to_owned(),
            "ENHANCEDSTATUSCODES".to_owned(),
        ];
        if !self.tls && self.shared.tls.is_some() {
            lines.push("STARTTLS".to_owned());
        }
        if self.tls || config.allow_plaintext_auth {
            lines.push("AUTH PLAIN LOGIN".to_owned());
        }
        let last = lines.len() - 1;
        lines
            .iter()
            .enumerate()
            .map(|(i, line)| format!("250{}{line}\r\n", if i == last { ' ' } else { '-' }))
            .collect()
    }

    /// `AUTH`: PLAIN or LOGIN, with or without an initial response.
    async fn auth(&mut self, mechanism: u64, initial: String, out: &mut Vec<u8>) -> Then {
        let refusal = if self.greeted != Some(true) {
            Some(Reply::new(503, "5.5.1", "EHLO first"))
        } else if self.login.is_some() {
            Some(Reply::new(503, "5.5.1", "already signed in"))
        } else if self.mail_from.is_some() {
            Some(Reply::new(503, "5.5.1", "not within a mail transaction"))
        } else if !self.tls && !self.shared.config.allow_plaintext_auth {
            Some(Reply::new(
                530,
                "5.7.0",
                "must issue a STARTTLS command first",
            ))
        } else {
            None
        };
        if let Some(reply) = refusal {
            push(out, &reply);
            return Then::Continue;
        }
        self.auth_step(auth::start(mechanism, &initial), out).await
    }

    /// Where an `AUTH` exchange stands: a prompt, a refusal, or the credentials checked.
    async fn auth_step(&mut self, step: Step, out: &mut Vec<u8>) -> Then {
        let (username, key) = match step {
            Step::Prompt(auth, prompt) => {
                out.extend_from_slice(format!("334 {prompt}\r\n").as_bytes());
                return Then::Auth(auth);
            }
            Step::Refused { reply, failed } => {
                push(out, &reply);
                return if failed {
                    self.failed(out).await
                } else {
                    Then::Continue
                };
            }
            Step::Credentials { username, key } => (username, key),
        };
        match self.shared.api.login(self.ip, &username, &key).await {
            Ok(()) => {
                self.login = Some(Login { key });
                push(out, &Reply::new(235, "2.7.0", "authentication succeeded"));
                Then::Continue
            }
            Err(LoginError::Refused) => {
                push(
                    out,
                    &Reply::new(535, "5.7.8", "authentication credentials invalid"),
                );
                self.failed(out).await
            }
            Err(LoginError::Unavailable) => {
                let reply = Reply::new(
                    454,
                    "4.7.0",
                    "temporary authentication failure; try again later",
                );
                push(out, &reply);
                Then::Continue
            }
        }
    }

    /// Counts a failed login: past the limit, 421 and the connection ends.
    async fn failed(&mut self, out: &mut Vec<u8>) -> Then {
        metrics::counter!("postmesh_smtp_failed_logins_total").increment(1);
        if self.shared.logins.fail(self.ip).await {
            push(
                out,
                &Reply::new(
                    421,
                    "4.7.0",
                    "too many failed logins from your address; try again later",
                ),
            );
            return Then::Close;
        }
        Then::Continue
    }

    /// The key of the signed-in client, or why a transaction cannot start.
    fn key(&self) -> Result<String, Reply> {
        match (&self.greeted, &self.login) {
            (None, _) => Err(Reply::new(503, "5.5.1", "EHLO first")),
            (_, None) => Err(Reply::new(530, "5.7.0", "authentication required")),
            (_, Some(login)) => Ok(login.key.clone()),
        }
    }

    /// `MAIL FROM`: a sender the workspace may send from, a message within the size limit.
    async fn mail(&mut self, address: String, flags: u64, size: usize) -> Reply {
        let key = match self.key() {
            Ok(key) => key,
            Err(reply) => return reply,
        };
        if self.mail_from.is_some() {
            return Reply::new(503, "5.5.1", "sender already given");
        }
        let max = self.shared.config.max_message_bytes;
        if size > max {
            return Reply::new(
                552,
                "5.3.4",
                format!("the message is larger than the {max} bytes allowed"),
            );
        }
        let smtputf8 = flags & MAIL_SMTPUTF8 != 0;
        if let Err(reply) = address_of(&address, smtputf8, "5.1.7") {
            return reply;
        }
        if self.sender_ok.as_deref() != Some(address.as_str()) {
            if let Err(reply) = self.shared.api.check_sender(self.ip, &key, &address).await {
                return reply;
            }
            self.sender_ok = Some(address.clone());
        }
        self.mail_from = Some((address, smtputf8));
        Reply::new(250, "2.1.0", "sender ok")
    }

    /// `RCPT TO`: at most 1,000, none suppressed.
    async fn rcpt(&mut self, address: String) -> Reply {
        let Some((_, smtputf8)) = &self.mail_from else {
            return Reply::new(503, "5.5.1", "MAIL FROM first");
        };
        if self.rcpt_to.len() >= MAX_RECIPIENTS {
            return Reply::new(
                452,
                "4.5.3",
                format!("too many recipients: at most {MAX_RECIPIENTS} per message"),
            );
        }
        if let Err(reply) = address_of(&address, *smtputf8, "5.1.3") {
            return reply;
        }
        let key = match self.key() {
            Ok(key) => key,
            Err(reply) => return reply,
        };
        if let Err(reply) = self
            .shared
            .api
            .check_recipient(self.ip, &key, &address)
            .await
        {
            return reply;
        }
        self.rcpt_to.push(address);
        Reply::new(250, "2.1.5", "recipient ok")
    }

    /// The end of `DATA`: the message sent, once, or why not.
    async fn message(&mut self, data: DataIn) -> Reply {
        let (from, rcpt_to) = (self.mail_from.take(), std::mem::take(&mut self.rcpt_to));
        if let Some(reply) = data.refusal() {
            metrics::counter!("postmesh_smtp_messages_total", "outcome" => "refused").increment(1);
            return reply;
        }
        let (Some((from, _)), Ok(key)) = (from, self.key()) else {
            return Reply::new(503, "5.5.1", "no mail transaction");
        };
        match self
            .shared
            .api
            .send(self.ip, &key, &from, &rcpt_to, data.bytes())
            .await
        {
            Ok(answer) => {
                metrics::counter!("postmesh_smtp_messages_total", "outcome" => "sent").increment(1);
                let task = answer.task_id.map(|t| t.to_string()).unwrap_or_default();
                let refused = answer.recipients.rejected.len();
                let note = if refused == 0 {
                    String::new()
                } else {
                    let why: Vec<String> = answer
                        .recipients
                        .rejected
                        .iter()
                        .take(3)
                        .map(|r| format!("{} ({})", r.email, r.reason))
                        .collect();
                    format!("; {refused} recipient(s) left out: {}", why.join(", "))
                };
                Reply::new(250, "2.0.0", format!("queued as {task}{note}"))
            }
            Err(reply) => {
                metrics::counter!("postmesh_smtp_messages_total", "outcome" => "refused")
                    .increment(1);
                reply
            }
        }
    }
}

/// Envelope recipients of one message at most (as the API's).
const MAX_RECIPIENTS: usize = 1000;
