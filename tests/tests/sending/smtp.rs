//! The SMTP submission service against a running stack: real clients (Python's `smtplib`
//! over STARTTLS with AUTH LOGIN and PLAIN, `lettre` over implicit TLS) whose messages arrive
//! as they wrote them, a retried message sent and charged once, the sandbox over SMTP, and
//! each refusal's SMTP answer.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Attachment, Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use mail_parser::MimeHeaders as _;
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use postmesh_shared::TaskId;
use postmesh_tests::smtp::{plain, SmtpConn, SmtpReply, SmtpServer};
use postmesh_tests::{eventually, Stack};

use super::wait_status;
use sender::sending::events::Kind;
use sender::sending::status::TaskProgress;

/// What the Python client sends: over STARTTLS, signed in with LOGIN (prompted) on one
/// connection and PLAIN on another, to a UTF-8 address (so smtplib uses SMTPUTF8 and writes
/// its headers in UTF-8), a message with an 8-bit body and a binary attachment.
const PYTHON_CLIENT: &str = r#"
import os, smtplib, ssl, sys
from email.message import EmailMessage

def message(n):
    msg = EmailMessage()
    msg["From"] = "Änne Süß <" + os.environ["FROM"] + ">"
    msg["To"] = os.environ["TO"]
    msg["Subject"] = "Grüße über SMTP " + str(n)
    msg["Message-ID"] = "<python-%d-%s>" % (n, os.environ["FROM"])
    msg.set_content("Hällo, ein 8-bit Text.\n", cte="8bit")
    msg.add_attachment(bytes(range(256)) * 40, maintype="application",
                       subtype="octet-stream", filename="blob.bin")
    return msg

ctx = ssl.create_default_context(cafile=os.environ["CERT"])
ctx.check_hostname = False
ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
for n, how in enumerate(["LOGIN", "PLAIN"]):
    with smtplib.SMTP("127.0.0.1", int(os.environ["PORT"]), timeout=30) as s:
        s.ehlo()
        s.starttls(context=ctx)
        s.ehlo()
        if how == "LOGIN":
            s.user, s.password = os.environ["USER"], os.environ["KEY"]
            s.auth("LOGIN", s.auth_login, initial_response_ok=False)
        else:
            s.login(os.environ["USER"], os.environ["KEY"])
        refused = s.send_message(message(n))
        assert not refused, refused
        code, text = s.noop()
        print(how, code)
"#;

fn at(local: &str) -> String {
    format!("{local}@example.com")
}

/// The task named in a `250 … queued as <task>` reply.
fn task_of(reply: &SmtpReply) -> TaskId {
    assert_eq!(reply.0, 250, "{reply:?}");
    let id = reply
        .1
        .split("queued as ")
        .nth(1)
        .expect("a task in the reply");
    TaskId::parse(id.split(';').next().unwrap_or_default().trim()).expect("a task id")
}

/// A fresh account with `credits`: its key and its email (the SMTP user name).
pub(crate) async fn account(stack: &Stack, credits: i64) -> (String, String) {
    let key = stack.key(credits).await;
    let user = stack.account_email(&key).await;
    (key, user)
}

/// The kinds of events of each recipient of `p`, `queued` left out.
pub(crate) fn kinds(p: &TaskProgress) -> Vec<(String, Vec<Kind>)> {
    p.recipients
        .iter()
        .map(|r| {
            let kinds = r
                .events
                .iter()
                .map(|e| e.kind)
                .filter(|k| *k != Kind::Queued);
            (r.email.clone(), kinds.collect())
        })
        .collect()
}

/// lettre over `smtp`'s implicit-TLS listener, signed in as `user` with `key` (PLAIN).
fn lettre_over_tls(smtp: &SmtpServer, user: &str, key: &str) -> AsyncSmtpTransport<Tokio1Executor> {
    let pem = std::fs::read(&smtp.cert).expect("the certificate");
    let tls = TlsParameters::builder("localhost".into())
        .add_root_certificate(Certificate::from_pem(&pem).expect("a PEM certificate"))
        .build_rustls()
        .expect("TLS parameters");
    AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
        .port(smtp.tls_addr.port())
        .tls(Tls::Wrapper(tls))
        .credentials(Credentials::new(user.to_owned(), key.to_owned()))
        .authentication(vec![Mechanism::Plain])
        .build()
}

