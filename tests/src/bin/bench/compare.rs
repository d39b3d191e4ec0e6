//! A Postmesh path against a baseline server under the same load from this process: each
//! server its own process (release builds), alternating rounds, throughput and latency, and
//! the CPU time each process spends per request, read from `/proc` for every round.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::http::{HeaderName, StatusCode};
use tokio::process::Child;

use postmesh_tests::free_port;

use super::Run;

/// The variable that makes the bench binary serve the baselines alone, on this address.
pub const SERVE: &str = "BENCH_BASELINE_ADDR";

/// Starts the baselines as a child process (this binary again) with `env`: its address and
/// process.
pub fn spawn_baseline(env: Vec<(&str, String)>) -> anyhow::Result<(SocketAddr, Child)> {
    let addr = free_port();
    let child = tokio::process::Command::new(std::env::current_exe()?)
        .env(SERVE, addr.to_string())
        .envs(env)
        .kill_on_drop(true)
        .spawn()?;
    Ok((addr, child))
}

/// What every request of a load sends beside its URL, and the status its answer must have.
pub struct Ask {
    pub header: (HeaderName, String),
    pub expected: StatusCode,
}

/// Waits until `url` answers as `ask` expects.
async fn answering(url: &str, ask: &Ask) -> anyhow::Result<()> {
    let client = postmesh_tests::no_redirects();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = client
            .get(url)
            .header(ask.header.0.clone(), &ask.header.1)
            .send()
            .await;
        match res {
            Ok(res) if res.status() == ask.expected => return Ok(()),
            other if Instant::now() > deadline => anyhow::bail!("{url} does not answer: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// `conns` connections each sending `GET url` back to back for `secs`.
pub async fn load(url: &str, ask: &Ask, conns: usize, secs: u64) -> Run {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let url = url.to_owned();
            let (name, value, expected) =
                (ask.header.0.clone(), ask.header.1.clone(), ask.expected);
            tokio::spawn(async move {
                // One client per task: one keep-alive connection each.
                let client = postmesh_tests::no_redirects();
                let (mut lat, mut errors) = (Vec::new(), 0usize);
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let ok = match client.get(&url).header(&name, &value).send().await {
                        Ok(res) => res.status() == expected && res.bytes().await.is_ok(),
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
pub struct Measured {
    name: &'static str,
    pid: Option<u32>,
}

/// The name under which idle time is measured.
const IDLE: &str = "idle (the machine's, not a process)";
/// The name under which this process (the load) is measured.
const LOAD: &str = "load (this process)";

impl Measured {
    /// Process `pid`.
    pub fn pid(name: &'static str, pid: Option<u32>) -> Self {
        Self { name, pid }
    }

    /// Every process whose command is `name`.
    pub fn named(name: &'static str) -> Self {
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

/// One side of the comparison: its URL, its server processes, and what its rounds gave.
pub struct Target {
    name: &'static str,
    url: String,
    processes: Vec<Measured>,
    runs: Vec<Run>,
    cpu: Vec<Duration>,
}

impl Target {
    /// A side named `name` asked at `url`, served by `servers` (the load and the machine's
    /// idle time are measured beside them).
    pub fn new(name: &'static str, url: String, mut servers: Vec<Measured>) -> Self {
        servers.push(Measured::pid(LOAD, Some(std::process::id())));
        servers.push(Measured::named(IDLE));
        Self {
            name,
            url,
            processes: servers,
            runs: Vec::new(),
            cpu: Vec::new(),
        }
    }

    /// Every round merged.
    fn merged(&self) -> Run {
        let mut all = Run::default();
        for r in &self.runs {
            all.requests += r.requests;
            all.errors += r.errors;
            all.elapsed += r.elapsed;
            all.latencies_us.extend(&r.latencies_us);
        }
        all.latencies_us.sort_unstable();
        all
    }

    /// CPU time `name` spent per request of `run`, in µs, if it is one of this side's.
    fn per_request(&self, run: &Run, name: &str) -> Option<f64> {
        self.processes
            .iter()
            .zip(&self.cpu)
            .find(|(p, _)| p.name == name)
            .map(|(_, cpu)| cpu.as_secs_f64() * 1e6 / run.requests.max(1) as f64)
    }

    /// CPU time every server of this side (not the load, not idle) spent per request.
    fn servers_per_request(&self, run: &Run) -> f64 {
        self.processes
            .iter()
            .filter(|p| p.name != LOAD && p.name != IDLE)
            .filter_map(|p| self.per_request(run, p.name))
            .sum()
    }
}

/// The goals of a comparison: the least throughput ratio and the most p99 ratio of ours to
/// the baseline's.
pub struct Goals {
    pub throughput: f64,
    pub p99: f64,
}

/// The load of a comparison: connections, seconds per round, rounds.
pub struct Load {
    pub conns: usize,
    pub secs: u64,
    pub rounds: usize,
}

/// Warms both sides up, runs `load.rounds` alternating rounds of `ask` and prints the tables:
/// throughput and latency, their ratios against `goals`, the CPU time per request of each
/// process. Answers whether both goals were met.
pub async fn compare(
    what: &str, mut base: Target, mut ours: Target, ask: &Ask, load: &Load, goals: &Goals,
) -> anyhow::Result<bool> {
    for t in [&base, &ours] {
        answering(&t.url, ask).await?;
        self::load(&t.url, ask, load.conns, 1).await; // warm-up: connections, caches
    }
    for _ in 0..load.rounds {
        for t in [&mut base, &mut ours] {
            let before: Vec<Duration> = t.processes.iter().map(Measured::cpu).collect();
            let run = self::load(&t.url, ask, load.conns, load.secs).await;
            let spent = t.processes.iter().zip(before);
            let spent: Vec<Duration> = spent.map(|(p, b)| p.cpu().saturating_sub(b)).collect();
            t.cpu.resize(spent.len(), Duration::ZERO);
            for (total, s) in t.cpu.iter_mut().zip(spent) {
                *total += s;
            }
            t.runs.push(run);
        }
    }
    let (base_run, ours_run) = (base.merged(), ours.merged());
    anyhow::ensure!(
        base_run.errors == 0 && ours_run.errors == 0,
        "answers other than {}: baseline {}, postmesh {}",
        ask.expected,
        base_run.errors,
        ours_run.errors
    );
    println!(
        "{what}, {} connections, {} alternating rounds of {} s each, {} cores; every server its own process\n",
        load.conns,
        load.rounds,
        load.secs,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("| target | req/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|");
    for (t, r) in [(&base, &base_run), (&ours, &ours_run)] {
        println!(
            "| {} | {:.0} | {:.2} | {:.2} |",
            t.name,
            r.rps(),
            r.percentile_ms(0.50),
            r.percentile_ms(0.99)
        );
    }
    let ratio = ours_run.rps() / base_run.rps();
    let p99 = ours_run.percentile_ms(0.99) / base_run.percentile_ms(0.99);
    let met = |ok: bool| if ok { "met" } else { "missed" };
    println!(
        "| ratio postmesh / baseline (goals: ≥ {} {}, p99 ≤ {}× {}) | {ratio:.2} | {:.2} | {p99:.2} |\n",
        goals.throughput,
        met(ratio >= goals.throughput),
        goals.p99,
        met(p99 <= goals.p99),
        ours_run.percentile_ms(0.50) / base_run.percentile_ms(0.50),
    );
    println!("CPU time per request, µs\n");
    println!("| process | baseline | postmesh |");
    println!("|---|---:|---:|");
    let mut names: Vec<&str> = Vec::new();
    for p in base.processes.iter().chain(&ours.processes) {
        if !names.contains(&p.name) {
            names.push(p.name);
        }
    }
    let cell = |v: Option<f64>| v.map_or_else(|| "—".to_owned(), |v| format!("{v:.1}"));
    for name in names {
        println!(
            "| {name} | {} | {} |",
            cell(base.per_request(&base_run, name)),
            cell(ours.per_request(&ours_run, name))
        );
    }
    println!(
        "| every server (not the load) | {:.1} | {:.1} |\n",
        base.servers_per_request(&base_run),
        ours.servers_per_request(&ours_run)
    );
    Ok(ratio >= goals.throughput && p99 <= goals.p99)
}
