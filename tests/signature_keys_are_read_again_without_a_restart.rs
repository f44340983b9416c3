//! The aggregator's signature keys are read again while the service runs
//! (`Credentials::read_again`, and on SIGHUP in the example merchant): a key added verifies
//! from the next callback on, a key taken out is refused — even for the very bytes it
//! verified before, booked or not — and a key file replaced under the same path is a
//! rotation too. A configuration whose keys cannot be read, or that lists none, changes
//! nothing (the operating API's credentials in the same file included); how signatures are
//! read (header, encoding, prefix) waits for a restart.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::server::{CredentialsRefused, OperatorToken};
use payhook::signature::{Algorithm, SigningKey};
use support::*;

const ALICE: &str = "phop_alice-token-for-tests-0123456789";
const BOB: &str = "phop_bob-token-for-tests-0123456789";

fn rsa(key: &str) -> SigningKey {
    fixture_signer(key, Algorithm::RsaPkcs1Sha256)
}

/// The status of a callback (`nonce`) signed by the fixture key `key` (RSA PKCS#1 v1.5).
async fn status_of(server: &TestServer, key: &str, nonce: &str) -> u16 {
    let request = signed_callback(&rsa(key), nonce, 4, "1", "c");
    server.send(&request).await.status
}

/// `config` verifying the fixture keys `keys`, by their names as ids.
fn with_keys(config: &payhook::Config, keys: &[&str]) -> payhook::Config {
    let mut next = config.clone();
    next.signature.keys = signed_config(keys).signature.keys;
    next
}

/// The answer to a signature no key listed verifies, one taken out or not.
const INVALID: &str = "invalid signature: it does not verify with any configured key";

fn names(list: &[&str]) -> Option<Vec<String>> {
    Some(list.iter().map(|n| (*n).to_owned()).collect())
}

#[tokio::test]
async fn a_key_added_verifies_from_the_next_callback_and_both_verify_during_rotation() {
    let logs = captured_logs(tracing::Level::INFO);
    let started = signed_config(&["rsa2048"]);
    let server = TestServer::start_with(started.clone()).await;
    let (old, new) = (rsa("rsa2048"), rsa("rsa3072"));
    let refused = server
        .send(&signed_callback(&new, "n-new-1", 4, "1", "c"))
        .await;
    assert_eq!(refused.status, 401, "{}", refused.message());

    let change = server
        .app
        .credentials()
        .read_again(&with_keys(
            &server.as_run(&started),
            &["rsa3072", "rsa2048"],
        ))
        .unwrap();
    assert_eq!(change.signature_keys, names(&["rsa3072", "rsa2048"]));
    assert!(change.need_a_restart.is_empty(), "{change:?}");
    assert_eq!(change.to_string(), "signature keys now: rsa3072, rsa2048");

    for (signer, nonce) in [(&new, "n-new-2"), (&old, "n-old-2")] {
        let answer = server
            .send(&signed_callback(signer, nonce, 4, "1", "c"))
            .await;
        assert_eq!(answer.status, 200, "{nonce}: {}", answer.message());
    }
    assert_eq!(callbacks_handled(&server, "n-new-1"), 0);
    assert_eq!(callbacks_handled(&server, "n-new-2"), 1);
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        text.lines().any(|l| l.contains("INFO")
            && l.contains("credentials: read again")
            && l.contains("signature keys now: rsa3072, rsa2048")),
        "{text}"
    );
}

