//! What keeps one client from wearing the service down: its connections at once, and all
//! clients' (per replica), and its failed logins (in Redis, across replicas).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;

use postmesh_shared::Namespace;

/// Open connections, per client and all together (per replica).
pub struct Connections {
    per_client: usize,
    total: usize,
    open: Arc<Mutex<Open>>,
}

/// Who holds the open connections.
#[derive(Default)]
struct Open {
    per_client: HashMap<IpAddr, usize>,
    total: usize,
}

/// One open connection, counted until it is dropped.
pub struct Slot {
    client: IpAddr,
    open: Arc<Mutex<Open>>,
}

/// Why a connection gets no slot.
#[derive(Debug, PartialEq, Eq)]
pub enum Full {
    /// Its client holds [`Connections`]' most already.
    Client,
    /// The replica holds its most already.
    Service,
}

/// The client an address is counted as: an IPv6 one by its /64, which one host is
/// typically given whole; an IPv4 one (also as `::ffff:a.b.c.d`) by itself.
pub fn client_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::from([s[0], s[1], s[2], s[3], 0, 0, 0, 0])
        }
        v4 => v4,
    }
}

impl Connections {
    /// At most `per_client` connections per client ([`client_of`]) and `total` in all.
    pub fn new(per_client: usize, total: usize) -> Self {
        Self {
            per_client,
            total,
            open: Arc::default(),
        }
    }

    /// A slot for a connection from `ip`, unless its client or the replica holds the most.
    pub fn take(&self, ip: IpAddr) -> Result<Slot, Full> {
        let client = client_of(ip);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.total >= self.total {
            return Err(Full::Service);
        }
        let count = open.per_client.entry(client).or_insert(0);
        if *count >= self.per_client {
            return Err(Full::Client);
        }
        *count += 1;
        open.total += 1;
        Ok(Slot {
            client,
            open: self.open.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total -= 1;
        if let Some(count) = open.per_client.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.per_client.remove(&self.client);
            }
        }
    }
}

/// Failed logins per client ([`client_of`]) within a window, all replicas together: the window
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

    /// The Redis key counting `ip`'s client's failures.
    fn key(&self, ip: IpAddr) -> String {
        failures_key(&self.prefix, ip)
    }

    /// Whether `ip` has failed too often within its window. Redis unreachable: not locked
    /// (the login itself is still checked).
    pub async fn locked(&self, ip: IpAddr) -> bool {
        let mut redis = self.redis.clone();
        let count: Option<u32> = redis::cmd("GET")
            .arg(self.key(ip))
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
        let key = self.key(ip);
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

/// The key under `prefix` counting the failed logins of `ip`'s client ([`client_of`]): one
/// host rotating through its /64 is counted once.
fn failures_key(prefix: &str, ip: IpAddr) -> String {
    format!("{prefix}{}", client_of(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_logins_are_counted_per_client() {
        let key = |s: &str| failures_key("p:", s.parse().unwrap());
        assert_eq!(key("2001:db8::1"), key("2001:db8::ffff:2"));
        assert_ne!(key("2001:db8::1"), key("2001:db8:0:1::1"));
        assert_eq!(key("192.0.2.1"), key("::ffff:192.0.2.1"));
    }

    #[test]
    fn a_clients_connections_and_the_replicas_are_bounded() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let limits = Connections::new(2, 3);
        let (a, b) = (
            limits.take(ip("192.0.2.1")),
            limits.take(ip("::ffff:192.0.2.1")),
        );
        assert!(a.is_ok() && b.is_ok());
        assert_eq!(limits.take(ip("192.0.2.1")).err(), Some(Full::Client));
        // One /64 is one client; the next /64 another.
        let c = limits.take(ip("2001:db8::1"));
        assert!(c.is_ok());
        assert_eq!(limits.take(ip("2001:db8::2")).err(), Some(Full::Service));
        drop(a);
        let d = limits.take(ip("2001:db8::ffff:1"));
        assert!(d.is_ok());
        drop(b);
        assert_eq!(limits.take(ip("2001:db8::3")).err(), Some(Full::Client));
        assert!(limits.take(ip("2001:db8:0:1::1")).is_ok());
        assert_eq!(
            client_of(ip("2001:db8::1")),
            client_of(ip("2001:db8::ffff:ffff"))
        );
        assert_ne!(
            client_of(ip("2001:db8::1")),
            client_of(ip("2001:db8:0:1::1"))
        );
    }
}