/// Waits for `count` messages whose envelope went to `to`; returns them.
async fn delivered(stack: &Stack, to: &str, count: usize) -> Vec<String> {
    eventually(Duration::from_secs(30), || async {
        let found = stack.delivered_to(to);
        if found.len() >= count {
            Ok(found)
        } else {
            Err(format!("{} of {count} messages to {to}", found.len()))
        }
    })
    .await
}

/// MAIL, RCPT (each accepted) and DATA with `message`; the final reply.
async fn transaction(conn: &mut SmtpConn, from: &str, to: &[&str], message: &str) -> SmtpReply {
    conn.expect(&format!("MAIL FROM:<{from}>"), 250).await;
    for to in to {
        let reply = conn.send(&format!("RCPT TO:<{to}>")).await;
        assert_eq!(reply.0, 250, "{to}: {reply:?}");
    }
    conn.expect("DATA", 354).await;
    conn.write(message.replace('\n', "\r\n").as_bytes()).await;
    conn.send(".").await
}

/// Python's smtplib over STARTTLS, signed in with AUTH LOGIN and with AUTH PLAIN: each
/// message arrives with its UTF-8 headers, its 8-bit body and its attachment's bytes as the
/// client wrote them, and is charged per recipient.
pub(crate) async fn python_smtplib_sends_with_starttls_login_and_plain(stack: &Stack) {
    let smtp = SmtpServer::start(stack, |_| {}).await;

    let (key, user) = account(stack, 10).await;
    let (from, to) = ("python@postmesh.localhost", at("jörg-python"));
    let out = tokio::process::Command::new("python3")
        .args(["-c", PYTHON_CLIENT])
        .env("PORT", smtp.addr.port().to_string())
        .env("CERT", &smtp.cert)
        .env("USER", &user)
        .env("KEY", &key)
        .env("FROM", from)
        .env("TO", &to)
        .output()
        .await
        .expect("python3 runs");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "smtplib failed: {printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(printed.trim(), "LOGIN 250\nPLAIN 250");
    let delivered = delivered(stack, &to, 2).await;
    let blob: Vec<u8> = (0..=255u8).cycle().take(256 * 40).collect();
    for eml in &delivered {
        let parsed = mail_parser::MessageParser::default()
            .parse(eml.as_bytes())
            .expect("a message");
        assert!(
            eml.contains("From: Änne Süß <python@postmesh.localhost>"),
            "{eml}"
        );
        assert!(parsed
            .subject()
            .unwrap_or_default()
            .starts_with("Grüße über SMTP"));
        assert!(
            eml.contains("Hällo, ein 8-bit Text."),
            "the 8-bit body as written"
        );
        let attachment = parsed.attachment(0).expect("the attachment");
        assert_eq!(attachment.contents(), blob.as_slice());
        assert_eq!(parsed.attachment_count(), 1);
    }
    assert_eq!(stack.settled_balance(&key).await, 8, "a credit a message");
    smtp.stop().await;
}

/// lettre over implicit TLS with AUTH PLAIN: a marketing message with a topic and a blind
/// copy. Each envelope recipient gets the message as written, with the one-click unsubscribe
/// fields; the Bcc and `X-Postmesh-*` fields reach nobody; three recipients cost three.
pub(crate) async fn lettre_sends_over_implicit_tls_and_a_blind_copy_stays_blind(stack: &Stack) {
    let smtp = SmtpServer::start(stack, |_| {}).await;

    let (key, user) = account(stack, 10).await;
    let transport = lettre_over_tls(&smtp, &user, &key);
    let (to, cc, bcc) = (at("lettre-to"), at("lettre-cc"), at("lettre-bcc"));
    let message = Message::builder()
        .from("News <news@postmesh.localhost>".parse::<Mailbox>().unwrap())
        .to(to.parse().unwrap())
        .cc(cc.parse().unwrap())
        .bcc(bcc.parse().unwrap())
        .subject("Our news")
        .raw_header(lettre::message::header::HeaderValue::new(
            lettre::message::header::HeaderName::new_from_ascii_str("X-Postmesh-Email-Type"),
            "marketing".into(),
        ))
        .raw_header(lettre::message::header::HeaderValue::new(
            lettre::message::header::HeaderName::new_from_ascii_str("X-Postmesh-Topic"),
            "news".into(),
        ))
        .multipart(
            MultiPart::mixed()
                .multipart(MultiPart::alternative_plain_html(
                    "plain news".to_owned(),
                    "<p>html news</p>".to_owned(),
                ))
                .singlepart(
                    Attachment::new("notes.txt".into())
                        .body(b"attached".to_vec(), ContentType::TEXT_PLAIN),
                ),
        )
        .expect("a message");
    let answer = transport.send(message).await.expect("lettre sends");
    let text = answer.message().collect::<Vec<_>>().join(" ");
    assert!(text.contains("queued as"), "{text}");
    for address in [&to, &cc, &bcc] {
        let delivered = delivered(stack, address, 1).await.remove(0);
        // What the recipient sees: the message after the file transport's envelope line.
        let seen = delivered.split_once('\n').map_or("", |(_, m)| m);
        assert!(
            !seen.contains("lettre-bcc"),
            "the blind copy shows: {delivered}"
        );
        assert!(!delivered.contains("X-Postmesh"), "{delivered}");
        assert!(delivered.contains("List-Unsubscribe-Post: List-Unsubscribe=One-Click"));
        assert!(delivered.contains("plain news") && delivered.contains("<p>html news</p>"));
        assert!(delivered.contains("filename=\"notes.txt\""), "{delivered}");
    }
    assert_eq!(stack.settled_balance(&key).await, 7, "three credits");
    smtp.stop().await;
}

