//! Sender domains end to end through the gateway: plan limits from billing, the ownership
//! review (TXT record at a local authoritative DNS server, the sweep, an admin), inbound MX
//! checks, SES identities (a fake SES v2 that checks SigV4), apply-dns at a fake
//! Cloudflare, the RPCs other services use, and isolation between workspaces.

use std::time::Duration;

use billing::entitlements::EntitlementsPage;
use domain::apply_dns::{Applied, Saved};
use domain::domains::{
    Deleted, DomainList, DomainPage, DomainView, InboundStatus, OutboundStatus, Ownership,
    Submitted, TrackingStatus,
};
use domain::inbound::InboundCheck;
use domain::outbound::OutboundSetup;
use domain::ownership::{PendingList, Reviewed};
use domain::records::DnsRecord;
use domain::tracking::TrackingSetup;
use futures::StreamExt;
use postmesh_shared::error::ErrorBody;
use postmesh_shared::{Rpc, Success};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use postmesh_shared::proto::{InboundDomainRequest, SendableRequest};
use postmesh_tests::eventually;
use postmesh_tests::fake_cloudflare::FakeCloudflare;
use postmesh_tests::fake_dns::FakeDns;
use postmesh_tests::fake_ses::FakeSes;
use postmesh_tests::mta::{ingest_body, message, mta};
use postmesh_tests::{peek, DomainOptions, FakeStripe, Options, Stack, TestClient};

/// A stack whose domain service asks the fake DNS, SES and Cloudflare, and whose billing
/// sells plans through a fake Stripe.
struct World {
    stack: Stack,
    stripe: FakeStripe,
    dns: FakeDns,
    ses: FakeSes,
    cloudflare: FakeCloudflare,
}

impl World {
    async fn start() -> Self {
        let stripe = FakeStripe::start().await;
        let dns = FakeDns::start().await;
        let ses = FakeSes::start().await;
        let cloudflare = FakeCloudflare::start().await;
        let stack = Stack::start_opts(Options {
            stripe: stripe.config(),
            domain: DomainOptions {
                nameservers: vec![dns.addr],
                ses: ses.config(),
                cloudflare_api_base: cloudflare.base.clone(),
                recheck: Duration::from_secs(1),
            },
            ..Options::default()
        })
        .await;
        Self {
            stack,
            stripe,
            dns,
            ses,
            cloudflare,
        }
    }

    /// A key whose workspace has `plan`.
    async fn subscribed(&self, plan: &str) -> String {
        let key = self.stack.key(0).await;
        self.stripe.subscribe(&self.stack, &key, plan).await;
        key
    }

    fn client(&self, key: &str) -> TestClient {
        self.stack.client(key)
    }

    /// Submits `name`; the answer's domain record.
    async fn submit(&self, key: &str, name: &str) -> DomainView {
        let answer: Success<Submitted> = self.post_domain(key, name, StatusCode::OK).await;
        answer.body.domain
    }

    /// `POST /sender-domains` of `name` as `key`, answered `expected`.
    async fn post_domain<T: DeserializeOwned>(
        &self, key: &str, name: &str, expected: StatusCode,
    ) -> T {
        self.client(key)
            .post("/sender-domains", &json!({ "domain": name }), expected)
            .await
    }

    /// Submits `name` and has its TXT record verified; the domain's id.
    async fn verified(&self, key: &str, name: &str) -> String {
        let domain = self.submit(key, name).await;
        let id = domain.id.expect("a custom domain's id").to_string();
        self.dns.zone(name);
        let txt = domain.verification.expect("the TXT record to publish");
        self.dns.set_txt(&txt.name, &[txt.value.as_str()]);
        let checked: Success<Reviewed> =
            self.act(key, &id, "verify-ownership", StatusCode::OK).await;
        assert!(checked.body.verified, "{checked:?}");
        id
    }

    /// [`World::verified`], then its tracking host (`track.<name>`) set up and verified;
    /// the domain's id.
    async fn tracking_verified(&self, key: &str, name: &str) -> String {
        let id = self.verified(key, name).await;
        let _: Value = self.act(key, &id, "setup-tracking", StatusCode::OK).await;
        let host = format!("track.{name}");
        self.dns.set_cname(&host, Some("track.postmesh.localhost"));
        let checked: Success<TrackingSetup> =
            self.act(key, &id, "verify-tracking", StatusCode::OK).await;
        assert!(checked.body.ready, "{checked:?}");
        id
    }

    /// `POST /admin/sender-domains/{id}/{decision}` (`approve` or `reject`) as `key`.
    async fn review<T: DeserializeOwned>(
        &self, key: &str, id: &str, decision: &str, expected: StatusCode,
    ) -> T {
        let path = format!("/admin/sender-domains/{id}/{decision}");
        self.client(key).post(&path, &json!({}), expected).await
    }

    /// `POST /sender-domains/{id}/apply-dns` of `body` as `key`, answered `expected`.
    async fn apply_dns<T: DeserializeOwned>(
        &self, key: &str, id: &str, body: &Value, expected: StatusCode,
    ) -> T {
        let path = format!("/sender-domains/{id}/apply-dns");
        self.client(key).post(&path, body, expected).await
    }

    /// Saves `token` as the workspace's Cloudflare token (`PUT /sender-domains/dns-provider`).
    async fn save_dns_token(&self, key: &str, token: &str) {
        let body = json!({"provider": "cloudflare", "apiToken": token});
        let saved: Success<Saved> = self
            .client(key)
            .call(
                Method::PUT,
                "/sender-domains/dns-provider",
                Some(serde_json::to_vec(&body).unwrap()),
                StatusCode::OK,
            )
            .await;
        assert!(saved.body.saved);
    }

    /// `POST /sender-domains/{id}/{action}` with an empty JSON body.
    async fn act<T: DeserializeOwned>(
        &self, key: &str, id: &str, action: &str, expected: StatusCode,
    ) -> T {
        let path = format!("/sender-domains/{id}/{action}");
        self.client(key).post(&path, &json!({}), expected).await
    }
}

/// The workspace of `key`, as the gateway stores it.
async fn workspace_of(stack: &Stack, key: &str) -> String {
    let db = stack.service_db(postmesh_shared::Service::ApiGateway).await;
    peek::gateway::workspace_of(&db, stack.key_id(key).await)
        .await
        .to_string()
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}.example",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

