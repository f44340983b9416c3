//! Independent test vectors (Python `cryptography` and OpenSSL, not ring) verify with every
//! key format, and every kind of damage makes them fail.
#![allow(clippy::unwrap_used, reason = "tests")]

use payhook::signature::{Algorithm, Encoding, KeyKind, PublicKey, SigningKey, Verifier};
use serde::Deserialize;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/signatures")
}

#[derive(Deserialize)]
struct Vectors {
    body: String,
    vectors: Vec<Vector>,
}

#[derive(Deserialize, Debug)]
struct Vector {
    name: String,
    key: String,
    algorithm: String,
    encoding: String,
    prefix: String,
    header_value: String,
}

impl Vector {
    fn algorithm(&self) -> Algorithm {
        self.algorithm.parse().unwrap()
    }

    fn encoding(&self) -> Encoding {
        self.encoding.parse().unwrap()
    }

    /// The raw signature bytes.
    fn signature(&self) -> Vec<u8> {
        self.encoding()
            .decode(&self.header_value[self.prefix.len()..])
            .unwrap()
    }
}

fn load() -> (Vec<u8>, Vec<Vector>) {
    let manifest: Vectors =
        serde_json::from_slice(&std::fs::read(fixtures().join("vectors.json")).unwrap()).unwrap();
    let body = std::fs::read(fixtures().join(&manifest.body)).unwrap();
    assert!(manifest.vectors.len() >= 24);
    (body, manifest.vectors)
}

/// Every public key file of `key`, each read on its own.
fn key_files(key: &str) -> Vec<(String, PublicKey)> {
    let mut names = vec!["public.pem", "public.der", "public.jwk"];
    if key.starts_with("rsa") {
        names.extend(["public_pkcs1.pem", "public_pkcs1.der", "public.xml"]);
    }
    names
        .into_iter()
        .map(|name| {
            let bytes = std::fs::read(fixtures().join(key).join(name)).unwrap();
            let mut keys = PublicKey::parse(&bytes).unwrap_or_else(|e| panic!("{key}/{name}: {e}"));
            assert_eq!(keys.len(), 1, "{key}/{name}");
            (format!("{key}/{name}"), keys.remove(0))
        })
        .collect()
}

fn public_key(key: &str) -> PublicKey {
    key_files(key).remove(0).1
}

fn verifier_for(vector: &Vector, key: PublicKey) -> Verifier {
    let prefix = Some(vector.prefix.as_str()).filter(|p| !p.is_empty());
    Verifier::new("X-Signature", vector.encoding(), prefix)
        .unwrap()
        .with_key(key, vector.algorithm())
        .unwrap()
}

fn headers(value: &str) -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    headers.insert("x-signature", value.parse().unwrap());
    headers
}

#[test]
fn every_vector_verifies_with_every_format_of_its_key() {
    let (body, vectors) = load();
    for vector in &vectors {
        for (file, key) in key_files(&vector.key) {
            let verifier = verifier_for(vector, key);
            assert!(
                verifier
                    .verify(&headers(&vector.header_value), &body)
                    .is_ok(),
                "{} with {file}",
                vector.name
            );
        }
    }
}

#[test]
fn all_formats_of_one_key_are_the_same_key() {
    for key in ["rsa2048", "rsa3072", "p256", "p384", "ed25519"] {
        let files = key_files(key);
        for (file, parsed) in &files[1..] {
            // Ids differ (a JWK carries a `kid`); the key material must not.
            assert_eq!(
                parsed.clone().with_id("k"),
                files[0].1.clone().with_id("k"),
                "{file}"
            );
        }
    }
}

#[test]
fn flipping_one_bit_of_the_body_fails_every_vector() {
    let (body, vectors) = load();
    for vector in &vectors {
        let key = public_key(&vector.key);
        for bit in [0, body.len() * 4, body.len() * 8 - 1] {
            let mut tampered = body.clone();
            tampered[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !key.verifies(vector.algorithm(), &tampered, &vector.signature()),
                "{} bit {bit}",
                vector.name
            );
        }
    }
}

#[test]
fn flipping_one_bit_of_the_signature_fails_every_vector() {
    let (body, vectors) = load();
    for vector in &vectors {
        let key = public_key(&vector.key);
        let signature = vector.signature();
        for bit in [0, signature.len() * 4, signature.len() * 8 - 1] {
            let mut tampered = signature.clone();
            tampered[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !key.verifies(vector.algorithm(), &body, &tampered),
                "{} bit {bit}",
                vector.name
            );
        }
    }
}

#[test]
fn flipping_one_bit_of_the_key_fails_every_vector() {
    let (body, vectors) = load();
    for vector in &vectors {
        let der = std::fs::read(fixtures().join(&vector.key).join("public.der")).unwrap();
        // The last bytes of an SPKI are key material (modulus, point or Ed25519 key).
        for back in [1, 8, 20] {
            let mut tampered = der.clone();
            let at = tampered.len() - back;
            tampered[at] ^= 0x10;
            let verified = PublicKey::parse(&tampered)
                .map(|keys| keys[0].verifies(vector.algorithm(), &body, &vector.signature()))
                .unwrap_or(false);
            assert!(!verified, "{} with key byte -{back} flipped", vector.name);
        }
    }
}

