//! `make soak`: the whole platform under faults. Every service runs as its own process in a
//! fresh namespace; a steady load of sends (over the API and over SMTP), deducts, code sends
//! and checks, and inbound messages (each delivered to two webhook receivers) runs while each
//! service in turn is
//! killed with SIGKILL and started again, then PostgreSQL, Redis and NATS are restarted
//! once each (`deploy/restart-dep.sh`). Afterwards it prints and asserts:
//!
//! - every request answered 2xx, except 502/503 (or no connection, while the gateway
//!   itself is down) inside an outage window: from the fault until the part is back and
//!   `SOAK_SETTLE_MS` (default 3000) have passed;
//! - every send (retried under its `Idempotency-Key`, or over SMTP its Message-ID, until
//!   answered) stored once, answered with its task, and delivered exactly once (one that
//!   is not delivered is traced: its task, its SEND job's outbox row and sequences, its
//!   delivery row and events, and the SEND consumer's state);
//! - every charge matched to its work: one live charge per stored send at its cost, one per
//!   deduct key, at most one per code address and only for one that got its email, nothing
//!   left on hold, and the balance equal to the grant less the live charges;
//! - every accepted inbound message stored once and delivered to each endpoint, under one
//!   `webhook-id` per endpoint (one that is not is traced: its outbox row, its INBOUND
//!   sequences, the dispatcher's record of it and the INBOUND consumer's state).
//!
//! With `REPLICAS=2`, every service runs as two processes (the load alternating between the
//! two gateways) and each process is killed in turn while its twin runs. With
//! `NATS_CLUSTER=3`, the services use a local three-node NATS cluster
//! (`deploy/nats-cluster.sh`) with every stream at three replicas, and instead of one NATS
//! restart the node leading JetStream's meta group is killed and started again, then the
//! node leading the SEND stream; then node 3 is cut off from the other two and from every
//! client for 10 s (a network namespace of its own, `deploy/nats-cluster.sh partition`).
//!
//! Settings: `SOAK_CALM_MS` (load between faults, default 5000; CI runs 2000), `SOAK_SETTLE_MS`,
//! `SOAK_DEPS` (`0` skips the dependency restarts, for machines where they are not ours),
//! `REPLICAS` (1 or more, default 1), `NATS_CLUSTER` (1 or 3, default 1).

mod trace;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use postmesh_shared::jetstream::Stream;
use postmesh_shared::{Common, Service};
use postmesh_tests::cluster::{
    deploy_script, nats_cluster, nats_cluster_can_partition, ClusterGuard,
};
use postmesh_tests::receiver::Receiver;
use postmesh_tests::{
    billing_config, common, dispatcher_config, domain_config, extract_code, free_port,
    fresh_namespace, gateway_config, inbound_config, mta, spawn_service_to, DomainOptions, Options,
    Stack, INBOUND_DOMAIN, INBOUND_SECRET,
};

/// Credits granted to the soak's key.
const GRANT: i64 = 1_000_000;

