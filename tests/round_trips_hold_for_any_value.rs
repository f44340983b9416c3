//! Round trips, for generated values rather than a few examples: a callback written as JSON
//! reads back as the same callback (amounts with every digit and scale, times to the
//! nanosecond), a body signed with each kind of key verifies while the same signature
//! over any other body does not, and a cursor of the failing callbacks' listing reads back
//! from its token while any other `after` is refused without a panic.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::model::{CallbackBody, TransactionStatus, TransactionType};
use payhook::signature::{Algorithm, Encoding, PublicKey, SigningKey, Verifier};
use proptest::prelude::*;
use rust_decimal::Decimal;

/// Any exact amount: a 96-bit mantissa at any scale a decimal allows.
fn amount() -> impl Strategy<Value = Decimal> {
    (any::<u64>(), any::<u32>(), any::<bool>(), 0u32..=28).prop_map(|(lo, hi, negative, scale)| {
        Decimal::from_parts(
            u32::try_from(lo & 0xffff_ffff).unwrap(),
            u32::try_from(lo >> 32).unwrap(),
            hi,
            negative,
            scale,
        )
    })
}

fn time() -> impl Strategy<Value = chrono::DateTime<chrono::Utc>> {
    // Years 1970 to 2200, to the nanosecond.
    (0i64..7_258_118_400, 0u32..1_000_000_000)
        .prop_map(|(seconds, nanos)| chrono::DateTime::from_timestamp(seconds, nanos).unwrap())
}

prop_compose! {
    fn callback()(
        id in any::<i64>(),
        reference in any::<u128>(),
        nonce in "\\PC{1,64}",
        provider_id in proptest::option::of(any::<i64>()),
        transaction_type in any::<i32>(),
        transaction_status in any::<i32>(),
        message in proptest::option::of("\\PC{0,40}"),
        client_id in "\\PC{0,64}",
        amount in amount().prop_map(|a| a.abs()),
        currency in "[A-Z]{3}",
        destination_amount in proptest::option::of(amount()),
        created in proptest::option::of(time()),
    ) -> CallbackBody {
        CallbackBody {
            id,
            transaction_reference_id: uuid::Uuid::from_u128(reference),
            nonce: nonce.into(),
            provider_id,
            provider_transaction_id: message.clone(),
            transaction_type: TransactionType::from_code(transaction_type),
            transaction_status: TransactionStatus::from_code(transaction_status),
            transaction_status_message: message.clone(),
            transaction_internal_message: message,
            client_id,
            additional_data: serde_json::json!({"k": id}),
            amount,
            currency: currency.clone(),
            destination_amount,
            destination_currency: Some(currency),
            created_utc: created,
            updated_utc: created,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_callback_reads_back_from_its_own_json(body in callback()) {
        let json = serde_json::to_vec(&body).unwrap();
        let again: CallbackBody = serde_json::from_slice(&json).unwrap();
        prop_assert_eq!(&again, &body);
        // The scale survives too: 10.50 stays 10.50, not 10.5.
        prop_assert_eq!(again.amount.scale(), body.amount.scale());
    }
}

/// Each kind of key of the fixtures, with an algorithm it signs.
fn keys() -> Vec<(SigningKey, PublicKey, Algorithm)> {
    let fixtures = support::signature_fixtures();
    [
        ("rsa2048", Algorithm::RsaPssSha256),
        ("p256", Algorithm::EcdsaP256Sha256),
        ("p384", Algorithm::EcdsaP384Sha384Fixed),
        ("ed25519", Algorithm::Ed25519),
    ]
    .into_iter()
    .map(|(dir, algorithm)| {
        let private = std::fs::read(fixtures.join(dir).join("private.pem")).unwrap();
        let public = std::fs::read(fixtures.join(dir).join("public.pem")).unwrap();
        (
            SigningKey::from_pkcs8(&private, algorithm).unwrap(),
            PublicKey::parse(&public).unwrap().remove(0),
            algorithm,
        )
    })
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn what_a_key_signs_verifies_and_nothing_else_does(
        body in proptest::collection::vec(any::<u8>(), 0..2048),
        flip in any::<usize>(),
        extra in any::<u8>(),
    ) {
        for (signer, public, algorithm) in keys() {
            let verifier = Verifier::new("X-Signature", Encoding::Base64, None)
                .unwrap()
                .with_key(public, algorithm)
                .unwrap();
            let signature = signer.sign(&body).unwrap();
            prop_assert!(verifier.check(&body, &signature).is_ok(), "{:?}", algorithm);
            let mut other = body.clone();
            if other.is_empty() {
                other.push(extra);
            } else {
                let at = flip % other.len();
                other[at] ^= extra.max(1);
            }
            prop_assert!(verifier.check(&other, &signature).is_err(), "{:?}", algorithm);
        }
    }
}

/// A failing pair at a generated place in the listing: time, nonce and status.
fn failing_pair() -> impl Strategy<Value = payhook::store::FailingCallback> {
    (time(), "[^\u{0}]{1,80}", any::<i32>()).prop_map(|(at, nonce, status)| {
        payhook::store::FailingCallback {
            nonce: nonce.into(),
            status,
            failures: 1,
            first_failed: at,
            last_failed: at,
            last_reason: String::new(),
            transaction_reference_id: String::new(),
            client_id: String::new(),
            amount: "0".into(),
            currency: "EUR".into(),
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The cursor of a page of failing callbacks reads back from its token as the same place
    /// (times to the nanosecond, any nonce a store holds), and names a strict order: a pair
    /// never comes after its own place, and of two places each other, one comes first.
    #[test]
    fn a_failing_listing_cursor_reads_back_and_orders_strictly(
        a in failing_pair(),
        b in failing_pair(),
        same_time in any::<bool>(),
    ) {
        use payhook::store::FailingCursor;
        let b = if same_time { payhook::store::FailingCallback { last_failed: a.last_failed, ..b } } else { b };
        let cursor = FailingCursor::after(&a);
        let token = cursor.to_string();
        prop_assert!(token.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        prop_assert_eq!(token.parse::<FailingCursor>(), Ok(cursor.clone()));
        prop_assert!(!cursor.precedes(&a));
        let same_place = (a.last_failed, a.nonce.as_str(), a.status) == (b.last_failed, b.nonce.as_str(), b.status);
        let other = FailingCursor::after(&b);
        prop_assert_eq!(cursor.precedes(&b) ^ other.precedes(&a), !same_place);
    }

    /// Whatever an `after` holds — any text, or the token form of any seconds, nanoseconds,
    /// status and nonce, in range or not — reading it never panics, and what it reads
    /// writes back.
    #[test]
    fn any_after_is_read_or_refused(
        text in "\\PC{0,120}",
        seconds in any::<i64>(),
        nanos in any::<u32>(),
        status in "-?[0-9]{1,12}|x",
        nonce in "\\PC{0,40}",
    ) {
        use base64::Engine as _;
        let shaped = format!("{seconds}.{nanos}:{status}:{nonce}");
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(shaped);
        for token in [text, encoded] {
            if let Ok(cursor) = token.parse::<payhook::store::FailingCursor>() {
                prop_assert_eq!(cursor.to_string().parse(), Ok(cursor));
            }
        }
    }
}
