//! What each fuzz target does with its input, one function a target: the cargo-fuzz targets
//! of `fuzz/` call them, and the test suite replays every target's seeds through them, so
//! the targets compile and their seeds pass on every `make test`.

use std::net::IpAddr;

use inbound_ingest::mime::{base_subject, Parsed};
use postmesh_shared::tracking::{Binding, HitKind, TrackingKey};
use postmesh_shared::DeliveryId;
use postmesh_shared::EmailAddress;
use sender::audience::audiences::{Audience, AudienceBody};
use sender::audience::contacts::{csv_rows, json_rows, ContactInput};
use sender::sending::raw_mime::{without_fields, RawMessage};
use sender::sending::render::{add_utm, fill};
use sender::sending::tracking::links::Instrument;
use sender::sending::tracking::Tracker;
use smtp_proto::{AUTH_LOGIN, AUTH_PLAIN};
use smtp_submission::session::auth::{self, Step};
use smtp_submission::session::data::{Budget, DataIn};
use webhook_dispatcher::content::quotes::{render, strip_html, strip_text, BodyFormat};
use webhook_dispatcher::target::{admit, is_public};

/// What a target does with one input; it panics on a finding.
pub type Body = fn(&[u8]);

/// Every target by the name `cargo fuzz list` gives it (its file in `fuzz/fuzz_targets/`).
pub const TARGETS: [(&str, Body); 11] = [
    ("audience_conditions", audience_conditions),
    ("contact_import", contact_import),
    ("html_render", html_render),
    ("link_rewrite", link_rewrite),
    ("mime_ingest", mime_ingest),
    ("quotes", quotes),
    ("raw_message", raw_message),
    ("smtp_input", smtp_input),
    ("templates", templates),
    ("tracking", tracking),
    ("webhook_url", webhook_url),
];

/// An audience's include and exclude conditions, as a request gives them.
pub fn audience_conditions(data: &[u8]) {
    if let Ok(body) = serde_json::from_slice::<AudienceBody>(data) {
        let _ = Audience::parse(&body, false);
        let _ = Audience::parse(&body, true);
    }
}

/// A contact import, as CSV and as a JSON array: rows read up to the cap, each validated.
pub fn contact_import(data: &[u8]) {
    for rows in [csv_rows(data), json_rows(data)].into_iter().flatten() {
        assert!(rows.len() <= 10_000, "more rows than the cap");
        for row in rows.into_iter().flatten() {
            let _ = ContactInput::parse(row);
        }
    }
}

/// Received HTML rendered for an inbox webhook: as text, HTML or markdown, quotes stripped
/// or not (the first byte chooses), through the dispatcher's bounded rewrite.
pub fn html_render(data: &[u8]) {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let format = match choice % 3 {
        0 => BodyFormat::Text,
        1 => BodyFormat::Html,
        _ => BodyFormat::Markdown,
    };
    let strip = choice & 4 != 0;
    let input = String::from_utf8_lossy(rest);
    let _ = render(None, Some(&input), format, strip);
    let _ = render(Some(&input), None, format, strip);
}

/// UTM link rewriting of a message's HTML: one pass, and idempotent.
pub fn link_rewrite(data: &[u8]) {
    let html = String::from_utf8_lossy(data);
    let params = vec![
        ("utm_source".to_owned(), "postmesh".to_owned()),
        ("utm_campaign".to_owned(), "fuzz & more".to_owned()),
    ];
    let once = add_utm(&html, &params);
    let twice = add_utm(&once, &params);
    assert_eq!(once, twice, "rewriting twice changed the document");
}

/// A received message as the MTA posts it: read by mail-parser within the ingest's bounds.
pub fn mime_ingest(raw: &[u8]) {
    let parsed = Parsed::of(raw);
    assert!(parsed.attachments.len() <= 100, "attachments are capped");
    assert!(parsed.references.len() <= 100, "references are capped");
    let _ = base_subject(&String::from_utf8_lossy(raw));
}

/// Quote stripping of received text and HTML: never panics, never longer than its input.
pub fn quotes(data: &[u8]) {
    let input = String::from_utf8_lossy(data);
    let (text, _) = strip_text(&input);
    assert!(text.len() <= input.len(), "stripped text grew");
    let _ = strip_html(&input);
}

