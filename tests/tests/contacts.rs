//! Contacts on the sender's router: upsert by email or externalId, the listing's filters,
//! changes and removal, another workspace's contacts invisible, and imports as JSON and CSV
//! keeping the good rows and naming the bad ones (a send taking a contact's external id is
//! among the sending scenarios).

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use postmesh_shared::error::ErrorBody;
use postmesh_shared::Success;
use postmesh_tests::sender_router;
use sender::audience::contacts::{ContactPage, Deleted, Imported, One, Subscription, Upserted};
use sender::Quotas;

#[tokio::test]
async fn contacts_are_upserted_by_external_id_or_email_and_filtered() {
    let (_store, mine, theirs) = sender_router(Quotas::default()).await;
    let made: Success<Upserted> = mine
        .post(
            "/contacts",
            &json!({"email": "Ann@Example.com", "externalId": "u-1",
                    "attributes": {"plan": "pro", "age": 41}, "tags": ["vip", "beta", "vip"],
                    "topics": {"news": "subscribed"}}),
            StatusCode::CREATED,
        )
        .await;
    let ann = made.body.contact;
    assert!(made.body.created);
    assert_eq!(ann.tags, ["beta", "vip"]);
    // Found again by its external id: attributes merged (null removes), tags replaced,
    // topics merged; the email changes with it.
    let again: Success<Upserted> = mine
        .post(
            "/contacts",
            &json!({"externalId": "u-1", "email": "ann@new.example",
                    "attributes": {"age": null, "city": "Oslo"}, "tags": ["gold"],
                    "topics": {"tips": "unsubscribed"}}),
            StatusCode::OK,
        )
        .await;
    let c = &again.body.contact;
    assert!(!again.body.created);
    assert_eq!(c.id, ann.id);
    assert_eq!(c.email.as_deref(), Some("ann@new.example"));
    assert_eq!(
        serde_json::Value::Object(c.attributes.0.clone()),
        json!({"plan": "pro", "city": "Oslo"})
    );
    assert_eq!(c.tags, ["gold"]);
    assert_eq!(c.topics.0.get("news"), Some(&Subscription::Subscribed));
    assert_eq!(c.topics.0.get("tips"), Some(&Subscription::Unsubscribed));
    // Found by its email, whatever the case.
    let by_email: Success<Upserted> = mine
        .post(
            "/contacts",
            &json!({"email": "ANN@new.example", "tags": ["gold", "vip"]}),
            StatusCode::OK,
        )
        .await;
    assert_eq!(by_email.body.contact.id, ann.id);
    // The email of one contact with the externalId of another: 409.
    let _: Success<Upserted> = mine
        .post(
            "/contacts",
            &json!({"email": "bob@example.com", "externalId": "u-2"}),
            StatusCode::CREATED,
        )
        .await;
    let e: ErrorBody = mine
        .post(
            "/contacts",
            &json!({"email": "bob@example.com", "externalId": "u-1"}),
            StatusCode::CONFLICT,
        )
        .await;
    assert!(e.error.contains("another contact"), "{}", e.error);
    for bad in [
        json!({"externalId": "nobody"}),
        json!({"email": "not an address"}),
        json!({"email": "a@x.com", "topics": {"news": "maybe"}}),
        json!({"email": "a@x.com", "tags": "vip"}),
    ] {
        let _: ErrorBody = mine.post("/contacts", &bad, StatusCode::BAD_REQUEST).await;
    }

    let vip: Success<ContactPage> = mine.get("/contacts?tag=vip", StatusCode::OK).await;
    let ids: Vec<_> = vip.body.contacts.iter().map(|c| c.id).collect();
    assert_eq!(ids, [ann.id]);
    let bob: Success<ContactPage> = mine
        .get("/contacts?email=BOB@example.com", StatusCode::OK)
        .await;
    assert_eq!(bob.body.contacts.len(), 1);
    let all: Success<ContactPage> = mine.get("/contacts?limit=1", StatusCode::OK).await;
    assert_eq!(all.body.contacts.len(), 1);
    let none: Success<ContactPage> = theirs.get("/contacts", StatusCode::OK).await;
    assert!(
        none.body.contacts.is_empty(),
        "another workspace's contacts"
    );
    let path = format!("/contacts/{}", ann.id);
    let _: ErrorBody = theirs.get(&path, StatusCode::NOT_FOUND).await;

    let changed: Success<One> = mine
        .patch(&path, &json!({"tags": []}), StatusCode::OK)
        .await;
    assert!(changed.body.contact.tags.is_empty());
    let _: ErrorBody = mine
        .patch(
            &path,
            &json!({"email": "bob@example.com"}),
            StatusCode::CONFLICT,
        )
        .await;
    let gone: Success<Deleted> = mine.delete(&path, StatusCode::OK).await;
    assert!(gone.body.deleted);
    let _: ErrorBody = mine.get(&path, StatusCode::NOT_FOUND).await;
    let _: ErrorBody = mine.delete(&path, StatusCode::NOT_FOUND).await;
}

