//! The per-key request rate: a GCRA limit kept in Redis, so every gateway replica counts
//! against the same allowance; over the limit → 429 with `Retry-After`. Allowance is taken
//! from Redis in batches sized to the key's recent traffic and spent locally. Large request
//! bodies also spend an account's byte budget ([`BodyRate`]). Policy: docs/decisions.md,
//! "Gateway".

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

use postmesh_shared::{ApiError, Namespace};

use crate::settings::{ACCOUNT_BODY_BURST_BYTES, ACCOUNT_BODY_BYTES_PER_SEC};

/// Requests a key may make: `per_sec` on average, up to `burst` at once. `per_sec == 0`
/// turns the limit off.
#[derive(Clone, Copy, Debug)]
pub struct RateConfig {
    pub per_sec: u32,
    pub burst: u32,
}

/// Bytes of request body an account may send: bodies over [`FREE_BODY_BYTES`] spend their
/// size, `bytes_per_sec` on average, up to `burst_bytes` at once. `bytes_per_sec == 0`
/// turns the budget off.
#[derive(Clone, Copy, Debug)]
pub struct BodyRateConfig {
    pub bytes_per_sec: u64,
    pub burst_bytes: u64,
}

impl Default for BodyRateConfig {
    /// 4 MiB a second, 64 MiB at once: four times the largest body any route takes.
    fn default() -> Self {
        Self {
            bytes_per_sec: ACCOUNT_BODY_BYTES_PER_SEC.default_of(),
            burst_bytes: ACCOUNT_BODY_BURST_BYTES.default_of(),
        }
    }
}

/// Bodies up to this size cost nothing of the byte budget: ordinary requests are counted by
/// the request rate alone.
pub const FREE_BODY_BYTES: u64 = 64 * 1024;

/// GCRA on Redis's clock for up to ARGV[3] requests at once, none when fewer than ARGV[4]
/// fit. KEYS[1] holds the theoretical arrival time (ms); ARGV[1] is the interval between
/// requests (ms), ARGV[2] the burst. Returns {granted, seconds to wait when none was}.
const GCRA_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local room = math.floor((now + interval * burst - tat) / interval + 1e-9)
local least = tonumber(ARGV[4])
local n = math.min(tonumber(ARGV[3]), room)
if n < least then
  return {0, math.max(1, math.ceil((tat - interval * (burst - least) - now) / 1000))}
end
tat = tat + n * interval
redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX', math.ceil(tat - now) + 1)
return {n, 0}
";

/// How long a batch of allowance taken from Redis may be spent locally.
const BATCH_LIFETIME: Duration = Duration::from_secs(1);
/// Keys with local allowance tracked at most; beyond it, the map is cleared (allowance
/// left in it is simply not used).
const LOCAL_KEYS_MAX: usize = 100_000;

/// Allowance of one key held by this replica.
struct Local {
    /// Requests left to spend.
    left: u32,
    /// When what is left may no longer be spent.
    until: Instant,
    /// When the batch request to Redis under way started (a request cancelled midway never
    /// clears it, so it counts only for a batch lifetime).
    fetching: Option<Instant>,
    /// Requests of this key seen here since `window`, and in the whole second before it.
    seen: u32,
    window: Instant,
    last_second: u32,
}

/// The per-key limiter of one gateway.
pub struct RateLimit {
    config: RateConfig,
    batch: u32,
    script: redis::Script,
    local: Mutex<HashMap<String, Local>>,
}

impl RateLimit {
    /// A limiter enforcing `config`, with no allowance held yet.
    pub fn new(config: RateConfig) -> Self {
        let batch = (config.per_sec / 10).min(config.burst / 4).clamp(1, 100);
        Self {
            config,
            batch,
            script: redis::Script::new(GCRA_SCRIPT),
            local: Mutex::new(HashMap::new()),
        }
    }

    /// Spends one request of local allowance (`None`), or says how many to ask Redis for.
    fn take_local(&self, api_key_id: &str) -> Option<u32> {
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let Some(entry) = local.get_mut(api_key_id) else {
            return Some(1);
        };
        if now >= entry.window + Duration::from_secs(1) {
            let whole = now < entry.window + Duration::from_secs(2);
            entry.last_second = if whole { entry.seen } else { 0 };
            entry.seen = 0;
            entry.window = now;
        }
        entry.seen += 1;
        if entry.left > 0 && entry.until > now {
            entry.left -= 1;
            return None;
        }
        let batch = (entry.last_second / 10).clamp(1, self.batch);
        let in_flight = entry.fetching.is_some_and(|t| now < t + BATCH_LIFETIME);
        if in_flight || batch == 1 {
            return Some(1);
        }
        entry.fetching = Some(now);
        Some(batch)
    }