/// A message an SMTP client sends, as `/send-raw` reads it: what is kept is the input with
/// its private fields taken out (and a Message-ID put before it when it had none), and
/// taking them out again changes nothing.
pub fn raw_message(data: &[u8]) {
    let from = EmailAddress::parse("fuzz@example.com").expect("an address");
    if let Ok(m) = RawMessage::parse(from, data.to_vec(), true) {
        assert!(
            m.mime.len() <= data.len() + m.message_id.len() + 16,
            "the message grew"
        );
        let private = [
            "Bcc",
            "Resent-Bcc",
            "X-Postmesh-Email-Type",
            "X-Postmesh-Topic",
            "X-Postmesh-Tags",
            "X-Postmesh-Metadata",
        ];
        assert_eq!(
            without_fields(&m.mime, &private),
            m.mime,
            "a private field is left"
        );
    }
}

/// What an SMTP client sends after DATA and within AUTH: the first byte cuts the rest into
/// reads; DATA's receiver keeps at most its limit and a read; the text as an AUTH PLAIN
/// initial response, and as LOGIN's lines.
pub fn smtp_input(data: &[u8]) {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let read = usize::from(cut % 64) + 1;
    let mut message = DataIn::new(256, Budget::new(1 << 20));
    'reads: for piece in rest.chunks(read) {
        let mut bytes = piece.iter();
        while !bytes.as_slice().is_empty() {
            if message.ingest(&mut bytes) {
                break 'reads;
            }
        }
    }
    assert!(
        message.bytes().len() <= 256 + read,
        "DATA kept past its limit"
    );
    let _ = auth::start(AUTH_PLAIN, &String::from_utf8_lossy(rest));
    if let Step::Prompt(mut login, _) = auth::start(AUTH_LOGIN, "") {
        let mut bytes = rest.iter();
        while !bytes.as_slice().is_empty() {
            match login.ingest(&mut bytes) {
                Ok(Step::Prompt(next, _)) => login = next,
                Ok(_) => break,
                Err(waiting) => login = waiting,
            }
        }
    }
}

/// Template filling: the template, then (after a NUL byte) its variables as JSON.
pub fn templates(data: &[u8]) {
    let (template, vars) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b"{}"[..]),
    };
    let template = String::from_utf8_lossy(template);
    let vars = serde_json::from_slice(vars).unwrap_or_default();
    let _ = fill(&template, &vars, true);
    let _ = fill(&template, &vars, false);
}

/// A webhook URL a customer registers: parsed and checked before any lookup; an address it
/// admits is public.
pub fn webhook_url(data: &[u8]) {
    let raw = String::from_utf8_lossy(data);
    if let Ok(url) = admit(&raw, false) {
        assert_eq!(url.scheme(), "https");
        let host = url.host_str().unwrap_or_default();
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            assert!(is_public(ip), "admitted {ip}");
        }
    }
    if let Ok(v6) = <[u8; 16]>::try_from(data) {
        let _ = is_public(IpAddr::from(v6));
    }
}

/// A message's HTML given its pixel and tracked links, and the text as a token the gateway
/// reads: no text verifies as a token unless signed, and every tracked link of the output
/// verifies to the `http(s)` destination it was made for.
pub fn tracking(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let key = TrackingKey::new("fuzz");
    let bound = Binding {
        host: "t.example",
        domain: postmesh_shared::DeliveryId::new().as_uuid(),
    };
    for kind in [HitKind::Open, HitKind::Click] {
        assert!(
            key.verify(&text, kind, None).is_none()
                && key.verify(&text, kind, Some(bound)).is_none(),
            "an unsigned token verified"
        );
    }
    let tracker = Tracker {
        key: key.clone(),
        base_url: "https://t.example".into(),
    };
    let delivery = DeliveryId::new().as_uuid();
    let out = Instrument {
        tracker: &tracker,
        bound: None,
        delivery,
        opens: true,
        clicks: true,
        unsubscribe_prefix: Some("https://u.example/unsubscribe"),
    }
    .apply(&text);
    let base = "https://t.example/t/c/";
    if text.contains(base) {
        return;
    }
    for (at, _) in out.match_indices(base) {
        let rest = &out[at + base.len()..];
        let token = &rest[..rest.find('"').unwrap_or(rest.len())];
        let claims = key
            .verify(token, HitKind::Click, None)
            .expect("a tracked link verifies");
        assert_eq!(claims.delivery, delivery);
        let url = claims.url.expect("a destination").to_ascii_lowercase();
        assert!(
            url.starts_with("http://") || url.starts_with("https://"),
            "{url}"
        );
    }
}