/// A client that lost the `250` and sends the same message again (same Message-ID) gets the
/// same task; nothing is sent or charged twice. A message without a Message-ID gets one on
/// its sender's domain. A connection cut within DATA sends nothing.
pub(crate) async fn a_retried_message_is_sent_and_charged_once(stack: &Stack) {
    let smtp = SmtpServer::start(stack, |c| c.allow_plaintext_auth = true).await;

    let (key, user) = account(stack, 10).await;
    let (a, b, hidden) = (at("retry-a"), at("retry-b"), at("retry-hidden"));
    // A client that writes its blind copy into the header (as some do).
    let message = format!(
        "From: retry@postmesh.localhost\nTo: {a}, {b}\nBcc: {hidden}\nSubject: once\n\
         Message-ID: <retry-1@client.test>\nX-Postmesh-Tags: source=smtp, kind=retry\n\
         X-Postmesh-Metadata: {{\"order\": \"7\"}}\n\nonly once\n"
    );
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let mut conn = smtp.connect().await;
        conn.login(&user, &key).await;
        let to = [a.as_str(), b.as_str(), hidden.as_str()];
        let reply = transaction(&mut conn, "retry@postmesh.localhost", &to, &message).await;
        tasks.push(task_of(&reply));
    }
    assert_eq!(tasks[0], tasks[1], "the retry answers the first task");
    let progress = wait_status(stack, &key, tasks[0], |p| p.queued == 0).await;
    assert_eq!((progress.total, progress.sent), (3, 3));
    // The tags and metadata fields are the send's, and no recipient sees them.
    let tags: Vec<(&str, &str)> = progress
        .tags
        .iter()
        .map(|t| (t.name.as_str(), t.value.as_str()))
        .collect();
    assert_eq!(tags, [("source", "smtp"), ("kind", "retry")]);
    assert_eq!(progress.metadata["order"], "7");
    for to in [&a, &b, &hidden] {
        let delivered = stack.delivered_to(to);
        assert_eq!(delivered.len(), 1, "{to}");
        assert!(!delivered[0].contains("Bcc:"), "{}", delivered[0]);
        assert!(!delivered[0].contains("X-Postmesh"), "{}", delivered[0]);
    }
    assert_eq!(stack.settled_balance(&key).await, 7);
    // Without a Message-ID: one on the From domain; the same text again is another message.
    let (c, plain_text) = (
        at("retry-c"),
        "From: me@postmesh.localhost\nSubject: x\n\nhi\n",
    );
    let mut conn = smtp.connect().await;
    conn.login(&user, &key).await;
    let first = task_of(&transaction(&mut conn, "me@postmesh.localhost", &[&c], plain_text).await);
    let second = task_of(&transaction(&mut conn, "me@postmesh.localhost", &[&c], plain_text).await);
    assert_ne!(first, second);
    let delivered = delivered(stack, &c, 2).await;
    assert!(
        delivered[0].contains("@postmesh.localhost>"),
        "{}",
        delivered[0]
    );
    // Cut within DATA: nothing stored, nothing charged.
    let mut cut = smtp.connect().await;
    cut.login(&user, &key).await;
    cut.expect("MAIL FROM:<me@postmesh.localhost>", 250).await;
    cut.expect(&format!("RCPT TO:<{}>", at("retry-cut")), 250)
        .await;
    cut.expect("DATA", 354).await;
    cut.write(b"From: me@postmesh.localhost\r\nSubject: cut\r\n\r\nhalf a mess")
        .await;
    drop(cut);
    conn.expect("NOOP", 250).await;
    assert_eq!(stack.settled_balance(&key).await, 5);
    assert!(stack.delivered_to(&at("retry-cut")).is_empty());
    smtp.stop().await;
}