async fn list(world: &World, key: &str, all: bool) -> DomainList {
    let path = if all {
        "/sender-domains?include_unverified=1"
    } else {
        "/sender-domains"
    };
    let list: Success<DomainList> = world.client(key).get(path, StatusCode::OK).await;
    list.body
}

fn names(domains: &[DomainView]) -> Vec<String> {
    domains.iter().map(|d| d.domain.clone()).collect()
}

/// The domain scenarios below, each with keys and names of their own, on one world (fake SES, whose outages would reach the others, keeps its own).
#[tokio::test]
async fn domains_of_one_key_each_side_by_side() {
    let mut world = World::start().await;
    tokio::join!(
        submission_needs_a_plan_a_free_slot_and_a_free_name(&world),
        ownership_is_proven_by_txt_by_the_sweep_or_by_an_admin(&world),
        inbound_is_ready_only_when_the_best_mx_is_ours(&world),
        apply_dns_creates_exactly_the_missing_records_and_never_overwrites(&world),
        a_workspace_never_sees_or_changes_anothers_domain(&world),
    );
    // After the others: one of them takes the fake Cloudflare down.
    a_verified_tracking_host_carries_its_domains_links(&world).await;
    // Alone: it slows every DNS answer.
    checks_answered_after_a_removal_leave_nothing_behind(&world).await;
    // Last: it stops the domain service.
    a_hung_domain_service_holds_a_release_pass_up_once(&mut world).await;
    world.stack.shutdown().await;
}

async fn submission_needs_a_plan_a_free_slot_and_a_free_name(world: &World) {
    // No plan: 402, whatever the name.
    let free = world.stack.key(0).await;
    let _: ErrorBody = world
        .post_domain(&free, &unique("free"), StatusCode::PAYMENT_REQUIRED)
        .await;

    let starter = world.subscribed("starter").await;
    for bad in [
        json!({}),
        json!({"domain": 5}),
        json!({"domain": ""}),
        json!({"domain": "localhost"}),
        json!({"domain": "exa_mple.com"}),
        json!({"domain": "-bad.example"}),
        json!({"domain": "10.0.0.1"}),
        json!({"domain": format!("{}.example", "a".repeat(64))}),
        // 214 characters: its DKIM records' names would be longer than DNS's 253.
        json!({"domain": format!("{0}.{0}.{0}.{1}.example", "a".repeat(63), "d".repeat(14))}),
        json!({"domain": "postmesh.localhost"}),
        json!({"domain": "team.postmesh.localhost"}),
    ] {
        let err: ErrorBody = world
            .client(&starter)
            .post("/sender-domains", &bad, StatusCode::BAD_REQUEST)
            .await;
        assert!(!err.success, "{bad}: {err:?}");
    }

    // Unicode names are stored in their ASCII form, and start pending.
    let name = format!(
        "bücher-{}.example",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let submitted: Success<Submitted> = world
        .post_domain(&starter, &name.to_uppercase(), StatusCode::OK)
        .await;
    let domain = &submitted.body.domain;
    assert!(domain.domain.starts_with("xn--"), "{domain:?}");
    assert_eq!(domain.ownership_status, Ownership::Pending);
    assert_eq!(domain.inbound_status, InboundStatus::NotStarted);
    assert_eq!(domain.outbound_status, OutboundStatus::NotStarted);
    let verification = domain.verification.as_ref().expect("a TXT record");
    assert_eq!(verification.kind, "TXT");
    assert_eq!(verification.name, format!("_postmesh.{}", domain.domain));
    let message = &submitted.body.message;
    assert!(message.contains(&verification.value), "{message}");

    // Starter allows one custom domain: the second is 403, and billing counts the one.
    let _: ErrorBody = world
        .post_domain(&starter, &unique("second"), StatusCode::FORBIDDEN)
        .await;
    let ent: Success<EntitlementsPage> = world
        .client(&starter)
        .get("/billing/entitlements", StatusCode::OK)
        .await;
    assert_eq!(ent.body.entitlements.custom_domains.used, 1);

    // The name is taken for everybody, the same workspace included.
    let pro = world.subscribed("pro").await;
    for key in [&pro, &starter] {
        let err: ErrorBody = world
            .post_domain(key, &domain.domain, StatusCode::CONFLICT)
            .await;
        assert!(!err.success);
    }

    // A name left unproven for a week is released to another workspace's submission, never
    // to its own holder's again; the holder's domain is gone.
    let db = world.stack.service_db(domain::SERVICE).await;
    let week = domain::domains::PENDING_RELEASE_SECS + 60;
    peek::domain::age(&db, &domain.domain, week, false).await;
    let _: ErrorBody = world
        .post_domain(&starter, &domain.domain, StatusCode::CONFLICT)
        .await;
    let taken: Success<Submitted> = world
        .post_domain(&pro, &domain.domain, StatusCode::OK)
        .await;
    assert_eq!(taken.body.domain.ownership_status, Ownership::Pending);
    let old = domain.id.expect("a custom domain's id");
    let _: ErrorBody = world
        .client(&starter)
        .get(&format!("/sender-domains/{old}"), StatusCode::NOT_FOUND)
        .await;
    // Proven (here: marked so), a name is never released, however old.
    peek::domain::age(&db, &domain.domain, week, true).await;
    let _: ErrorBody = world
        .post_domain(&starter, &domain.domain, StatusCode::CONFLICT)
        .await;

    // Two workspaces submitting one new name at the same moment: one wins.
    let other_pro = world.subscribed("pro").await;
    let (first, second) = (world.client(&pro), world.client(&other_pro));
    for _ in 0..3 {
        let contested = unique("race");
        let (a, b) = tokio::join!(
            first.send(
                Method::POST,
                "/sender-domains",
                Some(serde_json::to_vec(&json!({"domain": contested})).unwrap())
            ),
            second.send(
                Method::POST,
                "/sender-domains",
                Some(serde_json::to_vec(&json!({"domain": contested})).unwrap())
            ),
        );
        let mut statuses = [a.status, b.status];
        statuses.sort();
        assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT]);
    }
}