/// What a key verified is not taken for verified once it is taken out: a retry of bytes it
/// signed — booked (answered as a duplicate before) or not (the handler failed) — is refused
/// 401 like any other signature of it, and reaches no handler.
#[tokio::test]
async fn a_key_taken_out_is_refused_even_for_the_bytes_it_verified_before() {
    let started = signed_config(&["rsa2048", "rsa3072"]);
    let server = TestServer::start_with(started.clone()).await;
    let (old, new) = (rsa("rsa2048"), rsa("rsa3072"));
    let booked = signed_callback(&old, "n-booked", 4, "1", "c");
    let failing = signed_callback(&old, "n-failing", 4, "1", "fail");
    assert_eq!(server.send(&booked).await.status, 200);
    assert_eq!(server.send(&booked).await.status, 200, "a duplicate");
    let failed = server.send(&failing).await;
    assert!(failed.status >= 500, "{}", failed.message());
    assert_eq!(callbacks_handled(&server, "n-failing"), 1);

    let change = server
        .app
        .credentials()
        .read_again(&with_keys(&server.as_run(&started), &["rsa3072"]))
        .unwrap();
    assert_eq!(change.signature_keys, names(&["rsa3072"]));

    for (request, nonce) in [(&booked, "n-booked"), (&failing, "n-failing")] {
        let answer = server.send(request).await;
        assert_eq!(
            (answer.status, answer.message()),
            (401, INVALID.to_owned()),
            "{nonce}: a retry of what the key taken out signed"
        );
    }
    assert_eq!(callbacks_handled(&server, "n-booked"), 1);
    assert_eq!(callbacks_handled(&server, "n-failing"), 1);
    let answer = server
        .send(&signed_callback(&new, "n-new", 4, "1", "c"))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.message());
}

/// A rotation taken too early shows: a signature only a key taken out verifies is refused
/// all the same, and answered as any invalid one, but a warning and
/// `payhook_signatures_refused_total`'s `retired_key` name it apart from a forgery — through
/// later rotations too — until the key is listed again, when it verifies as before.
#[tokio::test]
async fn a_signature_only_a_key_taken_out_verifies_is_told_apart_from_a_forgery() {
    // INFO, as every test of this binary: the first call sets the level for all of them.
    let logs = captured_logs(tracing::Level::INFO);
    // Ids of this test's own, for its log lines.
    let early = |mut config: payhook::Config| {
        for key in &mut config.signature.keys {
            key.id = key.id.take().map(|id| format!("early-{id}"));
            if key.id.as_deref() == Some("early-p256") {
                key.algorithm = Some(Algorithm::EcdsaP256Sha256);
            }
        }
        config
    };
    let started = early(signed_config(&["rsa2048", "rsa3072"]));
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();
    let config = server.as_run(&started);
    credentials
        .read_again(&early(with_keys(&config, &["rsa3072"])))
        .unwrap();
    // A later rotation, to a P-256 key: rsa2048 is still known as taken out.
    credentials
        .read_again(&early(with_keys(&config, &["p256"])))
        .unwrap();

    for (key, nonce) in [("rsa2048", "n-old"), ("rsa3072", "n-previous")] {
        let answer = server
            .send(&signed_callback(&rsa(key), nonce, 4, "1", "c"))
            .await;
        assert_eq!(
            (answer.status, answer.message()),
            (401, INVALID.to_owned()),
            "{key}: the sender learns nothing of the keys"
        );
    }
    // A forgery: rsa2048's signature over other bytes.
    let mut forged = signed_callback(&rsa("rsa2048"), "n-forged", 4, "1", "c");
    let at = forged
        .windows(b"n-forged".len())
        .position(|w| w == b"n-forged")
        .unwrap();
    forged[at] = b'N';
    let forged = server.send(&forged).await;
    assert_eq!((forged.status, forged.message()), (401, INVALID.to_owned()));
    assert_eq!(callbacks_handled(&server, "n-old"), 0);
    server
        .assert_metrics(&[
            "payhook_signatures_refused_total{reason=\"retired_key\"} 2",
            "payhook_signatures_refused_total{reason=\"invalid\"} 1",
        ])
        .await;
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let warned = |key: &str| {
        text.lines().any(|l| {
            l.contains("WARN")
                && l.contains("signature made with a key taken out of signature.keys")
                && l.contains(&format!("key={key}"))
        })
    };
    assert!(warned("early-rsa2048") && warned("early-rsa3072"), "{text}");

    // Listed again, it verifies: no longer taken out.
    credentials
        .read_again(&early(with_keys(&config, &["p256", "rsa2048"])))
        .unwrap();
    assert_eq!(status_of(&server, "rsa2048", "n-old").await, 200);
    assert_eq!(callbacks_handled(&server, "n-old"), 1);
}

