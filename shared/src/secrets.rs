//! Secrets at rest (DNS host tokens, webhook signing secrets): ChaCha20-Poly1305 under
//! `SECRETS_KEY`, a random nonce per value, and the owner's id as associated data, so a
//! sealed value copied to another row does not open.

use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};

/// Bytes of the nonce stored in front of each sealed value.
const NONCE_LEN: usize = 12;

/// `SECRETS_KEY` outside production when none is set. Never use it for real secrets.
pub const DEV_SECRETS_KEY: &str = crate::config::SECRETS_KEY.default;

/// Seals and opens secrets with one key.
#[derive(Clone)]
pub struct SecretBox {
    cipher: ChaCha20Poly1305,
}

impl SecretBox {
    /// The box of `key_hex`: 32 bytes as 64 hex digits.
    pub fn from_hex(key_hex: &str) -> anyhow::Result<Self> {
        let key = hex::decode(key_hex.trim())
            .ok()
            .filter(|k| k.len() == 32)
            .ok_or_else(|| anyhow::anyhow!("SECRETS_KEY must be 64 hex digits (32 bytes)"))?;
        let cipher = ChaCha20Poly1305::new_from_slice(&key)
            .map_err(|_| anyhow::anyhow!("SECRETS_KEY has the wrong length"))?;
        Ok(Self { cipher })
    }

    /// `nonce || ciphertext` of `plain`, bound to `owner`.
    pub fn seal(&self, owner: &[u8], plain: &[u8]) -> Vec<u8> {
        let nonce_bytes: [u8; NONCE_LEN] = rand::random();
        let sealed = self
            .cipher
            .encrypt(
                (&nonce_bytes).into(),
                Payload {
                    msg: plain,
                    aad: owner,
                },
            )
            .expect("encrypting in memory cannot fail");
        let mut out = nonce_bytes.to_vec();
        out.extend(sealed);
        out
    }

    /// The plain text of a value sealed for `owner`; `None` when it was not (another key,
    /// another owner, or altered).
    pub fn open(&self, owner: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < NONCE_LEN {
            return None;
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce: &[u8; NONCE_LEN] = nonce.try_into().ok()?;
        self.cipher
            .decrypt(
                nonce.into(),
                Payload {
                    msg: body,
                    aad: owner,
                },
            )
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::SecretBox;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn a_sealed_value_opens_only_for_its_owner_and_key() {
        let sb = SecretBox::from_hex(KEY).unwrap();
        let sealed = sb.seal(b"workspace-a", b"cf-token");
        assert!(!sealed.windows(8).any(|w| w == b"cf-token"), "not in clear");
        assert_eq!(sb.open(b"workspace-a", &sealed).unwrap(), b"cf-token");
        assert_eq!(sb.open(b"workspace-b", &sealed), None);
        let other = SecretBox::from_hex(&KEY.replace("00", "ff")).unwrap();
        assert_eq!(other.open(b"workspace-a", &sealed), None);
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(sb.open(b"workspace-a", &altered), None);
        assert_ne!(sb.seal(b"workspace-a", b"cf-token"), sealed, "fresh nonce");
    }

    #[test]
    fn keys_must_be_32_bytes_of_hex() {
        assert!(SecretBox::from_hex("abcd").is_err());
        assert!(SecretBox::from_hex(&"zz".repeat(32)).is_err());
    }
}