async fn ownership_is_proven_by_txt_by_the_sweep_or_by_an_admin(world: &World) {
    let key = world.subscribed("pro").await;
    let name = unique("own");
    let domain = world.submit(&key, &name).await;
    let id = domain.id.expect("an id").to_string();
    world.dns.zone(&name);

    // Pending: every setup call is 409, and the domain is not listed as sendable.
    for action in [
        "verify-inbound",
        "setup-outbound",
        "verify-outbound",
        "apply-dns",
    ] {
        let err: ErrorBody = world.act(&key, &id, action, StatusCode::CONFLICT).await;
        assert!(err.error.contains("not verified"), "{action}: {err:?}");
    }
    assert_eq!(
        names(&list(world, &key, false).await.domains),
        ["postmesh.localhost"]
    );
    let all = list(world, &key, true).await;
    assert_eq!(names(&all.domains), ["postmesh.localhost", name.as_str()]);
    assert_eq!(all.inbound_mx_host, "mx.postmesh.localhost");

    // Without the record, or with a wrong one, it stays pending.
    let checked: Success<Reviewed> = world
        .act(&key, &id, "verify-ownership", StatusCode::OK)
        .await;
    assert!(!checked.body.verified);
    world
        .dns
        .set_txt(&format!("_postmesh.{name}"), &["postmesh-verify=wrong"]);
    let checked: Success<Reviewed> = world
        .act(&key, &id, "verify-ownership", StatusCode::OK)
        .await;
    assert_eq!(checked.body.domain.ownership_status, Ownership::Pending);

    // The right token among other TXT records verifies it.
    let token = domain.verification.expect("a TXT record").value;
    world
        .dns
        .set_txt(&format!("_postmesh.{name}"), &["v=something-else", &token]);
    let checked: Success<Reviewed> = world
        .act(&key, &id, "verify-ownership", StatusCode::OK)
        .await;
    assert!(checked.body.verified, "{checked:?}");
    assert_eq!(checked.body.domain.ownership_status, Ownership::Verified);
    assert!(checked.body.domain.verified_at.unwrap() > 0);
    assert_eq!(
        names(&list(world, &key, false).await.domains),
        ["postmesh.localhost", name.as_str()]
    );

    // The sweep verifies a pending domain on its own once its record appears.
    let swept_name = unique("swept");
    let swept = world.submit(&key, &swept_name).await;
    world.dns.zone(&swept_name);
    let txt = swept.verification.expect("a TXT record");
    world.dns.set_txt(&txt.name, &[txt.value.as_str()]);
    let swept_id = swept.id.expect("an id");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let page: Success<DomainPage> = world
            .client(&key)
            .get(&format!("/sender-domains/{swept_id}"), StatusCode::OK)
            .await;
        if page.body.domain.ownership_status == Ownership::Verified {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sweep never verified it"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The admin review: members may not, admins approve or reject, a decision is final.
    let admin = world.stack.admin_key().await;
    let approved_name = unique("approved");
    let to_approve = world.submit(&key, &approved_name).await;
    let to_reject = world.submit(&key, &unique("rejected")).await;
    let ids = (
        to_approve.id.unwrap().to_string(),
        to_reject.id.unwrap().to_string(),
    );
    let (approve_id, reject_id) = (ids.0.as_str(), ids.1.as_str());
    let queue: Success<PendingList> = world
        .client(&admin)
        .get("/admin/sender-domains", StatusCode::OK)
        .await;
    assert!(
        names(&queue.body.domains).contains(&approved_name),
        "{queue:?}"
    );
    let _: ErrorBody = world
        .client(&key)
        .get("/admin/sender-domains", StatusCode::FORBIDDEN)
        .await;
    let _: ErrorBody = world
        .review(&key, approve_id, "approve", StatusCode::FORBIDDEN)
        .await;
    let approved: Success<Reviewed> = world
        .review(&admin, approve_id, "approve", StatusCode::OK)
        .await;
    assert_eq!(approved.body.domain.ownership_status, Ownership::Verified);
    let rejected: Success<Reviewed> = world
        .review(&admin, reject_id, "reject", StatusCode::OK)
        .await;
    assert_eq!(rejected.body.domain.ownership_status, Ownership::Rejected);
    let _: ErrorBody = world
        .review(&admin, reject_id, "approve", StatusCode::CONFLICT)
        .await;
    let _: ErrorBody = world
        .act(&key, reject_id, "verify-ownership", StatusCode::CONFLICT)
        .await;
    let _: ErrorBody = world
        .act(&key, reject_id, "setup-outbound", StatusCode::CONFLICT)
        .await;
    let _: ErrorBody = world
        .review(
            &admin,
            &uuid::Uuid::new_v4().to_string(),
            "approve",
            StatusCode::NOT_FOUND,
        )
        .await;
}

async fn inbound_is_ready_only_when_the_best_mx_is_ours(world: &World) {
    let key = world.subscribed("pro").await;
    let name = unique("in");
    let id = world.verified(&key, &name).await;
    let ours = "mx.postmesh.localhost";

    let cases: [(&[(u16, &str)], bool); 5] = [
        (&[], false),
        (&[(10, "mx.elsewhere.example")], false),
        (&[(5, "mx.elsewhere.example"), (10, ours)], false),
        (&[(20, "backup.elsewhere.example"), (10, ours)], true),
        (&[(10, "MX.POSTMESH.LOCALHOST")], true),
    ];
    for (records, ready) in cases {
        world.dns.set_mx(&name, records);
        let check: Success<InboundCheck> =
            world.act(&key, &id, "verify-inbound", StatusCode::OK).await;
        let check = check.body;
        assert_eq!(check.ready, ready, "{records:?}: {check:?}");
        assert_eq!(check.domain, name);
        let status = if ready {
            InboundStatus::Verified
        } else {
            InboundStatus::Pending
        };
        assert_eq!(check.inbound_status, status);
        assert_eq!(check.expected_mx.value, ours);
        assert_eq!(check.expected_mx.priority, Some(10));
        assert_eq!(check.records.len(), records.len());
        assert!(!check.message.is_empty());
        let stored: Success<DomainPage> = world
            .client(&key)
            .get(&format!("/sender-domains/{id}"), StatusCode::OK)
            .await;
        assert_eq!(stored.body.domain.inbound_status, check.inbound_status);
    }
    // The inbound service learns who receives mail for it.
    let found = world
        .stack
        .rpc(&InboundDomainRequest {
            domain: name.to_uppercase(),
        })
        .await
        .unwrap();
    assert!(found.found);
    assert_eq!(found.domain_id, id);
    // An inbox on it receives while the domain stays verified for inbound, and not after.
    let address = format!("support@{name}");
    let _: Value = world
        .client(&key)
        .post(
            "/inbox/addresses",
            &json!({ "address": address }),
            StatusCode::CREATED,
        )
        .await;
    let validate = || async {
        let answer: Value = mta(&world.stack)
            .post(
                "/inbound-email/validate",
                &json!({ "address": address }),
                StatusCode::OK,
            )
            .await;
        answer["accepted"].clone()
    };
    assert_eq!(validate().await, json!(true));
    world.dns.set_mx(&name, &[(10, "mx.elsewhere.example")]);
    let _: Success<InboundCheck> = world.act(&key, &id, "verify-inbound", StatusCode::OK).await;
    assert_eq!(
        validate().await,
        json!(false),
        "its domain no longer routes to us"
    );
    let raw = message(None, "Late", "", "late");
    let late = mta(&world.stack)
        .request(
            Method::POST,
            "/inbound-email/ingest",
            &ingest_body(&raw, &[&address]),
        )
        .await;
    assert_eq!(late.status, StatusCode::NOT_FOUND);
    let gone = world
        .stack
        .rpc(&InboundDomainRequest {
            domain: name.clone(),
        })
        .await
        .unwrap();
    assert!(!gone.found, "no longer routed to us");

    // The domain changes hands: removed by this workspace, verified by another, whose inbox
    // of the same address is made (the first one's is let go) and receives.
    let _: Value = world
        .client(&key)
        .delete(&format!("/sender-domains/{id}"), StatusCode::OK)
        .await;
    let next = world.subscribed("pro").await;
    let next_id = world.verified(&next, &name).await;
    world.dns.set_mx(&name, &[(10, ours)]);
    let check: Success<InboundCheck> = world
        .act(&next, &next_id, "verify-inbound", StatusCode::OK)
        .await;
    assert!(check.body.ready, "{check:?}");
    let _: Value = world
        .client(&next)
        .post(
            "/inbox/addresses",
            &json!({ "address": address }),
            StatusCode::CREATED,
        )
        .await;
    assert_eq!(validate().await, json!(true));
    // A platform address held by another workspace stays its own.
    let platform = format!("taken-{}@{}", &next_id[..8], postmesh_tests::INBOUND_DOMAIN);
    for (who, expected) in [(&next, StatusCode::CREATED), (&key, StatusCode::CONFLICT)] {
        let _: Value = world
            .client(who)
            .post(
                "/inbox/addresses",
                &json!({ "address": platform }),
                expected,
            )
            .await;
    }
}

fn kinds(records: &[DnsRecord]) -> Vec<&str> {
    records.iter().map(|r| r.kind.as_str()).collect()
}

#[tokio::test]
async fn outbound_creates_or_reuses_the_ses_identity_and_follows_its_status() {
    let world = World::start().await;
    let key = world.subscribed("pro").await;
    let name = unique("out");
    let id = world.verified(&key, &name).await;

    let err: ErrorBody = world
        .act(&key, &id, "verify-outbound", StatusCode::CONFLICT)
        .await;
    assert!(err.error.contains("setup-outbound"), "{err:?}");

    let setup: Success<OutboundSetup> =
        world.act(&key, &id, "setup-outbound", StatusCode::OK).await;
    let setup = setup.body;
    assert!(!setup.ready);
    assert_eq!(setup.outbound_status, OutboundStatus::Pending);
    assert_eq!(
        kinds(&setup.records),
        ["CNAME", "CNAME", "CNAME", "MX", "TXT"]
    );
    let identity = world.ses.identity(&name).expect("identity created at SES");
    assert_eq!(
        identity.mail_from.as_deref(),
        Some(format!("mail.{name}").as_str())
    );
    for (record, token) in setup.records.iter().zip(&identity.tokens) {
        assert_eq!(record.name, format!("{token}._domainkey.{name}"));
        assert_eq!(record.value, format!("{token}.dkim.amazonses.com"));
    }
    let records = &setup.records;
    assert_eq!(records[3].name, format!("mail.{name}"));
    assert_eq!(records[3].value, "feedback-smtp.eu-west-1.amazonses.com");
    assert_eq!(records[3].priority, Some(10));
    assert_eq!(records[4].value, "v=spf1 include:amazonses.com ~all");

    // Again: the same identity and records, nothing created twice.
    let creates = |w: &World| {
        w.ses
            .requests()
            .iter()
            .filter(|(m, p)| m == "POST" && p == "/v2/email/identities")
            .count()
    };
    let again: Success<OutboundSetup> =
        world.act(&key, &id, "setup-outbound", StatusCode::OK).await;
    assert_eq!(again.body.records, setup.records);
    assert_eq!(creates(&world), 1);

    // Pending until SES has seen the records, then verified.
    let pending: Success<OutboundSetup> = world
        .act(&key, &id, "verify-outbound", StatusCode::OK)
        .await;
    assert_eq!(
        (pending.body.ready, pending.body.outbound_status),
        (false, OutboundStatus::Pending)
    );
    world.ses.verify(&name);
    let verified: Success<OutboundSetup> = world
        .act(&key, &id, "verify-outbound", StatusCode::OK)
        .await;
    assert!(verified.body.ready, "{verified:?}");
    assert_eq!(verified.body.outbound_status, OutboundStatus::Verified);
    assert_eq!(verified.body.domain, name);
    let stored: Success<DomainPage> = world
        .client(&key)
        .get(&format!("/sender-domains/{id}"), StatusCode::OK)
        .await;
    assert_eq!(stored.body.domain.outbound_status, OutboundStatus::Verified);

    // SES down is 503 and SES refusing is 502; nothing stored changes.
    world.ses.set_down(true);
    for action in ["verify-outbound", "setup-outbound"] {
        let _: ErrorBody = world
            .act(&key, &id, action, StatusCode::SERVICE_UNAVAILABLE)
            .await;
    }
    world.ses.set_down(false);
    for (status, code, message, ours) in [
        (
            StatusCode::BAD_REQUEST,
            "LimitExceededException",
            "Too many identities",
            StatusCode::BAD_GATEWAY,
        ),
        (
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequestsException",
            "Rate exceeded",
            StatusCode::SERVICE_UNAVAILABLE,
        ),
    ] {
        world.ses.fail_next(status, code, message);
        let _: ErrorBody = world.act(&key, &id, "verify-outbound", ours).await;
    }
    let after: Success<DomainPage> = world
        .client(&key)
        .get(&format!("/sender-domains/{id}"), StatusCode::OK)
        .await;
    assert_eq!(after.body.domain.outbound_status, OutboundStatus::Verified);

    // A failed DKIM shows as failed.
    let failing_name = unique("dkim");
    let failing = world.verified(&key, &failing_name).await;
    let _: Success<OutboundSetup> = world
        .act(&key, &failing, "setup-outbound", StatusCode::OK)
        .await;
    world.ses.fail_dkim(&failing_name);
    let failed: Success<OutboundSetup> = world
        .act(&key, &failing, "verify-outbound", StatusCode::OK)
        .await;
    assert_eq!(failed.body.outbound_status, OutboundStatus::Failed);

    // Deleting the domain removes its SES identity and frees the name.
    let deleted: Success<Deleted> = world
        .client(&key)
        .delete(&format!("/sender-domains/{id}"), StatusCode::OK)
        .await;
    assert!(deleted.body.deleted);
    assert!(world.ses.identity(&name).is_none());
    let _: ErrorBody = world
        .client(&key)
        .get(&format!("/sender-domains/{id}"), StatusCode::NOT_FOUND)
        .await;
    world.submit(&key, &name).await;
    world.stack.shutdown().await;
}

#[tokio::test]
async fn without_ses_credentials_outbound_is_unavailable() {
    let world = World::start().await;
    // A second stack on the same fakes, but without SES credentials.
    let stack = Stack::start_opts(Options {
        stripe: world.stripe.config(),
        domain: DomainOptions {
            nameservers: vec![world.dns.addr],
            ..DomainOptions::default()
        },
        ..Options::default()
    })
    .await;
    let key = stack.key(0).await;
    world.stripe.subscribe(&stack, &key, "pro").await;
    let name = unique("noses");
    let submitted: Success<Submitted> = stack
        .client(&key)
        .post("/sender-domains", &json!({"domain": name}), StatusCode::OK)
        .await;
    let id = submitted.body.domain.id.expect("an id");
    let admin = stack.admin_key().await;
    let _: Success<Reviewed> = stack
        .client(&admin)
        .act(
            &format!("/admin/sender-domains/{id}/approve"),
            StatusCode::OK,
        )
        .await;
    let _: ErrorBody = stack
        .client(&key)
        .act(
            &format!("/sender-domains/{id}/setup-outbound"),
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .await;
    stack.shutdown().await;
    world.stack.shutdown().await;
}

async fn apply_dns_creates_exactly_the_missing_records_and_never_overwrites(world: &World) {
    let key = world.subscribed("pro").await;
    let name = unique("cf");
    let id = world.verified(&key, &name).await;
    let setup: Success<OutboundSetup> =
        world.act(&key, &id, "setup-outbound", StatusCode::OK).await;
    let wanted = setup.body.records;

    // No token anywhere, an unknown provider, a bad scope, a token no HTTP header can
    // carry: 400.
    for body in [
        json!({}),
        json!({"provider": "route53", "apiToken": "t"}),
        json!({"scope": "everything", "apiToken": "t"}),
        json!({"apiToken": "ab\ncd"}),
        json!({"apiToken": "é".repeat(10)}),
    ] {
        let err: ErrorBody = world
            .apply_dns(&key, &id, &body, StatusCode::BAD_REQUEST)
            .await;
        assert!(!err.success, "{body}");
    }
    let status = world
        .client(&key)
        .send(
            Method::POST,
            &format!("/sender-domains/{id}/apply-dns"),
            None,
        )
        .await
        .status;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an empty body has no token either"
    );
    let _: ErrorBody = world
        .client(&key)
        .call(
            Method::PUT,
            "/sender-domains/dns-provider",
            Some(
                serde_json::to_vec(&json!({"provider": "cloudflare", "apiToken": "ab\ncd"}))
                    .unwrap(),
            ),
            StatusCode::BAD_REQUEST,
        )
        .await;

    // The zone already holds one of the DKIM CNAMEs, another proxied (Cloudflare answers
    // for it with its own addresses: no CNAME is published) and another SPF at the MAIL
    // FROM name.
    let token = format!("cf-{}", uuid::Uuid::new_v4().simple());
    let zone = world.cloudflare.add_zone(&name, &token);
    world
        .cloudflare
        .add_record(&zone, "CNAME", &wanted[0].name, &wanted[0].value, None);
    world
        .cloudflare
        .add_proxied_cname(&zone, &wanted[1].name, &wanted[1].value);
    // Many other TXT records before it: the SPF is on the second page of that name's list.
    for i in 0..110 {
        let text = format!("\"site-verification={i}\"");
        let name = format!("mail.{name}");
        world
            .cloudflare
            .add_record(&zone, "TXT", &name, &text, None);
    }
    world.cloudflare.add_record(
        &zone,
        "TXT",
        &format!("mail.{name}"),
        "\"v=spf1 include:_spf.elsewhere.example ~all\"",
        None,
    );
    // A token that sees no zone for it: 400.
    let stranger = format!("cf-{}", uuid::Uuid::new_v4().simple());
    world.cloudflare.add_zone(&unique("elsewhere"), &stranger);
    let err: ErrorBody = world
        .apply_dns(
            &key,
            &id,
            &json!({"apiToken": stranger}),
            StatusCode::BAD_REQUEST,
        )
        .await;
    assert!(err.error.contains("zone"), "{err:?}");

    // The token is saved (sealed at rest) and used when the body has none.
    world.save_dns_token(&key, &token).await;
    let db = world
        .stack
        .service_db(postmesh_shared::Service::Domain)
        .await;
    let sealed = peek::domain::sealed_dns_token(&db).await;
    assert!(
        !sealed.windows(token.len()).any(|w| w == token.as_bytes()),
        "never in clear"
    );

    let applied: Success<Applied> = world
        .apply_dns(
            &key,
            &id,
            &json!({"provider": "cloudflare"}),
            StatusCode::OK,
        )
        .await;
    let applied = applied.body;
    assert_eq!(applied.zone, name);
    // Created: a CNAME, the MAIL FROM MX and the inbound MX; unchanged: the first CNAME;
    // left alone: the proxied CNAME and the SPF, reported with what is there.
    let created = kinds(&applied.created);
    assert_eq!(created, ["MX", "CNAME", "MX"], "{applied:?}");
    assert_eq!(applied.unchanged.len(), 1);
    assert_eq!(applied.unchanged[0].name, wanted[0].name);
    let conflicts = &applied.conflicts;
    assert_eq!(conflicts.len(), 2, "{conflicts:?}");
    assert_eq!(conflicts[0].record, wanted[1]);
    assert!(conflicts[0].existing[0].proxied, "{conflicts:?}");
    assert_eq!(conflicts[1].record.kind, "TXT");
    assert!(conflicts[1].existing[0].value.contains("elsewhere"));
    assert_eq!(world.cloudflare.records(&zone).len(), 3 + 110 + 3);
    let spf: Vec<_> = world
        .cloudflare
        .records(&zone)
        .into_iter()
        .filter(|r| r.kind == "TXT" && r.content.contains("v=spf1"))
        .collect();
    assert_eq!(
        spf.len(),
        1,
        "the conflicting SPF is untouched and ours not added"
    );

    // Twice is a no-op; a wrong saved token loses to the body's.
    world.save_dns_token(&key, "not-a-token").await;
    let again: Success<Applied> = world
        .apply_dns(
            &key,
            &id,
            &json!({"apiToken": token, "scope": "all"}),
            StatusCode::OK,
        )
        .await;
    assert!(again.body.created.is_empty());
    assert_eq!(again.body.unchanged.len(), 4);
    assert_eq!(world.cloudflare.records(&zone).len(), 3 + 110 + 3);
    // The saved token is now wrong: Cloudflare refuses it, which is the caller's 400.
    let _: ErrorBody = world
        .apply_dns(
            &key,
            &id,
            &json!({"scope": "inbound"}),
            StatusCode::BAD_REQUEST,
        )
        .await;
    // Cloudflare down: 503.
    world.cloudflare.set_down(true);
    let _: ErrorBody = world
        .apply_dns(
            &key,
            &id,
            &json!({"apiToken": token}),
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .await;
}

async fn a_workspace_never_sees_or_changes_anothers_domain(world: &World) {
    let owner = world.subscribed("pro").await;
    let other = world.subscribed("pro").await;
    let name = unique("mine");
    let id = world.verified(&owner, &name).await;

    assert!(!names(&list(world, &other, true).await.domains).contains(&name));
    let path = format!("/sender-domains/{id}");
    let _: ErrorBody = world.client(&other).get(&path, StatusCode::NOT_FOUND).await;
    let _: ErrorBody = world
        .client(&other)
        .call(Method::DELETE, &path, None, StatusCode::NOT_FOUND)
        .await;
    for action in [
        "verify-ownership",
        "verify-inbound",
        "setup-outbound",
        "verify-outbound",
        "apply-dns",
    ] {
        let _: ErrorBody = world.act(&other, &id, action, StatusCode::NOT_FOUND).await;
    }
    let _: ErrorBody = world
        .client(&other)
        .get("/sender-domains/not-a-uuid", StatusCode::BAD_REQUEST)
        .await;
    let _: Success<DomainPage> = world.client(&owner).get(&path, StatusCode::OK).await;

    // Sending from it: the owner may, the other may not; platform domains are for all.
    let (owner_ws, other_ws) = (
        workspace_of(&world.stack, &owner).await,
        workspace_of(&world.stack, &other).await,
    );
    let ask = |ws: &str, from: &str| SendableRequest {
        workspace_id: ws.to_owned(),
        from_address: from.to_owned(),
        outbound: false,
    };
    let mine = world
        .stack
        .rpc(&ask(&owner_ws, &format!("hello@{}", name.to_uppercase())))
        .await
        .unwrap();
    assert!(mine.sendable, "{}", mine.reason);
    assert_eq!(mine.domain, name);
    // A sender whose transport is SES needs the domain verified for outbound too.
    let through_ses = |from: &str, ws: &str| SendableRequest {
        outbound: true,
        ..ask(ws, from)
    };
    let not_yet = world
        .stack
        .rpc(&through_ses(&format!("hello@{name}"), &owner_ws))
        .await
        .unwrap();
    assert!(!not_yet.sendable);
    assert!(
        not_yet.reason.contains("not for sending"),
        "{}",
        not_yet.reason
    );
    let platform_ses = world
        .stack
        .rpc(&through_ses("news@postmesh.localhost", &owner_ws))
        .await
        .unwrap();
    assert!(platform_ses.sendable, "{}", platform_ses.reason);
    let theirs = world
        .stack
        .rpc(&ask(&other_ws, &format!("hello@{name}")))
        .await
        .unwrap();
    assert!(!theirs.sendable);
    assert!(!theirs.reason.is_empty());
    let platform = world
        .stack
        .rpc(&ask(&other_ws, "news@postmesh.localhost"))
        .await
        .unwrap();
    assert!(platform.sendable);
    let invalid = world
        .stack
        .rpc(&ask(&other_ws, "not an address"))
        .await
        .unwrap();
    assert!(!invalid.sendable);
}

#[tokio::test]
async fn the_fake_ses_refuses_what_ses_refuses() {
    use postmesh_ses::{SesClient, SesError};
    let ses = FakeSes::start().await;
    let client = |config| {
        SesClient::new(&config, Duration::from_secs(5))
            .unwrap()
            .unwrap()
    };
    let right = client(ses.config());
    assert!(matches!(
        right.get_identity("nothing.example").await,
        Err(SesError::NotFound)
    ));
    let mut wrong_secret = ses.config();
    wrong_secret.credentials = Some((
        postmesh_tests::fake_ses::ACCESS_KEY_ID.into(),
        "not-the-secret".into(),
    ));
    let mut wrong_region = ses.config();
    wrong_region.region = "us-west-2".into();
    let mut unknown_key = ses.config();
    unknown_key.credentials = Some(("AKIAUNKNOWN".into(), "x".into()));
    for (config, kind) in [
        (wrong_secret, "SignatureDoesNotMatch"),
        (wrong_region, "InvalidSignatureException"),
        (unknown_key, "UnrecognizedClientException"),
    ] {
        match client(config).get_identity("nothing.example").await {
            Err(SesError::Rejected {
                status, kind: got, ..
            }) => {
                assert_eq!((status, got.as_str()), (403, kind))
            }
            other => panic!("expected {kind}, got {other:?}"),
        }
    }
    let unsigned = reqwest::Client::new()
        .get(format!("{}/v2/email/identities/x.example", ses.base))
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        unsigned.headers()["x-amzn-errortype"],
        "MissingAuthenticationTokenException"
    );
}

/// Checks whose DNS answers come after their domain was removed: `verify-ownership` and
/// `verify-tracking` are 404s (not a 500, not a success), and the removed domain's tracking
/// host is held by no domain, so the gateway answers none of its links.
async fn checks_answered_after_a_removal_leave_nothing_behind(world: &World) {
    use postmesh_shared::tracking_hosts;

    let key = world.stack.key(10).await;
    world.stripe.subscribe(&world.stack, &key, "pro").await;
    let key = key.as_str();
    let removed = |id: String| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let path = format!("/sender-domains/{id}");
        let _: Value = world.client(key).delete(&path, StatusCode::OK).await;
    };
    let slow = Duration::from_millis(1500);

    let name = unique("race");
    let domain = world.submit(key, &name).await;
    let id = domain.id.expect("an id").to_string();
    world.dns.zone(&name);
    let txt = domain.verification.expect("the TXT record");
    world.dns.set_txt(&txt.name, &[txt.value.as_str()]);
    world.dns.set_delay(slow);
    let (_, ()): (ErrorBody, ()) = tokio::join!(
        world.act(key, &id, "verify-ownership", StatusCode::NOT_FOUND),
        removed(id.clone())
    );
    world.dns.set_delay(Duration::ZERO);

    let name = unique("race-track");
    let id = world.verified(key, &name).await;
    let _: Value = world.act(key, &id, "setup-tracking", StatusCode::OK).await;
    let host = format!("track.{name}");
    world.dns.set_cname(&host, Some("track.postmesh.localhost"));
    world.dns.set_delay(slow);
    let (_, ()): (ErrorBody, ()) = tokio::join!(
        world.act(key, &id, "verify-tracking", StatusCode::NOT_FOUND),
        removed(id.clone())
    );
    world.dns.set_delay(Duration::ZERO);
    let nats = postmesh_tests::ops_nats(&world.stack.common.nats_url)
        .await
        .unwrap();
    let js = async_nats::jetstream::new(nats);
    let hosts = tracking_hosts::ensure(&js, world.stack.ns(), 1)
        .await
        .unwrap();
    assert_eq!(hosts.get(host.as_str()).await.unwrap(), None, "{host} held");
}

