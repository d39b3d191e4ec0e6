//! What keeps one client from wearing the service down: its connections at once (per
//! replica) and its failed logins (in Redis, across replicas).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;

use postmesh_shared::Namespace;

/// Open connections per client address.
pub struct Connections {
    max: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One open connection, counted until it is dropped.
pub struct Slot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Connections {
    /// At most `max` connections per address.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            open: Arc::default(),
        }
    }

    /// A slot for a connection from `ip`, unless it holds the most already.
    pub fn take(&self, ip: IpAddr) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Slot {
            ip,
            open: self.open.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Failed logins per client address within a window, all replicas together: the window
/// starts at an address's first failure and its count expires with it.
pub struct FailedLogins {
    redis: ConnectionManager,
    prefix: String,
    max: u32,
    window: Duration,
}

impl FailedLogins {
    /// At most `max` failures per address in `window`, under the namespace's keys.
    pub fn new(redis: ConnectionManager, ns: &Namespace, max: u32, window: Duration) -> Self {
        Self {
            redis,
            prefix: format!("{}:smtp:failed-logins:", ns.as_str()),
            max,
            window,
        }
    }

    /// Whether `ip` has failed too often within its window. Redis unreachable: not locked
    /// (the login itself is still checked).
    pub async fn locked(&self, ip: IpAddr) -> bool {
        let mut redis = self.redis.clone();
        let count: Option<u32> = redis::cmd("GET")
            .arg(format!("{}{ip}", self.prefix))
            .query_async(&mut redis)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "reading failed logins");
                None
            });
        count.is_some_and(|c| c >= self.max)
    }

    /// Counts a failure of `ip`; answers whether it is now locked out.
    pub async fn fail(&self, ip: IpAddr) -> bool {
        let mut redis = self.redis.clone();
        let key = format!("{}{ip}", self.prefix);
        let counted: Result<(u32, i64), _> = redis::pipe()
            .atomic()
            .cmd("INCR")
            .arg(&key)
            .cmd("EXPIRE")
            .arg(&key)
            .arg(self.window.as_secs().max(1))
            .arg("NX")
            .query_async(&mut redis)
            .await;
        match counted {
            Ok((count, _)) => count >= self.max,
            Err(e) => {
                tracing::warn!(error = %e, "counting a failed login");
                false
            }
        }
    }
}