/// The usual rotation: the file the configuration names is replaced, the configuration
/// stays. Reading it again with nothing changed changes nothing.
#[tokio::test]
async fn a_key_file_replaced_under_the_same_path_is_a_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("aggregator.pem");
    let public = |key: &str| signature_fixtures().join(key).join("public.pem");
    std::fs::copy(public("rsa2048"), &file).unwrap();
    let mut started = signed_config(&[]);
    started.signature.keys = vec![payhook::config::KeySource {
        id: Some("current".into()),
        file: Some(file.clone()),
        ..Default::default()
    }];
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();
    let config = server.as_run(&started);

    let unchanged = credentials.read_again(&config).unwrap();
    assert_eq!(unchanged.signature_keys, None);
    assert!(unchanged.is_empty());
    assert_eq!(unchanged.to_string(), "no change");

    std::fs::copy(public("rsa3072"), &file).unwrap();
    let change = credentials.read_again(&config).unwrap();
    assert_eq!(change.signature_keys, names(&["current"]));
    assert_eq!(status_of(&server, "rsa3072", "n-1").await, 200);
    assert_eq!(status_of(&server, "rsa2048", "n-2").await, 401);
}

/// Keys that cannot be read, or none at all, are refused: nothing of the configuration is
/// taken — neither its keys nor the operating API's credentials beside them.
#[tokio::test]
async fn keys_that_cannot_be_read_or_none_change_nothing() {
    let mut started = signed_config(&["rsa2048"]);
    started.admin.operators = [("alice".to_owned(), OperatorToken::digest_of(ALICE))].into();
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();
    let mut next = with_keys(&server.as_run(&started), &["rsa3072"]);
    next.admin.operators = [("bob".to_owned(), OperatorToken::digest_of(BOB))].into();

    let mut missing = next.clone();
    missing.signature.keys[0].file = Some(server.data.path().join("no-such-key.pem"));
    let error = credentials.read_again(&missing).unwrap_err();
    assert!(
        matches!(error, CredentialsRefused::SignatureKey(_)),
        "{error:?}"
    );
    let said = payhook::Report::new(&error).to_string();
    assert!(
        said.contains("signature.keys[0] (id `rsa3072`, file ") && said.contains("no-such-key.pem"),
        "{said}"
    );

    let mut private = next.clone();
    private.signature.keys[0].file = Some(signature_fixtures().join("rsa3072").join("private.pem"));
    let error = credentials.read_again(&private).unwrap_err();
    assert!(
        matches!(error, CredentialsRefused::SignatureKey(_)),
        "{error:?}"
    );

    let mut none = next.clone();
    none.signature.keys.clear();
    let error = credentials.read_again(&none).unwrap_err();
    assert!(matches!(error, CredentialsRefused::WouldStopVerifying));
    assert!(error.to_string().contains("no signature.keys"), "{error}");

    // As it was: the old key verifies, the new one not; alice is in, bob is not.
    assert_eq!(status_of(&server, "rsa2048", "n-1").await, 200);
    assert_eq!(status_of(&server, "rsa3072", "n-2").await, 401);
    let held = "/payhook/admin/callbacks/held";
    assert_eq!(
        server.admin("GET", held, Some(ALICE), None).await.status,
        200
    );
    assert_eq!(server.admin("GET", held, Some(BOB), None).await.status, 401);

    // The configuration whose keys read is taken whole.
    let change = credentials.read_again(&next).unwrap();
    assert_eq!(change.signature_keys, names(&["rsa3072"]));
    assert_eq!(change.added, vec!["bob".to_owned()]);
    assert_eq!(status_of(&server, "rsa3072", "n-3").await, 200);
    assert_eq!(server.admin("GET", held, Some(BOB), None).await.status, 200);
}

