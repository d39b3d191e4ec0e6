//! The web app in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by `deploy/deps.sh`) driven over WebDriver at a phone's
//! width. Signs in on `/app/login` with the emailed code, approves a device on
//! `/app/device`, creates a key on `/app/keys`, reads the mail chart of `/app/usage` against
//! the API's numbers and follows a message from `/app/emails` to its events. Screenshots go
//! to `var/screenshots/`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use api_gateway::create_key::CreateKey;
use postmesh_contracts::answers::gateway::KeyMode;
use postmesh_shared::proto::Role;
use postmesh_tests::webdriver::Browser;
use postmesh_tests::{eventually, free_port, html_part, no_redirects, Stack};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// Where screenshots are kept: `var/screenshots/` of the workspace.
fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../var/screenshots");
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

    mail_pages(&stack, &client, &email).await;

    client.close().await;
    let _ = driver.kill().await;
    stack.shutdown().await;
}

/// The account's mail in the web app: a tracked message opened and clicked by a person, a
/// bounce and a complaint (sandbox); `/app/usage` draws each day's counts as `/email-stats`
/// answers them, with its rates; `/app/emails` lists the messages, filters them by state and
/// shows one with its events.
async fn mail_pages(stack: &Stack, client: &Browser, email: &str) {
    let key = CreateKey {
        email: postmesh_shared::EmailAddress::parse(email).expect("address"),
        credits: 5,
        role: Role::Member,
        mode: KeyMode::Live,
    }
    .create(&stack.common)
    .await
    .expect("a key with credits");
    let api = stack.client(&key);
    let reader = format!(
        "reader-{}@example.com",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    for (to, tracked) in [
        (reader.as_str(), true),
        ("bounced@sandbox.postmesh.test", false),
        ("complained@sandbox.postmesh.test", false),
    ] {
        let _: Value = api
            .post(
                "/send-email",
                &json!({ "to": to, "subject": "Chart", "trackOpens": tracked, "trackClicks": tracked,
                         "html": "<p>Hi</p><a href=\"https://example.com/chart\">read</a>" }),
                StatusCode::OK,
            )
            .await;
    }
    let eml = stack
        .wait_for_messages(&reader, 1, Duration::from_secs(30))
        .await;
    let html = html_part(&eml[0]);
    let http = no_redirects();
    for kind in ["/t/o/", "/t/c/"] {
        let at = html
            .rfind(&format!("{}{kind}", stack.base))
            .expect("a tracked URL");
        let url = &html[at..at + html[at..].find('"').expect("quoted")];
        let hit = http
            .get(url)
            .header("user-agent", "Mozilla/5.0 (X11; Linux x86_64) Chrome/126.0")
            .send()
            .await
            .unwrap();
        assert!(hit.status().is_success() || hit.status() == StatusCode::FOUND);
    }
    let stats: Value = eventually(Duration::from_secs(30), || async {
        let stats: Value = api.get("/email-stats?days=30", StatusCode::OK).await;
        let today = &stats["days"][29];
        let want = [
            ("opened", 1),
            ("clicked", 1),
            ("bounced", 1),
            ("complained", 1),
        ];
        if want.iter().all(|(k, n)| today[*k] == *n) {
            Ok(stats)
        } else {
            Err(stats)
        }
    })
    .await;

    client.goto(&format!("{}/app/usage", stack.base)).await;
    let drawn = client
        .execute(
            "return Object.fromEntries([...document.querySelectorAll('#mail-chart polyline')]\
             .map(p => [p.dataset.series, p.dataset.values]));",
        )
        .await;
    for series in [
        "sent",
        "delivered",
        "bounced",
        "complained",
        "opened",
        "clicked",
    ] {
        let api_values: Vec<String> = stats["days"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d[series].to_string())
            .collect();
        assert_eq!(drawn[series], api_values.join(","), "{series}");
    }
    let percent = |rate: &Value| format!("{:.1}%", rate.as_f64().unwrap() * 100.0);
    assert_eq!(
        client.find("#open-rate").await.text().await,
        percent(&stats["openRate"])
    );
    assert_eq!(
        client.find("#click-rate").await.text().await,
        percent(&stats["clickRate"])
    );
    shot(client, "8-usage-chart").await;

    client.goto(&format!("{}/app/emails", stack.base)).await;
    let rows = client.find("#emails").await.text().await;
    assert!(
        rows.contains(&reader) && rows.contains("bounced@sandbox.postmesh.test"),
        "{rows}"
    );
    shot(client, "9-emails").await;
    client
        .goto(&format!("{}/app/emails?status=bounced", stack.base))
        .await;
    let bounced = client.find("#emails").await.text().await;
    assert!(
        bounced.contains("bounced@sandbox") && !bounced.contains(&reader),
        "{bounced}"
    );
    client
        .goto(&format!("{}/app/emails?to={reader}", stack.base))
        .await;
    client.find("a[href^='/app/emails/']").await.click().await;
    let events = client.find("#events").await.text().await;
    assert!(
        events.contains("opened") && events.contains("clicked"),
        "{events}"
    );
    assert!(events.contains("https://example.com/chart"), "{events}");
    shot(client, "10-email").await;
}
