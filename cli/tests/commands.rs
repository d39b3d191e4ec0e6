//! The `postmesh` binary as a person or a script runs it: against a fake API on a local port,
//! with its own config directory, reading stdout, stderr and the exit code.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A fake Postmesh API: answers each request with the next scripted answer and records what
/// it was asked (`METHOD /path`, headers and body).
struct FakeApi {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    served: JoinHandle<()>,
}

impl FakeApi {
    /// Serves `answers` (`"200 OK"`, JSON body) in order, one request each.
    fn start(answers: Vec<(&'static str, String)>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let served = std::thread::spawn(move || {
            for (status, body) in answers {
                let (conn, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(conn);
                let mut head = String::new();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if let Some(v) = line.to_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                let mut request_body = vec![0; length];
                reader.read_exact(&mut request_body).unwrap();
                seen.lock().unwrap().push(format!(
                    "{head}\n{}",
                    String::from_utf8_lossy(&request_body)
                ));
                let reply = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                reader.get_mut().write_all(reply.as_bytes()).unwrap();
            }
        });
        Self {
            url,
            requests,
            served,
        }
    }

    /// What was asked, once every answer was given.
    fn requests(self) -> Vec<String> {
        self.served.join().unwrap();
        Arc::try_unwrap(self.requests)
            .unwrap()
            .into_inner()
            .unwrap()
    }
}

/// Runs `postmesh args` with `config` as its config directory and no key in the environment.
fn postmesh(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_postmesh"))
        .args(args)
        .env("XDG_CONFIG_HOME", config)
        .env("HOME", config)
        .env_remove("POSTMESH_API_KEY")
        .env_remove("POSTMESH_API_URL")
        .output()
        .unwrap()
}

/// The gateway's answer to `POST /device/start` for a request whose page is `url`.
fn device_started(url: &str) -> (&'static str, String) {
    let body = format!(
        r#"{{"success":true,"deviceToken":"x","expiresIn":60,"interval":1,
            "userCode":"BCDF-GHJK","verificationUrl":"{url}"}}"#
    );
    ("200 OK", body)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn login_stores_the_key_that_later_commands_present() {
    let config = tempfile::tempdir().unwrap();
    let api = FakeApi::start(vec![
        device_started("http://web.test/app/device?request=r1"),
        ("202 Accepted", r#"{"success":true,"status":"pending"}"#.into()),
        (
            "200 OK",
            r#"{"success":true,"status":"approved","apiKey":"pm_0123abcd_s3cret","email":"ann@example.com"}"#
                .into(),
        ),
        (
            "200 OK",
            r#"{"success":true,"email":"ann@example.com","accountId":"a1",
                "key":{"id":"0190a000-0000-7000-8000-0000000000a1","name":"CLI","prefix":"0123abcd","primary":false,"createdAt":1}}"#
                .into(),
        ),
    ]);
    let login = postmesh(
        config.path(),
        &["--api-url", &api.url, "login", "--no-browser"],
    );
    assert!(login.status.success(), "{}", text(&login.stderr));
    assert_eq!(text(&login.stdout), "Logged in as ann@example.com\n");
    assert!(
        text(&login.stderr)
            .contains("Open http://web.test/app/device?request=r1 and check the code BCDF-GHJK"),
        "{}",
        text(&login.stderr)
    );
    let file = config.path().join("postmesh/credentials.json");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    }
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(stored["apiKey"], "pm_0123abcd_s3cret");

    let whoami = postmesh(config.path(), &["--api-url", &api.url, "whoami"]);
    assert!(whoami.status.success(), "{}", text(&whoami.stderr));
    assert_eq!(
        text(&whoami.stdout),
        "ann@example.com\nkey: CLI (pm_0123abcd_…)\n"
    );

    let requests = api.requests();
    let token = |request: &str| {
        let body: serde_json::Value =
            serde_json::from_str(request.split("\r\n\n").last().unwrap()).unwrap();
        body["deviceToken"].as_str().unwrap().to_owned()
    };
    assert!(
        requests[0].starts_with("POST /cli/auth/init "),
        "{}",
        requests[0]
    );
    assert!(
        requests[1].starts_with("POST /cli/auth/poll "),
        "{}",
        requests[1]
    );
    let device_token = token(&requests[0]);
    assert_eq!(device_token.len(), 64);
    assert!(device_token.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(token(&requests[1]), device_token);
    assert_eq!(token(&requests[2]), device_token);
    let init: serde_json::Value =
        serde_json::from_str(requests[0].split("\r\n\n").last().unwrap()).unwrap();
    assert!(
        init["deviceName"].as_str().is_some_and(|n| !n.is_empty()),
        "{init}"
    );
    assert!(!requests[1].contains("deviceName"), "{}", requests[1]);
    assert!(!requests[0].to_lowercase().contains("authorization:"));
    assert!(requests[3].starts_with("GET /account "), "{}", requests[3]);
    assert!(
        requests[3]
            .to_lowercase()
            .contains("authorization: bearer pm_0123abcd_s3cret"),
        "{}",
        requests[3]
    );

    let logout = postmesh(config.path(), &["logout"]);
    assert!(logout.status.success());
    assert!(text(&logout.stdout).starts_with("Logged out: removed "));
    assert!(!file.exists());
    let again = postmesh(config.path(), &["logout"]);
    assert!(again.status.success());
    assert!(text(&again.stdout).starts_with("Not logged in: no credentials at "));
}