    /// Keeps `left` requests of a fresh allowance; `batch` says this was the key's batch fetch.
    fn keep_local(&self, api_key_id: &str, left: u32, batch: bool) {
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        if local.len() >= LOCAL_KEYS_MAX && !local.contains_key(api_key_id) {
            local.clear();
        }
        let until = Instant::now() + BATCH_LIFETIME;
        let entry = local.entry(api_key_id.to_owned()).or_insert(Local {
            left: 0,
            until,
            fetching: None,
            seen: 1,
            window: Instant::now(),
            last_second: 0,
        });
        if entry.until <= Instant::now() {
            entry.left = 0;
        }
        entry.left += left;
        entry.until = until;
        if batch {
            entry.fetching = None;
        }
    }

    /// Counts one request of `api_key_id`; 429 when it is over the limit. When Redis cannot
    /// answer, the request goes through (a limiter outage must not stop the API).
    pub async fn check(
        &self, redis: &mut ConnectionManager, ns: &Namespace, api_key_id: &str,
    ) -> Result<(), ApiError> {
        self.check_bucket(redis, ns, api_key_id, "API key").await
    }

    /// [`RateLimit::check`] for the whole account `account_id`: all its keys together
    /// have the same allowance as one, so more keys are no more requests.
    pub async fn check_account(
        &self, redis: &mut ConnectionManager, ns: &Namespace, account_id: &str,
    ) -> Result<(), ApiError> {
        let bucket = format!("account:{account_id}");
        self.check_bucket(redis, ns, &bucket, "account").await
    }

    /// Takes one request of `bucket`'s allowance (`what` names it in the 429).
    async fn check_bucket(
        &self, redis: &mut ConnectionManager, ns: &Namespace, api_key_id: &str, what: &str,
    ) -> Result<(), ApiError> {
        if self.config.per_sec == 0 {
            return Ok(());
        }
        let Some(ask) = self.take_local(api_key_id) else {
            return Ok(());
        };
        let batch = ask > 1;
        let interval_ms = 1000.0 / f64::from(self.config.per_sec);
        let answer: Result<(u32, u64), _> = self
            .script
            .key(ns.redis_key(&format!("rate:{api_key_id}")))
            .arg(interval_ms)
            .arg(self.config.burst.max(1))
            .arg(ask)
            .arg(1)
            .invoke_async(redis)
            .await;
        let (granted, verdict) = match answer {
            Ok((0, retry_after)) => (
                0,
                Err(ApiError::TooManyRequests {
                    message: format!("too many requests for this {what}"),
                    retry_after,
                }),
            ),
            Ok((granted, _)) => (granted, Ok(())),
            Err(e) => {
                tracing::warn!(error = %e, "rate limiter unavailable; request let through");
                (0, Ok(()))
            }
        };
        self.keep_local(api_key_id, granted.saturating_sub(1), batch);
        verdict
    }
}

/// The per-account byte budget of large request bodies, shared by every gateway replica
/// through Redis in KiB units.
pub struct BodyRate {
    config: BodyRateConfig,
    script: redis::Script,
}

impl BodyRate {
    /// A budget enforcing `config`.
    pub fn new(config: BodyRateConfig) -> Self {
        Self {
            config,
            script: redis::Script::new(GCRA_SCRIPT),
        }
    }

    /// Spends `bytes` of `account_id`'s budget when the body is over [`FREE_BODY_BYTES`];
    /// 429 with `Retry-After` when they do not fit yet. A body larger than the burst costs
    /// the whole burst, so every body the route takes can pass. Redis down: it passes.
    pub async fn check(
        &self, redis: &mut ConnectionManager, ns: &Namespace, account_id: &str, bytes: u64,
    ) -> Result<(), ApiError> {
        if self.config.bytes_per_sec == 0 || bytes <= FREE_BODY_BYTES {
            return Ok(());
        }
        let burst = (self.config.burst_bytes / 1024).max(1);
        let cost = bytes.div_ceil(1024).min(burst);
        let interval_ms = 1000.0 * 1024.0 / self.config.bytes_per_sec as f64;
        let answer: Result<(u64, u64), _> = self
            .script
            .key(ns.redis_key(&format!("body-rate:account:{account_id}")))
            .arg(interval_ms)
            .arg(burst)
            .arg(cost)
            .arg(cost)
            .invoke_async(redis)
            .await;
        match answer {
            Ok((0, retry_after)) => Err(ApiError::TooManyRequests {
                message: format!(
                    "too many request body bytes for this account (large bodies may send \
                     {} bytes a second)",
                    self.config.bytes_per_sec
                ),
                retry_after,
            }),
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "body rate limiter unavailable; request let through");
                Ok(())
            }
        }
    }
}
