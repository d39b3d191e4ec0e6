//! Engagement: a send's tags and metadata in its status and every event and webhook, and open
//! and click tracking — off unless asked, on the right host, a signed redirect to the link
//! with its UTM parameters, machines told apart from people.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use postmesh_shared::{Success, TaskId};
use postmesh_tests::eventually;
use postmesh_tests::receiver::{received, Receiver};
use postmesh_tests::{html_part, no_redirects, Stack};

use super::wait_status;
use sender::sending::events::Kind;
use sender::sending::log::{Detail as LogDetail, Log};

/// A browser's user agent: a person.
const BROWSER: &str =
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/126.0 Safari/537.36";

/// `method url` as a browser would ask it, redirects not followed.
async fn by_browser(method: reqwest::Method, url: &str) -> reqwest::Response {
    let req = no_redirects().request(method, url);
    req.header("user-agent", BROWSER).send().await.unwrap()
}

/// Every `{base}/t/{kind}/{token}` URL of `html`, in order.
fn tracked(html: &str, base: &str, kind: char) -> Vec<String> {
    let prefix = format!("{base}/t/{kind}/");
    html.match_indices(&prefix)
        .map(|(at, _)| {
            let rest = &html[at..];
            rest[..rest.find('"').expect("a quoted URL")].to_owned()
        })
        .collect()
}

/// Sends `body` with `key`; the task.
async fn send(stack: &Stack, key: &str, body: Value) -> TaskId {
    stack.sent(key, &body).await.task_id.expect("a task")
}

/// One event `kind` of a recipient's, its detail.
fn details(p: &sender::sending::status::TaskProgress, email: &str, kind: Kind) -> Vec<Value> {
    p.recipients
        .iter()
        .filter(|r| r.email == email)
        .flat_map(|r| r.events.iter())
        .filter(|e| e.kind == kind)
        .map(|e| e.detail.clone())
        .collect()
}