/// Sandbox addresses over SMTP behave as over the API and cost nothing; `suppressed@` is
/// refused at RCPT TO and an unknown one names the valid ones.
pub(crate) async fn sandbox_addresses_work_over_smtp(stack: &Stack) {
    let smtp = SmtpServer::start(stack, |c| c.allow_plaintext_auth = true).await;

    let (key, user) = account(stack, 1).await;
    let mut conn = smtp.connect().await;
    conn.login(&user, &key).await;
    conn.expect("MAIL FROM:<s@postmesh.localhost>", 250).await;
    let suppressed = conn
        .send("RCPT TO:<suppressed@sandbox.postmesh.test>")
        .await;
    assert_eq!(suppressed.0, 550, "{suppressed:?}");
    assert!(suppressed.1.starts_with("5.7.1") && suppressed.1.contains("suppressed:sandbox"));
    let unknown = conn.send("RCPT TO:<nobody@sandbox.postmesh.test>").await;
    assert_eq!(unknown.0, 550, "{unknown:?}");
    assert!(
        unknown.1.contains("delivered"),
        "names the valid ones: {unknown:?}"
    );
    conn.expect("RSET", 250).await;
    let (delivered, bounced) = (
        "delivered@sandbox.postmesh.test",
        "bounced+smtp@sandbox.postmesh.test",
    );
    let message = "From: s@postmesh.localhost\nSubject: sandbox\n\nhi\n";
    let reply = transaction(
        &mut conn,
        "s@postmesh.localhost",
        &[delivered, bounced],
        message,
    )
    .await;
    let task = task_of(&reply);
    let want = vec![
        (delivered.to_owned(), vec![Kind::Sent, Kind::Delivered]),
        (bounced.to_owned(), vec![Kind::Sent, Kind::Bounced]),
    ];
    wait_status(stack, &key, task, |p| kinds(p) == want).await;
    assert_eq!(stack.settled_balance(&key).await, 1, "the sandbox is free");
    smtp.stop().await;
}

