//! The signature header: any header value (in every encoding, with and without a scheme
//! prefix) and body give a verdict or an error, never a panic, and never "verified" for
//! bytes the key did not sign.
#![no_main]

use libfuzzer_sys::fuzz_target;
use payhook::signature::{Algorithm, Encoding, PublicKey, Verifier};
use std::sync::OnceLock;

const PUBLIC: &str = include_str!("../../tests/fixtures/signatures/ed25519/public.pem");

fn verifiers() -> &'static [Verifier] {
    static VERIFIERS: OnceLock<Vec<Verifier>> = OnceLock::new();
    VERIFIERS.get_or_init(|| {
        let key = PublicKey::parse(PUBLIC.as_bytes()).expect("the fixed key reads")[0].clone();
        [
            (Encoding::Base64, None),
            (Encoding::Hex, Some("sha256=")),
            (Encoding::Base64Url, None),
        ]
        .into_iter()
        .map(|(encoding, prefix)| {
            Verifier::new("X-Signature", encoding, prefix)
                .and_then(|v| v.with_key(key.clone(), Algorithm::Ed25519))
                .expect("a verifier")
        })
        .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    // The first line is the header value, the rest the body.
    let split = data.iter().position(|b| *b == b'\n').unwrap_or(data.len());
    let (value, body) = (&data[..split], data.get(split + 1..).unwrap_or_default());
    let Ok(value) = http::HeaderValue::from_bytes(value) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert("x-signature", value);
    for verifier in verifiers() {
        // No fuzzed input can carry a valid Ed25519 signature of its own body by this key.
        assert!(verifier.verify(&headers, body).is_err());
    }
});
