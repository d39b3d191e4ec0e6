//! The web app in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by `deploy/deps.sh`) driven over WebDriver at a phone's
//! width. Signs in on `/app/login` with the emailed code, approves a device on
//! `/app/device`, creates a key on `/app/keys`. Screenshots go to `target/screenshots/`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use postmesh_tests::webdriver::Browser;
use postmesh_tests::{eventually, free_port, Stack};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// Where screenshots are kept: `target/screenshots/` of the workspace.
fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// Saves a screenshot of the page, after checking it fits a phone's width.
async fn shot(client: &Browser, name: &str) {
    let width = client
        .execute("return document.documentElement.scrollWidth;")
        .await;
    assert!(
        width.as_u64().is_some_and(|w| w <= 390),
        "{name} is {width} px wide"
    );
    let png = client.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(screenshots().join(format!("{name}.png")), png).expect("write screenshot");
}

#[tokio::test]
async fn a_browser_signs_in_approves_a_device_and_creates_a_key() {
    if !std::path::Path::new(CHROMEDRIVER).exists() || !std::path::Path::new(CHROMIUM).exists() {
        eprintln!(
            "\n\n*** SKIPPED the browser test: {CHROMIUM} or {CHROMEDRIVER} is missing; \
             deploy/deps.sh installs them (apt: chromium chromium-driver) when run as root ***\n"
        );
        return;
    }
    let stack = Stack::start().await;
    let port = free_port().port();
    let mut driver = tokio::process::Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("chromedriver starts");
    let webdriver = format!("http://127.0.0.1:{port}");
    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
            // A phone's viewport (headless windows are at least 500 wide).
            "mobileEmulation": { "deviceMetrics": { "width": 390, "height": 844, "pixelRatio": 1 } },
        },
    });
    let client = eventually(Duration::from_secs(20), || {
        let caps = caps.clone();
        let webdriver = webdriver.clone();
        async move { Browser::start(&webdriver, caps).await }
    })
    .await;

    // Sign in: email, then the code from the delivered email.
    let email = format!("browser-{}@example.com", uuid::Uuid::new_v4().simple());
    client.goto(&format!("{}/app/login", stack.base)).await;
    shot(&client, "1-login").await;
    client.find("#email").await.type_text(&email).await;
    client
        .find("form[action='/app/login'] button")
        .await
        .click()
        .await;
    let code = stack.code_sent_to(&email, 1).await;
    let field = client.find("#code").await;
    shot(&client, "2-code").await;
    field.type_text(&code).await;
    client
        .find("form[action='/app/login/verify'] button")
        .await
        .click()
        .await;
    let balance = client.find("#balance").await;
    assert_eq!(balance.text().await, "0");
    assert!(client.url().await.ends_with("/app/usage"));
    shot(&client, "3-usage").await;

    // A CLI asks to sign in; the user follows its link and types the code it shows.
    let cli = stack.anonymous();
    let token = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let started: Value = cli
        .post(
            "/cli/auth/init",
            &json!({ "deviceToken": token, "deviceName": "laptop" }),
            StatusCode::OK,
        )
        .await;
    client
        .goto(
            started["verificationUrl"]
                .as_str()
                .expect("verificationUrl"),
        )
        .await;
    let typed = client.find("#user_code").await;
    typed
        .type_text(started["userCode"].as_str().expect("userCode"))
        .await;
    shot(&client, "4-device").await;
    client.find("button[value='approve']").await.click().await;
    let done = client.find("p.ok").await;
    assert!(done.text().await.starts_with("Approved"));
    shot(&client, "5-device-approved").await;
    let polled = cli
        .request(
            Method::POST,
            "/cli/auth/poll",
            &json!({ "deviceToken": token }),
        )
        .await;
    let polled: Value = polled.expect(StatusCode::OK, "poll");
    assert!(polled["apiKey"]
        .as_str()
        .is_some_and(|k| k.starts_with("pm_")));

    // Create a key; it is shown once and works.
    client.goto(&format!("{}/app/keys", stack.base)).await;
    client
        .find("#name")
        .await
        .type_text("from the browser")
        .await;
    client
        .find("form[action='/app/keys'] button")
        .await
        .click()
        .await;
    let key = client.find("#new-key").await.property("value").await;
    assert!(key.starts_with("pm_"), "{key}");
    shot(&client, "6-keys").await;
    let _: Value = stack.client(&key).get("/balance", StatusCode::OK).await;
    let page = client.source().await;
    assert!(
        page.contains("from the browser") && page.contains("CLI: laptop"),
        "{page}"
    );

    // The API reference: every operation's bodies link to their schemas.
    client.goto(&format!("{}/docs", stack.base)).await;
    client.find("a[href='#sendbody']").await.click().await;
    assert!(client.url().await.ends_with("/docs#sendbody"));
    let fields = client
        .find("#sendbody + p + table, #sendbody + table")
        .await
        .text()
        .await;
    assert!(fields.contains("subject"), "{fields}");
    shot(&client, "7-docs").await;

    client.close().await;
    let _ = driver.kill().await;
    stack.shutdown().await;
}