/// A marketing send with tags, metadata, UTM parameters and both kinds of tracking: its
/// message has the pixel and tracked links on the gateway's host (the unsubscribe link and a
/// `data-pm-notrack` one untouched, the plain text untouched); fetching them makes `opened`
/// and `clicked` events with the send's labels in `/email-status` and webhooks; the redirect
/// lands on the link with its UTM parameters; a tampered token is a 404; a `HEAD` and a
/// click right after delivery with no open are machines'. Without opting in, nothing is
/// tracked.
pub(crate) async fn a_tagged_tracked_send_reports_opens_and_clicks_with_its_labels(stack: &Stack) {
    let key = stack.key(10).await;
    let client = stack.client(&key);
    let receiver = Receiver::start().await;
    let events = ["email.opened", "email.clicked", "email.sent"];
    receiver.subscribe(stack, &key, &events).await;
    let defaults: Success<Value> = client.get("/tracking", StatusCode::OK).await;
    assert_eq!(defaults.body, json!({"opens": false, "clicks": false}));

    let html = r#"<html><body><p>Hi</p><a href="https://example.com/page">Read</a>
<a data-pm-notrack href="https://example.com/keep">Keep</a>
<a href="{{unsubscribe_url}}">Unsubscribe</a></body></html>"#;
    // Not asked for: nothing tracked.
    let plain = "untracked@example.com";
    send(stack, &key, json!({ "to": plain, "subject": "Plain", "html": html, "text": "https://example.com/page" })).await;
    let eml = stack
        .wait_for_messages(plain, 1, Duration::from_secs(30))
        .await;
    assert!(
        !eml[0].contains("/t/o/") && !eml[0].contains("/t/c/"),
        "tracked without asking"
    );

    let (reader, scanned) = ("reader@example.com", "scanned@example.com");
    let task = send(
        stack,
        &key,
        json!({ "to": [reader, scanned], "subject": "News", "html": html,
                "text": "Read https://example.com/page", "emailType": "marketing",
                "utm": {"source": "news"}, "trackOpens": true, "trackClicks": true,
                "tags": [{"name": "campaign", "value": "fall"}],
                "metadata": {"userId": "42"} }),
    )
    .await;
    let base = stack.base.trim_end_matches('/');
    // A scanner fetches the other recipient's pixel with a HEAD (a machine's open) and
    // follows its link as soon as it arrives (within TRACKING_SCANNER_WINDOW_SECS of
    // sending), with no person's open before.
    let eml = stack
        .wait_for_messages(scanned, 1, Duration::from_secs(30))
        .await;
    let scanned_html = html_part(&eml[0]);
    let head = by_browser(reqwest::Method::HEAD, &tracked(&scanned_html, base, 'o')[0]).await;
    assert_eq!(head.status(), StatusCode::OK);
    let hit = by_browser(reqwest::Method::GET, &tracked(&scanned_html, base, 'c')[0]).await;
    assert_eq!(hit.status(), StatusCode::FOUND);
    let eml = stack
        .wait_for_messages(reader, 1, Duration::from_secs(30))
        .await;
    let html = html_part(&eml[0]);
    let (opens, clicks) = (tracked(&html, base, 'o'), tracked(&html, base, 'c'));
    assert_eq!((opens.len(), clicks.len()), (1, 1), "{html}");
    assert!(
        html.contains(r#"<a href="https://example.com/keep?utm_source=news">"#),
        "{html}"
    );
    assert!(
        html.contains("/unsubscribe?token="),
        "the unsubscribe link stays"
    );
    let text = mail_parser::MessageParser::default()
        .parse(eml[0].as_bytes())
        .unwrap()
        .body_text(0)
        .unwrap()
        .into_owned();
    assert!(text.contains("Read https://example.com/page") && !text.contains("/t/c/"));

    let http = no_redirects();
    // A HEAD of the pixel is a machine's; a browser's GET is the first open by a person.
    let head = by_browser(reqwest::Method::HEAD, &opens[0]).await;
    assert_eq!(head.status(), StatusCode::OK);
    let open = by_browser(reqwest::Method::GET, &opens[0]).await;
    assert_eq!(open.status(), StatusCode::OK);
    assert_eq!(open.headers()["content-type"], "image/gif");
    assert_eq!(open.headers()["cache-control"], "no-store");
    assert_eq!(&open.bytes().await.unwrap()[..6], b"GIF89a");
    let click = by_browser(reqwest::Method::GET, &clicks[0]).await;
    assert_eq!(click.status(), StatusCode::FOUND);
    assert_eq!(
        click.headers()["location"],
        "https://example.com/page?utm_source=news"
    );
    // A changed token is a 404, never a redirect.
    let mut tampered = clicks[0].clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    // So is one that is not even valid percent-encoding.
    let garbled = format!("{}%FF%FE", &clicks[0][..clicks[0].len() - 4]);
    for changed in [tampered, garbled] {
        let refused = http.get(&changed).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::NOT_FOUND, "{changed}");
        assert!(refused.headers().get("location").is_none());
    }

    let progress = wait_status(stack, &key, task, |p| {
        details(p, reader, Kind::Opened).len() == 2
            && details(p, reader, Kind::Clicked).len() == 1
            && details(p, scanned, Kind::Clicked).len() == 1
            && details(p, scanned, Kind::Opened).len() == 1
    })
    .await;
    assert_eq!(progress.tags.len(), 1);
    assert_eq!(progress.metadata["userId"], "42");
    let opened = details(&progress, reader, Kind::Opened);
    let machine: Vec<(bool, bool)> = opened
        .iter()
        .map(|d| {
            (
                d["machine"].as_bool().unwrap(),
                d["first"].as_bool().unwrap(),
            )
        })
        .collect();
    assert!(machine.contains(&(true, false)), "the HEAD: {opened:?}");
    assert!(
        machine.contains(&(false, true)),
        "the browser's: {opened:?}"
    );
    let clicked = &details(&progress, reader, Kind::Clicked)[0];
    assert_eq!(clicked["url"], "https://example.com/page?utm_source=news");
    assert_eq!(
        (clicked["machine"].as_bool(), clicked["first"].as_bool()),
        (Some(false), Some(true))
    );
    assert_eq!(clicked["ip"], "127.0.0.0");
    let scanner = &details(&progress, scanned, Kind::Clicked)[0];
    assert_eq!(
        (scanner["machine"].as_bool(), scanner["first"].as_bool()),
        (Some(true), Some(false))
    );

    // Webhooks: sent, opened and clicked, each of the tagged send with its tags and metadata.
    let hooks = received(&receiver, 3 + 3 + 2, Duration::from_secs(30)).await;
    for (kind, count) in [("email.sent", 2), ("email.opened", 3), ("email.clicked", 2)] {
        let of_kind: Vec<&Value> = hooks
            .iter()
            .map(|d| &d.body)
            .filter(|b| b["type"] == kind && b["data"]["email"] != plain)
            .collect();
        assert_eq!(of_kind.len(), count, "{kind} in {hooks:?}");
        for body in of_kind {
            assert_eq!(
                body["data"]["tags"],
                json!([{"name": "campaign", "value": "fall"}])
            );
            assert_eq!(body["data"]["metadata"], json!({"userId": "42"}));
        }
    }
    let human_click = hooks
        .iter()
        .map(|d| &d.body["data"])
        .find(|d| d["email"] == reader && d["url"].is_string())
        .expect("the reader's click");
    assert_eq!(human_click["first"], true);

    // The log: by tag, by recipient (any case), by state and time; one message's events.
    let log = |query: &str| {
        let path = format!("/emails{query}");
        let client = stack.client(&key);
        async move {
            let page: Success<Log> = client.get(&path, StatusCode::OK).await;
            page.body.emails
        }
    };
    let tagged = log("?tag=campaign:fall").await;
    let rows: Vec<(&str, i32, i32)> = tagged
        .iter()
        .map(|e| (e.to.as_str(), e.opens, e.clicks))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.contains(&(reader, 1, 1)) && rows.contains(&(scanned, 0, 0)),
        "{rows:?}"
    );
    assert!(tagged
        .iter()
        .all(|e| e.task_id == task.as_uuid() && e.subject == "News"));
    assert_eq!(log("?to=READER@example.com").await.len(), 1);
    assert_eq!(log("?status=sent&to=untracked@example.com").await.len(), 1);
    assert_eq!(
        log("?status=bounced&to=untracked@example.com").await.len(),
        0
    );
    let created = tagged[0].created_at;
    assert_eq!(
        log(&format!("?tag=campaign:fall&until={created}"))
            .await
            .len(),
        0
    );
    assert_eq!(
        log(&format!("?tag=campaign:fall&since={created}"))
            .await
            .len(),
        2
    );
    assert!(log("?tag=campaign:other").await.is_empty());
    let all = log("?limit=2").await;
    assert_eq!(all.len(), 2);
    assert!(all[0].created_at >= all[1].created_at, "newest first");
    for bad in [
        "?tag=campaign",
        "?tag=a%20b:c",
        "?status=opened",
        "?limit=101",
        "?since=-1",
    ] {
        let refused: Value = client
            .get(&format!("/emails{bad}"), StatusCode::BAD_REQUEST)
            .await;
        assert_eq!(refused["success"], false, "{bad}");
    }
    let one = tagged.iter().find(|e| e.to == reader).unwrap();
    let detail: Success<LogDetail> = client
        .get(&format!("/emails/{}", one.delivery_id), StatusCode::OK)
        .await;
    assert_eq!(detail.body.metadata["userId"], "42");
    let kinds: Vec<Kind> = detail.body.events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds.first(), Some(&Kind::Sent), "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| **k == Kind::Opened).count(),
        2,
        "{kinds:?}"
    );
    // People's opens and clicks only: the reader's of the three messages sent.
    let overview: Value = client
        .get("/operations-overview?since=0", StatusCode::OK)
        .await;
    let third = 1.0 / 3.0;
    assert_eq!(
        overview["stats"]["openRate"].as_f64(),
        Some(third),
        "{overview}"
    );
    assert_eq!(
        overview["stats"]["clickRate"].as_f64(),
        Some(third),
        "{overview}"
    );
    let other = stack.key(1).await;
    let _: Value = stack
        .client(&other)
        .get(
            &format!("/emails/{}", one.delivery_id),
            StatusCode::NOT_FOUND,
        )
        .await;
}