/// One service as a child process: its settings, to start it again.
struct Proc {
    service: Service,
    env: Vec<(&'static str, String)>,
    admin: SocketAddr,
    /// The SMTP listener of an smtp-submission process.
    smtp: Option<SocketAddr>,
    child: Option<tokio::process::Child>,
}

/// What one request got: its status, or no answer at all.
#[derive(Clone, Debug)]
enum Outcome {
    Status(u16),
    Unreachable(String),
}

/// Every request of the load: which operation, when it was sent and answered, and how.
#[derive(Default)]
struct Journal {
    calls: Vec<(&'static str, Instant, Instant, Outcome)>,
    /// Work answered 2xx whose result never showed.
    lost: Vec<String>,
}

/// A fault: what was down, from when until it was back plus the settle time.
struct Window {
    part: String,
    from: Instant,
    to: Instant,
}

type Shared<T> = Arc<Mutex<T>>;

/// A ledger row of the soak's key: idempotency key, kind, delta, hold, whether it was
/// refunded, and the address it was for.
type Entry = (String, String, i64, Option<i64>, bool, Option<String>);

#[tokio::main]
async fn main() {
    let settle = Duration::from_millis(env_u64("SOAK_SETTLE_MS", 3000));
    let calm = Duration::from_millis(env_u64("SOAK_CALM_MS", 5000));
    let with_deps = std::env::var("SOAK_DEPS").map_or(true, |v| v != "0");
    let replicas = env_u64("REPLICAS", 1).max(1) as usize;
    let cluster = env_u64("NATS_CLUSTER", 1);
    assert!(matches!(cluster, 1 | 3), "NATS_CLUSTER is 1 or 3");

    let _ = std::fs::remove_dir_all(logs());
    std::fs::create_dir_all(logs()).expect("var/soak");
    let mut common = common(fresh_namespace());
    let cluster_guard = if cluster == 3 {
        Some(ClusterGuard::start().await)
    } else {
        None
    };
    if let Some(guard) = &cluster_guard {
        common.nats_url = guard.url.clone();
        common.stream_replicas = 3;
    }
    let ports = Ports::default();
    let gateways: Vec<SocketAddr> = (0..replicas).map(|_| ports.fresh()).collect();
    let bases: Vec<String> = gateways.iter().map(|a| format!("http://{a}")).collect();
    let stack = Stack::attach(common.clone(), bases[0].clone());
    let mut procs = fleet(&common, &stack, &gateways, &ports);
    for p in &mut procs {
        start(p, &stack).await;
    }
    eprintln!(
        "soak: seven services up, {replicas} process(es) each, in namespace {:?} on {}",
        common.namespace, common.nats_url
    );
    if cluster == 3 {
        replicated(&stack, &common).await;
    }

    let key = stack.key(GRANT).await;
    let receivers = [Receiver::start().await, Receiver::start().await];
    let inbox = format!("soak@{INBOUND_DOMAIN}");
    let address_id = mta::inbox(&stack, &key, "soak").await;
    for r in &receivers {
        let made: Value = stack
            .client(&key)
            .post(
                "/inbox/webhook/endpoints",
                &json!({ "addressId": address_id.to_string(), "url": r.url("/hook") }),
                reqwest::StatusCode::CREATED,
            )
            .await;
        r.trust(made["signingSecret"].as_str().expect("secret"));
    }

    let journal: Shared<Journal> = Shared::default();
    let stop = Arc::new(AtomicBool::new(false));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let load = Load {
        http,
        bases: Arc::new(bases),
        turn: Arc::default(),
        key: key.clone(),
        journal: journal.clone(),
        stop: stop.clone(),
    };
    let accepted_sends: Shared<Vec<String>> = Shared::default();
    let deduct_keys: Shared<Vec<String>> = Shared::default();
    let accepted_inbound: Shared<Vec<String>> = Shared::default();
    let outbox = stack.outbox().to_owned();
    let smtp: Vec<SocketAddr> = procs.iter().filter_map(|p| p.smtp).collect();
    let user = stack.account_email(&key).await;
    let (click_paths, clicked, task) = tracked_links(&stack, &key, &outbox).await;
    accepted_sends.lock().expect("sends").push(task);
    let clicks: Shared<(usize, usize)> = Shared::default();
    let tasks = vec![
        tokio::spawn(load.clone().clicks(click_paths, clicks.clone())),
        tokio::spawn(load.clone().smtp_sends(smtp, user, accepted_sends.clone())),
        tokio::spawn(load.clone().sends("a", accepted_sends.clone())),
        tokio::spawn(load.clone().sends("b", accepted_sends.clone())),
        tokio::spawn(load.clone().deducts(deduct_keys.clone())),
        tokio::spawn(load.clone().codes(outbox.clone())),
        tokio::spawn(
            load.clone()
                .ingests(inbox.clone(), accepted_inbound.clone()),
        ),
    ];

    let began = Instant::now();
    let mut windows = Vec::new();
    tokio::time::sleep(calm).await;
    for p in &mut procs {
        let from = Instant::now();
        p.child
            .take()
            .expect("running")
            .kill()
            .await
            .expect("SIGKILL");
        tokio::time::sleep(Duration::from_millis(500)).await;
        start(p, &stack).await;
        eprintln!(
            "soak: {} killed and back in {:?}",
            p.service.name(),
            from.elapsed()
        );
        windows.push(Window {
            part: p.service.name().into(),
            from,
            to: Instant::now() + settle,
        });
        tokio::time::sleep(calm.max(settle)).await;
    }
    if cluster == 3 {
        for leading in ["meta", "SEND"] {
            let node = leader(&stack, &common, leading).await;
            let from = Instant::now();
            nats_cluster(&["stop-node", &node]).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            nats_cluster(&["start-node", &node]).await;
            eprintln!(
                "soak: NATS node {node}, the {leading} leader, killed and back in {:?}",
                from.elapsed()
            );
            windows.push(Window {
                part: format!("nats {leading} leader"),
                from,
                to: Instant::now() + settle,
            });
            tokio::time::sleep(calm.max(settle)).await;
        }
        if nats_cluster_can_partition().await {
            let from = Instant::now();
            nats_cluster(&["partition", "10"]).await;
            eprintln!(
                "soak: NATS node 3 cut off from the others and every client, healed after {:?}",
                from.elapsed()
            );
            windows.push(Window {
                part: "nats partition".into(),
                from,
                to: Instant::now() + settle,
            });
            tokio::time::sleep(calm.max(settle)).await;
        } else {
            eprintln!("soak: no network namespace for node 3 here (needs root): the partition is left out");
        }
    }
    if with_deps {
        let nats = if cluster == 3 { None } else { Some("nats") };
        for dep in ["postgres", "redis"].into_iter().chain(nats) {
            let from = Instant::now();
            let status = deploy_script("restart-dep.sh", &[dep])
                .status()
                .await
                .expect("restart-dep.sh runs");
            assert!(status.success(), "{dep} restarted");
            windows.push(Window {
                part: dep.into(),
                from,
                to: Instant::now() + settle,
            });
            tokio::time::sleep(calm.max(settle)).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("load task");
    }
    let loaded = began.elapsed();
    eprintln!("soak: load stopped after {loaded:?}; draining");

    let report = Report {
        stack: &stack,
        key: &key,
        windows: &windows,
    };
    let mut failures = Vec::new();
    failures.extend(report.answers(&journal.lock().expect("journal")));
    // The load has stopped: what it wrote down is final.
    let taken = |list: &Shared<Vec<String>>| std::mem::take(&mut *list.lock().expect("list"));
    let (accepted_sends, deduct_keys) = (taken(&accepted_sends), taken(&deduct_keys));
    let accepted_inbound = taken(&accepted_inbound);
    failures.extend(report.sends(&accepted_sends).await);
    failures.extend(report.charges(&deduct_keys, &outbox).await);
    failures.extend(report.inbound(&accepted_inbound, &receivers).await);
    let clicks = *clicks.lock().expect("clicks");
    failures.extend(report.clicks(&clicked, clicks).await);
    for mut p in procs {
        if let Some(mut child) = p.child.take() {
            let _ = child.kill().await;
        }
    }
    stack.shutdown().await;
    drop(cluster_guard); // before a failure's exit, which runs no destructor
    eprintln!(
        "soak: JetStream answered {} publishes as duplicates of sequence 0 (not stored: published again)",
        unstored_answers()
    );
    eprintln!("soak: the services' logs are in var/soak/");
    if failures.is_empty() {
        eprintln!("soak: every count held");
    } else {
        for f in failures.iter().take(30) {
            eprintln!("soak: FAILED: {f}");
        }
        eprintln!("soak: {} checks failed", failures.len());
        std::process::exit(1);
    }
}

/// Fails the soak unless every stream of the namespace has the replicas the services were
/// given.
async fn replicated(stack: &Stack, common: &Common) {
    let js = stack.jetstream().await;
    for stream in Stream::ALL {
        let name = stream.name(&common.namespace);
        let mut found = js.get_stream(&name).await.expect("the stream");
        let info = found.info().await.expect("stream info");
        assert_eq!(
            info.config.num_replicas, common.stream_replicas,
            "{name}'s replicas"
        );
        let cluster = info.cluster.as_ref().expect("a clustered stream");
        assert_eq!(
            1 + cluster.replicas.len(),
            common.stream_replicas,
            "{name}'s peers: {cluster:?}"
        );
    }
    eprintln!("soak: every stream has {} replicas", common.stream_replicas);
}

/// The node (`1`-`3`) leading JetStream's `meta` group, or the stream named `leading`;
/// asked again while the cluster is still electing after the last fault (up to 60 s).
async fn leader(stack: &Stack, common: &Common, leading: &str) -> String {
    let js = stack.jetstream().await;
    let name = until(Duration::from_secs(60), || {
        let js = js.clone();
        let stream = Stream::Send.name(&common.namespace);
        async move {
            let found = if leading == "meta" {
                // What the monitoring endpoint of node 1 reports (every node is up here).
                let jsz: Value = reqwest::get("http://127.0.0.1:8231/jsz")
                    .await
                    .map_err(|e| format!("/jsz: {e}"))?
                    .json()
                    .await
                    .map_err(|e| format!("/jsz: {e}"))?;
                jsz["meta_cluster"]["leader"].as_str().map(str::to_owned)
            } else {
                let mut stream = js
                    .get_stream(stream)
                    .await
                    .map_err(|e| format!("SEND: {e}"))?;
                let info = stream.info().await.map_err(|e| format!("SEND: {e}"))?;
                info.cluster.as_ref().and_then(|c| c.leader.clone())
            };
            found.ok_or_else(|| format!("no {leading} leader yet"))
        }
    })
    .await
    .expect("a leader");
    name.trim_start_matches('n').to_owned()
}

/// The seven services' settings, in start order (the gateways at `gateways`, then the SMTP
/// service, each process of which uses one of them), each service as many times as there
/// are gateways.
fn fleet(common: &Common, stack: &Stack, gateways: &[SocketAddr], ports: &Ports) -> Vec<Proc> {
    let opts = Options::default();
    let mut dispatcher = dispatcher_config(common);
    dispatcher.delivery.retry_schedule = [1, 2, 5, 10, 20]
        .into_iter()
        .map(Duration::from_secs)
        .collect();
    let backends = [
        (
            billing::SERVICE,
            billing_config(common, opts.stripe).to_env(),
        ),
        (
            domain::SERVICE,
            domain_config(common, DomainOptions::default()).to_env(),
        ),
        (inbound_ingest::SERVICE, inbound_config(common).to_env()),
        (webhook_dispatcher::SERVICE, dispatcher.to_env()),
        (sender::SERVICE, stack.sender_config().to_env()),
    ];
    let gateways = gateways.iter().map(|addr| {
        let config = api_gateway::Config {
            http_addr: *addr,
            public_base_url: format!("http://{addr}"),
            ..gateway_config(common, opts.rate)
        };
        (api_gateway::SERVICE, config.to_env())
    });
    let smtp = gateways.clone().map(|(_, env)| {
        let gateway = env.iter().find(|(name, _)| *name == "GATEWAY_ADDR");
        let listen = ports.fresh();
        let config = smtp_submission::Config {
            common: common.clone(),
            listen,
            tls_listen: None,
            tls: None,
            allow_plaintext_auth: true,
            max_message_bytes: 1 << 20,
            api_url: format!("http://{}", gateway.expect("the gateway's address").1),
            hostname: "soak.postmesh.test".into(),
            max_connections_per_ip: 100,
            max_connections: 1000,
            idle_timeout: Duration::from_secs(30),
            max_commands: 1_000_000,
            auth_failures: 10,
            auth_failure_window: Duration::from_secs(600),
            message_memory: smtp_submission::settings::SMTP_MESSAGE_MEMORY_BYTES.default_of(),
        };
        (smtp_submission::SERVICE, config.to_env())
    });
    let replicas = gateways.len();
    backends
        .into_iter()
        .flat_map(|backend| std::iter::repeat_n(backend, replicas))
        .chain(gateways)
        .chain(smtp)
        .map(|(service, mut env)| {
            let admin = ports.fresh();
            env.retain(|(name, _)| *name != "ADMIN_ADDR");
            env.push(("ADMIN_ADDR", admin.to_string()));
            env.push(("RUST_LOG", "info".into()));
            let smtp = env
                .iter()
                .find(|(name, _)| *name == "SMTP_LISTEN")
                .and_then(|(_, addr)| addr.parse().ok());
            Proc {
                service,
                env,
                admin,
                smtp,
                child: None,
            }
        })
        .collect()
}

/// The ports handed to the soak's processes: a free port is free only until it is released,
/// so one handed out earlier (and not yet bound by its process) may come back; each is given
/// once.
#[derive(Default)]
struct Ports(Mutex<HashSet<u16>>);

impl Ports {
    /// A free port no process of the soak was given.
    fn fresh(&self) -> SocketAddr {
        loop {
            let addr = free_port();
            if self.0.lock().expect("ports").insert(addr.port()) {
                return addr;
            }
        }
    }
}

/// Where the services' log lines go: `var/soak/<service>.log`.
fn logs() -> std::path::PathBuf {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../var/soak")).to_owned()
}

/// How many publishes the services' logs say JetStream answered as duplicates of sequence 0
/// (`jetstream::UNSTORED`): messages it had not stored, which were published again.
fn unstored_answers() -> usize {
    std::fs::read_dir(logs())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .map(|log| log.matches(postmesh_shared::jetstream::UNSTORED).count())
        .sum()
}

/// Starts `p` and waits until its admin server reports ready.
async fn start(p: &mut Proc, stack: &Stack) {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs().join(format!("{}.log", p.service.name())))
        .expect("service log file");
    let child = spawn_service_to(p.service, p.env.clone(), log);
    stack.wait_ready(p.admin, &child).await;
    p.child = Some(child);
}

/// The load: one client, the gateways it takes in turn, the key, where answers are written,
/// and when to stop.
#[derive(Clone)]
struct Load {
    http: reqwest::Client,
    bases: Arc<Vec<String>>,
    turn: Arc<std::sync::atomic::AtomicUsize>,
    key: String,
    journal: Shared<Journal>,
    stop: Arc<AtomicBool>,
}

impl Load {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::SeqCst)
    }

