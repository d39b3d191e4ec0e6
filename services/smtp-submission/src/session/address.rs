//! Envelope addresses as `MAIL FROM` and `RCPT TO` give them.

use postmesh_shared::EmailAddress;

use crate::reply::Reply;

/// Refused unless `address` is a mailbox; a non-ASCII one needs SMTPUTF8 (RFC 6531).
pub fn address_of(address: &str, smtputf8: bool, status: &'static str) -> Result<(), Reply> {
    if address.is_empty() {
        return Err(Reply::new(553, status, "an address is required"));
    }
    if !address.is_ascii() && !smtputf8 {
        return Err(Reply::new(
            553,
            "5.6.7",
            "a non-ASCII address needs SMTPUTF8",
        ));
    }
    EmailAddress::parse(address)
        .map(|_| ())
        .ok_or_else(|| Reply::new(553, status, format!("{address:?} is not a valid address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_need_smtputf8_to_be_non_ascii() {
        assert!(address_of("ann@example.com", false, "5.1.3").is_ok());
        assert_eq!(
            address_of("ännä@example.com", false, "5.1.3")
                .unwrap_err()
                .status,
            "5.6.7"
        );
        assert!(address_of("ännä@example.com", true, "5.1.3").is_ok());
        assert_eq!(address_of("", false, "5.1.7").unwrap_err().code, 553);
        assert_eq!(
            address_of("no-at", false, "5.1.3").unwrap_err().status,
            "5.1.3"
        );
    }
}
