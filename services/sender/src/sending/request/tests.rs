use super::*;

fn parse(v: Value) -> Result<SendRequest, String> {
    let body: SendBody = serde_json::from_value(v).map_err(|e| e.to_string())?;
    SendRequest::parse(body, 1_000_000).map_err(|e| e.to_string())
}

#[test]
fn recipients_are_deduplicated_without_regard_to_case() {
    let r = parse(serde_json::json!({
        "to": ["a@x.com", {"email": "A@X.com", "externalId": "c1"}, {"email": "b@x.com", "externalId": "c2"}],
        "subject": "s", "text": "t"
    }))
    .unwrap();
    assert_eq!(r.recipients.len(), 2);
    assert_eq!(r.recipients[1].external_id.as_deref(), Some("c2"));
    assert_eq!(r.rejected.len(), 1);
    assert_eq!(r.rejected[0].email, "A@x.com");
}

#[test]
fn refusals_name_what_is_wrong() {
    let cases = [
        (
            serde_json::json!({"subject": "s", "text": "t"}),
            "exactly one",
        ),
        (
            serde_json::json!({"to": "a@x.com", "campaignKey": "k", "subject": "s", "text": "t"}),
            "only one",
        ),
        (
            serde_json::json!({"to": ["a@x.com", "nope"], "subject": "s", "text": "t"}),
            "\"nope\"",
        ),
        (
            serde_json::json!({"to": "a@x.com", "subject": "s"}),
            "no content",
        ),
        (serde_json::json!({"to": "a@x.com", "text": "t"}), "subject"),
        (
            serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t", "scheduledAt": 999_999}),
            "future",
        ),
        (
            serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t", "scheduledAt": 1_000_000 + 31 * 86400}),
            "30 days",
        ),
        (
            serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t", "scheduledAt": 1_000_100.5}),
            "whole",
        ),
        (
            serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t", "attachments": [{"filename": "a.txt", "content": "%%%"}]}),
            "base64",
        ),
        (
            serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t", "attachments": [{"content": "aGk="}]}),
            "no filename",
        ),
        (
            serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t", "emailType": "spam"}),
            "emailType",
        ),
        (
            serde_json::json!({"to": "a@x.com", "subject": "a\r\nBcc: x@y.com", "text": "t"}),
            "single line",
        ),
        (
            serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t", "messageId": "no-at"}),
            "message id",
        ),
        (
            serde_json::json!({"to": "a@x.com", "templateKey": "k", "html": "<p>"}),
            "not both",
        ),
    ];
    for (body, needle) in cases {
        let err = parse(body.clone()).err().unwrap_or_default();
        assert!(err.contains(needle), "{body} → {err:?}, wanted {needle:?}");
    }
    let many: Vec<String> = (0..=MAX_RECIPIENTS)
        .map(|i| format!("r{i}@x.com"))
        .collect();
    let err = parse(serde_json::json!({"to": many, "subject": "s", "text": "t"})).unwrap_err();
    assert!(err.contains("at most 1000"), "{err}");
}

#[test]
fn header_texts_are_counted_in_characters_as_documented() {
    // 998 two-byte characters: within the documented `maxLength`, so taken.
    let at_limit = "é".repeat(MAX_HEADER_LEN);
    let r = parse(serde_json::json!({"to": "a@x.com", "subject": at_limit.clone(), "text": "t"}))
        .unwrap();
    assert!(matches!(r.content, Content::Inline { subject, .. } if subject == at_limit));
    let over = "é".repeat(MAX_HEADER_LEN + 1);
    let e = parse(serde_json::json!({"to": "a@x.com", "subject": over, "text": "t"})).unwrap_err();
    assert!(e.contains("longer than 998 characters"), "{e}");
}

