//! API keys: issued as `pm_<prefix>_<secret>` (a test key `pm_test_<prefix>_<secret>`),
//! stored as a SHA-256 hash next to the visible prefix, checked with a constant-time
//! comparison and cached briefly in memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use subtle::ConstantTimeEq;
use uuid::Uuid;

use postmesh_contracts::answers::gateway::KeyMode;
use postmesh_shared::clients::billing::BillingClient;
use postmesh_shared::db::now_unix;
use postmesh_shared::proto::{AuthContext, GrantRequest, Role};
use postmesh_shared::{ApiError, EmailAddress};

/// Hex chars in the visible prefix.
const PREFIX_LEN: usize = 12;
/// Hex chars in the secret part.
const SECRET_LEN: usize = 64;
/// Entries each of the two key caches (known keys, unknown prefixes) holds by default.
pub const DEFAULT_CACHE_CAPACITY: usize = 100_000;

/// A bearer token shaped like an API key; its existence says nothing about validity.
pub struct PresentedKey<'a> {
    prefix: &'a str,
    full: &'a str,
}

impl<'a> PresentedKey<'a> {
    /// Parses `pm_<12 hex>_<64 hex>` or `pm_test_<12 hex>_<64 hex>`; anything else is not
    /// a key.
    pub fn parse(raw: &'a str) -> Option<Self> {
        let rest = raw.strip_prefix("pm_")?;
        let rest = rest.strip_prefix("test_").unwrap_or(rest);
        let (prefix, secret) = rest.split_once('_')?;
        let hex = |s: &str, n| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
        (hex(prefix, PREFIX_LEN) && hex(secret, SECRET_LEN)).then_some(Self { prefix, full: raw })
    }

    fn hash(&self) -> [u8; 32] {
        Sha256::digest(self.full.as_bytes()).into()
    }
}

/// A newly generated key: the full text (shown once) and what is stored.
pub struct NewKey {
    pub text: String,
    pub prefix: String,
    pub hash: [u8; 32],
}

/// Generates a random key of `mode`.
pub fn generate(mode: KeyMode) -> NewKey {
    let mut bytes = [0u8; PREFIX_LEN / 2 + SECRET_LEN / 2];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let prefix = hex::encode(&bytes[..PREFIX_LEN / 2]);
    let secret = hex::encode(&bytes[PREFIX_LEN / 2..]);
    let text = match mode {
        KeyMode::Live => format!("pm_{prefix}_{secret}"),
        KeyMode::Test => format!("pm_test_{prefix}_{secret}"),
    };
    let hash = Sha256::digest(text.as_bytes()).into();
    NewKey { text, prefix, hash }
}

/// A key's row as authentication reads it.
#[derive(sqlx::FromRow)]
struct StoredKey {
    id: Uuid,
    account_id: Uuid,
    workspace_id: Uuid,
    hash: Vec<u8>,
    role: Role,
    email: String,
    billing_key_id: Uuid,
    mode: KeyMode,
}

/// A looked-up key: its hash and who it belongs to.
type KeyRow = ([u8; 32], AuthContext);

/// A cache of prefix lookups whose entries expire; when full, expired entries go first, and
/// everything if that frees less than a tenth, so one cache never grows past its capacity.
struct ExpiringMap<V> {
    entries: RwLock<HashMap<String, (V, Instant)>>,
    capacity: usize,
}

impl<V: Clone> ExpiringMap<V> {
    fn new(capacity: usize) -> Self {
        Self {
            entries: RwLock::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    fn get(&self, prefix: &str) -> Option<V> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries
            .get(prefix)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(v, _)| v.clone())
    }

    fn insert(&self, prefix: &str, value: V, until: Instant) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= self.capacity {
            let now = Instant::now();
            entries.retain(|_, (_, until)| *until > now);
            // Below nine tenths full after the sweep, or start over: a cache that stays
            // nearly full would sweep on every insert.
            if entries.len() >= self.capacity / 10 * 9 {
                entries.clear();
            }
        }
        entries.insert(prefix.to_owned(), (value, until));
    }
}