/// Retention: a send's deliveries, events and tags go `EMAIL_RETENTION_DAYS` after its
/// release, its row staying and its status a 404; a send accepted as long ago but still
/// waiting for its time keeps them; an event left after its delivery went goes by its own
/// time, a provider notification applied by when it came.
pub(crate) async fn a_sends_log_is_purged_a_retention_after_its_release_and_not_before(
    stack: &Stack,
) {
    use sender::sending::retention::{first_id_at, purge};
    let key = stack.key(10).await;
    let client = stack.client(&key);
    let db = stack.sender_db().await;
    let now = postmesh_shared::db::now_unix();
    let month_ago = now - 31 * 24 * 3600;
    let tags = json!([{"name": "kept", "value": "long"}]);
    let released = send(
        stack,
        &key,
        json!({"to": "old@example.com", "subject": "Old", "text": "x", "tags": tags}),
    )
    .await;
    wait_status(stack, &key, released, |p| p.sent == 1).await;
    let waiting = send(stack, &key, json!({"to": "later@example.com", "subject": "Later", "text": "x", "tags": tags, "scheduledAt": now + 3600})).await;
    let failed = send(stack, &key, json!({"to": "never@example.com", "subject": "Never", "text": "x", "scheduledAt": now + 3600})).await;
    // All accepted a month ago; the first released then, the last set aside as failed at its
    // time then, the second still waiting.
    for (task, status, released_at) in [
        (released, "queued", Some(month_ago)),
        (waiting, "scheduled", None),
        (failed, "failed", None),
    ] {
        sqlx::query(
            "UPDATE tasks SET created_at = $2, released_at = $3, status = $4,
                 scheduled_at = CASE WHEN $4 = 'failed' THEN $2 ELSE scheduled_at END
             WHERE id = $1",
        )
        .bind(task.as_uuid())
        .bind(month_ago)
        .bind(released_at)
        .bind(status)
        .execute(&db)
        .await
        .unwrap();
    }
    // Events whose delivery is gone: one a month old, one new.
    let (stale, fresh) = (first_id_at(month_ago), uuid::Uuid::now_v7());
    for id in [stale, fresh] {
        sqlx::query(
            "INSERT INTO delivery_events (id, workspace_id, delivery_id, email, kind, occurred_at, source_key)
             VALUES ($1, $1, $1, 'gone@example.com', 'clicked', 0, $1::text)",
        )
        .bind(id)
        .execute(&db)
        .await
        .unwrap();
    }
    // Provider notifications applied: one a month ago, one now.
    let (old_note, new_note) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    for (id, at) in [(&old_note, month_ago), (&new_note, now)] {
        sqlx::query("INSERT INTO provider_notifications (message_id, received_at) VALUES ($1, $2)")
            .bind(id)
            .bind(at)
            .execute(&db)
            .await
            .unwrap();
    }
    while purge(&db, 30).await.unwrap() {}
    let notes: Vec<String> = sqlx::query_scalar(
        "SELECT message_id FROM provider_notifications WHERE message_id = ANY($1)",
    )
    .bind([&old_note, &new_note])
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(
        notes,
        [new_note],
        "the notifications applied a retention ago are forgotten"
    );

    let rows = |table: &'static str, task: TaskId| {
        let db = db.clone();
        async move {
            let query = format!("SELECT count(*) FROM {table} WHERE task_id = $1");
            sqlx::query_scalar::<_, i64>(&query)
                .bind(task.as_uuid())
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    for table in [
        "task_recipients",
        "task_tags",
        "delivery_events",
        "deliveries",
    ] {
        assert_eq!(
            rows(table, released).await,
            0,
            "{table} of the released send"
        );
    }
    assert_eq!(
        rows("task_recipients", failed).await,
        0,
        "the send set aside"
    );
    let purged: bool = sqlx::query_scalar("SELECT log_purged FROM tasks WHERE id = $1")
        .bind(released.as_uuid())
        .fetch_one(&db)
        .await
        .unwrap();
    assert!(purged, "the released send's row stays, marked");
    let gone: postmesh_shared::error::ErrorBody = client
        .get(&format!("/email-status/{released}"), StatusCode::NOT_FOUND)
        .await;
    assert!(gone.error.contains("retention"), "{}", gone.error);
    for table in ["task_recipients", "task_tags"] {
        assert_eq!(rows(table, waiting).await, 1, "{table} of the waiting send");
    }
    let later: Success<sender::sending::status::TaskProgress> = client
        .get(&format!("/email-status/{waiting}"), StatusCode::OK)
        .await;
    assert_eq!(later.body.recipients.len(), 1);
    let left: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT id FROM delivery_events WHERE id = ANY($1)")
            .bind([stale, fresh])
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(left, [fresh]);
}

/// A TRACKING message handed out again while its first recording waits for its delivery
/// (two replicas of the sender, each with a copy): one event, counted once.
pub(crate) async fn a_hit_recorded_twice_at_once_is_one_event_counted_once(stack: &Stack) {
    use postmesh_shared::proto::{TrackingHit, TrackingHits};
    use prost::Message as _;
    use sender::sending::events::Outlet;
    use sender::sending::tracking::record::{Hit, Recorder};
    let key = stack.key(10).await;
    let task = send(stack, &key, json!({"to": "twice@example.com", "subject": "Twice", "html": "<p>Hi</p>", "trackOpens": true})).await;
    wait_status(stack, &key, task, |p| p.sent == 1).await;
    let db = stack.sender_db().await;
    let delivery: uuid::Uuid =
        sqlx::query_scalar("SELECT delivery_id FROM task_recipients WHERE task_id = $1")
            .bind(task.as_uuid())
            .fetch_one(&db)
            .await
            .unwrap();
    let hit_id = uuid::Uuid::now_v7();
    let payload = TrackingHits {
        hits: vec![TrackingHit {
            hit_id: hit_id.to_string(),
            kind: "opened".into(),
            delivery_id: delivery.to_string(),
            url: String::new(),
            user_agent: BROWSER.into(),
            client_ip: "203.0.113.0".into(),
            occurred_at: postmesh_shared::db::now_unix() + 60,
            head: false,
        }],
    }
    .encode_to_vec();
    let recorder = Recorder {
        db: db.clone(),
        outlet: Outlet {
            ns: stack.ns().clone(),
            message_id_domain: "postmesh.test".into(),
        },
        scanner_window: 5,
    };
    let copy = || recorder.record(Hit::decode_all(&payload).unwrap());
    // The delivery held, as a third batch would hold it, until both copies wait for it.
    let mut holder = db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM task_recipients WHERE delivery_id = $1 FOR UPDATE")
        .bind(delivery)
        .execute(&mut *holder)
        .await
        .unwrap();
    let release = async {
        eventually(Duration::from_secs(10), || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND query LIKE '%task_recipients%FOR UPDATE%'",
            )
            .fetch_one(&db)
            .await
            .unwrap();
            if waiting == 2 {
                Ok(())
            } else {
                Err(waiting)
            }
        })
        .await;
        holder.rollback().await.unwrap();
    };
    let (first, second, ()) = tokio::join!(copy(), copy(), release);
    first.unwrap();
    second.unwrap();
    let (events, opens): (i64, i32) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM delivery_events WHERE source_key = $2), opens
         FROM task_recipients WHERE delivery_id = $1",
    )
    .bind(delivery)
    .bind(format!("track:{hit_id}"))
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!((events, opens), (1, 1));

    // One link fetched in a loop: its delivery's log stops at 1,000 opens and clicks.
    let hits = TrackingHits {
        hits: (0..1000)
            .map(|_| TrackingHit {
                hit_id: uuid::Uuid::now_v7().to_string(),
                ..TrackingHits::decode(payload.as_slice()).unwrap().hits[0].clone()
            })
            .collect(),
    }
    .encode_to_vec();
    recorder
        .record(Hit::decode_all(&hits).unwrap())
        .await
        .unwrap();
    let (events, opens): (i64, i32) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM delivery_events WHERE delivery_id = $1 AND kind = 'opened'),
                opens
         FROM task_recipients WHERE delivery_id = $1",
    )
    .bind(delivery)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!((events, opens), (1000, 1000));
}
