//! The `postmesh` CLI end to end against a real stack: `login --no-browser` approved through
//! a web session, then `balance`, `send` and `status --wait` with the stored key; a bad API
//! URL and a revoked key each give one clear line and a non-zero exit.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use postmesh_shared::proto::GrantRequest;
use postmesh_tests::web::{text, WebUser};
use postmesh_tests::{workspace_binary, Stack};

/// `postmesh` with a home of its own, against `api`.
fn postmesh(home: &Path, api: &str) -> Command {
    let mut cmd = Command::new(workspace_binary("postmesh"));
    cmd.env_clear()
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("POSTMESH_API_URL", api)
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs `postmesh args…`; exit success, stdout, stderr.
async fn run(home: &Path, api: &str, args: &[&str]) -> (bool, String, String) {
    run_with(home, api, &[], args).await
}

/// Runs `postmesh args…` with `env` set too; exit success, stdout, stderr.
async fn run_with(
    home: &Path, api: &str, env: &[(&str, &str)], args: &[&str],
) -> (bool, String, String) {
    let mut cmd = postmesh(home, api);
    cmd.envs(env.iter().copied());
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.args(args).output())
        .await
        .expect("postmesh finishes")
        .expect("postmesh runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts a failed run told the user in exactly one line on stderr; that line.
fn one_error_line(ok: bool, stderr: &str) -> String {
    assert!(!ok, "the command should fail");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {stderr:?}");
    assert!(lines[0].starts_with("error: "), "{stderr:?}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr:?}"
    );
    lines[0].to_owned()
}

#[tokio::test]
async fn the_cli_logs_in_by_device_flow_and_sends_with_the_stored_key() {
    let stack = Stack::start().await;
    let home = tempfile::tempdir().expect("home");
    let email = format!("cli-{}@example.com", uuid::Uuid::new_v4().simple());

    // `postmesh login --no-browser` prints the link and the code, then polls.
    let mut login = postmesh(home.path(), &stack.base)
        .args(["login", "--no-browser"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("postmesh login starts");
    let (tx, mut lines) = mpsc::unbounded_channel();
    for stream in [
        Box::new(login.stdout.take().expect("stdout"))
            as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
        Box::new(login.stderr.take().expect("stderr")),
    ] {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stream).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let _ = tx.send(line);
            }
        });
    }
    drop(tx);
    let (mut url, mut code, mut printed) = (None, None, String::new());
    while url.is_none() || code.is_none() {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.recv())
            .await
            .unwrap_or_else(|_| panic!("login printed no link and code: {printed}"))
            .unwrap_or_else(|| panic!("login ended early: {printed}"));
        printed.push_str(&line);
        printed.push('\n');
        for word in line.split_whitespace() {
            let word = word.trim_matches(|c: char| c == '"' || c == '\'' || c == ',');
            if word.contains("/app/device?request=") {
                url = Some(word.to_owned());
            }
            let bare = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-');
            if bare.len() == 9
                && bare.as_bytes()[4] == b'-'
                && bare
                    .chars()
                    .filter(|c| *c != '-')
                    .all(|c| c.is_ascii_uppercase())
            {
                code = Some(bare.to_owned());
            }
        }
    }
    let url = url.expect("link");
    let code = code.expect("code");
    let rid = url
        .split("request=")
        .nth(1)
        .expect("request id")
        .trim_end_matches('.');

    // The user signs in on the web and approves with the code the terminal shows.
    let mut user = WebUser::login(&stack, &email, 0).await;
    let page = user.page(&format!("/app/device?request={rid}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", text(&page));
    let approved = user
        .form(
            "/app/device",
            &[
                ("request", rid),
                ("user_code", &code),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(approved.status, StatusCode::OK, "{}", text(&approved));
    let status = tokio::time::timeout(Duration::from_secs(30), login.wait())
        .await
        .expect("login finishes after approval")
        .expect("exit status");
    // Everything it printed, to its end (both pipes close when it exits).
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(5), lines.recv()).await {
        printed.push_str(&line);
        printed.push('\n');
    }
    assert!(status.success(), "{printed}");
    assert!(printed.contains(&email), "{printed}");

    // The key is stored for this user only.
    let stored = home.path().join("config/postmesh/credentials.json");
    let mode = std::fs::metadata(&stored)
        .expect("credentials stored")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );

    // Credits for the account's primary key, which the new key bills to.
    let db = stack.service_db(api_gateway::SERVICE).await;
    let (account, primary): (uuid::Uuid, uuid::Uuid) =
        sqlx::query_as("SELECT id, primary_key_id FROM accounts WHERE email = $1")
            .bind(&email)
            .fetch_one(&db)
            .await
            .expect("account");
    stack
        .rpc(&GrantRequest {
            api_key_id: primary.to_string(),
            account_id: account.to_string(),
            email: email.clone(),
            credits: 7,
            idempotency_key: "cli-test-grant".into(),
        })
        .await
        .expect("grant");

    let (ok, out, err) = run(home.path(), &stack.base, &["balance"]).await;
    assert!(ok, "{err}");
    assert!(out.contains('7'), "{out}");
    let (ok, out, err) = run(home.path(), &stack.base, &["--json", "whoami"]).await;
    assert!(ok, "{err}");
    let me: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(me["email"], email.as_str());

    let (ok, out, err) = run(
        home.path(),
        &stack.base,
        &[
            "--json",
            "send",
            "--to",
            "ann@example.com",
            "--subject",
            "From the CLI",
            "--text",
            "Hello",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let sent: Value = serde_json::from_str(&out).expect("JSON");
    let task = sent["taskId"].as_str().expect("taskId").to_owned();
    let (ok, out, err) = run(home.path(), &stack.base, &["status", &task, "--wait"]).await;
    assert!(ok, "{err}");
    assert!(
        out.to_lowercase().contains("completed") || out.to_lowercase().contains("sent"),
        "{out}"
    );
    stack
        .wait_for_messages("ann@example.com", 1, Duration::from_secs(15))
        .await;

    // A workflow event, then the same again: recorded once.
    let event = [
        "events",
        "send",
        "--name",
        "joined",
        "--email",
        "bo@example.com",
        "--id",
        "cli-1",
    ];
    let (ok, out, err) = run(home.path(), &stack.base, &event).await;
    assert!(ok, "{err}");
    assert!(out.contains("cli-1 recorded"), "{out}");
    let (ok, out, err) = run(home.path(), &stack.base, &event).await;
    assert!(ok, "{err}");
    assert!(out.contains("already recorded"), "{out}");

    // The stored key goes to no other API than the one that issued it.
    let (ok, _, err) = run(home.path(), "http://127.0.0.1:9", &["balance"]).await;
    let line = one_error_line(ok, &err);
    assert!(
        line.contains("stored key is for") && line.contains("127.0.0.1:9"),
        "{line}"
    );
    // An API that cannot be reached: one clear line, non-zero exit.
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&stored).expect("read"))
        .expect("credentials JSON");
    assert_eq!(saved["apiUrl"], stack.base.as_str());
    let key = saved["apiKey"].as_str().expect("apiKey");
    let env = [("POSTMESH_API_KEY", key)];
    let (ok, _, err) = run_with(home.path(), "http://127.0.0.1:9", &env, &["balance"]).await;
    let line = one_error_line(ok, &err);
    assert!(
        line.contains("cannot reach") && line.contains("127.0.0.1:9"),
        "{line}"
    );

    // The key revoked on the web: one clear line, non-zero exit.
    let keys: Value = user
        .json(Method::GET, "/api-keys", &json!({}))
        .await
        .expect(StatusCode::OK, "keys");
    let cli_key = keys["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|k| k["primary"] == false)
        .expect("the CLI's key")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let _: Value = user
        .json(Method::DELETE, &format!("/api-keys/{cli_key}"), &json!({}))
        .await
        .expect(StatusCode::OK, "revoke");
    let (ok, _, err) = run(home.path(), &stack.base, &["balance"]).await;
    let line = one_error_line(ok, &err);
    assert!(
        line.contains("401") || line.to_lowercase().contains("refused"),
        "{line}"
    );

    // Logged out, nothing is stored and commands say how to log in.
    let (ok, _, err) = run(home.path(), &stack.base, &["logout"]).await;
    assert!(ok, "{err}");
    assert!(!stored.exists());
    let (ok, _, err) = run(home.path(), &stack.base, &["balance"]).await;
    let line = one_error_line(ok, &err);
    assert!(line.contains("postmesh login"), "{line}");
    stack.shutdown().await;
}