#[test]
fn any_other_algorithm_of_the_same_key_fails() {
    let (body, vectors) = load();
    for vector in &vectors {
        let key = public_key(&vector.key);
        for other in Algorithm::for_key(key.kind()).filter(|a| *a != vector.algorithm()) {
            assert!(
                !key.verifies(other, &body, &vector.signature()),
                "{} checked as {other}",
                vector.name
            );
        }
        for other in Algorithm::ALL
            .into_iter()
            .filter(|a| a.key_kind() != key.kind())
        {
            assert!(
                !key.verifies(other, &body, &vector.signature()),
                "{} with a {other} key",
                vector.name
            );
        }
    }
}

#[test]
fn der_ecdsa_checked_as_fixed_and_fixed_as_der_fail() {
    let (body, vectors) = load();
    let pairs = [
        (Algorithm::EcdsaP256Sha256, Algorithm::EcdsaP256Sha256Fixed),
        (Algorithm::EcdsaP384Sha384, Algorithm::EcdsaP384Sha384Fixed),
    ];
    let mut checked = 0;
    for vector in vectors
        .iter()
        .filter(|v| v.algorithm().key_kind() != KeyKind::Rsa)
    {
        for (der, fixed) in pairs {
            let swapped = match vector.algorithm() {
                a if a == der => fixed,
                a if a == fixed => der,
                _ => continue,
            };
            assert!(
                !public_key(&vector.key).verifies(swapped, &body, &vector.signature()),
                "{}",
                vector.name
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 6,
        "both directions on both curves, {checked} checked"
    );
}

#[test]
fn empty_truncated_and_over_long_signatures_fail() {
    let (body, vectors) = load();
    for vector in &vectors {
        let key = public_key(&vector.key);
        let signature = vector.signature();
        let zero_in_front = [&[0], signature.as_slice()].concat();
        let mut cases = vec![
            Vec::new(),
            signature[..signature.len() - 1].to_vec(),
            signature[1..].to_vec(),
            signature[..signature.len() / 2].to_vec(),
            [signature.as_slice(), &[0]].concat(),
            [signature.as_slice(), signature.as_slice()].concat(),
        ];
        if key.kind() == KeyKind::Rsa {
            // The same integer (a signed integer's sign byte): see
            // `an_rsa_signature_with_a_sign_byte_in_front_verifies`.
            assert!(
                key.verifies(vector.algorithm(), &body, &zero_in_front),
                "{}",
                vector.name
            );
        } else {
            cases.push(zero_in_front);
        }
        for (i, case) in cases.iter().enumerate() {
            assert!(
                !key.verifies(vector.algorithm(), &body, case),
                "{} case {i}",
                vector.name
            );
        }
        let verifier = verifier_for(vector, key.clone());
        assert!(
            verifier.verify(&headers(&vector.prefix), &body).is_err(),
            "{}: an empty header value",
            vector.name
        );
    }
}

#[test]
fn the_wrong_key_of_the_right_kind_fails() {
    let (body, vectors) = load();
    for vector in vectors.iter().filter(|v| v.key.starts_with("rsa")) {
        let other = if vector.key == "rsa2048" {
            "rsa3072"
        } else {
            "rsa2048"
        };
        assert!(
            !public_key(other).verifies(vector.algorithm(), &body, &vector.signature()),
            "{}",
            vector.name
        );
    }
}

#[test]
fn rotation_accepts_the_old_and_the_new_key_and_names_the_one_that_verified() {
    let (body, vectors) = load();
    let jwks = PublicKey::parse(&std::fs::read(fixtures().join("jwks.json")).unwrap()).unwrap();
    assert_eq!(
        jwks.iter().map(|k| k.id().unwrap()).collect::<Vec<_>>(),
        ["rsa-2026-01", "rsa-2026-07"]
    );
    let pick = |name: &str| vectors.iter().find(|v| v.name == name).unwrap();
    let old = pick("rsa2048-rsa-pkcs1-sha256-base64-python");
    let new = pick("rsa3072-rsa-pkcs1-sha256-base64-python");

    let mut both = Verifier::new("X-Signature", Encoding::Base64, None).unwrap();
    for key in jwks.clone() {
        both = both.with_key(key, Algorithm::RsaPkcs1Sha256).unwrap();
    }
    assert_eq!(
        both.verify(&headers(&old.header_value), &body).unwrap(),
        Some("rsa-2026-01")
    );
    assert_eq!(
        both.verify(&headers(&new.header_value), &body).unwrap(),
        Some("rsa-2026-07")
    );

    let only_new = Verifier::new("X-Signature", Encoding::Base64, None)
        .unwrap()
        .with_key(jwks[1].clone(), Algorithm::RsaPkcs1Sha256)
        .unwrap();
    assert!(
        only_new.verify(&headers(&old.header_value), &body).is_err(),
        "a retired key no longer verifies"
    );
    assert!(only_new.verify(&headers(&new.header_value), &body).is_ok());
}

#[test]
fn the_private_keys_sign_what_the_public_keys_verify() {
    let (body, vectors) = load();
    for vector in &vectors {
        let pem = std::fs::read(fixtures().join(&vector.key).join("private.pem")).unwrap();
        let signer = SigningKey::from_pkcs8(&pem, vector.algorithm()).unwrap();
        assert_eq!(
            signer.public_key(),
            public_key(&vector.key),
            "{}",
            vector.name
        );
        let value = signer
            .header_value(&body, vector.encoding(), Some(&vector.prefix))
            .unwrap();
        let verifier = verifier_for(vector, public_key(&vector.key));
        assert!(
            verifier.verify(&headers(&value), &body).is_ok(),
            "{}: ring's signature",
            vector.name
        );
    }
}

#[test]
fn a_key_configured_for_the_wrong_algorithm_is_refused_by_name() {
    let config = payhook::config::SignatureConfig {
        algorithm: Algorithm::RsaPkcs1Sha256,
        keys: vec![payhook::config::KeySource {
            id: Some("aggregator-ec".into()),
            file: Some(fixtures().join("p256/public.pem")),
            ..Default::default()
        }],
        ..Default::default()
    };
    // The setting, then the reason as its cause: printed as a report, the way payhook
    // prints errors.
    let error = Verifier::from_config(&config).unwrap_err();
    let error = payhook::Report::new(&error).to_string();
    assert!(
        error.contains("signature.keys[0]") && error.contains("aggregator-ec"),
        "{error}"
    );
    assert!(
        error.contains("P-256 key cannot verify rsa-pkcs1-sha256"),
        "{error}"
    );
}

/// An RSA signature written as a minimal integer — its leading zero byte dropped, as some
/// signers' big-integer encodings do about once in 256 signatures — is the same signature:
/// it verifies, and stays bound to its body.
#[test]
fn an_rsa_signature_without_its_leading_zero_byte_verifies() {
    let pem = std::fs::read(fixtures().join("rsa2048").join("private.pem")).unwrap();
    let signer = SigningKey::from_pkcs8(&pem, Algorithm::RsaPkcs1Sha256).unwrap();
    let key = public_key("rsa2048");
    // PKCS#1 v1.5 is deterministic: the first body whose signature starts with a zero byte
    // is always the same one.
    let (body, signature) = (0..10_000)
        .map(|i| format!("{{\"nonce\":\"n-{i}\"}}").into_bytes())
        .map(|body| {
            let signature = signer.sign(&body).unwrap();
            (body, signature)
        })
        .find(|(_, signature)| signature[0] == 0)
        .expect("a signature with a leading zero byte among 10,000");
    let minimal = &signature[1..];
    assert!(key.verifies(Algorithm::RsaPkcs1Sha256, &body, &signature));
    assert!(key.verifies(Algorithm::RsaPkcs1Sha256, &body, minimal));
    assert!(!key.verifies(Algorithm::RsaPkcs1Sha256, b"{\"nonce\":\"other\"}", minimal));
}

/// An RSA signature written as a signed integer — a zero sign byte in front when its first
/// bit is set, as Java's `BigInteger.toByteArray()` and .NET's `BigInteger` bytes write about
/// half of all signatures — is the same signature: it verifies, on the wire too, and stays
/// bound to its body. A byte in front that is not zero makes another integer, refused.
#[test]
fn an_rsa_signature_with_a_sign_byte_in_front_verifies() {
    let pem = std::fs::read(fixtures().join("rsa2048").join("private.pem")).unwrap();
    let signer = SigningKey::from_pkcs8(&pem, Algorithm::RsaPkcs1Sha256).unwrap();
    let key = public_key("rsa2048");
    let body = (0..100)
        .map(|i| format!("{{\"nonce\":\"n-{i}\"}}").into_bytes())
        .find(|body| signer.sign(body).unwrap()[0] >= 0x80)
        .expect("a signature whose first bit is set among 100");
    let genuine = signer.sign(&body).unwrap();
    let signed = [&[0u8][..], &genuine].concat();
    assert_eq!(signed.len(), 257);
    assert!(key.verifies(Algorithm::RsaPkcs1Sha256, &body, &signed));
    assert!(!key.verifies(Algorithm::RsaPkcs1Sha256, b"{\"nonce\":\"other\"}", &signed));
    let other = [&[1u8][..], &genuine].concat();
    assert!(!key.verifies(Algorithm::RsaPkcs1Sha256, &body, &other));

    let verifier = Verifier::new("X-Signature", Encoding::Base64, None)
        .unwrap()
        .with_key(key, Algorithm::RsaPkcs1Sha256)
        .unwrap();
    let header = |signature: &[u8]| {
        use base64::Engine as _;
        headers(&base64::engine::general_purpose::STANDARD.encode(signature))
    };
    assert!(verifier.verify(&header(&signed), &body).is_ok());
    assert!(verifier.verify(&header(&other), &body).is_err());
}
