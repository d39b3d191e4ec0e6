//! The pre-auth limiter: failed authentications per client address (an IPv6 address by its
//! /56, the least a customer network is given) in the current minute. Past
//! `AUTH_FAILURES_PER_IP_PER_MINUTE` the address is answered 429 for the rest of the minute
//! before any key is looked up, so a flood of made-up keys costs no database query each.
//! Kept in each gateway replica's memory: the check is on every keyed request, and a
//! replica's own count is enough to stop a flood reaching its database.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;

use postmesh_shared::db::now_unix;
use postmesh_shared::ApiError;

/// Addresses tracked at most; beyond it the counts start afresh (a flood of addresses
/// cannot grow the map without bound).
const ADDRESSES_MAX: usize = 100_000;

/// Failed authentications per address in the current minute.
pub struct FailedAuths {
    /// Failures an address may have in a minute; 0 turns the limit off.
    limit: u32,
    counts: Mutex<HashMap<IpAddr, (i64, u32)>>,
}

impl FailedAuths {
    /// A limiter allowing `limit` failures per address and minute.
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            counts: Mutex::new(HashMap::new()),
        }
    }

    /// 429 until the minute ends when `ip` has used up its failures in it.
    pub fn check(&self, ip: Option<IpAddr>) -> Result<(), ApiError> {
        let (Some(ip), true) = (ip, self.limit > 0) else {
            return Ok(());
        };
        let now = now_unix();
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        match counts.get(&bucket(ip)) {
            Some(&(minute, failures)) if minute == now / 60 && failures >= self.limit => {
                Err(ApiError::TooManyRequests {
                    message: "too many failed authentications from this address; wait a minute"
                        .into(),
                    retry_after: u64::try_from(60 - now % 60).unwrap_or(60),
                })
            }
            _ => Ok(()),
        }
    }

    /// Counts a failed authentication of `ip`.
    pub fn failed(&self, ip: Option<IpAddr>) {
        let Some(ip) = ip else { return };
        let minute = now_unix() / 60;
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if counts.len() >= ADDRESSES_MAX {
            counts.retain(|_, (m, _)| *m == minute);
            if counts.len() >= ADDRESSES_MAX {
                counts.clear();
            }
        }
        let entry = counts.entry(bucket(ip)).or_insert((minute, 0));
        if entry.0 != minute {
            *entry = (minute, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }
}

/// The address a limit counts: an IPv4 address itself (also when written IPv4-mapped), an
/// IPv6 address by its /56.
fn bucket(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut octets = v6.octets();
                octets[7..].fill(0);
                IpAddr::V6(Ipv6Addr::from(octets))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_refused_after_its_failures_and_ipv6_counts_by_56() {
        let limiter = FailedAuths::new(3);
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        for _ in 0..3 {
            assert!(limiter.check(ip("203.0.113.9")).is_ok());
            limiter.failed(ip("203.0.113.9"));
        }
        let refused = limiter.check(ip("203.0.113.9")).unwrap_err();
        assert!(
            matches!(refused, ApiError::TooManyRequests { retry_after, .. } if (1..=60).contains(&retry_after))
        );
        assert!(
            limiter.check(ip("::ffff:203.0.113.9")).is_err(),
            "mapped is the same"
        );
        assert!(limiter.check(ip("203.0.113.10")).is_ok());
        for n in 0..3u8 {
            limiter.failed(ip(&format!("2001:db8:1:ff{n:02x}::1")));
        }
        assert!(limiter.check(ip("2001:db8:1:ffee::7")).is_err(), "same /56");
        assert!(
            limiter.check(ip("2001:db8:1:100::1")).is_ok(),
            "another /56"
        );
        assert!(
            FailedAuths::new(0).check(ip("203.0.113.9")).is_ok(),
            "0 is off"
        );
    }
}
