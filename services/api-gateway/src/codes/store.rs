//! The code store: codes in Redis, only as an HMAC under a server secret, with their attempt
//! counts, and the per-recipient send limits. Every key of one (account, recipient) shares
//! one Redis Cluster hash tag. Policy: docs/decisions.md, "Verification codes".

use hmac::{Hmac, Mac};
use rand::Rng;
use redis::aio::ConnectionManager;
use sha2::Sha256;

use postmesh_shared::{ApiError, EmailAddress, JobId};

use super::CodeConfig;
use crate::AppState;

/// A 6-digit code.
pub(super) struct Code(String);

impl Code {
    /// A code as typed by a user; `None` unless it is 6 ASCII digits.
    pub(super) fn parse(raw: &str) -> Option<Self> {
        (raw.len() == 6 && raw.bytes().all(|b| b.is_ascii_digit())).then(|| Self(raw.to_owned()))
    }

    /// A fresh random code.
    pub(super) fn random() -> Self {
        Self(format!(
            "{:06}",
            rand::thread_rng().gen_range(0..1_000_000u32)
        ))
    }

    /// The digits.
    pub(super) fn as_str(&self) -> &str {
        &self.0
    }

    /// HMAC-SHA256 of the code, bound to the account and recipient.
    fn digest(&self, secret: &str, account: &str, email: &EmailAddress) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
        for part in [account, &recipient_id(email), &self.0] {
            mac.update(part.as_bytes());
            mac.update(b"\0");
        }
        hex::encode(mac.finalize().into_bytes())
    }
}

/// The recipient as codes and limits know it: case-insensitive, as mailboxes are in practice.
fn recipient_id(email: &EmailAddress) -> String {
    email.as_str().to_lowercase()
}

/// The scope of login codes: no account's id can equal it.
pub(super) const LOGIN_SCOPE: &str = "login";

/// Whether a send to the recipient is allowed now.
pub(super) enum Limit {
    /// Allowed, and counted.
    Allowed,
    /// A code was sent within the cooldown; retry after this many seconds.
    Cooldown(u64),
    /// The hourly cap is reached; retry after this many seconds.
    HourlyCap(u64),
}

/// What checking a code found.
#[derive(Clone, Copy, Debug)]
pub(super) enum Check {
    /// No code (never sent, expired, used or void).
    Missing,
    /// The code matched and is used up.
    Match,
    /// Wrong code; the code stays.
    Mismatch,
    /// Wrong code, and the last allowed attempt: the code is void.
    Voided,
}

impl Check {
    /// The outcome's name in metrics.
    pub(super) fn name(self) -> &'static str {
        match self {
            Check::Missing => "missing",
            Check::Match => "match",
            Check::Mismatch => "mismatch",
            Check::Voided => "void",
        }
    }
}

/// Rate limit: `{0, 0}` allowed (and counted), `{1, ttl}` cooling down, `{2, ttl}` hourly cap.
const LIMIT_SCRIPT: &str = r"
local ttl = redis.call('TTL', KEYS[1])
if ttl > 0 then return {1, ttl} end
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
if n >= tonumber(ARGV[2]) then return {2, math.max(redis.call('TTL', KEYS[2]), 1)} end
redis.call('SET', KEYS[1], '1', 'EX', ARGV[1])
if redis.call('INCR', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], 3600) end
return {0, 0}
";

/// Undoes one counted send (the send failed later on).
const UNLIMIT_SCRIPT: &str = r"
redis.call('DEL', KEYS[1])
if tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then redis.call('DECR', KEYS[2]) end
return 0
";

/// Checks a code: 0 missing, 1 match (code deleted), 2 mismatch, 3 mismatch that voided it.
const VERIFY_SCRIPT: &str = r"
local h = redis.call('HGET', KEYS[1], 'h')
if not h then return 0 end
if h == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
local a = redis.call('HINCRBY', KEYS[1], 'a', 1)
if a >= tonumber(ARGV[2]) then redis.call('DEL', KEYS[1]) return 3 end
return 2
";

fn redis_err(e: redis::RedisError) -> ApiError {
    ApiError::redis("code store unavailable", e)
}

/// The codes and limits of one (account, recipient).
pub(super) struct CodeStore<'a> {
    redis: ConnectionManager,
    config: &'a CodeConfig,
    account_id: String,
    email: &'a EmailAddress,
    code: String,
    cooldown: String,
    hourly: String,
}