/// Looks keys up by prefix, caching rows and misses for `ttl`. Known keys and unknown
/// prefixes live in separate caches, so a flood of made-up tokens never evicts real keys.
pub struct KeyStore {
    db: PgPool,
    ttl: Duration,
    known: ExpiringMap<KeyRow>,
    unknown: ExpiringMap<()>,
    /// Bumped by every [`KeyStore::forget`]: a lookup that started before one does not
    /// cache what it read (it may be the row just revoked).
    revocations: AtomicU64,
}

impl KeyStore {
    /// A store reading `api_keys` from `db`; a revoked key stops working within `ttl`. Each
    /// cache holds at most `capacity` entries.
    pub fn new(db: PgPool, ttl: Duration, capacity: usize) -> Self {
        Self {
            db,
            ttl,
            known: ExpiringMap::new(capacity),
            unknown: ExpiringMap::new(capacity),
            revocations: AtomicU64::new(0),
        }
    }

    /// The caller behind a bearer token, or 401.
    pub async fn authenticate(&self, token: &str) -> Result<AuthContext, ApiError> {
        let invalid = || ApiError::Unauthorized("invalid API key".into());
        let key = PresentedKey::parse(token).ok_or_else(invalid)?;
        let row = match self.known.get(key.prefix) {
            Some(row) => Some(row),
            None if self.unknown.get(key.prefix).is_some() => None,
            None => {
                let epoch = self.revocations.load(Ordering::Acquire);
                let row = self.load(key.prefix).await?;
                let until = Instant::now() + self.ttl;
                match &row {
                    Some(_) if self.revocations.load(Ordering::Acquire) != epoch => {}
                    Some(row) => self.known.insert(key.prefix, row.clone(), until),
                    None => self.unknown.insert(key.prefix, (), until),
                }
                row
            }
        };
        match row {
            Some((hash, auth)) if bool::from(hash.ct_eq(&key.hash())) => Ok(auth),
            _ => Err(invalid()),
        }
    }

    /// Forgets a cached key at once (it was revoked here); other replicas forget it within
    /// the cache's `ttl`.
    pub fn forget(&self, prefix: &str) {
        self.revocations.fetch_add(1, Ordering::AcqRel);
        let mut entries = self
            .known
            .entries
            .write()
            .unwrap_or_else(|e| e.into_inner());
        entries.remove(prefix);
    }

    async fn load(&self, prefix: &str) -> Result<Option<KeyRow>, ApiError> {
        let row: Option<StoredKey> = sqlx::query_as(
            "SELECT k.id, k.account_id, k.workspace_id, k.hash, k.role, a.email, k.billing_key_id,
                    k.mode
             FROM api_keys k JOIN accounts a ON a.id = k.account_id
             WHERE k.prefix = $1 AND k.revoked_at IS NULL",
        )
        .bind(prefix)
        .fetch_optional(&self.db)
        .await?;
        Ok(row.and_then(|k| {
            let hash: [u8; 32] = k.hash.try_into().ok()?;
            let auth = AuthContext {
                account_id: k.account_id.to_string(),
                workspace_id: k.workspace_id.to_string(),
                api_key_id: k.billing_key_id.to_string(),
                key_id: k.id.to_string(),
                role: k.role.into(),
                email: k.email,
                test: k.mode == KeyMode::Test,
            };
            Some((hash, auth))
        }))
    }
}