/// Each refusal has its SMTP answer: AUTH before TLS, a wrong key, MAIL before AUTH, a
/// sender or From: the workspace may not use, a declared or actual size over the limit, a
/// suppressed recipient, the 1,001st recipient, too little credit.
pub(crate) async fn each_refusal_has_its_smtp_answer(stack: &Stack) {
    let strict = SmtpServer::start(stack, |_| {}).await;
    let open = SmtpServer::start(stack, |c| {
        c.allow_plaintext_auth = true;
        c.max_message_bytes = 64 * 1024;
    })
    .await;

    let (key, user) = account(stack, 5).await;
    // Before STARTTLS: offered, and AUTH is not.
    let mut conn = strict.connect().await;
    let ehlo = conn.send("EHLO client.test").await;
    assert!(
        ehlo.1.contains("STARTTLS") && !ehlo.1.contains("AUTH"),
        "{ehlo:?}"
    );
    for extension in [
        "PIPELINING",
        "SIZE 26214400",
        "8BITMIME",
        "SMTPUTF8",
        "ENHANCEDSTATUSCODES",
    ] {
        assert!(
            ehlo.1.lines().any(|l| l == extension),
            "{extension}: {ehlo:?}"
        );
    }
    let early = conn
        .send(&format!("AUTH PLAIN {}", plain(&user, &key)))
        .await;
    assert_eq!((early.0, &early.1[..5]), (530, "5.7.0"), "{early:?}");
    let mut conn = open.connect().await;
    conn.expect("EHLO client.test", 250).await;
    conn.expect("MAIL FROM:<a@postmesh.localhost>", 530).await;
    let wrong = conn
        .send(&format!("AUTH PLAIN {}", plain(&user, "pm_wrong")))
        .await;
    assert_eq!((wrong.0, &wrong.1[..5]), (535, "5.7.8"), "{wrong:?}");
    let other = conn
        .send(&format!("AUTH PLAIN {}", plain("someone@else.test", &key)))
        .await;
    assert_eq!(other.0, 535, "another account's email: {other:?}");
    let ok = conn
        .send(&format!("AUTH PLAIN {}", plain(&user, &key)))
        .await;
    assert_eq!(ok.0, 235, "{ok:?}");
    // RFC 3207 §4.2: what was said before STARTTLS is forgotten, a login among it (one an
    // attacker in the middle could slip in before the client's STARTTLS).
    let mut before = open.connect().await;
    before.login(&user, &key).await;
    let mut tls = before.starttls(&open.cert).await;
    tls.expect("EHLO client.test", 250).await;
    tls.expect("MAIL FROM:<a@postmesh.localhost>", 530).await;
    // Hostile: a 100 KB line is answered once and dropped to its end; bytes that are no
    // command are refused; the session goes on.
    conn.write(&[b'A'; 100_000]).await;
    conn.write(b"\r\n\x00\xff\xfe garbage\r\n").await;
    let long = conn.reply().await;
    assert_eq!((long.0, &long.1[..5]), (500, "5.5.2"), "{long:?}");
    assert_eq!(conn.reply().await.0, 500);
    conn.expect("NOOP", 250).await;
    // Parameters of extensions not offered are refused, never taken silently (RFC 5321
    // §4.1.1.11); those of the ones offered are taken.
    for param in [
        "REQUIRETLS",
        "BODY=BINARYMIME",
        "RET=HDRS",
        "ENVID=e1",
        "HOLDFOR=600",
        "BY=120;R",
        "MT-PRIORITY=3",
    ] {
        let refused = conn
            .send(&format!("MAIL FROM:<a@postmesh.localhost> {param}"))
            .await;
        assert_eq!(
            (refused.0, &refused.1[..5]),
            (555, "5.5.4"),
            "{param}: {refused:?}"
        );
    }
    let offered = "MAIL FROM:<a@postmesh.localhost> BODY=8BITMIME SMTPUTF8 SIZE=100 AUTH=<>";
    conn.expect(offered, 250).await;
    for param in ["NOTIFY=NEVER", "ORCPT=rfc822;x@example.com"] {
        let refused = conn.send(&format!("RCPT TO:<x@example.com> {param}")).await;
        assert_eq!(
            (refused.0, &refused.1[..5]),
            (555, "5.5.4"),
            "{param}: {refused:?}"
        );
    }
    conn.expect("RSET", 250).await;
    let foreign = conn.send("MAIL FROM:<me@elsewhere.example>").await;
    assert_eq!((foreign.0, &foreign.1[..5]), (550, "5.7.1"), "{foreign:?}");
    let big = conn
        .send("MAIL FROM:<a@postmesh.localhost> SIZE=1000000")
        .await;
    assert_eq!((big.0, &big.1[..5]), (552, "5.3.4"), "{big:?}");
    // A suppressed recipient, with its reason.
    let gone = at("refusal-gone");
    let _: serde_json::Value = stack
        .client(&key)
        .post("/suppressions", &json!({ "email": gone }), StatusCode::OK)
        .await;
    conn.expect("MAIL FROM:<a@postmesh.localhost>", 250).await;
    let refused = conn.send(&format!("RCPT TO:<{gone}>")).await;
    assert_eq!((refused.0, &refused.1[..5]), (550, "5.7.1"), "{refused:?}");
    assert!(refused.1.contains("suppressed"), "{refused:?}");
    // From: another address than MAIL FROM, one the workspace may not use.
    conn.expect(&format!("RCPT TO:<{}>", at("refusal-to")), 250)
        .await;
    conn.expect("DATA", 354).await;
    conn.write(b"From: me@elsewhere.example\r\nSubject: x\r\n\r\nhi\r\n")
        .await;
    let from = conn.send(".").await;
    assert_eq!((from.0, &from.1[..5]), (550, "5.7.1"), "{from:?}");
    // Larger than the limit, undeclared: read to its end, then refused.
    conn.expect("MAIL FROM:<a@postmesh.localhost>", 250).await;
    conn.expect(&format!("RCPT TO:<{}>", at("refusal-to")), 250)
        .await;
    conn.expect("DATA", 354).await;
    conn.write(b"From: a@postmesh.localhost\r\n\r\n").await;
    conn.write(
        &"x".repeat(100)
            .repeat(1000)
            .replace("xxxxxxxxxx", "xxxxxxxx\r\n")
            .into_bytes(),
    )
    .await;
    let large = conn.send(".").await;
    assert_eq!((large.0, &large.1[..5]), (552, "5.3.4"), "{large:?}");
    // A message that never ends: past twice the limit the connection is ended.
    let mut endless = open.connect().await;
    endless.login(&user, &key).await;
    endless
        .expect("MAIL FROM:<a@postmesh.localhost>", 250)
        .await;
    endless
        .expect(&format!("RCPT TO:<{}>", at("refusal-to")), 250)
        .await;
    endless.expect("DATA", 354).await;
    // 150,000 bytes in lines of 100, the limit 64 KiB.
    let lines = format!("{}\r\n", "x".repeat(98)).repeat(1500);
    endless.write(lines.as_bytes()).await;
    assert!(
        endless.ended().await,
        "still reading a message that never ends"
    );
    // The 1,001st recipient.
    conn.expect("MAIL FROM:<a@postmesh.localhost>", 250).await;
    let rcpts: String = (0..1001)
        .map(|i| format!("RCPT TO:<many{i}@example.com>\r\n"))
        .collect();
    conn.write(rcpts.as_bytes()).await;
    for i in 0..1000 {
        assert_eq!(conn.reply().await.0, 250, "recipient {i}");
    }
    let over = conn.reply().await;
    assert_eq!((over.0, &over.1[..5]), (452, "4.5.3"), "{over:?}");
    conn.expect("RSET", 250).await;
    // Too little credit: 6 recipients, 5 credits.
    conn.expect("MAIL FROM:<a@postmesh.localhost>", 250).await;
    for i in 0..6 {
        assert_eq!(
            conn.send(&format!("RCPT TO:<{}>", at(&format!("poor{i}"))))
                .await
                .0,
            250
        );
    }
    conn.expect("DATA", 354).await;
    conn.write(b"From: a@postmesh.localhost\r\nSubject: x\r\n\r\nhi\r\n")
        .await;
    let poor = conn.send(".").await;
    assert_eq!((poor.0, &poor.1[..5]), (452, "4.2.1"), "{poor:?}");
    assert!(poor.1.contains("credit"), "{poor:?}");
    assert_eq!(stack.settled_balance(&key).await, 5, "nothing was charged");
    strict.stop().await;
    open.stop().await;
}