/// The keys are taken; where signatures are read from, and how, is not: the header, the
/// encoding and the prefix are named as waiting for a restart. A service started without
/// keys (unsigned callbacks allowed) takes none: verifying takes a restart.
#[tokio::test]
async fn how_signatures_are_read_and_whether_they_are_waits_for_a_restart() {
    let started = signed_config(&["rsa2048"]);
    let server = TestServer::start_with(started.clone()).await;
    let mut next = with_keys(&server.as_run(&started), &["rsa3072"]);
    next.signature.header = "X-Aggregator-Signature".into();
    next.signature.prefix = "sha256=".into();
    let change = server.app.credentials().read_again(&next).unwrap();
    assert_eq!(change.signature_keys, names(&["rsa3072"]));
    assert_eq!(
        change.need_a_restart,
        vec!["signature.header", "signature.prefix"]
    );
    // Still read from X-Signature, without a prefix: verified by the new key.
    let answer = server
        .send(&signed_callback(&rsa("rsa3072"), "n-1", 4, "1", "c"))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.message());

    let unsigned = TestServer::start().await;
    let change = unsigned
        .app
        .credentials()
        .read_again(&with_keys(&unsigned.as_run(&test_config()), &["rsa2048"]))
        .unwrap();
    assert_eq!(change.signature_keys, None);
    assert_eq!(change.need_a_restart, vec!["signature"]);
    let answer = unsigned.post_json(CALLBACK_PATH, CALLBACK).await;
    assert_eq!(answer.status, 200, "still unsigned: {}", answer.message());
}

/// The example merchant reads its key file again on SIGHUP: a callback signed by the new
/// key is accepted and one signed by the old refused, without a restart.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_merchant_reads_its_key_file_again_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("aggregator.pem");
    std::fs::copy(signature_fixtures().join("ed25519/public.pem"), &key_file).unwrap();
    let env = vec![
        ("PAYHOOK_SIGNATURE_ALGORITHM", "ed25519".to_owned()),
        (
            "PAYHOOK_SIGNATURE_KEYS",
            format!(
                "[{{id = \"aggregator\", file = \"{}\"}}]",
                key_file.display()
            ),
        ),
        ("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0".to_owned()),
        (
            "PAYHOOK_STORE_PATH",
            dir.path().join("store").display().to_string(),
        ),
    ];
    let (child, address) = spawn_example(&env);
    let old = fixture_signer("ed25519", Algorithm::Ed25519);
    let pair = payhook::signature::generate_key_pair(Algorithm::Ed25519).unwrap();
    let new = SigningKey::from_pkcs8(pair.private_pem.as_bytes(), Algorithm::Ed25519).unwrap();
    let status = |signer: &SigningKey, nonce: &str| {
        let request = signed_callback(signer, nonce, 4, "1", "c");
        async move { exchange(address, &request).await.status }
    };
    assert_eq!(status(&old, "n-1").await, 200);
    assert_eq!(status(&new, "n-2").await, 401);

    std::fs::write(&key_file, &pair.public_pem).unwrap();
    signal(child.0.id(), "HUP");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut nonce = 2;
    loop {
        nonce += 1;
        if status(&new, &format!("n-{nonce}")).await == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new key not taken within {DEADLINE:?} of SIGHUP"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(status(&old, "n-old").await, 401);
}

/// A validation endpoint authenticated by the aggregator's signature takes the keys read
/// again as the callbacks do: the key taken out is refused there too.
#[tokio::test]
async fn a_validation_endpoint_signed_by_a_key_taken_out_is_refused() {
    let mut started = signed_config(&["rsa2048", "rsa3072"]);
    started.auth.transaction_validation.method = payhook::config::AuthMethod::Signature;
    let server = TestServer::start_with(started.clone()).await;
    let signed = |key: &str| {
        let signature = rsa(key)
            .header_value(
                TRANSACTION_VALIDATION.as_bytes(),
                payhook::signature::Encoding::Base64,
                None,
            )
            .unwrap();
        post(
            VALIDATION_PATH,
            &[
                ("Content-Type", "application/json"),
                ("X-Signature", &signature),
            ],
            TRANSACTION_VALIDATION.as_bytes(),
        )
    };
    assert_eq!(server.send(&signed("rsa2048")).await.status, 200);
    server
        .app
        .credentials()
        .read_again(&with_keys(&server.as_run(&started), &["rsa3072"]))
        .unwrap();
    let refused = server.send(&signed("rsa2048")).await;
    assert_eq!(refused.status, 401, "{}", refused.message());
    assert_eq!(server.send(&signed("rsa3072")).await.status, 200);
}

