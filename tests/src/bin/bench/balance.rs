//! `GET /balance` through the whole stack (gateway → NATS → billing → Postgres) against a
//! baseline: one axum + sqlx process answering the same request with the same query on the
//! same database, under the same load from this process. The gateway, billing and the
//! baseline each run as their own process (release builds), so the CPU time each process
//! spends per request is read from `/proc` for every round: the gateway, billing,
//! nats-server and Postgres (all its processes) beside the baseline and Postgres.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::process::Child;
use uuid::Uuid;

use postmesh_tests::{free_port, workspace_binary, Stack};

use super::Run;

/// The variable that makes the bench binary serve the baseline alone, on this address.
const SERVE: &str = "BENCH_BASELINE_ADDR";

/// The baseline's whole state: known keys and the billing database.
#[derive(Clone)]
struct Baseline {
    keys: Arc<HashMap<String, Uuid>>,
    db: PgPool,
}

async fn baseline_balance(
    State(b): State<Baseline>, headers: HeaderMap,
) -> Result<Json<Value>, StatusCode> {
    let key_id = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|k| b.keys.get(k))
        .ok_or(StatusCode::UNAUTHORIZED)?;
    let balance: Option<i64> =
        sqlx::query_scalar("SELECT balance FROM balances WHERE api_key_id = $1")
            .bind(key_id)
            .fetch_optional(&b.db)
            .await
            .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    Ok(Json(
        json!({ "success": true, "balance": balance.unwrap_or(0) }),
    ))
}

/// When the bench binary was started to serve the baseline (`BENCH_BASELINE_ADDR`, with
/// `BENCH_BASELINE_DB`, `BENCH_BASELINE_KEY` and `BENCH_BASELINE_KEY_ID`), serves it until
/// killed; otherwise answers `false` at once.
pub async fn serve_if_asked() -> anyhow::Result<bool> {
    let Ok(addr) = std::env::var(SERVE) else {
        return Ok(false);
    };
    let var = |name: &str| std::env::var(name).map_err(|_| anyhow::anyhow!("{name} unset"));
    let db = PgPoolOptions::new()
        .max_connections(var("DB_MAX_CONNECTIONS")?.parse()?)
        .connect(&var("BENCH_BASELINE_DB")?)
        .await?;
    let state = Baseline {
        keys: Arc::new(HashMap::from([(
            var("BENCH_BASELINE_KEY")?,
            var("BENCH_BASELINE_KEY_ID")?.parse()?,
        )])),
        db,
    };
    let app = Router::new()
        .route("/balance", get(baseline_balance))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    axum::serve(listener, app).await?;
    Ok(true)
}

/// Starts the baseline as a child process (this binary again): its address and process.
async fn spawn_baseline(stack: &Stack, key: &str) -> anyhow::Result<(SocketAddr, Child)> {
    let addr = free_port();
    let db = format!(
        "{}/{}",
        stack.common.database_url,
        billing::SERVICE.database(stack.ns())
    );
    let child = tokio::process::Command::new(std::env::current_exe()?)
        .env(SERVE, addr.to_string())
        .env("BENCH_BASELINE_DB", db)
        .env("BENCH_BASELINE_KEY", key)
        .env("BENCH_BASELINE_KEY_ID", stack.key_id(key).await.to_string())
        .env(
            "DB_MAX_CONNECTIONS",
            stack.common.db_max_connections.to_string(),
        )
        .kill_on_drop(true)
        .spawn()?;
    Ok((addr, child))
}