/// A client that misbehaves is cut off: past the connections one address may hold, when
/// idle, past the command cap, and after ten failed logins, until the window passes.
pub(crate) async fn a_client_that_misbehaves_is_cut_off(stack: &Stack) {
    let guarded = SmtpServer::start(stack, |c| {
        c.allow_plaintext_auth = true;
        c.max_connections_per_ip = 3;
        c.idle_timeout = Duration::from_secs(1);
        c.max_commands = 20;
        // Its failed logins lock 127.0.0.1 out of it alone.
        c.common.namespace =
            postmesh_shared::Namespace::parse(&format!("{}g", c.common.namespace.as_str()))
                .expect("a namespace");
    })
    .await;

    let (_, user) = account(stack, 0).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(guarded.connect().await);
    }
    let (mut fourth, greeting) = SmtpConn::connect(guarded.addr).await;
    assert_eq!(
        (greeting.0, &greeting.1[..5]),
        (421, "4.7.0"),
        "{greeting:?}"
    );
    assert!(fourth.closed().await);
    drop(held);
    // Idle past the timeout.
    let mut idle = guarded.connect().await;
    let idled = idle.reply().await;
    assert_eq!((idled.0, &idled.1[..5]), (421, "4.4.2"), "{idled:?}");
    assert!(idle.closed().await);
    // Past the command cap (20).
    let mut chatty = guarded.connect().await;
    chatty.write("NOOP\r\n".repeat(25).as_bytes()).await;
    for _ in 0..20 {
        assert_eq!(chatty.reply().await.0, 250);
    }
    let capped = chatty.reply().await;
    assert_eq!((capped.0, &capped.1[..5]), (421, "4.7.0"), "{capped:?}");
    assert!(capped.1.contains("too many commands"), "{capped:?}");
    assert!(chatty.closed().await);
    // Ten failed logins: the tenth is answered 421 and the address is locked out.
    let mut conn = guarded.connect().await;
    conn.expect("EHLO client.test", 250).await;
    for i in 1..10 {
        let reply = conn
            .send(&format!("AUTH PLAIN {}", plain(&user, "pm_wrong")))
            .await;
        assert_eq!(reply.0, 535, "failure {i}: {reply:?}");
        if i % 4 == 0 {
            conn = guarded.connect().await;
            conn.expect("EHLO client.test", 250).await;
        }
    }
    let tenth = conn
        .send(&format!("AUTH PLAIN {}", plain(&user, "pm_wrong")))
        .await;
    assert_eq!(tenth.0, 535);
    let locked_out = conn.reply().await;
    assert_eq!(
        (locked_out.0, &locked_out.1[..5]),
        (421, "4.7.0"),
        "{locked_out:?}"
    );
    assert!(locked_out.1.contains("failed logins"), "{locked_out:?}");
    assert!(conn.closed().await);
    let (mut locked, greeting) = SmtpConn::connect(guarded.addr).await;
    assert_eq!(greeting.0, 421, "{greeting:?}");
    assert!(locked.closed().await);
    guarded.stop().await;
    slow_clients_are_cut_off(stack).await;
    each_client_fails_its_logins_alone_at_the_gateway(stack).await;
}