/// A configuration refused for its operating API (no token left) takes none of its keys.
#[tokio::test]
async fn keys_beside_refused_operators_are_not_taken() {
    let mut started = signed_config(&["rsa2048"]);
    started.admin.operators = [("alice".to_owned(), OperatorToken::digest_of(ALICE))].into();
    let server = TestServer::start_with(started.clone()).await;
    let mut next = with_keys(&server.as_run(&started), &["rsa3072"]);
    next.admin.operators.clear();
    let error = server.app.credentials().read_again(&next).unwrap_err();
    assert!(
        matches!(error, CredentialsRefused::WouldTurnOff),
        "{error:?}"
    );
    assert_eq!(status_of(&server, "rsa3072", "n-1").await, 401);
    assert_eq!(status_of(&server, "rsa2048", "n-2").await, 200);
}

/// Without the operating API the keys are read again all the same; an `[admin]` section
/// that would turn the API on is named as waiting for a restart, and the API stays off.
#[tokio::test]
async fn without_the_operating_api_the_keys_are_read_again_and_admin_waits() {
    let started = signed_config(&["rsa2048"]);
    let server = TestServer::start_with(started.clone()).await;
    let mut next = with_keys(&server.as_run(&started), &["rsa3072"]);
    next.admin.operators = [("alice".to_owned(), OperatorToken::digest_of(ALICE))].into();
    let change = server.app.credentials().read_again(&next).unwrap();
    assert_eq!(change.signature_keys, names(&["rsa3072"]));
    assert!(change.added.is_empty(), "{change:?}");
    assert_eq!(change.need_a_restart, vec!["admin"]);
    let held = "/payhook/admin/callbacks/held";
    assert_eq!(
        server.admin("GET", held, Some(ALICE), None).await.status,
        404
    );
    let answer = server
        .send(&signed_callback(&rsa("rsa3072"), "n-1", 4, "1", "c"))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.message());
}

/// `signature.algorithm` is read with the keys it applies to: the same keys under another
/// algorithm are a change, and signatures of the old one are refused. The keys' order is
/// the order they are tried in: a change too.
#[tokio::test]
async fn the_keys_algorithm_and_order_are_read_again_with_them() {
    let started = signed_config(&["rsa2048", "rsa3072"]);
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();
    let mut next = server.as_run(&started);
    next.signature.algorithm = Algorithm::RsaPssSha256;
    let change = credentials.read_again(&next).unwrap();
    assert_eq!(change.signature_keys, names(&["rsa2048", "rsa3072"]));
    let pkcs1 = server
        .send(&signed_callback(&rsa("rsa2048"), "n-1", 4, "1", "c"))
        .await;
    assert_eq!(pkcs1.status, 401, "{}", pkcs1.message());
    let pss = fixture_signer("rsa2048", Algorithm::RsaPssSha256);
    let answer = server
        .send(&signed_callback(&pss, "n-2", 4, "1", "c"))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.message());

    let reordered = with_keys(&next, &["rsa3072", "rsa2048"]);
    let change = credentials.read_again(&reordered).unwrap();
    assert_eq!(change.signature_keys, names(&["rsa3072", "rsa2048"]));
}

/// A service started without keys takes none read again, but it reads them: a key file
/// that cannot be read is refused as it would be at the restart that takes them.
#[tokio::test]
async fn keys_that_a_restart_would_refuse_are_refused_before() {
    let server = TestServer::start().await;
    let mut next = with_keys(&server.as_run(&test_config()), &["rsa2048"]);
    next.signature.keys[0].file = Some(server.data.path().join("no-such-key.pem"));
    let error = server.app.credentials().read_again(&next).unwrap_err();
    assert!(
        matches!(error, CredentialsRefused::SignatureKey(_)),
        "{error:?}"
    );
}