#[test]
fn caps_and_exclusions_are_checked() {
    let send = |extra: Value| {
        let mut body = serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        parse(body)
    };
    let r = send(serde_json::json!({"frequencyCapDays": 7, "frequencyCapMax": 2, "topic": "news", "topicExclusionDays": 3})).unwrap();
    assert_eq!(
        (r.frequency_cap, r.topic_exclusion_days),
        (Some((7, 2)), Some(3))
    );
    for (extra, needle) in [
        (serde_json::json!({"frequencyCapDays": 7}), "together"),
        (
            serde_json::json!({"frequencyCapDays": 0, "frequencyCapMax": 1}),
            "frequencyCapDays",
        ),
        (
            serde_json::json!({"frequencyCapDays": 2, "frequencyCapMax": 1.5}),
            "frequencyCapMax",
        ),
        (
            serde_json::json!({"topicExclusionDays": 3}),
            "needs a topic",
        ),
        (
            serde_json::json!({"topic": "t", "topicExclusionDays": 400}),
            "topicExclusionDays",
        ),
    ] {
        let err = send(extra.clone()).err().unwrap_or_default();
        assert!(err.contains(needle), "{extra} → {err:?}");
    }
}

#[test]
fn a_message_goes_to_fifty_addresses_at_most() {
    let copies = |n: usize| (0..n).map(|i| format!("c{i}@x.com")).collect::<Vec<_>>();
    let body = |cc: usize, bcc: usize| serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t", "cc": copies(cc), "bcc": copies(bcc)});
    assert_eq!(parse(body(40, 9)).unwrap().cc.len(), 40);
    let err = parse(body(40, 10)).unwrap_err();
    assert!(err.contains("together"), "{err}");
}

#[test]
fn copies_go_only_with_transactional_mail() {
    let body = |kind: &str, copy: &str| serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t", "emailType": kind, copy: "c@x.com"});
    assert_eq!(parse(body("transactional", "cc")).unwrap().cc.len(), 1);
    for kind in ["lifecycle", "marketing"] {
        for copy in ["cc", "bcc"] {
            let err = parse(body(kind, copy)).unwrap_err();
            assert!(
                err.contains("only with transactional"),
                "{kind} {copy}: {err}"
            );
        }
    }
}

#[test]
fn filenames_are_counted_in_characters_as_documented() {
    let with = |name: String| {
        serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t",
        "attachments": [{"filename": name, "content": "aGk="}]})
    };
    // 255 two-byte characters: within the documented `maxLength`, so taken.
    let at_limit = "é".repeat(255);
    assert_eq!(
        parse(with(at_limit.clone())).unwrap().attachments[0].filename,
        at_limit
    );
    let e = parse(with("é".repeat(256))).unwrap_err();
    assert!(e.contains("at most 255 characters"), "{e}");
}

#[test]
fn attachments_are_bounded_by_their_decoded_size() {
    let chunk = base64::engine::general_purpose::STANDARD.encode(vec![0u8; 5 * 1024 * 1024]);
    let ok = parse(serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t",
        "attachments": [{"filename": "a.bin", "content": chunk}, {"filename": "b.bin", "content": chunk, "contentType": "application/pdf"}]}))
    .unwrap();
    assert_eq!(ok.attachments[1].content_type, "application/pdf");
    let err = parse(serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t",
        "attachments": [{"filename": "a.bin", "content": chunk}, {"filename": "b.bin", "content": chunk}, {"filename": "c.bin", "content": "AA=="}]}))
    .unwrap_err();
    assert!(err.contains("10 MiB"), "{err}");
}

#[test]
fn message_ids_and_utm_are_normalised() {
    let r = parse(serde_json::json!({"to": "a@x.com", "subject": "s", "text": "t",
        "messageId": "abc@example.com", "inReplyTo": "<p@x.com>", "references": ["r1@x.com", "<r2@x.com>"],
        "utm": {"source": "news", "utm_medium": "email"}, "unknownField": {"any": 1}}))
    .unwrap();
    assert_eq!(r.message_id.as_deref(), Some("<abc@example.com>"));
    assert_eq!(r.references, ["<r1@x.com>", "<r2@x.com>"]);
    assert_eq!(
        r.utm,
        [
            ("utm_source".to_owned(), "news".to_owned()),
            ("utm_medium".to_owned(), "email".to_owned())
        ]
    );
}