/// A domain's own tracking host: `setup-tracking` answers the CNAME, `verify-tracking` finds
/// it through DNS (none, another host's, then ours), `apply-dns` writes it at the DNS host,
/// and once verified, tracked mail from the domain links through `https://track.<domain>`,
/// which the gateway answers while the domain holds the host, for that domain's links only.
async fn a_verified_tracking_host_carries_its_domains_links(world: &World) {
    let key = world.stack.key(10).await;
    world.stripe.subscribe(&world.stack, &key, "pro").await;
    let name = unique("track");
    let id = world.verified(&key, &name).await;
    let host = format!("track.{name}");
    let _: ErrorBody = world
        .act(&key, &id, "verify-tracking", StatusCode::CONFLICT)
        .await;
    let setup: Success<TrackingSetup> =
        world.act(&key, &id, "setup-tracking", StatusCode::OK).await;
    let record = DnsRecord {
        kind: "CNAME".into(),
        name: host.clone(),
        value: "track.postmesh.localhost".into(),
        priority: None,
        proxied: false,
    };
    assert_eq!(setup.body.record, record);
    assert_eq!(setup.body.tracking_status, TrackingStatus::Pending);
    let (key_ref, id_ref) = (key.as_str(), id.as_str());
    let check = |expected: bool| async move {
        let checked: Success<TrackingSetup> = world
            .act(key_ref, id_ref, "verify-tracking", StatusCode::OK)
            .await;
        assert_eq!(checked.body.ready, expected, "{checked:?}");
        checked.body
    };
    assert_eq!(check(false).await.found, None);
    world
        .dns
        .set_cname(&host, Some("tracking.elsewhere.example"));
    assert_eq!(
        check(false).await.found.as_deref(),
        Some("tracking.elsewhere.example")
    );
    world.dns.set_cname(&host, Some("TRACK.postmesh.localhost"));
    assert_eq!(check(true).await.tracking_status, TrackingStatus::Verified);

    world.cloudflare.set_down(false);
    let token = format!("cf-{}", uuid::Uuid::new_v4().simple());
    let zone = world.cloudflare.add_zone(&name, &token);
    // Another apply-dns (a retry, say) makes the record just before this one's create: it is
    // there, unchanged, not a 502.
    world.cloudflare.beat_next_creates(1);
    let applied: Success<Applied> = world
        .apply_dns(
            &key,
            &id,
            &json!({"scope": "tracking", "apiToken": token}),
            StatusCode::OK,
        )
        .await;
    assert!(applied.body.created.is_empty(), "{:?}", applied.body);
    assert_eq!(applied.body.unchanged, [record]);
    assert_eq!(world.cloudflare.records(&zone).len(), 1);

    let to = format!(
        "reader-{}@example.com",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let from = json!({ "fromEmail": format!("news@{name}") });
    send_tracked(world, &key, &to, from.clone()).await;
    let own_path = tracked_path(world, &to, &format!("https://{host}")).await;
    // The gateway answers the tracking path on the domain's own host, and there only: not
    // on another domain's (whose brand it would lend), nor on the shared host.
    let asked = |path: String, host: Option<String>| async move {
        let mut get = postmesh_tests::no_redirects().get(format!("{}{path}", world.stack.base));
        if let Some(host) = host {
            get = get.header("host", host);
        }
        get.send().await.unwrap()
    };
    let answer = asked(own_path.clone(), Some(host.to_uppercase())).await;
    assert_eq!(answer.status(), StatusCode::FOUND);
    assert_eq!(answer.headers()["location"], "https://example.com/x");
    let other = format!("track.{}", unique("other"));
    for elsewhere in [Some(other.clone()), None] {
        let answer = asked(own_path.clone(), elsewhere.clone()).await;
        assert_eq!(answer.status(), StatusCode::NOT_FOUND, "on {elsewhere:?}");
    }
    // Nor does a link of the shared host redirect on the domain's.
    let shared_to = format!("shared-{to}");
    send_tracked(world, &key, &shared_to, json!({})).await;
    let path = tracked_path(world, &shared_to, &world.stack.base).await;
    assert_eq!(asked(path.clone(), None).await.status(), StatusCode::FOUND);
    for custom in [host.clone(), other] {
        let answer = asked(path.clone(), Some(custom.clone())).await;
        assert_eq!(answer.status(), StatusCode::NOT_FOUND, "on {custom}");
    }

    // The CNAME removed, the sweep finds it gone: the host is pending again and the
    // domain's mail links through the shared host, a send scheduled before among it.
    let scheduled_to = format!("scheduled-{to}");
    let mut scheduled = from.clone();
    scheduled["scheduledAt"] = json!(postmesh_shared::db::now_unix() + 8);
    send_tracked(world, &key, &scheduled_to, scheduled).await;
    world.dns.set_cname(&host, None);
    let swept = |expected: TrackingStatus| async move {
        eventually(Duration::from_secs(15), || async {
            let page: Success<DomainPage> = world
                .client(key_ref)
                .get(&format!("/sender-domains/{id_ref}"), StatusCode::OK)
                .await;
            let status = page.body.domain.tracking_status;
            (status == expected).then_some(()).ok_or(status)
        })
        .await
    };
    swept(TrackingStatus::Pending).await;
    let later_to = format!("later-{to}");
    send_tracked(world, &key, &later_to, from.clone()).await;
    for to in [later_to, scheduled_to] {
        tracked_path(world, &to, &world.stack.base).await;
    }
    // The host answers as the gateway last heard: pending, none of its links; verified
    // again by the sweep, the domain's links again; the domain removed, none.
    let (asked, on) = (&asked, host.as_str());
    let answers = |path: String, expected: StatusCode| async move {
        eventually(Duration::from_secs(10), || async {
            let status = asked(path.clone(), Some(on.to_owned())).await.status();
            (status == expected).then_some(()).ok_or(status)
        })
        .await
    };
    answers(own_path.clone(), StatusCode::NOT_FOUND).await;
    world.dns.set_cname(&host, Some("track.postmesh.localhost"));
    swept(TrackingStatus::Verified).await;
    answers(own_path.clone(), StatusCode::FOUND).await;
    let _: Value = world
        .client(&key)
        .delete(&format!("/sender-domains/{id}"), StatusCode::OK)
        .await;
    answers(own_path.clone(), StatusCode::NOT_FOUND).await;
    // Another workspace adds the name and verifies its tracking host: its links answer
    // there, the first workspace's never again.
    let next = world.stack.key(10).await;
    world.stripe.subscribe(&world.stack, &next, "pro").await;
    world.tracking_verified(&next, &name).await;
    let next_to = format!("next-{to}");
    send_tracked(world, &next, &next_to, from).await;
    let next_path = tracked_path(world, &next_to, &format!("https://{host}")).await;
    answers(next_path, StatusCode::FOUND).await;
    assert_eq!(
        asked(own_path, Some(host.clone())).await.status(),
        StatusCode::NOT_FOUND
    );
}

/// Scheduled tracked sends from three domains released while the domain service hangs:
/// the pass asks it once, not once a send, and each goes out through the tracking host
/// stored at acceptance.
async fn a_hung_domain_service_holds_a_release_pass_up_once(world: &mut World) {
    let key = world.stack.key(10).await;
    world.stripe.subscribe(&world.stack, &key, "pro").await;
    // Due once the domain service has stopped (a second or so), with time to spare.
    let at = postmesh_shared::db::now_unix() + 8;
    let mut sent = Vec::new();
    for _ in 0..3 {
        let name = unique("hung");
        world.tracking_verified(&key, &name).await;
        let to = format!("hung-{}@example.com", uuid::Uuid::new_v4().simple());
        let body = json!({ "fromEmail": format!("news@{name}"), "scheduledAt": at });
        send_tracked(world, &key, &to, body).await;
        sent.push((to, format!("https://track.{name}")));
    }
    let nats = postmesh_tests::ops_nats(&world.stack.common.nats_url)
        .await
        .expect("nats");
    let subject = SendableRequest::rpc_subject(world.stack.ns());
    let mut hung = nats.subscribe(subject.clone()).await.expect("subscribe");
    nats.flush().await.expect("flush");
    world.stack.stop_domain().await;
    assert!(
        postmesh_shared::db::now_unix() < at,
        "stopped after the sends were due"
    );
    for (to, base) in &sent {
        tracked_path(world, to, base).await;
    }
    // Every ask came before the deliveries; a marker published after them arrives last.
    nats.publish(subject, "marker".into())
        .await
        .expect("marker");
    let mut asks = 0;
    while hung.next().await.expect("the marker").payload != "marker" {
        asks += 1;
    }
    assert_eq!(asks, 1, "asks of the hung domain service");
}

/// Sends `to` a tracked link to `https://example.com/x`, the body's other fields `extra`.
async fn send_tracked(world: &World, key: &str, to: &str, mut extra: Value) {
    extra["to"] = json!(to);
    extra["subject"] = json!("Hi");
    extra["html"] = json!("<a href=\"https://example.com/x\">x</a>");
    extra["trackClicks"] = json!(true);
    let _: Value = world
        .client(key)
        .post("/send-email", &extra, StatusCode::OK)
        .await;
}

/// The path (`/t/c/…`) of the tracked link in the message delivered to `to`, which must
/// point at `base`.
async fn tracked_path(world: &World, to: &str, base: &str) -> String {
    let eml = world
        .stack
        .wait_for_messages(to, 1, Duration::from_secs(30))
        .await;
    let html = postmesh_tests::html_part(&eml[0]);
    let prefix = format!("{base}/t/c/");
    let at = html
        .find(&prefix)
        .unwrap_or_else(|| panic!("no link on {base} to {to}: {html}"));
    let path = &html[at + base.len()..];
    path[..path.find('"').expect("a quoted link")].to_owned()
}
