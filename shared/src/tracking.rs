//! Open and click tracking tokens: what a tracked pixel or link carries — its delivery and,
//! for a click, the destination — signed with HMAC-SHA256 (`TRACKING_SECRET`). The sender
//! makes them; the gateway checks them before it answers, so it never redirects anyone to
//! a URL it did not sign and reads no database to do so. A token made for a domain's own
//! tracking host (`track.<domain>`) is bound to it and to the domain ([`Binding`]): its
//! signature covers both, so it works on that host only while the same domain holds it
//! (not after the domain was removed and added again, by another workspace or the same),
//! and a token of the shared hosts works on none of the custom ones.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

/// Bytes of a destination a click token carries at most: a longer link is not tracked.
pub const MAX_URL: usize = 2048;
/// Bytes of a hit's `User-Agent` kept at most.
pub const MAX_USER_AGENT: usize = 512;
/// Characters of a token at most (a longer one is refused before it is decoded).
pub const MAX_TOKEN: usize = (1 + 16 + MAX_URL + MAC_LEN) * 4 / 3 + 4;
/// Bytes of the HMAC a token keeps (128 bits).
const MAC_LEN: usize = 16;

/// What a token is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HitKind {
    /// The open pixel (`/t/o/{token}`).
    Open,
    /// A tracked link (`/t/c/{token}`).
    Click,
}

impl HitKind {
    /// The token's first byte: lower case for the shared hosts, upper case when bound to a
    /// host (so that no token of one kind can be read as one of the other).
    fn byte(self, bound: bool) -> u8 {
        let byte = match self {
            Self::Open => b'o',
            Self::Click => b'c',
        };
        if bound {
            byte.to_ascii_uppercase()
        } else {
            byte
        }
    }

    /// `opened` or `clicked`: the event it makes.
    pub fn event(self) -> &'static str {
        match self {
            Self::Open => "opened",
            Self::Click => "clicked",
        }
    }
}

/// What a valid token says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    pub kind: HitKind,
    pub delivery: Uuid,
    /// A click's destination.
    pub url: Option<String>,
}

/// What a token for a domain's own tracking host is bound to: the host, and the domain that
/// verified it (its id in the domain service).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding<'a> {
    pub host: &'a str,
    pub domain: Uuid,
}

/// Signs and checks tracking tokens.
#[derive(Clone)]
pub struct TrackingKey {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for TrackingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TrackingKey(..)")
    }
}

impl TrackingKey {
    /// Tokens signed with `secret`.
    pub fn new(secret: &str) -> Self {
        Self {
            mac: Hmac::new_from_slice(secret.as_bytes()).expect("any key length"),
        }
    }

    /// The MAC of `payload` as a token `bound` (none: for the shared hosts) has it: a bound
    /// one covers the host's length and name and the domain's id before the payload.
    fn mac(&self, payload: &[u8], bound: Option<Binding>) -> Option<Hmac<Sha256>> {
        let mut mac = self.mac.clone();
        if let Some(Binding { host, domain }) = bound {
            let host = canonical_host(host);
            mac.update(&u16::try_from(host.len()).ok()?.to_be_bytes());
            mac.update(host.as_bytes());
            mac.update(domain.as_bytes());
        }
        mac.update(payload);
        Some(mac)
    }

    fn sign(
        &self, kind: HitKind, delivery: Uuid, url: &str, bound: Option<Binding>,
    ) -> Option<String> {
        let mut token = vec![kind.byte(bound.is_some())];
        token.extend_from_slice(delivery.as_bytes());
        token.extend_from_slice(url.as_bytes());
        let mac = self.mac(&token, bound)?;
        token.extend_from_slice(&mac.finalize().into_bytes()[..MAC_LEN]);
        Some(URL_SAFE_NO_PAD.encode(token))
    }

    /// The pixel token of `delivery`, `bound` when given.
    pub fn open(&self, delivery: Uuid, bound: Option<Binding>) -> Option<String> {
        self.sign(HitKind::Open, delivery, "", bound)
    }

    /// The link token of `delivery` to `url`, `bound` when given; none for a URL over
    /// [`MAX_URL`] bytes.
    pub fn click(&self, delivery: Uuid, url: &str, bound: Option<Binding>) -> Option<String> {
        if url.len() > MAX_URL {
            return None;
        }
        self.sign(HitKind::Click, delivery, url, bound)
    }

