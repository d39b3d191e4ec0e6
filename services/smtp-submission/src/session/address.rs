//! Envelope addresses as `MAIL FROM` and `RCPT TO` give them, and their parameters.

use postmesh_shared::EmailAddress;
use smtp_proto::{
    MailFrom, RcptTo, MAIL_BODY_7BIT, MAIL_BODY_8BITMIME, MAIL_BODY_BINARYMIME, MAIL_REQUIRETLS,
    MAIL_RET_FULL, MAIL_RET_HDRS, MAIL_SMTPUTF8,
};

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

/// 555 for a `MAIL FROM` parameter of an extension this server does not offer (RFC 5321
/// §4.1.1.11): taken silently, `REQUIRETLS` would be dropped and a held message sent now.
/// `SIZE`, `BODY=7BIT|8BITMIME`, `SMTPUTF8` and `AUTH=` (RFC 4954 §5) are taken.
pub fn offered_mail(from: &MailFrom<String>) -> Result<(), Reply> {
    let flags = from.flags & !(MAIL_BODY_7BIT | MAIL_BODY_8BITMIME | MAIL_SMTPUTF8);
    let unoffered = [
        (flags & MAIL_REQUIRETLS != 0, "REQUIRETLS"),
        (flags & MAIL_BODY_BINARYMIME != 0, "BODY=BINARYMIME"),
        (flags & (MAIL_RET_FULL | MAIL_RET_HDRS) != 0, "RET"),
        (from.env_id.is_some(), "ENVID"),
        (
            from.hold_for != 0 || from.hold_until != 0,
            "HOLDFOR/HOLDUNTIL",
        ),
        (from.by != 0, "BY"),
        (from.mt_priority != 0, "MT-PRIORITY"),
        (from.mtrk.is_some(), "MTRK"),
        (
            from.trans_id.is_some() || from.solicit.is_some(),
            "TRANSID/SOLICIT",
        ),
        (flags != 0, "a parameter"),
    ];
    refuse_any(&unoffered)
}

/// 555 for a `RCPT TO` parameter (`NOTIFY`, `ORCPT`, `RRVS`): none is offered.
pub fn offered_rcpt(to: &RcptTo<String>) -> Result<(), Reply> {
    refuse_any(&[
        (to.orcpt.is_some(), "ORCPT"),
        (to.rrvs != 0, "RRVS"),
        (to.flags != 0, "NOTIFY"),
    ])
}

fn refuse_any(params: &[(bool, &str)]) -> Result<(), Reply> {
    match params.iter().find(|(given, _)| *given) {
        Some((_, name)) => Err(Reply::new(555, "5.5.4", format!("{name} is not supported"))),
        None => Ok(()),
    }
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