/// The gateway counts failed authentications per SMTP client, not per SMTP service: one
/// client's wrong keys leave another's login alone.
async fn each_client_fails_its_logins_alone_at_the_gateway(stack: &Stack) {
    let (gateway, base) = stack
        .another_gateway(|c| {
            c.auth_failures_per_ip_per_minute = 5;
            c.trust_forwarded_for = true;
        })
        .await;
    let second = postmesh_shared::db::now_unix() % 60;
    if second > 50 {
        tokio::time::sleep(Duration::from_secs(61 - second as u64)).await;
    }
    let smtp = SmtpServer::start(stack, |c| {
        c.allow_plaintext_auth = true;
        c.api_url = base;
        c.auth_failures = 100;
    })
    .await;
    let (key, user) = account(stack, 0).await;
    let (mut guesser, _) = SmtpConn::connect_from(smtp.addr, [127, 0, 0, 2].into()).await;
    guesser.expect("EHLO guesser.test", 250).await;
    for _ in 0..6 {
        let reply = guesser
            .send(&format!("AUTH PLAIN {}", plain(&user, "pm_wrong")))
            .await;
        assert!([535, 454].contains(&reply.0), "{reply:?}");
    }
    let (mut other, _) = SmtpConn::connect_from(smtp.addr, [127, 0, 0, 3].into()).await;
    other.login(&user, &key).await;
    // A key no key could be is refused for good, not "try again later".
    let (mut odd, _) = SmtpConn::connect_from(smtp.addr, [127, 0, 0, 4].into()).await;
    odd.expect("EHLO odd.test", 250).await;
    let reply = odd
        .send(&format!("AUTH PLAIN {}", plain(&user, "pm_\u{1}x")))
        .await;
    assert_eq!(reply.0, 535, "{reply:?}");
    smtp.stop().await;
    gateway.stop().await;
}