    /// What `token` says, if it is ours, of `kind` and `bound` so (none: made for the shared
    /// hosts); constant time in its signature.
    pub fn verify(&self, token: &str, kind: HitKind, bound: Option<Binding>) -> Option<Claims> {
        if token.len() > MAX_TOKEN {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
        let cut = bytes.len().checked_sub(MAC_LEN)?;
        let (payload, signature) = bytes.split_at(cut);
        if payload.len() < 17 || payload[0] != kind.byte(bound.is_some()) {
            return None;
        }
        self.mac(payload, bound)?
            .verify_truncated_left(signature)
            .ok()?;
        let delivery = Uuid::from_slice(&payload[1..17]).ok()?;
        let url = match kind {
            HitKind::Open if payload.len() == 17 => None,
            HitKind::Open => return None,
            HitKind::Click => Some(String::from_utf8(payload[17..].to_vec()).ok()?),
        };
        Some(Claims {
            kind,
            delivery,
            url,
        })
    }
}

/// `host` without a port or a final dot, its case as given.
pub fn host_name(host: &str) -> &str {
    let name = match host.strip_prefix('[') {
        // An IPv6 literal keeps its brackets.
        Some(rest) => rest.find(']').map_or(host, |end| &host[..end + 2]),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.trim_end_matches('.')
}

/// `host` as tokens are bound to it: its [`host_name`] in lower case.
pub fn canonical_host(host: &str) -> String {
    host_name(host).to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_say_what_they_were_signed_with_and_nothing_else() {
        let key = TrackingKey::new("secret");
        let d = Uuid::now_v7();
        let open = key.open(d, None).unwrap();
        assert_eq!(
            key.verify(&open, HitKind::Open, None),
            Some(Claims {
                kind: HitKind::Open,
                delivery: d,
                url: None
            })
        );
        assert_eq!(
            key.verify(&open, HitKind::Click, None),
            None,
            "an open is no click"
        );
        let click = key.click(d, "https://x.com/a?b=1", None).unwrap();
        let claims = key.verify(&click, HitKind::Click, None).unwrap();
        assert_eq!(claims.url.as_deref(), Some("https://x.com/a?b=1"));
        // Another key's token, a changed character, a cut token and junk are refused.
        assert_eq!(
            TrackingKey::new("other").verify(&click, HitKind::Click, None),
            None
        );
        let mut bytes = URL_SAFE_NO_PAD.decode(&click).unwrap();
        bytes[20] ^= 1;
        assert_eq!(
            key.verify(&URL_SAFE_NO_PAD.encode(&bytes), HitKind::Click, None),
            None
        );
        assert_eq!(
            key.verify(&click[..click.len() - 2], HitKind::Click, None),
            None
        );
        for junk in ["", "x", "!!!!", &"A".repeat(MAX_TOKEN + 1)] {
            assert_eq!(key.verify(junk, HitKind::Click, None), None, "{junk:.20}");
        }
        assert!(key.click(d, &"x".repeat(MAX_URL + 1), None).is_none());
        let longest = key.click(d, &"x".repeat(MAX_URL), None).unwrap();
        assert!(longest.len() <= MAX_TOKEN);
        assert!(key.verify(&longest, HitKind::Click, None).is_some());
    }

    #[test]
    fn a_token_bound_to_a_host_works_there_only_for_its_domain() {
        let key = TrackingKey::new("secret");
        let d = Uuid::now_v7();
        let url = "https://x.com/a";
        let (domain, later_owner) = (Uuid::now_v7(), Uuid::now_v7());
        let at = |host| Some(Binding { host, domain });
        let a = key.click(d, url, at("track.a.example")).unwrap();
        let verify = |token: &str, bound| key.verify(token, HitKind::Click, bound);
        assert_eq!(
            verify(&a, at("TRACK.a.example.:443")).and_then(|c| c.url),
            Some(url.to_owned()),
            "its host in any case, with a port or a final dot"
        );
        assert_eq!(verify(&a, at("track.b.example")), None, "another host");
        let moved = Binding {
            host: "track.a.example",
            domain: later_owner,
        };
        assert_eq!(
            verify(&a, Some(moved)),
            None,
            "the host's domain added again"
        );
        assert_eq!(verify(&a, None), None, "the shared hosts");
        let shared = key.click(d, url, None).unwrap();
        assert_eq!(verify(&shared, at("track.a.example")), None);
        // A shared token's bytes, kind byte raised, are no bound token either.
        let mut raised = URL_SAFE_NO_PAD.decode(&shared).unwrap();
        raised[0] = b'C';
        let raised = URL_SAFE_NO_PAD.encode(raised);
        assert_eq!(verify(&raised, at("track.a.example")), None);
        let open = key.open(d, at("track.a.example")).unwrap();
        assert!(key
            .verify(&open, HitKind::Open, at("track.a.example"))
            .is_some());
        assert_eq!(key.verify(&open, HitKind::Open, None), None);
        let long = "h".repeat(70_000);
        assert_eq!(verify(&"A".repeat(40), at(&long)), None);
    }

    #[test]
    fn hosts_are_compared_by_name() {
        assert_eq!(canonical_host("Track.Example.com."), "track.example.com");
        assert_eq!(
            canonical_host("track.example.com:8443"),
            "track.example.com"
        );
        assert_eq!(canonical_host("[::1]:8080"), "[::1]");
        assert_eq!(canonical_host("[::1]"), "[::1]");
        assert_eq!(canonical_host("127.0.0.1:8080"), "127.0.0.1");
    }
}
