//! Open and click tracking tokens: what a tracked pixel or link carries — its delivery and,
//! for a click, the destination — signed with HMAC-SHA256 (`TRACKING_SECRET`). The sender
//! makes them; the gateway checks them before it answers, so it never redirects anyone to
//! a URL it did not sign and reads no database to do so.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

/// Bytes of a destination a click token carries at most: a longer link is not tracked.
pub const MAX_URL: usize = 2048;
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
    fn byte(self) -> u8 {
        match self {
            Self::Open => b'o',
            Self::Click => b'c',
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

    fn sign(&self, payload: Vec<u8>) -> String {
        let mut mac = self.mac.clone();
        mac.update(&payload);
        let mut token = payload;
        token.extend_from_slice(&mac.finalize().into_bytes()[..MAC_LEN]);
        URL_SAFE_NO_PAD.encode(token)
    }

    /// The pixel token of `delivery`.
    pub fn open(&self, delivery: Uuid) -> String {
        let mut payload = vec![HitKind::Open.byte()];
        payload.extend_from_slice(delivery.as_bytes());
        self.sign(payload)
    }

    /// The link token of `delivery` to `url`; none for a URL over [`MAX_URL`] bytes.
    pub fn click(&self, delivery: Uuid, url: &str) -> Option<String> {
        if url.len() > MAX_URL {
            return None;
        }
        let mut payload = vec![HitKind::Click.byte()];
        payload.extend_from_slice(delivery.as_bytes());
        payload.extend_from_slice(url.as_bytes());
        Some(self.sign(payload))
    }

    /// What `token` says, if it is ours and of `kind`; constant time in its signature.
    pub fn verify(&self, token: &str, kind: HitKind) -> Option<Claims> {
        if token.len() > MAX_TOKEN {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
        let cut = bytes.len().checked_sub(MAC_LEN)?;
        let (payload, signature) = bytes.split_at(cut);
        if payload.len() < 17 || payload[0] != kind.byte() {
            return None;
        }
        let mut mac = self.mac.clone();
        mac.update(payload);
        mac.verify_truncated_left(signature).ok()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_say_what_they_were_signed_with_and_nothing_else() {
        let key = TrackingKey::new("secret");
        let d = Uuid::now_v7();
        let open = key.open(d);
        assert_eq!(
            key.verify(&open, HitKind::Open),
            Some(Claims {
                kind: HitKind::Open,
                delivery: d,
                url: None
            })
        );
        assert_eq!(
            key.verify(&open, HitKind::Click),
            None,
            "an open is no click"
        );
        let click = key.click(d, "https://x.com/a?b=1").unwrap();
        let claims = key.verify(&click, HitKind::Click).unwrap();
        assert_eq!(claims.url.as_deref(), Some("https://x.com/a?b=1"));
        // Another key's token, a changed character, a cut token and junk are refused.
        assert_eq!(
            TrackingKey::new("other").verify(&click, HitKind::Click),
            None
        );
        let mut bytes = URL_SAFE_NO_PAD.decode(&click).unwrap();
        bytes[20] ^= 1;
        assert_eq!(
            key.verify(&URL_SAFE_NO_PAD.encode(&bytes), HitKind::Click),
            None
        );
        assert_eq!(key.verify(&click[..click.len() - 2], HitKind::Click), None);
        for junk in ["", "x", "!!!!", &"A".repeat(MAX_TOKEN + 1)] {
            assert_eq!(key.verify(junk, HitKind::Click), None, "{junk:.20}");
        }
        assert!(key.click(d, &"x".repeat(MAX_URL + 1)).is_none());
        let longest = key.click(d, &"x".repeat(MAX_URL)).unwrap();
        assert!(longest.len() <= MAX_TOKEN);
        assert!(key.verify(&longest, HitKind::Click).is_some());
    }
}