/// Creates the account for `email` (stored under its [`EmailAddress::key`]) if needed and a
/// new API key named `name` with `role` in `mode`.
/// The account's first key is its primary key; every later key bills to it. `credits` are
/// granted to the primary key through billing, and the key row commits only after billing
/// confirmed the grant.
pub async fn create_key(
    db: &PgPool, billing: &BillingClient, email: &EmailAddress, role: Role, credits: i64,
    name: &str, mode: KeyMode,
) -> anyhow::Result<String> {
    anyhow::ensure!(credits >= 0, "credits must not be negative");
    let mut tx = db.begin().await?;
    // The row lock makes two first keys of one account take turns, so it gets one primary.
    let (account_id, primary): (Uuid, Option<Uuid>) = sqlx::query_as(
        "INSERT INTO accounts (id, email, created_at) VALUES ($1, $2, $3)
         ON CONFLICT (email) DO UPDATE SET email = EXCLUDED.email
         RETURNING id, primary_key_id",
    )
    .bind(Uuid::now_v7())
    .bind(email.key())
    .bind(now_unix())
    .fetch_one(&mut *tx)
    .await?;
    let key_id = Uuid::now_v7();
    let billing_key = primary.unwrap_or(key_id);
    let new = NewRow {
        account: account_id,
        id: key_id,
        billing_key,
        name,
        role,
        mode,
    };
    let key = insert_key(&mut tx, &new).await?;
    if primary.is_none() {
        sqlx::query("UPDATE accounts SET primary_key_id = $2 WHERE id = $1")
            .bind(account_id)
            .bind(key_id)
            .execute(&mut *tx)
            .await?;
    }
    // A first key always gets a grant (of 0, too), so its balance exists from the start.
    if primary.is_none() || credits > 0 {
        let grant = GrantRequest {
            api_key_id: billing_key.to_string(),
            account_id: account_id.to_string(),
            email: email.as_str().to_owned(),
            credits,
            idempotency_key: format!("grant:{key_id}"),
        };
        billing
            .grant(&grant)
            .await
            .map_err(|e| anyhow::anyhow!("billing could not grant the credits: {e}"))?;
    }
    tx.commit().await?;
    Ok(key)
}

/// A key row to insert: whose, its id, the key it bills to, its name, role and mode.
pub struct NewRow<'a> {
    pub account: Uuid,
    pub id: Uuid,
    pub billing_key: Uuid,
    pub name: &'a str,
    pub role: Role,
    pub mode: KeyMode,
}

/// Inserts `row`; the key's text.
pub async fn insert_key(tx: &mut sqlx::PgConnection, row: &NewRow<'_>) -> sqlx::Result<String> {
    let key = generate(row.mode);
    // One workspace per account for now: the workspace id is the account id.
    sqlx::query(
        "INSERT INTO api_keys (id, account_id, workspace_id, prefix, hash, role, created_at, name,
                               billing_key_id, mode)
         VALUES ($1, $2, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(row.id)
    .bind(row.account)
    .bind(&key.prefix)
    .bind(key.hash.as_slice())
    .bind(row.role)
    .bind(now_unix())
    .bind(row.name)
    .bind(row.billing_key)
    .bind(row.mode)
    .execute(tx)
    .await?;
    Ok(key.text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_parse_and_hash_to_the_stored_hash() {
        let key = generate(KeyMode::Live);
        let parsed = PresentedKey::parse(&key.text).expect("generated key parses");
        assert_eq!(parsed.prefix, key.prefix);
        assert_eq!(parsed.hash(), key.hash);
        assert_ne!(generate(KeyMode::Live).text, key.text);
        let test = generate(KeyMode::Test);
        assert!(test.text.starts_with("pm_test_"));
        assert_eq!(
            PresentedKey::parse(&test.text)
                .expect("a test key parses")
                .prefix,
            test.prefix
        );
    }

    #[test]
    fn malformed_tokens_are_not_keys() {
        let good = generate(KeyMode::Live).text;
        let cases = [
            String::new(),
            good.replacen("pm_", "pk_", 1),
            good[..good.len() - 1].to_owned(),
            format!("{good}0"),
            good.replace('_', "-"),
            format!("pm_{}_{}", "g".repeat(PREFIX_LEN), "0".repeat(SECRET_LEN)),
        ];
        for bad in cases {
            assert!(PresentedKey::parse(&bad).is_none(), "{bad:?} parsed");
        }
    }
}