#[tokio::test]
async fn imports_keep_the_good_rows_and_name_the_bad_ones() {
    let (_store, client, _) = sender_router(Quotas::default()).await;
    let _: Success<Upserted> = client
        .post(
            "/contacts",
            &json!({"email": "old@example.com"}),
            StatusCode::CREATED,
        )
        .await;
    let rows = json!([
        {"email": "new@example.com", "tags": ["a"]},
        {"email": "nope"},
        {"email": "OLD@example.com", "attributes": {"plan": "pro"}},
        {"externalId": "unknown"},
        "not an object",
    ]);
    let imported: Success<Imported> = client.post("/contacts/import", &rows, StatusCode::OK).await;
    let errors: Vec<usize> = imported.body.errors.iter().map(|e| e.row).collect();
    assert_eq!((imported.body.created, imported.body.updated), (1, 1));
    assert_eq!(errors, [2, 4, 5]);

    let csv = "email,externalId,tags,topic:news,plan\n\
               csv1@example.com,c-1,x;y,subscribed,pro\n\
               csv2@example.com,,,maybe,\n\
               new@example.com,,,unsubscribed,free\n";
    let imported: Success<Imported> = client
        .clone()
        .with_header("content-type", "text/csv")
        .call(
            Method::POST,
            "/contacts/import",
            Some(csv.as_bytes().to_vec()),
            StatusCode::OK,
        )
        .await;
    assert_eq!((imported.body.created, imported.body.updated), (1, 1));
    assert_eq!(imported.body.errors.len(), 1);
    assert_eq!(imported.body.errors[0].row, 2);
    let found: Success<ContactPage> = client
        .get("/contacts?email=csv1@example.com", StatusCode::OK)
        .await;
    let c = &found.body.contacts[0];
    assert_eq!(
        (c.external_id.as_deref(), c.tags.clone()),
        (Some("c-1"), vec!["x".to_owned(), "y".to_owned()])
    );
    assert_eq!(c.attributes.0["plan"], "pro");
    let updated: Success<ContactPage> = client
        .get("/contacts?email=new@example.com", StatusCode::OK)
        .await;
    let c = &updated.body.contacts[0];
    assert_eq!(c.tags, ["a"], "an empty cell sets nothing");
    assert_eq!(c.topics.0.get("news"), Some(&Subscription::Unsubscribed));

    // Too many rows: nothing is written.
    let many: Vec<_> = (0..=sender::audience::contacts::MAX_IMPORT_ROWS)
        .map(|i| json!({"email": format!("bulk{i}@example.com")}))
        .collect();
    let _: ErrorBody = client
        .post("/contacts/import", &many, StatusCode::BAD_REQUEST)
        .await;
    let bulk: Success<ContactPage> = client
        .get("/contacts?email=bulk0@example.com", StatusCode::OK)
        .await;
    assert!(bulk.body.contacts.is_empty());
    let _: ErrorBody = client
        .clone()
        .with_header("content-type", "text/plain")
        .call(
            Method::POST,
            "/contacts/import",
            Some(b"hello".to_vec()),
            StatusCode::BAD_REQUEST,
        )
        .await;
}