impl<'a> CodeStore<'a> {
    /// The store of the codes for `email` within `scope`: an account's id for
    /// `/send-code`, [`LOGIN_SCOPE`] for signing in.
    pub(super) fn new(state: &'a AppState, scope: String, email: &'a EmailAddress) -> Self {
        let account_id = scope;
        // One hash tag for all keys of a (account, recipient): the scripts and the pending-code
        // RENAME touch several of them, which Redis Cluster allows only within one slot.
        let tag = format!("{{{account_id}:{}}}", recipient_id(email));
        let key = |kind: &str| state.ns.redis_key(&format!("code:{kind}:{tag}"));
        Self {
            redis: state.redis.clone(),
            config: &state.config.codes,
            account_id,
            email,
            code: key("hash"),
            cooldown: key("cooldown"),
            hourly: key("hourly"),
        }
    }

    /// Counts a send to the recipient, unless the cooldown or the hourly cap forbids it.
    pub(super) async fn limit(&mut self) -> Result<Limit, ApiError> {
        let (outcome, wait): (i64, u64) = redis::Script::new(LIMIT_SCRIPT)
            .key(&self.cooldown)
            .key(&self.hourly)
            .arg(self.config.cooldown_secs)
            .arg(self.config.hourly_cap)
            .invoke_async(&mut self.redis)
            .await
            .map_err(redis_err)?;
        Ok(match outcome {
            0 => Limit::Allowed,
            1 => Limit::Cooldown(wait),
            _ => Limit::HourlyCap(wait),
        })
    }

    /// Takes back the send counted by [`CodeStore::limit`] (it failed later on).
    pub(super) async fn lift_limit(&mut self) {
        let undo: Result<i64, _> = redis::Script::new(UNLIMIT_SCRIPT)
            .key(&self.cooldown)
            .key(&self.hourly)
            .invoke_async(&mut self.redis)
            .await;
        if let Err(e) = undo {
            tracing::warn!(error = %e, "could not lift the send-code limit after a failure");
        }
    }

    fn pending(&self, job: JobId) -> String {
        format!("{}:pending:{job}", self.code)
    }

    /// Stores `code` for the email of `job`, not yet active: the previous code keeps working
    /// until [`CodeStore::promote`].
    pub(super) async fn stage(&mut self, job: JobId, code: &Code) -> Result<(), ApiError> {
        let pending = self.pending(job);
        let digest = code.digest(&self.config.secret, &self.account_id, self.email);
        redis::pipe()
            .atomic()
            .hset(&pending, "h", digest)
            .hset(&pending, "a", 0)
            .expire(&pending, self.config.ttl_secs as i64)
            .ignore()
            .query_async(&mut self.redis)
            .await
            .map_err(redis_err)
    }

    /// Drops the staged code of `job` (its email could not be queued).
    pub(super) async fn discard(&mut self, job: JobId) {
        let dropped: Result<(), _> = redis::cmd("DEL")
            .arg(self.pending(job))
            .query_async(&mut self.redis)
            .await;
        if let Err(e) = dropped {
            tracing::warn!(error = %e, "could not drop a staged code; it expires on its own");
        }
    }

    /// Makes the staged code of `job` the recipient's code, replacing the previous one and
    /// its attempt count in one step.
    pub(super) async fn promote(&mut self, job: JobId) -> Result<(), ApiError> {
        redis::cmd("RENAME")
            .arg(self.pending(job))
            .arg(&self.code)
            .query_async(&mut self.redis)
            .await
            .map_err(redis_err)
    }

    /// Checks `code` against the recipient's code; a match uses it up, the last allowed
    /// wrong attempt voids it.
    pub(super) async fn check(&mut self, code: &Code) -> Result<Check, ApiError> {
        let outcome: i64 = redis::Script::new(VERIFY_SCRIPT)
            .key(&self.code)
            .arg(code.digest(&self.config.secret, &self.account_id, self.email))
            .arg(self.config.max_attempts)
            .invoke_async(&mut self.redis)
            .await
            .map_err(redis_err)?;
        Ok(match outcome {
            0 => Check::Missing,
            1 => Check::Match,
            3 => Check::Voided,
            _ => Check::Mismatch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_six_digits() {
        for _ in 0..100 {
            let c = Code::random();
            assert!(Code::parse(&c.0).is_some(), "{}", c.0);
        }
        for bad in ["", "12345", "1234567", "12a456", " 23456", "１２３４５６"] {
            assert!(Code::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn digest_binds_code_account_and_recipient() {
        let a = EmailAddress::parse("a@example.com").unwrap();
        let b = EmailAddress::parse("b@example.com").unwrap();
        let c = Code("123456".into());
        let d = c.digest("s", "acct", &a);
        assert_eq!(d, c.digest("s", "acct", &a));
        assert!(!d.contains("123456"));
        assert_ne!(d, c.digest("s", "acct", &b));
        let upper = EmailAddress::parse("A@Example.com").unwrap();
        assert_eq!(d, c.digest("s", "acct", &upper));
        assert_ne!(d, c.digest("s", "other", &a));
        assert_ne!(d, c.digest("t", "acct", &a));
        assert_ne!(d, Code("123457".into()).digest("s", "acct", &a));
    }
}
