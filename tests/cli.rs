//! The `payhook` binary: help, version, and `check-config`.
#![allow(clippy::unwrap_used, reason = "tests")]

use std::process::{Command, Output};

fn payhook(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(args)
        .env_remove("PAYHOOK_CONFIG")
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn help_lists_the_commands() {
    let output = payhook(&["--help"]);
    assert!(output.status.success());
    assert!(
        stdout(&output).contains("check-config"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn version_prints_the_crate_version() {
    let output = payhook(&["--version"]);
    assert!(output.status.success());
    assert_eq!(
        stdout(&output).trim(),
        format!("payhook {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn check_config_accepts_a_valid_file_and_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    std::fs::write(
        &file,
        "[server]\nbody_limit = 65536\n[gateway]\nusername = \"shop\"\npassword = \"hunter2\"\n",
    )
    .unwrap();
    let output = payhook(&["check-config", file.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = stdout(&output);
    assert!(
        printed.contains(": ok") && printed.contains("65536"),
        "{printed}"
    );
    assert!(
        !printed.contains("hunter2"),
        "the password leaked: {printed}"
    );
}

#[test]
fn check_config_names_the_bad_key_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    std::fs::write(&file, "[paths]\ncallback = \"no-slash\"\n").unwrap();
    let output = payhook(&["check-config", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("paths.callback"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn check_config_reads_the_gateway_s_files_as_the_service_would() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    std::fs::write(
        &file,
        concat!(
            "[gateway]\nauth_url = \"https://auth.example\"\n",
            "gateway_url = \"https://gateway.example\"\nusername = \"shop\"\n",
            "password = \"hunter2\"\nca_file = \"no-such-ca.pem\"\n",
        ),
    )
    .unwrap();
    let output = payhook(&["check-config", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", stdout(&output));
    assert!(
        stderr(&output).contains("ca_file") && !stderr(&output).contains("hunter2"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn check_config_reports_a_missing_file() {
    let output = payhook(&["check-config", "/nonexistent/payhook.toml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("cannot read /nonexistent/payhook.toml"),
        "{}",
        stderr(&output)
    );
}

mod signature_tools {
    use super::*;
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::process::Stdio;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/signatures")
    }

    /// Runs payhook with `stdin` as its standard input.
    fn payhook_with_input(args: &[&str], stdin: &[u8]) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_payhook"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }

    fn path(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    /// The command failed with exit code 1 and said `why` on stderr.
    fn assert_refused(output: &Output, why: &str) {
        assert_eq!(output.status.code(), Some(1), "{}", stderr(output));
        assert!(
            stderr(output).contains(why),
            "`{}` should say `{why}`",
            stderr(output)
        );
    }

    #[test]
    fn keygen_sign_and_verify_round_trip_for_every_key_kind() {
        let dir = tempfile::tempdir().unwrap();
        let body = br#"{"nonce":"n-1","amount":10.50}"#;
        for alg in [
            "rsa-pss-sha256",
            "ecdsa-p256-sha256-fixed",
            "ecdsa-p384-sha384",
            "ed25519",
        ] {
            let out = dir.path().join(alg);
            let output = payhook(&["keygen", "--alg", alg, "--out", path(&out)]);
            assert!(output.status.success(), "{alg}: {}", stderr(&output));
            let private = out.join("private.pem");
            let public = out.join("public.pem");
            assert!(
                std::fs::read_to_string(&private)
                    .unwrap()
                    .starts_with("-----BEGIN PRIVATE KEY-----")
            );
            assert!(
                std::fs::read_to_string(&public)
                    .unwrap()
                    .starts_with("-----BEGIN PUBLIC KEY-----")
            );
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                assert_eq!(
                    std::fs::metadata(&private).unwrap().permissions().mode() & 0o777,
                    0o600,
                    "{alg}"
                );
            }

            let signed = payhook_with_input(
                &[
                    "sign",
                    "--key",
                    path(&private),
                    "--alg",
                    alg,
                    "--encoding",
                    "hex",
                ],
                body,
            );
            assert!(signed.status.success(), "{alg}: {}", stderr(&signed));
            let signature = stdout(&signed).trim().to_owned();
            let args = [
                "verify",
                "--key",
                path(&public),
                "--alg",
                alg,
                "--encoding",
                "hex",
                "--signature",
                &signature,
            ];
            let verified = payhook_with_input(&args, body);
            assert!(verified.status.success(), "{alg}: {}", stderr(&verified));
            assert!(stdout(&verified).starts_with("ok:"));
            let refused = payhook_with_input(&args, b"{\"nonce\":\"n-1\",\"amount\":10.51}");
            assert_refused(&refused, "invalid signature");
        }
    }

    #[test]
    fn keygen_makes_rsa_keys_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("rsa");
        assert!(
            payhook(&["keygen", "--alg", "rsa-pkcs1-sha256", "--out", path(&out)])
                .status
                .success()
        );
        let again = payhook(&["keygen", "--alg", "rsa-pkcs1-sha256", "--out", path(&out)]);
        assert_eq!(again.status.code(), Some(2));
        assert!(stderr(&again).contains("--force"));
        // Forced over a private key file others may read (a copy, a checkout): the new key
        // is readable by its owner only.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let private = out.join("private.pem");
            std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o644)).unwrap();
            let forced = payhook(&["keygen", "--alg", "ed25519", "--out", path(&out), "--force"]);
            assert!(forced.status.success(), "{}", stderr(&forced));
            assert_eq!(
                std::fs::metadata(&private).unwrap().permissions().mode() & 0o777,
                0o600
            );
            let rsa = payhook(&[
                "keygen",
                "--alg",
                "rsa-pkcs1-sha256",
                "--out",
                path(&out),
                "--force",
            ]);
            assert!(rsa.status.success(), "{}", stderr(&rsa));
        }
        let body = b"{}";
        let signed = payhook_with_input(&["sign", "--key", path(&out.join("private.pem"))], body);
        let signature = stdout(&signed).trim().to_owned();
        let verified = payhook_with_input(
            &[
                "verify",
                "--key",
                path(&out.join("public.pem")),
                "--signature",
                &signature,
            ],
            body,
        );
        assert!(verified.status.success(), "{}", stderr(&verified));
    }

    #[test]
    fn verify_checks_an_independent_vector_and_explains_a_malformed_one() {
        let body = std::fs::read(fixtures().join("body.json")).unwrap();
        let vectors: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixtures().join("vectors.json")).unwrap())
                .unwrap();
        let vector = &vectors["vectors"][0];
        let key = fixtures()
            .join(vector["key"].as_str().unwrap())
            .join("public.xml");
        let alg = vector["algorithm"].as_str().unwrap();
        let signature = vector["header_value"].as_str().unwrap();
        let verify = |signature: &str| {
            payhook_with_input(
                &[
                    "verify",
                    "--key",
                    path(&key),
                    "--alg",
                    alg,
                    "--signature",
                    signature,
                ],
                &body,
            )
        };
        let ok = verify(signature);
        assert!(ok.status.success(), "{}", stderr(&ok));
        assert_refused(&verify("%%%"), "malformed signature");
        // A value no header can carry (a line break) is malformed too, not a usage error.
        assert_refused(&verify("abc\ndef"), "malformed signature");
    }

    #[test]
    fn sniff_finds_the_scheme_of_a_captured_request() {
        let dir = tempfile::tempdir().unwrap();
        let body = std::fs::read(fixtures().join("body.json")).unwrap();
        let signer = payhook::signature::SigningKey::from_pkcs8(
            &std::fs::read(fixtures().join("p384/private.pem")).unwrap(),
            payhook::signature::Algorithm::EcdsaP384Sha384,
        )
        .unwrap();
        let value = signer
            .header_value(
                &body,
                payhook::signature::Encoding::Base64UrlNoPad,
                Some("v1="),
            )
            .unwrap();
        let mut raw = format!(
            "POST /payhook/callback HTTP/1.1\r\nHost: shop.example\r\nContent-Type: application/json\r\n\
             X-Request-Id: abc\r\nX-Payload-Signature: {value}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        raw.extend_from_slice(&body);
        let request = dir.path().join("captured.http");
        std::fs::write(&request, &raw).unwrap();

        let output = payhook(&[
            "sniff",
            "--key",
            path(&fixtures().join("p384/public.jwk")),
            "--request",
            path(&request),
        ]);
        assert!(output.status.success(), "{}", stderr(&output));
        let printed = stdout(&output);
        assert!(
            printed.contains("header X-Payload-Signature, prefix \"v1=\", encoding base64url-nopad, algorithm ecdsa-p384-sha384, key p384"),
            "{printed}"
        );
        assert!(
            printed.contains("[signature]\nheader = \"X-Payload-Signature\""),
            "{printed}"
        );

        let body_file = dir.path().join("body.json");
        std::fs::write(&body_file, &body).unwrap();
        let header = format!("X-Payload-Signature: {value}");
        let by_parts = payhook(&[
            "sniff",
            "--key",
            path(&fixtures().join("p384/public.pem")),
            "--body",
            path(&body_file),
            "--header",
            &header,
        ]);
        assert!(by_parts.status.success(), "{}", stderr(&by_parts));

        let wrong_key = payhook(&[
            "sniff",
            "--key",
            path(&fixtures().join("p256/public.pem")),
            "--request",
            path(&request),
        ]);
        assert_refused(&wrong_key, "no header");
    }
}

/// `payhook openapi` prints the document as the service's configuration (its file, then
/// `PAYHOOK_*`) serves it, never a secret of it; `--shipped` prints the shipped one.
#[test]
fn openapi_prints_the_document_as_the_configuration_serves_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    std::fs::write(
        &file,
        "[paths]\ncallback = \"/shop/results\"\n\n\
         [auth.transaction_validation]\nmethod = \"shared_secret\"\nheader = \"X-Shop-Key\"\n\
         secret = \"never-printed-0123456789\"\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(["openapi", "--config"])
        .arg(&file)
        .env_remove("PAYHOOK_CONFIG")
        .env("PAYHOOK_PATHS_PROVIDERS_VALIDATION", "/shop/providers")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = stdout(&output);
    assert!(!printed.contains("never-printed"), "a secret was printed");
    let doc: serde_json::Value = serde_json::from_str(&printed).unwrap();
    for path in [
        "/shop/results",
        "/shop/providers",
        "/payhook/transaction-validation",
    ] {
        assert!(doc["paths"][path]["post"].is_object(), "{path}");
    }
    assert_eq!(
        doc["paths"]["/payhook/transaction-validation"]["post"]["security"],
        serde_json::json!([{"sharedSecretTransaction": []}])
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["sharedSecretTransaction"]["name"],
        "X-Shop-Key"
    );

    let shipped = payhook(&["openapi", "--shipped"]);
    assert!(shipped.status.success());
    assert_eq!(stdout(&shipped), format!("{}\n", payhook::server::OPENAPI));
}
