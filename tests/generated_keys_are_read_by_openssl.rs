//! The keys `payhook keygen` writes are read by the standard tool: the `openssl` command
//! line derives from each private key the public key payhook wrote beside it, and a
//! signature OpenSSL makes with it is one `payhook verify` accepts.
//!
//! Needs `openssl` (Debian's `openssl` package; `.ci/setup`, which `.ci/run` calls,
//! installs it). Without it the test says it was skipped, unless `CI` is set: there its
//! absence is a failure.
#![allow(
    clippy::unwrap_used,
    clippy::print_stderr,
    reason = "tests; a skip is said on stderr"
)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn run(program: &str, args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn payhook(args: &[&str], input: &[u8]) -> Output {
    run(env!("CARGO_BIN_EXE_payhook"), args, input)
}

fn ok(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn openssl_present() -> bool {
    let present = Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        assert!(
            std::env::var_os("CI").is_none(),
            "`openssl` is not installed, and CI needs it for this test (Debian's `openssl` package)"
        );
        use std::io::Write;
        // Written to stderr directly: libtest hides a passing test's `eprintln!`.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: `openssl` is not installed (Debian's `openssl` package)"
        );
    }
    present
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// OpenSSL's signature of `body` with `private`, as hex.
fn openssl_sign(private: &Path, alg: &str, body: &Path) -> String {
    let signature = body.with_extension("sig");
    let args: Vec<&str> = if alg == "ed25519" {
        vec![
            "pkeyutl",
            "-sign",
            "-rawin",
            "-inkey",
            path(private),
            "-in",
            path(body),
            "-out",
            path(&signature),
        ]
    } else {
        let digest = if alg.contains("384") {
            "-sha384"
        } else {
            "-sha256"
        };
        vec![
            "dgst",
            digest,
            "-sign",
            path(private),
            "-out",
            path(&signature),
            path(body),
        ]
    };
    ok(
        &run("openssl", &args, b""),
        &format!("openssl signs ({alg})"),
    );
    std::fs::read(&signature)
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn openssl_reads_every_generated_key_and_payhook_verifies_what_it_signs() {
    if !openssl_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body.json");
    let text = br#"{"nonce":"n-1","amount":10.50}"#;
    std::fs::write(&body, text).unwrap();
    for alg in [
        "rsa-pkcs1-sha256",
        "ecdsa-p256-sha256",
        "ecdsa-p384-sha384",
        "ed25519",
    ] {
        let out = dir.path().join(alg);
        ok(
            &payhook(&["keygen", "--alg", alg, "--out", path(&out)], b""),
            &format!("payhook keygen --alg {alg}"),
        );
        let private = out.join("private.pem");
        let public = std::fs::read_to_string(out.join("public.pem")).unwrap();

        let checked = run("openssl", &["pkey", "-in", path(&private), "-check"], b"");
        assert!(
            ok(&checked, &format!("openssl reads the {alg} private key")).contains("valid"),
            "{alg}: {}",
            String::from_utf8_lossy(&checked.stdout)
        );
        let derived = ok(
            &run("openssl", &["pkey", "-in", path(&private), "-pubout"], b""),
            &format!("openssl derives the {alg} public key"),
        );
        assert_eq!(derived, public, "{alg}: the public key OpenSSL derives");

        let signature = openssl_sign(&private, alg, &body);
        let verified = payhook(
            &[
                "verify",
                "--key",
                path(&out.join("public.pem")),
                "--alg",
                alg,
                "--encoding",
                "hex",
                "--signature",
                &signature,
            ],
            text,
        );
        assert!(
            ok(
                &verified,
                &format!("payhook verifies OpenSSL's {alg} signature")
            )
            .starts_with("ok:")
        );
    }
}