    /// POSTs `body` to `path` (with the key, or with `secret` as the inbound secret), writes
    /// the outcome down as `op`, and returns it with the JSON body.
    async fn post(
        &self, op: &'static str, path: &str, body: &Value, inbound: bool, idem: Option<&str>,
    ) -> (Outcome, Value) {
        let base = &self.bases[self.turn.fetch_add(1, Ordering::Relaxed) % self.bases.len()];
        let mut req = self.http.post(format!("{base}{path}")).json(body);
        if let Some(idem) = idem {
            req = req.header("idempotency-key", idem);
        }
        req = if inbound {
            req.header("x-service-inbound-secret", INBOUND_SECRET)
        } else {
            req.bearer_auth(&self.key)
        };
        let sent = Instant::now();
        let (outcome, json) = match req.send().await {
            Ok(res) => {
                let status = res.status().as_u16();
                let json = res.json::<Value>().await.unwrap_or(Value::Null);
                (Outcome::Status(status), json)
            }
            Err(e) => (Outcome::Unreachable(format!("{e:#}")), Value::Null),
        };
        self.journal.lock().expect("journal").calls.push((
            op,
            sent,
            Instant::now(),
            outcome.clone(),
        ));
        (outcome, json)
    }

    /// One click of a tracked link after another (the links and the gateways in turn,
    /// redirects not followed); counts the clicks asked and those answered 302.
    async fn clicks(self, paths: Vec<String>, counts: Shared<(usize, usize)>) {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(20))
            .build()
            .expect("client");
        while self.running() {
            let turn = self.turn.fetch_add(1, Ordering::Relaxed);
            let (base, path) = (
                &self.bases[turn % self.bases.len()],
                &paths[turn % paths.len()],
            );
            let sent = Instant::now();
            counts.lock().expect("clicks").0 += 1;
            let outcome = match http
                .get(format!("{base}{path}"))
                .header("user-agent", "Mozilla/5.0 (X11; Linux x86_64) soak")
                .send()
                .await
            {
                Ok(res) => Outcome::Status(res.status().as_u16()),
                Err(e) => Outcome::Unreachable(format!("{e:#}")),
            };
            if matches!(outcome, Outcome::Status(302)) {
                counts.lock().expect("clicks").1 += 1;
            }
            let call = ("click", sent, Instant::now(), outcome);
            self.journal.lock().expect("journal").calls.push(call);
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }

    /// One send to a fresh recipient after another, each retried under its own
    /// `Idempotency-Key` until it answers 2xx; the task ids answered.
    async fn sends(self, lane: &'static str, accepted: Shared<Vec<String>>) {
        let mut i = 0;
        while self.running() {
            i += 1;
            let body = json!({
                "to": format!("soak-send-{lane}{i}@example.com"),
                "subject": format!("soak {lane}{i}"),
                "text": "a soak send",
            });
            let idem = format!("soak-send-{lane}-{i:08}");
            loop {
                if let (Outcome::Status(200..=299), answer) = self
                    .post("send-email", "/send-email", &body, false, Some(&idem))
                    .await
                {
                    let task = answer["taskId"].as_str().expect("taskId").to_owned();
                    accepted.lock().expect("sends").push(task);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }

    /// One message over SMTP after another (the SMTP processes in turn), each to a fresh
    /// recipient under a Message-ID of its own, sent again (a new connection when the last
    /// broke) until answered 250; the tasks answered. A temporary refusal counts as a 503, a
    /// permanent one as its code.
    async fn smtp_sends(self, smtp: Vec<SocketAddr>, user: String, accepted: Shared<Vec<String>>) {
        use lettre::transport::smtp::authentication::{Credentials, Mechanism};
        use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
        let transports: Vec<AsyncSmtpTransport<Tokio1Executor>> = smtp
            .iter()
            .map(|addr| {
                AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
                    .port(addr.port())
                    .credentials(Credentials::new(user.clone(), self.key.clone()))
                    .authentication(vec![Mechanism::Plain])
                    .timeout(Some(Duration::from_secs(20)))
                    .build()
            })
            .collect();
        let mut i = 0;
        while self.running() {
            i += 1;
            let to = format!("soak-send-s{i}@example.com");
            let message = lettre::Message::builder()
                .message_id(Some(format!("<soak-smtp-{i}@soak.test>")))
                .from("soak@postmesh.localhost".parse().expect("an address"))
                .to(to.parse().expect("an address"))
                .subject(format!("soak s{i}"))
                .body("a soak message over SMTP".to_owned())
                .expect("a message");
            for attempt in 0.. {
                let transport = &transports[(i + attempt) % transports.len()];
                let sent = Instant::now();
                let (outcome, task) = match transport.send(message.clone()).await {
                    Ok(answer) => {
                        let text = answer.message().collect::<Vec<_>>().join(" ");
                        let task = text.split("queued as ").nth(1).map(|t| t.trim().to_owned());
                        (Outcome::Status(u16::from(answer.code())), task)
                    }
                    Err(e) => match e.status() {
                        Some(_) if e.is_transient() => (Outcome::Status(503), None),
                        Some(code) => (Outcome::Status(u16::from(code)), None),
                        None => (Outcome::Unreachable(format!("{e:#}")), None),
                    },
                };
                self.journal.lock().expect("journal").calls.push((
                    "smtp-send",
                    sent,
                    Instant::now(),
                    outcome,
                ));
                if let Some(task) = task {
                    accepted.lock().expect("sends").push(task);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }

    /// Deducts under a fresh idempotency key, retrying that key until it answers 200.
    async fn deducts(self, keys: Shared<Vec<String>>) {
        let mut i = 0;
        while self.running() {
            i += 1;
            let key = format!("soak-deduct-{i}");
            keys.lock().expect("keys").push(key.clone());
            loop {
                let body = json!({ "idempotencyKey": key });
                if let (Outcome::Status(200), _) =
                    self.post("deduct", "/deduct", &body, false, None).await
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }

    /// Sends a code to a fresh address, reads it from the delivered email and checks it.
    async fn codes(self, outbox: std::path::PathBuf) {
        let mut i = 0;
        while self.running() {
            i += 1;
            let email = format!("soak-code-{i}@example.com");
            let sent = self
                .post(
                    "send-code",
                    "/send-code",
                    &json!({ "email": email }),
                    false,
                    None,
                )
                .await;
            if let Outcome::Status(200) = sent.0 {
                let code = until(Duration::from_secs(60), || {
                    let found = messages_to(&outbox, &email)
                        .iter()
                        .find_map(|m| extract_code(m));
                    async move { found.ok_or_else(|| "no code email yet".to_owned()) }
                })
                .await;
                match code {
                    Ok(code) => {
                        let body = json!({ "email": email, "code": code });
                        self.post("verify-code", "/verify-code", &body, false, None)
                            .await;
                    }
                    Err(e) => self
                        .journal
                        .lock()
                        .expect("journal")
                        .lost
                        .push(format!("code to {email}: {e}")),
                }
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }

    /// Ingests message after message to `inbox`, each retried until it answers 200.
    async fn ingests(self, inbox: String, accepted: Shared<Vec<String>>) {
        let mut i = 0;
        while self.running() {
            i += 1;
            let id = format!("soak-{i}@customer.example");
            let raw = mta::message(
                Some(&id),
                &format!("soak {i}"),
                "",
                "an inbound soak message",
            );
            let body = mta::ingest_body(&raw, &[&inbox]);
            loop {
                if let (Outcome::Status(200), _) = self
                    .post("ingest", "/inbound-email/ingest", &body, true, None)
                    .await
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            accepted.lock().expect("ids").push(id);
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }
}

/// Delivered `.eml` files in `outbox` addressed to `to`.
fn messages_to(outbox: &std::path::Path, to: &str) -> Vec<String> {
    std::fs::read_dir(outbox)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter(|text| {
            text.lines()
                .any(|l| l.starts_with("To:") && l.to_lowercase().contains(to))
        })
        .collect()
}

/// Tracked messages clicked in turn: a delivery records at most 1,000 clicks, and a long
/// soak clicks more than that.
const CLICKED: usize = 25;

/// The tracked messages' links (their paths on the gateway), their deliveries and their
/// send's task, sent before the load.
async fn tracked_links(
    stack: &Stack, key: &str, outbox: &std::path::Path,
) -> (Vec<String>, Vec<uuid::Uuid>, String) {
    let to: Vec<String> = (0..CLICKED)
        .map(|i| format!("soak-clicks-{i}@example.com"))
        .collect();
    let sent: Value = stack
        .client(key)
        .post(
            "/send-email",
            &json!({ "to": to, "subject": "soak clicks", "trackClicks": true,
                     "html": "<a href=\"https://example.com/soak\">soak</a>" }),
            reqwest::StatusCode::OK,
        )
        .await;
    let mut paths = Vec::with_capacity(CLICKED);
    for to in &to {
        let eml = until(Duration::from_secs(60), || async {
            messages_to(outbox, to)
                .pop()
                .ok_or_else(|| format!("the tracked message to {to} is not delivered yet"))
        })
        .await
        .expect("the tracked message");
        let html = postmesh_tests::html_part(&eml);
        let at = html.find("/t/c/").expect("a tracked link");
        paths.push(html[at..html[at..].find('"').map_or(html.len(), |e| at + e)].to_owned());
    }
    let deliveries =
        sqlx::query_scalar("SELECT delivery_id FROM task_recipients WHERE email = ANY($1)")
            .bind(&to)
            .fetch_all(&stack.sender_db().await)
            .await
            .expect("the tracked deliveries");
    let task = sent["taskId"]
        .as_str()
        .expect("the tracked send's task")
        .to_owned();
    (paths, deliveries, task)
}

/// Every `To:` address of the `.eml` files in `outbox`, with how many were delivered to it.
fn delivered(outbox: &std::path::Path) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for entry in std::fs::read_dir(outbox).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        if let Some(line) = text.lines().find(|l| l.starts_with("To:")) {
            let to = line["To:".len()..]
                .trim()
                .trim_matches(['<', '>'])
                .to_lowercase();
            *counts.entry(to).or_default() += 1;
        }
    }
    counts
}

/// The checks after the load, each returning what failed.
struct Report<'a> {
    stack: &'a Stack,
    key: &'a str,
    windows: &'a [Window],
}

impl Report<'_> {
    /// The window (if any) a call from `sent` to `answered` overlaps.
    fn windows(&self, sent: Instant, answered: Instant) -> Vec<&Window> {
        self.windows
            .iter()
            .filter(|w| sent <= w.to && answered >= w.from)
            .collect()
    }

    /// Every answer 2xx, or 502/503/no connection inside an outage window.
    fn answers(&self, journal: &Journal) -> Vec<String> {
        let mut table: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
        let mut failures = Vec::new();
        for (op, sent, answered, outcome) in &journal.calls {
            let windows = self.windows(*sent, *answered);
            let (label, allowed) = match outcome {
                Outcome::Status(s @ 200..=299) => (format!("{s}"), true),
                Outcome::Status(302) if *op == "click" => ("302".into(), true),
                Outcome::Status(s @ (502 | 503)) => (format!("{s}"), !windows.is_empty()),
                Outcome::Status(s) => (format!("{s}"), false),
                // No connection while the gateway is down; over SMTP, while the SMTP service is.
                Outcome::Unreachable(_) => (
                    "no connection".into(),
                    windows.iter().any(|w| {
                        w.part == "api-gateway"
                            || (*op == "smtp-send" && w.part == smtp_submission::SERVICE.name())
                    }),
                ),
            };
            *table
                .entry(op)
                .or_default()
                .entry(label.clone())
                .or_default() += 1;
            if !allowed {
                let during = match windows.as_slice() {
                    [] => "outside any outage".to_owned(),
                    parts => {
                        let parts: Vec<&str> = parts.iter().map(|w| w.part.as_str()).collect();
                        format!("during the {} outage", parts.join(" and "))
                    }
                };
                let detail = match outcome {
                    Outcome::Unreachable(e) => e.as_str(),
                    Outcome::Status(_) => "",
                };
                failures.push(format!("{op}: {label} {during} {detail}"));
            }
        }
        failures.extend(journal.lost.iter().cloned());
        eprintln!("soak: answers by operation:");
        for (op, counts) in &table {
            eprintln!("  {op:<12} {counts:?}");
        }
        failures
    }

    /// Every click answered 302 recorded (none lost, whatever was killed), and no more than
    /// were asked (none twice).
    async fn clicks(
        &self, deliveries: &[uuid::Uuid], (asked, answered): (usize, usize),
    ) -> Vec<String> {
        let db = self.stack.sender_db().await;
        let count = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM delivery_events
                 WHERE delivery_id = ANY($1) AND kind = 'clicked'",
            )
            .bind(deliveries)
            .fetch_one(&db)
            .await
            .map(|n| n as usize)
            .map_err(|e| e.to_string())
        };
        let recorded = until(Duration::from_secs(120), || async {
            let n = count().await?;
            if n >= answered {
                Ok(n)
            } else {
                Err(format!("{n} of {answered} clicks recorded"))
            }
        })
        .await;
        let recorded = match recorded {
            Ok(n) => n,
            Err(e) => return vec![format!("clicks: {e}")],
        };
        eprintln!("soak: clicks asked {asked}, answered 302 {answered}, recorded {recorded}");
        let mut failures = Vec::new();
        if recorded < answered {
            failures.push(format!(
                "clicks: {answered} answered 302 but {recorded} recorded"
            ));
        }
        if recorded > asked {
            failures.push(format!("clicks: {asked} asked but {recorded} recorded"));
        }
        failures
    }

    /// Every task answered 2xx is stored; every stored task delivered once per recipient.
    async fn sends(&self, accepted: &[String]) -> Vec<String> {
        let db = self.stack.sender_db().await;
        let outbox = self.stack.outbox();
        let recipients: Vec<(String, String)> = sqlx::query_as(
            "SELECT t.id::text, lower(r.email) FROM tasks t JOIN task_recipients r ON r.task_id = t.id",
        )
        .fetch_all(&db)
        .await
        .expect("tasks");
        let wanted: HashSet<&str> = recipients
            .iter()
            .map(|(_, e)| e.as_str())
            .filter(|e| e.starts_with("soak-send-"))
            .collect();
        let stored: HashSet<&str> = recipients.iter().map(|(t, _)| t.as_str()).collect();
        let settled = until_complete("stored sends not delivered yet", || {
            let counts = delivered(outbox);
            let missing = wanted.iter().filter(|e| !counts.contains_key(**e)).count();
            (counts, missing)
        })
        .await;
        let mut failures = Vec::new();
        if let Err(e) = settled {
            failures.push(format!("sends: {e}"));
            let counts = delivered(outbox);
            let missing: Vec<&str> = wanted
                .iter()
                .copied()
                .filter(|e| !counts.contains_key(*e))
                .collect();
            self.trace_sends(&missing).await;
        }
        // Every job published and acknowledged: nothing sent so far can still arrive twice.
        self.stack.sends_done().await;
        let counts = delivered(outbox);
        let twice: Vec<_> = counts
            .iter()
            .filter(|(to, n)| to.starts_with("soak-send-") && **n > 1)
            .collect();
        let unasked: Vec<_> = counts
            .keys()
            .filter(|to| to.starts_with("soak-send-") && !wanted.contains(to.as_str()))
            .collect();
        let lost: Vec<_> = accepted
            .iter()
            .filter(|t| !stored.contains(t.as_str()))
            .collect();
        let answered: HashSet<&str> = accepted.iter().map(String::as_str).collect();
        let unanswered: Vec<_> = stored.iter().filter(|t| !answered.contains(*t)).collect();
        eprintln!(
            "soak: sends: {} answered 2xx, {} stored ({} stored but never answered), {} delivered, {} twice, {} never stored but delivered, {} answered but not stored",
            accepted.len(),
            wanted.len(),
            unanswered.len(),
            counts.keys().filter(|t| t.starts_with("soak-send-")).count(),
            twice.len(),
            unasked.len(),
            lost.len()
        );
        if !twice.is_empty() {
            failures.push(format!("sends delivered twice: {twice:?}"));
        }
        if !unasked.is_empty() {
            failures.push(format!("delivered without a stored send: {unasked:?}"));
        }
        if !lost.is_empty() {
            failures.push(format!("sends answered 2xx but not stored: {lost:?}"));
        }
        // Every send is retried under its key until answered, so a stored send the client
        // never learnt of means a retry made a second task or lost the first one's answer.
        if !unanswered.is_empty() {
            failures.push(format!(
                "stored sends no retry was answered with: {unanswered:?}"
            ));
        }
        failures
    }

    /// Every charge matched to its work, nothing on hold, the balance the ledger's.
    async fn charges(&self, deduct_keys: &[String], outbox: &std::path::Path) -> Vec<String> {
        let billing = self.stack.service_db(billing::SERVICE).await;
        let key_id = self.stack.key_id(self.key).await;
        let mut failures = Vec::new();
        // Holds run out (and are refunded) within the hold time; wait for none to be left.
        let entries: Vec<Entry> = match until(Duration::from_secs(120), || {
            let billing = billing.clone();
            async move {
                let rows: Vec<Entry> = sqlx::query_as(
                    "SELECT l.idempotency_key, l.kind, l.delta, l.hold_until,
                                EXISTS (SELECT 1 FROM ledger r WHERE r.refund_of = l.id),
                                l.target_email
                         FROM ledger l WHERE l.api_key_id = $1",
                )
                .bind(key_id)
                .fetch_all(&billing)
                .await
                .expect("ledger");
                let held = rows.iter().filter(|r| r.3.is_some_and(|h| h > 0)).count();
                if held == 0 {
                    Ok(rows)
                } else {
                    Err(format!("{held} charges still on hold"))
                }
            }
        })
        .await
        {
            Ok(rows) => rows,
            Err(e) => return vec![format!("charges: {e}")],
        };
        // A live charge: confirmed and not refunded.
        let live_entries: Vec<&Entry> = entries
            .iter()
            .filter(|(_, kind, _, hold, refunded, _)| {
                kind == "charge" && hold.is_none() && !refunded
            })
            .collect();
        let live: HashMap<&str, i64> = live_entries
            .iter()
            .map(|(key, _, delta, _, _, _)| (key.as_str(), *delta))
            .collect();
        let sender = self.stack.sender_db().await;
        let tasks: Vec<(String, i64)> =
            sqlx::query_as("SELECT id::text, cost FROM tasks WHERE api_key_id = $1")
                .bind(key_id)
                .fetch_all(&sender)
                .await
                .expect("tasks");
        let task_ids: HashSet<&str> = tasks.iter().map(|(t, _)| t.as_str()).collect();
        for (task, cost) in &tasks {
            if live.get(task.as_str()) != Some(&-cost) {
                failures.push(format!(
                    "send {task} costs {cost} but its live charge is {:?}",
                    live.get(task.as_str())
                ));
            }
        }
        let is_task = |k: &str| uuid::Uuid::parse_str(k).is_ok();
        for key in live.keys().filter(|k| is_task(k)) {
            if !task_ids.contains(key) {
                failures.push(format!("a live charge {key} without its send"));
            }
        }
        for key in deduct_keys {
            let charge = live.get(format!("deduct:{key}").as_str());
            if charge != Some(&-1) {
                failures.push(format!("deduct {key}: live charge {charge:?}"));
            }
        }
        // A code charge is for the address it names: that address must have got its
        // email (once per address: the load sends one code to each).
        let emails = delivered(outbox);
        let mut charged: HashMap<&str, usize> = HashMap::new();
        for (key, .., target) in &live_entries {
            if key.starts_with("send-code:") {
                *charged.entry(target.as_deref().unwrap_or("")).or_default() += 1;
            }
        }
        for (to, n) in &charged {
            if *n > 1 {
                failures.push(format!("{n} live code charges for {to}"));
            }
            if !emails.contains_key(*to) {
                failures.push(format!(
                    "a live code charge for {to}, who got no code email"
                ));
            }
        }
        let code_emails: Vec<&String> = emails
            .keys()
            .filter(|to| to.starts_with("soak-code-"))
            .collect();
        let free = code_emails
            .iter()
            .filter(|to| !charged.contains_key(to.as_str()))
            .count();
        let code_charges = charged.values().sum::<usize>();
        let code_emails = code_emails.len();
        let spent: i64 = live.values().sum();
        let balance = self.stack.balance(self.key).await;
        if balance != GRANT + spent {
            failures.push(format!(
                "balance {balance}, but the grant {GRANT} less live charges is {}",
                GRANT + spent
            ));
        }
        let refunded = entries.iter().filter(|e| e.1 == "refund").count();
        if free > 0 {
            eprintln!("soak: charges: {free} code emails went out uncharged (their hold ran out or was refunded after the code was queued)");
        }
        eprintln!(
            "soak: charges: {} live ({} sends, {} deducts, {code_charges} code sends for {code_emails} code emails), {refunded} refunded, balance {balance} = {GRANT} - {}",
            live.len(),
            tasks.len(),
            deduct_keys.len(),
            -spent
        );
        failures
    }

    /// Every accepted message stored once and delivered to each receiver under one id.
    async fn inbound(&self, accepted: &[String], receivers: &[Receiver]) -> Vec<String> {
        let db = self.stack.service_db(inbound_ingest::SERVICE).await;
        let stored: Vec<(String, i64)> =
            sqlx::query_as("SELECT message_id, count(*) FROM messages GROUP BY message_id")
                .fetch_all(&db)
                .await
                .expect("messages");
        let stored: HashMap<String, i64> = stored.into_iter().collect();
        let mut failures = Vec::new();
        for id in accepted {
            if stored.get(id) != Some(&1) {
                failures.push(format!("message {id} stored {:?} times", stored.get(id)));
            }
        }
        let per_receiver = |r: &Receiver| {
            let mut ids: HashMap<String, HashSet<String>> = HashMap::new();
            let mut posts = 0;
            for d in r.deliveries() {
                posts += 1;
                let message = d.body["data"]["emailId"].as_str().unwrap_or("").to_owned();
                ids.entry(message).or_default().insert(d.id);
            }
            (ids, posts)
        };
        let seen = until_complete("deliveries still missing", || {
            let got: Vec<_> = receivers.iter().map(per_receiver).collect();
            let missing: usize = got
                .iter()
                .map(|(ids, _)| stored.keys().filter(|m| !ids.contains_key(*m)).count())
                .sum();
            (got, missing)
        })
        .await;
        let seen = match seen {
            Ok(seen) => seen,
            Err(e) => {
                failures.push(format!("inbound: {e}"));
                let seen: Vec<_> = receivers.iter().map(per_receiver).collect();
                let missing: HashSet<&str> = seen
                    .iter()
                    .flat_map(|(ids, _)| stored.keys().filter(|m| !ids.contains_key(*m)))
                    .map(String::as_str)
                    .collect();
                self.trace_inbound(&missing.into_iter().collect::<Vec<_>>())
                    .await;
                seen
            }
        };
        for (n, (ids, posts)) in seen.iter().enumerate() {
            let split: Vec<_> = ids.iter().filter(|(_, w)| w.len() > 1).collect();
            if !split.is_empty() {
                failures.push(format!(
                    "receiver {n}: messages under more than one webhook-id: {split:?}"
                ));
            }
            eprintln!(
                "soak: inbound: receiver {n} got {} messages in {posts} POSTs ({} repeated)",
                ids.len(),
                posts - ids.len()
            );
        }
        eprintln!(
            "soak: inbound: {} accepted, {} stored",
            accepted.len(),
            stored.len()
        );
        failures
    }
}

/// Polls `probe` every 100 ms until it answers `Ok`, or gives its last `Err` once `within`
/// has passed (a failure to report, not to panic on).
async fn until<T, F: std::future::Future<Output = Result<T, String>>>(
    within: Duration, mut probe: impl FnMut() -> F,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        match probe().await {
            Ok(done) => return Ok(done),
            Err(seen) if Instant::now() >= deadline => {
                return Err(format!("after {within:?}: {seen}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// [`until`] the `probe`, which counts what is still `missing`, counts none (three minutes
/// at most: the drain after the load). A message whose id a NATS 2.10 stream leader recorded
/// and never stored is published once JetStream forgets the id, two minutes on (the
/// duplicate window), and a fault can come near the load's end.
async fn until_complete<T>(
    missing: &str, mut probe: impl FnMut() -> (T, usize),
) -> Result<T, String> {
    until(Duration::from_secs(180), || {
        let (seen, left) = probe();
        async move {
            match left {
                0 => Ok(seen),
                n => Err(format!("{n} {missing}")),
            }
        }
    })
    .await
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