/// Waits until `url` answers 200 with `key`.
async fn answering(url: &str, key: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.get(url).bearer_auth(key).send().await {
            Ok(res) if res.status().is_success() => return Ok(()),
            other if Instant::now() > deadline => anyhow::bail!("{url} does not answer: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// CPU time (user and system) of process `pid` so far; zero once it is gone.
fn cpu_of(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The fields after the command (which may hold spaces) in parentheses.
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    ticks_to_time(ticks)
}

/// Time the machine's CPUs spent idle so far (all of them, waiting for I/O included).
fn idle() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: u64 = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .enumerate()
        .filter(|(i, _)| *i == 3 || *i == 4)
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum();
    ticks_to_time(ticks)
}

/// Clock ticks (`_SC_CLK_TCK` a second) as time.
fn ticks_to_time(ticks: u64) -> Duration {
    // SAFETY: sysconf only reads a constant of the system.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros(ticks * 1_000_000 / per_sec)
}

/// The processes whose command is `name`.
fn pids_named(name: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .collect()
}

/// A measured process, every process of a name (Postgres' backends, looked up at each
/// reading: a pool may connect during a round), or the machine's idle time.
struct Measured {
    name: &'static str,
    pid: Option<u32>,
}

/// The name under which idle time is measured.
const IDLE: &str = "idle (the machine's, not a process)";

impl Measured {
    /// Process `pid`.
    fn pid(name: &'static str, pid: Option<u32>) -> Self {
        Self { name, pid }
    }

    /// Every process whose command is `name`.
    fn named(name: &'static str) -> Self {
        Self { name, pid: None }
    }

    fn cpu(&self) -> Duration {
        match self.pid {
            Some(pid) => cpu_of(pid),
            None if self.name == IDLE => idle(),
            None => pids_named(self.name).into_iter().map(cpu_of).sum(),
        }
    }
}

/// The CPU time each process spent over a run of `load`, per request.
async fn measured_run(
    processes: &[Measured], load: impl std::future::Future<Output = Run>,
) -> (Run, Vec<Duration>) {
    let before: Vec<Duration> = processes.iter().map(Measured::cpu).collect();
    let run = load.await;
    let spent = processes
        .iter()
        .zip(before)
        .map(|(p, before)| p.cpu().saturating_sub(before))
        .collect();
    (run, spent)
}

/// `conns` connections each sending `GET url` back to back for `secs`.
async fn load(url: &str, key: &str, conns: usize, secs: u64) -> Run {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let (url, key) = (url.to_owned(), key.to_owned());
            tokio::spawn(async move {
                // One client per task: one keep-alive connection each.
                postmesh_shared::tls::install_provider();
                let client = reqwest::Client::builder()
                    .pool_max_idle_per_host(1)
                    .build()
                    .expect("client");
                let (mut lat, mut errors) = (Vec::new(), 0usize);
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let ok = match client.get(&url).bearer_auth(&key).send().await {
                        Ok(res) => res.status().is_success() && res.bytes().await.is_ok(),
                        Err(_) => false,
                    };
                    if ok {
                        lat.push(t.elapsed().as_micros() as u64);
                    } else {
                        errors += 1;
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let mut run = Run::default();
    for t in tasks {
        let (lat, errors) = t.await.expect("load task");
        run.requests += lat.len();
        run.errors += errors;
        run.latencies_us.extend(lat);
    }
    run.elapsed = started.elapsed();
    run.latencies_us.sort_unstable();
    run
}

/// Merges rounds of one target.
fn merge(runs: Vec<Run>) -> Run {
    let mut all = Run::default();
    for r in runs {
        all.requests += r.requests;
        all.errors += r.errors;
        all.elapsed += r.elapsed;
        all.latencies_us.extend(r.latencies_us);
    }
    all.latencies_us.sort_unstable();
    all
}

/// One side of the comparison: its URL, its processes, and what its rounds gave.
struct Target {
    name: &'static str,
    url: String,
    processes: Vec<Measured>,
    runs: Vec<Run>,
    cpu: Vec<Duration>,
}

/// The benchmark: billing and a gateway started as child processes in place of the stack's
/// in-process billing (started again afterwards), the baseline as a third; alternating
/// rounds; prints the tables.
pub async fn run(stack: &mut Stack, secs: u64, conns: usize, rounds: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        workspace_binary("api-gateway").exists() && workspace_binary("billing").exists(),
        "build the gateway and billing first (make bench does)"
    );
    let key = stack.key(1).await;
    stack.stop_billing().await;
    let (billing, gateway, base) = stack.spawn_gateway_and_billing().await;
    let (baseline_addr, baseline) = spawn_baseline(stack, &key).await?;
    let measured = async {
        let this = || Measured::pid("load (this process)", Some(std::process::id()));
        let mut targets = [
            Target {
                name: "baseline (axum + sqlx, one process)",
                url: format!("http://{baseline_addr}/balance"),
                processes: vec![
                    Measured::pid("baseline", baseline.id()),
                    Measured::named("postgres"),
                    this(),
                    Measured::named(IDLE),
                ],
                runs: Vec::new(),
                cpu: Vec::new(),
            },
            Target {
                name: "postmesh gateway → NATS → billing",
                url: format!("{base}/balance"),
                processes: vec![
                    Measured::pid("gateway", gateway.id()),
                    Measured::pid("billing", billing.id()),
                    Measured::named("nats-server"),
                    Measured::named("postgres"),
                    this(),
                    Measured::named(IDLE),
                ],
                runs: Vec::new(),
                cpu: Vec::new(),
            },
        ];
        for t in &targets {
            answering(&t.url, &key).await?;
            load(&t.url, &key, conns, 1).await; // warm-up: connections, caches, statements
        }
        for _ in 0..rounds {
            for t in &mut targets {
                let (run, spent) =
                    measured_run(&t.processes, load(&t.url, &key, conns, secs)).await;
                t.runs.push(run);
                t.cpu.resize(spent.len(), Duration::ZERO);
                for (total, s) in t.cpu.iter_mut().zip(spent) {
                    *total += s;
                }
            }
        }
        anyhow::Ok(targets)
    }
    .await;
    drop((billing, gateway, baseline));
    stack.start_billing().await;
    let [mut base_target, mut gw_target] = measured?;
    let (base_run, gw_run) = (
        merge(std::mem::take(&mut base_target.runs)),
        merge(std::mem::take(&mut gw_target.runs)),
    );
    println!(
        "GET /balance, {conns} connections, {rounds} alternating rounds of {secs}s each, {} cores; \
         every server its own process\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("| target | req/s | p50 ms | p99 ms | errors |");
    println!("|---|---:|---:|---:|---:|");
    for (name, r) in [(base_target.name, &base_run), (gw_target.name, &gw_run)] {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {} |",
            r.rps(),
            r.percentile_ms(0.50),
            r.percentile_ms(0.99),
            r.errors
        );
    }
    let ratio = gw_run.rps() / base_run.rps();
    let p99 = gw_run.percentile_ms(0.99) / base_run.percentile_ms(0.99);
    let met = |ok: bool| if ok { "met" } else { "missed" };
    println!(
        "| ratio gateway / baseline (goals: ≥ 0.5 {}, p99 ≤ 2× {}) | {ratio:.2} | {:.2} | {p99:.2} | |\n",
        met(ratio >= 0.5),
        met(p99 <= 2.0),
        gw_run.percentile_ms(0.50) / base_run.percentile_ms(0.50),
    );
    println!("CPU time per request, µs\n");
    println!("| process | baseline | postmesh |");
    println!("|---|---:|---:|");
    let per_request = |t: &Target, run: &Run, name: &str| {
        t.processes
            .iter()
            .zip(&t.cpu)
            .find(|(p, _)| p.name == name)
            .map(|(_, cpu)| {
                format!(
                    "{:.1}",
                    cpu.as_secs_f64() * 1e6 / run.requests.max(1) as f64
                )
            })
            .unwrap_or_else(|| "—".into())
    };
    let names = [
        "baseline",
        "gateway",
        "billing",
        "nats-server",
        "postgres",
        "load (this process)",
        IDLE,
    ];
    for name in names {
        println!(
            "| {name} | {} | {} |",
            per_request(&base_target, &base_run, name),
            per_request(&gw_target, &gw_run, name)
        );
    }
    let total = |t: &Target, run: &Run| {
        let servers: Duration = t
            .processes
            .iter()
            .zip(&t.cpu)
            .filter(|(p, _)| !p.name.starts_with("load") && p.name != IDLE)
            .map(|(_, cpu)| *cpu)
            .sum();
        servers.as_secs_f64() * 1e6 / run.requests.max(1) as f64
    };
    println!(
        "| every server (not the load) | {:.1} | {:.1} |\n",
        total(&base_target, &base_run),
        total(&gw_target, &gw_run)
    );
    Ok(())
}
