//! The per-key request rate: a GCRA limit kept in Redis, so every gateway replica counts
//! against the same allowance. Over the limit → 429 with `Retry-After`.

use redis::aio::ConnectionManager;

use postmesh_shared::{ApiError, Namespace};

/// Requests a key may make: `per_sec` on average, up to `burst` at once. `per_sec == 0`
/// turns the limit off.
#[derive(Clone, Copy, Debug)]
pub struct RateConfig {
    pub per_sec: u32,
    pub burst: u32,
}

/// GCRA on Redis time. KEYS[1] holds the theoretical arrival time (ms); ARGV[1] is the
/// interval between requests (ms), ARGV[2] the burst. Returns 0, or the seconds to wait.
const GCRA_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local allow_at = tat - interval * (tonumber(ARGV[2]) - 1)
if now < allow_at then return math.max(1, math.ceil((allow_at - now) / 1000)) end
redis.call('SET', KEYS[1], string.format('%.3f', tat + interval), 'PX', math.ceil(tat + interval - now) + 1)
return 0
";

/// The per-key limiter of one gateway.
pub struct RateLimit {
    config: RateConfig,
    script: redis::Script,
}

impl RateLimit {
    pub fn new(config: RateConfig) -> Self {
        Self {
            config,
            script: redis::Script::new(GCRA_SCRIPT),
        }
    }

    /// Counts one request of `api_key_id`; 429 when it is over the limit. When Redis cannot
    /// answer, the request goes through (a limiter outage must not stop the API).
    pub async fn check(
        &self,
        redis: &mut ConnectionManager,
        ns: &Namespace,
        api_key_id: &str,
    ) -> Result<(), ApiError> {
        if self.config.per_sec == 0 {
            return Ok(());
        }
        let interval_ms = 1000.0 / f64::from(self.config.per_sec);
        let waited: Result<u64, _> = self
            .script
            .key(ns.redis_key(&format!("rate:{api_key_id}")))
            .arg(interval_ms)
            .arg(self.config.burst.max(1))
            .invoke_async(redis)
            .await;
        match waited {
            Ok(0) => Ok(()),
            Ok(retry_after) => Err(ApiError::TooManyRequests {
                message: "too many requests for this API key".into(),
                retry_after,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "rate limiter unavailable; request let through");
                Ok(())
            }
        }
    }
}