/// A client that trickles a command a byte at a time is cut off as an idle one is, and one
/// that sends and never reads once its replies stop being taken, its connection freed.
async fn slow_clients_are_cut_off(stack: &Stack) {
    let slow = SmtpServer::start(stack, |c| {
        c.max_connections_per_ip = 1;
        c.idle_timeout = Duration::from_secs(1);
    })
    .await;
    // A byte every 300 ms: a command never whole.
    let stream = TcpStream::connect(slow.addr).await.unwrap();
    let (read, mut write) = stream.into_split();
    let mut replies = BufReader::new(read).lines();
    let greeting = replies.next_line().await.unwrap().unwrap_or_default();
    assert!(greeting.starts_with("220"), "{greeting}");
    let drip = tokio::spawn(async move {
        while write.write_all(b"N").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let cut = tokio::time::timeout(Duration::from_secs(30), replies.next_line())
        .await
        .expect("a reply within 30 s")
        .unwrap()
        .unwrap_or_default();
    assert!(cut.starts_with("421 4.4.2"), "{cut}");
    drip.abort();
    // Long EHLOs, their replies never read (a receive buffer of 4 KiB): the one connection
    // its address may hold is given back.
    let (unread, mut write) = eventually(Duration::from_secs(10), || async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let (read, write) = socket.connect(slow.addr).await.unwrap().into_split();
        let mut read = BufReader::new(read);
        let mut greeting = String::new();
        read.read_line(&mut greeting).await.unwrap();
        match greeting.starts_with("220") {
            true => Ok((read, write)),
            false => Err(greeting),
        }
    })
    .await;
    let flood = tokio::spawn(async move {
        let ehlo = format!("EHLO {}.example\r\n", "h".repeat(200));
        for _ in 0..20_000 {
            if write.write_all(ehlo.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    eventually(Duration::from_secs(20), || async {
        let (_, greeting) = SmtpConn::connect(slow.addr).await;
        (greeting.0 == 220).then_some(()).ok_or(greeting)
    })
    .await;
    flood.abort();
    drop(unread);
    slow.stop().await;
}

/// A workspace that tracks by default gets its SMTP messages tracked too: the HTML part's
/// link goes through a signed redirect to where it pointed and a pixel is added; the plain
/// text and the attachment stay as written.
pub(crate) async fn a_workspace_that_tracks_has_its_smtp_messages_tracked(stack: &Stack) {
    let smtp = SmtpServer::start(stack, |_| {}).await;
    let (key, user) = account(stack, 10).await;
    let _: serde_json::Value = stack
        .client(&key)
        .put(
            "/tracking",
            &json!({"opens": true, "clicks": true}),
            StatusCode::OK,
        )
        .await;
    let to = at("smtp-tracked");
    let message = Message::builder()
        .from("News <news@postmesh.localhost>".parse::<Mailbox>().unwrap())
        .to(to.parse().unwrap())
        .subject("Tracked over SMTP")
        .multipart(
            MultiPart::mixed()
                .multipart(MultiPart::alternative_plain_html(
                    "Read https://example.com/page".to_owned(),
                    r#"<p>Résumé: <a href="https://example.com/page">read</a></p>"#.to_owned(),
                ))
                .singlepart(SinglePart::html(
                    r#"<p>More: <a href="https://example.com/more">more</a></p>"#.to_owned(),
                ))
                .singlepart(Attachment::new("page.html".into()).body(
                    br#"<a href="https://example.com/attached">kept</a>"#.to_vec(),
                    ContentType::TEXT_HTML,
                )),
        )
        .expect("a message");
    lettre_over_tls(&smtp, &user, &key)
        .send(message)
        .await
        .expect("lettre sends");
    let delivered = delivered(stack, &to, 1).await.remove(0);
    let seen = delivered.split_once('\n').map_or("", |(_, m)| m);
    let html = postmesh_tests::html_part(seen);
    let base = stack.base.trim_end_matches('/');
    assert!(html.contains("Résumé"), "{html}");
    assert!(html.contains(&format!("{base}/t/o/")), "a pixel: {html}");
    let click = html
        .split('"')
        .find(|s| s.starts_with(&format!("{base}/t/c/")))
        .unwrap_or_else(|| panic!("a tracked link: {html}"));
    let parsed = mail_parser::MessageParser::default()
        .parse(seen.as_bytes())
        .unwrap();
    assert_eq!(
        parsed.body_text(0).unwrap(),
        "Read https://example.com/page"
    );
    // Both HTML parts' links tracked, one pixel in the message.
    let html: Vec<String> = parsed
        .parts
        .iter()
        .filter(|p| !p.content_disposition().is_some_and(|d| d.is_attachment()))
        .filter_map(|p| match &p.body {
            mail_parser::PartType::Html(h) => Some(h.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(html.len(), 2, "{seen}");
    assert!(
        html.iter().all(|h| h.contains(&format!("{base}/t/c/"))),
        "{html:?}"
    );
    assert_eq!(html.concat().matches("/t/o/").count(), 1, "{html:?}");
    let attached = parsed
        .attachments()
        .find(|a| a.attachment_name() == Some("page.html"))
        .expect("the attachment");
    assert_eq!(
        attached.contents(),
        br#"<a href="https://example.com/attached">kept</a>"#,
        "{seen}"
    );
    let followed = postmesh_tests::no_redirects()
        .get(click)
        .send()
        .await
        .unwrap();
    assert_eq!(followed.status(), StatusCode::FOUND);
    assert_eq!(followed.headers()["location"], "https://example.com/page");
    smtp.stop().await;
}