/// Hostile imports stay bounded: a header of too many columns is refused whole, a row's tags
/// stop at one past the cap, an error quotes no more than the start of a cell, and rows of
/// new attributes for one contact stop at its bounds instead of growing it without end.
#[tokio::test]
async fn hostile_imports_are_bounded_and_quote_little() {
    let (_store, client, _) = sender_router(Quotas::default()).await;
    let csv = |body: String| {
        let client = client.clone().with_header("content-type", "text/csv");
        async move {
            client
                .send(Method::POST, "/contacts/import", Some(body.into_bytes()))
                .await
        }
    };
    let wide: Vec<String> = (0..300).map(|i| format!("c{i}")).collect();
    let answer = csv(format!("email,{}\nwide@example.com\n", wide.join(","))).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let long_email = "x".repeat(100_000);
    let tags = ";".repeat(2_000_000);
    let body = format!("email,tags,topic:news\n{long_email},,\nt@example.com,{tags},\nn@example.com,,{long_email}\n");
    let answer = csv(body).await;
    assert_eq!(answer.status, StatusCode::OK);
    let imported: Success<Imported> = serde_json::from_slice(&answer.body).unwrap();
    let errors: Vec<(usize, usize)> = imported
        .body
        .errors
        .iter()
        .map(|e| (e.row, e.error.len()))
        .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors.iter().all(|(_, len)| *len < 200), "{errors:?}");

    // One contact, 150 rows of 100 new attributes each: the first holds, the rest refused.
    let rows: Vec<Value> = (0..150)
        .map(|r| {
            let attributes: serde_json::Map<String, Value> =
                (0..100).map(|k| (format!("a{r}_{k}"), json!(1))).collect();
            json!({"email": "grows@example.com", "attributes": attributes})
        })
        .collect();
    let imported: Success<Imported> = client
        .post("/contacts/import", &json!(rows), StatusCode::OK)
        .await;
    assert_eq!((imported.body.created, imported.body.updated), (1, 0));
    assert_eq!(imported.body.errors.len(), 149);
    let found: Success<ContactPage> = client
        .get("/contacts?email=grows@example.com", StatusCode::OK)
        .await;
    assert_eq!(found.body.contacts[0].attributes.0.len(), 100);
}

#[tokio::test]
async fn stored_json_reads_back_whatever_its_numbers_and_text_holding_nul_is_refused() {
    let (_store, client, _) = sender_router(Quotas::default()).await;
    // Postgres writes jsonb numbers out in full (309 digits for the largest float): they
    // must read back as the numbers that went in, not fail every later read.
    let numbers = json!({"max": f64::MAX, "min": -f64::MAX, "tiny": -2.225073858507203e-309,
                         "big": 6.311553497814555e24});
    let made: Success<Upserted> = client
        .post(
            "/contacts",
            &json!({"email": "numbers@example.com", "attributes": numbers}),
            StatusCode::CREATED,
        )
        .await;
    let read: Success<One> = client
        .get(
            &format!("/contacts/{}", made.body.contact.id),
            StatusCode::OK,
        )
        .await;
    assert_eq!(
        serde_json::Value::Object(read.body.contact.attributes.0),
        numbers
    );
    let page: Success<ContactPage> = client.get("/contacts", StatusCode::OK).await;
    assert_eq!(page.body.contacts.len(), 1);
    // Neither text nor jsonb can hold a NUL: refused at the edge with a 400, not a 500.
    for (path, body) in [
        (
            "/templates",
            json!({"key": "nul", "subject": "s", "html": "a\u{0}b"}),
        ),
        (
            "/contacts",
            json!({"email": "nul@example.com", "attributes": {"a\u{0}": 1}}),
        ),
    ] {
        let refused: ErrorBody = client.post(path, &body, StatusCode::BAD_REQUEST).await;
        assert!(refused.error.contains("NUL"), "{path}: {}", refused.error);
    }
    for (kind, body) in [
        ("text/csv", b"email,city\nnul@example.com,O\0slo\n".to_vec()),
        (
            "application/json",
            br#"[{"email": "nul@example.com", "tags": ["a\u0000"]}]"#.to_vec(),
        ),
    ] {
        let refused: ErrorBody = client
            .clone()
            .with_header("content-type", kind)
            .call(
                Method::POST,
                "/contacts/import",
                Some(body),
                StatusCode::BAD_REQUEST,
            )
            .await;
        assert!(refused.error.contains("NUL"), "{kind}: {}", refused.error);
    }
    // Nor a query parameter (the API check found `?email=` with one answered 500).
    for path in ["/contacts?email=a%00b%40example.com", "/contacts?tag=a%00"] {
        let refused: ErrorBody = client.get(path, StatusCode::BAD_REQUEST).await;
        assert!(refused.error.contains("NUL"), "{path}: {}", refused.error);
    }
}
