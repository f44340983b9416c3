//! A callback refused for its body: what an operator needs to find it among the failing
//! callbacks.
//!
//! A callback body payhook cannot read as a payment — a required field `null` or of another
//! type, a reference that is no GUID, a negative amount, a client id carrying U+0000 — is
//! answered 400. The aggregator sends the same bytes on each of its attempts, and each is
//! refused the same way: after the last, the transaction's result is never booked. Logs and
//! the answers' counts alone would leave that to be noticed. So a refused body that passed
//! the endpoint's authentication (its signature verified, or signatures are off) is recorded
//! among the failing callbacks under its (nonce, status), read field by field, with the
//! refusal as its reason: it is listed by `GET /payhook/admin/callbacks/failing`, counted by
//! `payhook_callbacks_failing`, and goes away like any failing callback, once booked (by
//! `payhook reconcile --ref`, or a later delivery the handler acknowledges) or with the
//! retention.
//!
//! What could not be read is left empty in the record: the nil reference, a zero amount, an
//! empty client id or currency (the reason names the field that was refused). A currency is
//! kept as a failed delivery's is (`CallbackFailure::kept_currency`): cut, never refused. A
//! body whose nonce or status cannot be read has no (nonce, status) to be listed under; its
//! refusal is logged at error level.

use crate::model::ReadableCallback;
use crate::store::CallbackFailure;

use super::ingress::{is_blank, unkeepable};

/// The failure to record for a callback body refused with `reason`, or `None` when it has no
/// readable nonce (a non-blank string payhook can key, of at most `max_chars` characters)
/// and status.
pub(super) fn failure(bytes: &[u8], reason: String, max_chars: usize) -> Option<CallbackFailure> {
    let readable = ReadableCallback::of(bytes);
    let nonce = readable
        .nonce
        .filter(|nonce| !is_blank(nonce) && unkeepable(nonce, max_chars).is_none())?;
    let kept = |text: Option<String>| {
        text.filter(|text| unkeepable(text, max_chars).is_none())
            .unwrap_or_default()
    };
    Some(CallbackFailure {
        nonce: nonce.into(),
        status: readable.status?,
        reason,
        transaction_reference_id: readable.reference.unwrap_or_default(),
        client_id: kept(readable.client_id),
        amount: readable.amount.unwrap_or_default(),
        currency: readable
            .currency
            .map(|currency| CallbackFailure::kept_currency(&currency))
            .unwrap_or_default(),
        at: chrono::Utc::now(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::model::TransactionStatus;

    #[test]
    fn a_refused_body_is_recorded_under_its_nonce_and_status_with_what_can_be_read() {
        let body = br#"{"transactionReferenceId":"not-a-guid","nonce":"n-1","transactionStatus":4,
            "clientId":"c\u0000","amount":12.5,"currency":null}"#;
        let failure = failure(body, "invalid field".to_owned(), 64).unwrap();
        assert_eq!(failure.nonce, "n-1");
        assert_eq!(failure.status, TransactionStatus::Success);
        assert_eq!(failure.reason, "invalid field");
        assert!(failure.transaction_reference_id.is_nil());
        assert_eq!(failure.client_id, "", "U+0000 is not kept");
        assert_eq!(failure.amount.to_string(), "12.5");
        assert_eq!(failure.currency, "");
    }

    /// The status is read as a delivery reads it: a sender that writes its numbers as
    /// strings has `"4"` read as a success, and a body refused for another field (an id
    /// as a string, which no integer field accepts) is listed, not only logged.
    #[test]
    fn a_status_is_read_as_the_body_reads_it() {
        let body = br#"{"id":"1001","nonce":"n-1","transactionStatus":"4"}"#;
        let listed = failure(body, "invalid field `id`".to_owned(), 64).unwrap();
        assert_eq!(listed.status, TransactionStatus::Success);
        for (code, status) in [
            ("4.0", TransactionStatus::Success),
            ("\"-1\"", TransactionStatus::from_code(-1)),
        ] {
            let body = format!(r#"{{"nonce":"n-1","transactionStatus":{code}}}"#);
            let listed = failure(body.as_bytes(), String::new(), 64).unwrap();
            assert_eq!(listed.status, status, "{code}");
        }
    }

    #[test]
    fn a_body_without_a_keepable_nonce_and_status_is_not_recorded() {
        for body in [
            &br#"{"nonce":null,"transactionStatus":4}"#[..],
            br#"{"nonce":" \t","transactionStatus":4}"#,
            br#"{"nonce":"0123456789","transactionStatus":4}"#,
            br#"{"nonce":"n-1","transactionStatus":"four"}"#,
            br#"{"nonce":"n-1"}"#,
            b"{",
        ] {
            let text = String::from_utf8_lossy(body);
            assert_eq!(failure(body, String::new(), 9), None, "{text}");
        }
    }

    /// A refused body's currency is kept by the rule a failed delivery's is: a long one cut,
    /// U+0000 shown as U+FFFD, not emptied.
    #[test]
    fn a_currency_is_kept_as_a_failed_delivery_keeps_it() {
        let long = format!(
            r#"{{"nonce":"n-1","transactionStatus":4,"currency":"{}"}}"#,
            "E".repeat(300)
        );
        let kept = failure(long.as_bytes(), String::new(), 256)
            .unwrap()
            .currency;
        assert_eq!(kept, format!("{}…", "E".repeat(64)));
        let body = br#"{"nonce":"n-1","transactionStatus":4,"currency":"EU\u0000"}"#;
        let kept = failure(body, String::new(), 256).unwrap().currency;
        assert_eq!(kept, "EU\u{fffd}");
    }
}