#[test]
fn an_expired_login_request_says_to_start_again() {
    let config = tempfile::tempdir().unwrap();
    let api = FakeApi::start(vec![
        device_started("http://web.test/app/device"),
        (
            "410 Gone",
            r#"{"success":false,"status":"expired","error":"device authorization missing or expired"}"#
                .into(),
        ),
    ]);
    let login = postmesh(
        config.path(),
        &["--api-url", &api.url, "login", "--no-browser"],
    );
    assert_eq!(login.status.code(), Some(1));
    assert_eq!(
        text(&login.stderr).lines().last(),
        Some("error: the login request expired; run postmesh login again")
    );
    assert!(!config.path().join("postmesh/credentials.json").exists());
    api.requests();
}

#[test]
fn each_failure_is_one_error_line_and_exit_code_1() {
    let config = tempfile::tempdir().unwrap();
    let not_logged_in = postmesh(config.path(), &["balance"]);
    assert_eq!(not_logged_in.status.code(), Some(1));
    assert_eq!(
        text(&not_logged_in.stderr),
        "error: not logged in; run postmesh login or set POSTMESH_API_KEY\n"
    );
    assert_eq!(text(&not_logged_in.stdout), "");

    let api = FakeApi::start(vec![
        (
            "401 Unauthorized",
            r#"{"success":false,"error":"invalid API key"}"#.into(),
        ),
        (
            "500 Internal Server Error",
            r#"{"success":false,"error":"log query failed"}"#.into(),
        ),
    ]);
    let keyed = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_postmesh"));
        command
            .args(["--api-url", &api.url])
            .args(args)
            .env("XDG_CONFIG_HOME", config.path())
            .env("POSTMESH_API_KEY", "pm_dead_beef");
        command.output().unwrap()
    };
    let refused = keyed(&["balance"]);
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(
        text(&refused.stderr),
        "error: the API key was refused (401): invalid API key; run postmesh login\n"
    );
    let failed = keyed(&["logs", "--csv"]);
    assert_eq!(failed.status.code(), Some(1));
    assert_eq!(
        text(&failed.stderr),
        "error: 500 Internal Server Error: log query failed\n"
    );
    let requests = api.requests();
    assert!(requests[1].starts_with("GET /logs "), "{}", requests[1]);

    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let unreachable = postmesh(config.path(), &["--api-url", &url, "login"]);
    assert_eq!(unreachable.status.code(), Some(1));
    let stderr = text(&unreachable.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: cannot reach the Postmesh API at {url}: ")),
        "{stderr}"
    );

    let usage = postmesh(
        config.path(),
        &["send", "--to", "a@x.com", "--subject", "s"],
    );
    assert_eq!(usage.status.code(), Some(2));
}
