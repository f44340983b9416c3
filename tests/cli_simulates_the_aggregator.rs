//! The simulator's commands, run as real binaries: `payhook mock-gateway`, and `payhook
//! trigger` against the example merchant's binary — signed and unsigned, `--expect`,
//! `--await` of a postponed validation's result, and delivery from a settings file.
#![cfg(unix)]
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::gateway::GatewayClient;
use payhook::sim::{MockGateway, MockGatewayConfig};
use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::Path,
    process::{Command, Output, Stdio},
};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The example merchant's binary, verifying the Ed25519 fixture key; `extra` adds settings.
fn start_merchant(data: &Path, extra: &[(&str, String)]) -> (Spawned, SocketAddr) {
    let mut env = ed25519_example_env();
    env.push(("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0".into()));
    env.push(("PAYHOOK_STORE_PATH", data.display().to_string()));
    env.extend(extra.iter().cloned());
    spawn_example(&env)
}

/// Runs `payhook args` off the runtime, so that in-process servers keep answering.
async fn payhook(args: Vec<String>) -> (i32, String, String) {
    payhook_with(args, Vec::new()).await
}

/// [`payhook`] with extra environment variables.
async fn payhook_with(args: Vec<String>, env: Vec<(String, String)>) -> (i32, String, String) {
    let output: Output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_payhook"))
            .args(args)
            .env_clear()
            .env("PAYHOOK_SIGNATURE_ALGORITHM", "ed25519")
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn private_key() -> String {
    signature_fixtures()
        .join("ed25519/private.pem")
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_signs_like_the_aggregator_and_expect_makes_the_exit_code() {
    let data = tempfile::tempdir().unwrap();
    let (mut merchant, address) = start_merchant(data.path(), &[]);
    let to = format!("http://{address}");
    let key = private_key();
    for kind in ["providers-validation", "transaction-validation", "callback"] {
        let (code, stdout, stderr) = payhook(args(&[
            "trigger", kind, "--to", &to, "--key", &key, "--expect", "200",
        ]))
        .await;
        assert_eq!(code, 0, "{kind}: {stdout}{stderr}");
        assert!(stdout.contains("← 200 in"), "{stdout}");
    }
    // Unsigned: the merchant refuses the callback, and --expect turns that into exit 1.
    let (code, stdout, stderr) = payhook(args(&[
        "trigger", "callback", "--to", &to, "--expect", "200",
    ]))
    .await;
    assert_eq!(code, 1);
    assert!(
        stdout.contains("← 401") && stderr.contains("expected 200, got 401"),
        "{stdout}{stderr}"
    );
    // A body from the flags, overridden by --set, sent exactly.
    let (code, stdout, _) = payhook(args(&[
        "trigger",
        "transaction-validation",
        "--to",
        &to,
        "--key",
        &key,
        "--amount",
        "25000.00",
        "--set",
        "merchantData.clientId=vip-7",
        "--expect",
        "403",
    ]))
    .await;
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains("\"amount\":25000.00") && stdout.contains("vip-7"),
        "{stdout}"
    );
    merchant.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn await_prints_the_result_the_merchant_posts_to_the_mock_gateway() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut env = gateway_env(&mock.gateway_config());
    env.extend([
        ("PAYHOOK_VALIDATION_AWAITABLE", "true".into()),
        ("PAYHOOK_VALIDATION_ALLOW_UNAUTHENTICATED", "true".into()),
        ("MERCHANT_REVIEW_ABOVE", "100".into()),
        ("MERCHANT_REVIEW_EVERY", "50ms".into()),
    ]);
    let (mut merchant, address) = start_merchant(data.path(), &env);
    let (code, stdout, stderr) = payhook(args(&[
        "trigger",
        "transaction-validation",
        "--to",
        &format!("http://{address}"),
        "--key",
        &private_key(),
        "--amount",
        "500",
        "--client",
        "blocked-9",
        "--validation-id",
        "77",
        "--await",
        "--gateway",
        &mock.url(),
    ]))
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("validation postponed"), "{stdout}");
    assert!(
        stdout.contains(
            "result posted: success = false, description = \"reviewed: blocked-9 is blocked\""
        ),
        "{stdout}"
    );
    assert_eq!(
        mock.validation_result(77.into()).map(|r| r.success),
        Some(false)
    );
    merchant.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_from_a_settings_file_reaches_the_matching_urls_and_is_recorded() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    let (mut merchant, address) = start_merchant(data.path(), &[]);
    let settings = data.path().join("callback-settings.json");
    std::fs::write(
        &settings,
        serde_json::json!([
            {"collabId": 3, "callbackUrl": format!("http://{address}/payhook/callback"), "maxAttempts": 17,
             "isEnabled": true, "addSignature": true, "transactionTypeId": null},
            {"collabId": 3, "callbackUrl": "http://127.0.0.1:1/disabled", "maxAttempts": 3,
             "isEnabled": false, "addSignature": false, "transactionTypeId": null},
            {"collabId": 3, "callbackUrl": "http://127.0.0.1:1/withdrawals", "maxAttempts": 3,
             "isEnabled": true, "addSignature": false, "transactionTypeId": 2}
        ])
        .to_string(),
    )
    .unwrap();
    let reference = "5f0c6a1e-0000-4000-8000-000000000042";
    let (code, stdout, stderr) = payhook(args(&[
        "trigger",
        "callback",
        "--settings",
        settings.to_str().unwrap(),
        "--key",
        &private_key(),
        "--fast",
        "--gateway",
        &mock.url(),
        "--reference-id",
        reference,
        "--collab",
        "3",
    ]))
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("attempt 1 at +0ns → 200"), "{stdout}");
    assert!(
        !stdout.contains("disabled") && !stdout.contains("withdrawals"),
        "{stdout}"
    );
    assert!(
        stdout.contains("callbackDeliveryStatus: Delivered"),
        "{stdout}"
    );
    // The merchant's view of it, through the lookup endpoint of the mock.
    let env = owned_env(&gateway_env(&mock.gateway_config()));
    let (code, stdout, stderr) = payhook_with(args(&["transaction", reference]), env).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("callback delivery   Delivered"), "{stdout}");
    merchant.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_gateway_command_serves_logins_until_stopped() {
    let mut child = Spawned(
        Command::new(env!("CARGO_BIN_EXE_payhook"))
            .args([
                "mock-gateway",
                "--listen",
                "127.0.0.1:0",
                "--access-lifetime",
                "30s",
            ])
            .env_clear()
            .env("PAYHOOK_MOCK_PASSWORD", "s3cret")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let url = lines
        .next()
        .unwrap()
        .unwrap()
        .strip_prefix("mock gateway listening on ")
        .unwrap()
        .to_owned();
    let client = GatewayClient::new(&payhook::config::GatewayConfig {
        auth_url: Some(url.clone()),
        gateway_url: Some(url),
        username: Some(payhook::sim::DEFAULT_USERNAME.into()),
        password: Some("s3cret".into()),
        ..Default::default()
    })
    .unwrap();
    let session = client.login().await.unwrap();
    let lifetime = session.access_token_expiry_utc - chrono::Utc::now();
    assert!(lifetime <= chrono::TimeDelta::seconds(30), "{lifetime}");
    assert_eq!(session.access_token.expose().split('.').count(), 3, "a JWT");
    child.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_report_right_and_wrong_receivers_through_the_exit_code() {
    let data = tempfile::tempdir().unwrap();
    let (mut merchant, address) = start_merchant(data.path(), &[]);
    let (code, stdout, stderr) = payhook(args(&[
        "trigger",
        "callback",
        "--to",
        &format!("http://{address}"),
        "--key",
        &private_key(),
        "--fault",
        "duplicate",
        "--fault",
        "concurrent",
        "--fault",
        "tamper-body",
        "--fault",
        "reorder",
        "--fault",
        "reuse-nonce",
    ]))
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    for line in [
        "duplicate: ok",
        "concurrent: ok",
        "tamper-body: ok",
        "reorder: ok",
        "reuse-nonce: ok",
    ] {
        assert!(stdout.contains(line), "{line} in {stdout}");
    }
    merchant.kill();

    // A receiver that checks no signature accepts a tampered body: the simulator says so.
    let careless = TestServer::start().await;
    let (code, stdout, stderr) = payhook(args(&[
        "trigger",
        "callback",
        "--to",
        &format!("http://{}", careless.addr),
        "--key",
        &private_key(),
        "--fault",
        "tamper-body",
    ]))
    .await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("tamper-body: WRONG") && stdout.contains("the forged request 401"),
        "{stdout}"
    );

    // A receiver that holds the nonce as seen before it checks the signature refuses the
    // forgery, then answers the aggregator's genuine request as a duplicate and never books
    // it; one that refuses the genuine request with 500 has not taken it either. Neither
    // is judged correct.
    for (genuine, message) in [(200, "callback already processed"), (500, "internal error")] {
        let receiver =
            scripted_receiver(vec![(401, "invalid signature"), (genuine, message)]).await;
        let (code, stdout, stderr) = payhook(args(&[
            "trigger",
            "callback",
            "--to",
            &format!("http://{receiver}"),
            "--key",
            &private_key(),
            "--fault",
            "tamper-signature",
        ]))
        .await;
        assert_eq!(code, 1, "{genuine}: {stdout}{stderr}");
        assert!(stdout.contains("tamper-signature: WRONG"), "{stdout}");
    }
}

/// `payhook scenario FILES --to TO --gateway GATEWAY --key (the fixture's) EXTRA…`.
fn scenario_command(files: &[String], to: &str, gateway: &str, extra: &[&str]) -> Vec<String> {
    let mut command = vec!["scenario".to_owned()];
    command.extend(files.iter().cloned());
    command.extend(args(&[
        "--to",
        to,
        "--gateway",
        gateway,
        "--key",
        &private_key(),
    ]));
    command.extend(args(extra));
    command
}

/// A scenario file named `name` in `dir` with `steps`; a list of its path, for
/// [`scenario_command`].
fn scenario_file(dir: &Path, name: &str, steps: &str) -> Vec<String> {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, format!("name = \"{name}\"\n{steps}")).unwrap();
    vec![path.display().to_string()]
}

/// A receiver on 127.0.0.1 that answers each request it reads with the next of `answers`
/// (status, JSON message), one request per connection.
/// Runs `scenario` against a receiver that answers `script` in turn, expecting it unmet
/// (exit 1); what it printed.
async fn unmet_against(
    scenario: &[String],
    gateway: &str,
    script: Vec<(u16, &'static str)>,
) -> String {
    let receiver = scripted_receiver(script).await;
    let (code, stdout, stderr) = payhook(scenario_command(
        scenario,
        &format!("http://{receiver}"),
        gateway,
        &[],
    ))
    .await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    stdout
}

async fn scripted_receiver(answers: Vec<(u16, &'static str)>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for (status, message) in answers {
            let (mut stream, _) = listener.accept().await.unwrap();
            let _ = read_request(&mut stream).await;
            let body = serde_json::json!({ "message": message }).to_string();
            let head = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    });
    address
}

/// Reads one request's head and its `Content-Length` body.
async fn read_request(stream: &mut tokio::net::TcpStream) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(bytes);
        }
        bytes.extend_from_slice(&chunk[..n]);
        let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if bytes.len() >= end + 4 + length {
            return Ok(bytes);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_every_shipped_scenario_green() {
    let (code, stdout, stderr) = payhook(args(&["demo"])).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("all 14 scenarios passed"), "{stdout}");
    for told in [
        "merchant's ledger:",
        "reconcile",
        "403",
        "callback already processed",
    ] {
        assert!(stdout.contains(told), "the story tells {told}: {stdout}");
    }
    // A success unlike its validation is held, in the example's quarantine and in
    // payhook's list for a person.
    let unlike = stdout
        .split("▶ ")
        .find(|story| story.starts_with("a result unlike its validation"))
        .unwrap();
    assert!(
        unlike.contains("nothing booked; held in quarantine")
            && unlike.contains(
                "the success is not the payment validated: amount 400.00, validated 40.00"
            )
            && unlike.contains("payhook lists it among the held results"),
        "{unlike}"
    );
    // The conflicting second result is told as it happened: the merchant's approval went
    // out and was refused; the gateway kept its denial.
    let conflict = stdout
        .split("▶ ")
        .find(|story| story.starts_with("conflicting second result"))
        .unwrap();
    let refused = conflict
        .find("merchant → gateway: result of validation")
        .unwrap_or_else(|| panic!("the merchant's result is told: {conflict}"));
    assert!(
        conflict[refused..]
            .lines()
            .next()
            .unwrap()
            .contains("success = true")
            && conflict.contains("→ 403"),
        "{conflict}"
    );
    assert!(
        conflict.contains("the gateway keeps the result it held")
            && conflict.contains("success = false (\"denied by an operator\")"),
        "{conflict}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_files_run_against_a_running_merchant_and_unmet_expectations_fail() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let gateway = mock.gateway_config();
    let data = tempfile::tempdir().unwrap();
    let mut env = gateway_env(&gateway);
    env.extend([
        ("PAYHOOK_VALIDATION_AWAITABLE", "true".into()),
        ("PAYHOOK_VALIDATION_ALLOW_UNAUTHENTICATED", "true".into()),
        ("PAYHOOK_VALIDATION_RETRY_SCHEDULE", r#"["100ms"]"#.into()),
        ("MERCHANT_REVIEW_EVERY", "100ms".into()),
    ]);
    let (mut merchant, address) = start_merchant(data.path(), &env);
    let to = format!("http://{address}");
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<String> = std::fs::read_dir(&shipped)
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        // These two need the merchant's reconcile (`payhook demo` runs them in-process);
        // reconcile steps are tried below with a command, in files of their own.
        .filter(|p| {
            !p.ends_with("lost-callback.toml") && !p.ends_with("reconcile-in-progress.toml")
        })
        .collect();
    files.sort();
    let run_on = |files: &[String], extra: &[&str]| {
        payhook(scenario_command(files, &to, &mock.url(), extra))
    };
    let (code, stdout, stderr) = run_on(&files, &["--allow-unchecked"]).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    // From outside, the merchant's books cannot be seen: said, not passed over.
    assert!(
        stdout.contains("⚠ not checked: bookings = 1")
            && stdout.contains("all 12 scenario(s) passed, ")
            && stdout.contains("expectation(s) not checked (--allow-unchecked)"),
        "{stdout}"
    );
    // Without --allow-unchecked, a run that could not check them all is no pass: a
    // receiver that books every copy of a callback meets every other expectation.
    let deposit = vec![shipped.join("deposit.toml").display().to_string()];
    let (code, stdout, stderr) = run_on(&deposit, &[]).await;
    assert_eq!(code, 3, "{stdout}{stderr}");
    assert!(
        stderr.contains("2 could not be checked") && stderr.contains("--bookings-command"),
        "{stderr}"
    );
    assert!(!stdout.contains("scenario(s) passed"), "{stdout}");
    // A command that reads the books checks them: the count it prints, for the nonce, and
    // how the transaction moved the balance.
    let (code, stdout, stderr) = run_on(
        &deposit,
        &[
            "--bookings-command",
            r#"test "$PAYHOOK_MOCK_NONCE" = "{nonce}" && echo 1 25.5"#,
        ],
    )
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("1 result(s) booked, the balance moved by 25.5 (the bookings command)")
            && stdout.contains("all 1 scenario(s) passed\n"),
        "{stdout}"
    );
    // Counted once but credited the wrong way: a withdrawal's sign on a deposit.
    let (code, stdout, _) = run_on(&deposit, &["--bookings-command", "echo 1 -25.50"]).await;
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(
            "expected the transaction to move the balance by 25.50, the merchant's books moved it by -25.50"
        ),
        "{stdout}"
    );
    // A count without the amount checks the count alone: `moved` is said not checked.
    let (code, stdout, _) = run_on(&deposit, &["--bookings-command", "echo 1"]).await;
    assert_eq!(code, 3, "{stdout}");
    assert!(stdout.contains("⚠ not checked: moved = 25.50"), "{stdout}");
    let (code, stdout, _) = run_on(&deposit, &["--bookings-command", "echo 2"]).await;
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("expected 1 booking(s) of the transaction, the merchant's books count 2"),
        "{stdout}"
    );
    let (code, stdout, _) = run_on(&deposit, &["--bookings-command", "echo no; exit 4"]).await;
    assert_eq!(code, 3, "{stdout}");
    assert!(
        stdout.contains("the bookings command did not print a count"),
        "{stdout}"
    );

    // `conflicts = 0` holds once the merchant's result is posted, not before: watched at
    // a gateway the merchant does not post to, it is unmet.
    let elsewhere = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let no_conflict = scenario_file(
        data.path(),
        "no-conflict",
        "[[step]]\nkind = \"transaction-validation\"\nexpect = { status = 200, conflicts = 0 }\n",
    );
    let met_here_not_elsewhere = async |scenario: &[String], unmet: &str| {
        for (gateway, code_wanted) in [(mock.url(), 0), (elsewhere.url(), 1)] {
            let (code, stdout, _) = payhook(scenario_command(
                scenario,
                &to,
                &gateway,
                &["--await-timeout", "2s"],
            ))
            .await;
            assert_eq!(code, code_wanted, "{stdout}");
            if code_wanted == 1 {
                assert!(stdout.contains(unmet), "{stdout}");
            }
        }
    };
    met_here_not_elsewhere(&no_conflict, "no result was posted").await;

    // A result the scenario posted itself (`gateway-result`) is not the merchant's: with
    // the same result expected, the merchant's own post is looked for. Watched at a gateway
    // the merchant does not post to, none comes, and the expectation is unmet.
    let own_result = scenario_file(
        data.path(),
        "own-result",
        "[[step]]\nkind = \"gateway-result\"\nsuccess = true\n\n\
         [[step]]\nkind = \"transaction-validation\"\nexpect = { status = 200, result = \"allow\" }\n",
    );
    met_here_not_elsewhere(
        &own_result,
        "the result the gateway holds is this scenario's own",
    )
    .await;

    // An expectation that does not hold: exit 1, and the report says what was wrong.
    let wrong = scenario_file(
        data.path(),
        "wrong",
        "[[step]]\nkind = \"transaction-validation\"\nexpect = { status = 500 }\n",
    );
    let (code, stdout, _) = payhook(scenario_command(&wrong, &to, &mock.url(), &[])).await;
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("✗ expected status 500, got 200"),
        "{stdout}"
    );

    // A callback acknowledged only at its second attempt (days late on the aggregator's
    // schedule) is delivered, but not by the attempt a scenario asks for.
    let late = scenario_file(
        data.path(),
        "late",
        "[[step]]\nkind = \"callback\"\nexpect = { delivered = true, attempts = 1 }\n",
    );
    let flaky = vec![(500, "try later"), (200, "callback accepted")];
    let stdout = unmet_against(&late, &mock.url(), flaky).await;
    assert!(
        stdout.contains("expected acknowledged by attempt 1; acknowledged at attempt 2"),
        "{stdout}"
    );
    // One never acknowledged is said so.
    let never = scenario_file(
        data.path(),
        "never",
        "[[step]]\nkind = \"callback\"\nmax_attempts = 2\nexpect = { attempts = 2 }\n",
    );
    let stdout = unmet_against(&never, &mock.url(), vec![(500, "down"), (500, "down")]).await;
    assert!(
        stdout.contains("expected acknowledged by attempt 2; not acknowledged in 2"),
        "{stdout}"
    );

    // A receiver that records a forgery's nonce before checking its signature fails a
    // forged-callback step: its genuine callback is answered as a duplicate.
    let forged = scenario_file(
        data.path(),
        "forged",
        "[[step]]\nkind = \"forged-callback\"\nforgery = \"tamper-body\"\n",
    );
    let careless = vec![
        (401, "invalid signature"),
        (200, "callback already processed"),
    ];
    let stdout = unmet_against(&forged, &mock.url(), careless).await;
    assert!(
        stdout.contains("forged (tamper-body) → 401")
            && stdout.contains("expected the forged request 401, then the genuine one accepted"),
        "{stdout}"
    );
    // Without the signing key, a forgery cannot be made: a clear error, not a pass.
    let mut unsigned = scenario_command(&forged, &to, &mock.url(), &[]);
    let key = unsigned.iter().position(|a| a == "--key").unwrap();
    unsigned.drain(key..key + 2);
    let (code, stdout, stderr) = payhook(unsigned).await;
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stderr.contains("needs a signing key (--key)"), "{stderr}");
    // A run without the key whose expectations all hold is no pass: unsigned, it passes
    // exactly the receiver that books forged callbacks — unless --allow-unsigned says so.
    let delivered = scenario_file(
        data.path(),
        "delivered",
        "[[step]]\nkind = \"callback\"\nexpect = { delivered = true }\n",
    );
    for (allow, wanted) in [(&[][..], 3), (&["--allow-unsigned"][..], 0)] {
        let receiver = scripted_receiver(vec![(200, "callback accepted")]).await;
        let mut unsigned = scenario_command(
            &delivered,
            &format!("http://{receiver}"),
            &mock.url(),
            allow,
        );
        let key = unsigned.iter().position(|a| a == "--key").unwrap();
        unsigned.drain(key..key + 2);
        let (code, stdout, stderr) = payhook(unsigned).await;
        assert_eq!(code, wanted, "{stdout}{stderr}");
        if wanted == 3 {
            assert!(stderr.contains("--allow-unsigned"), "{stderr}");
        }
    }

    // A reconcile step runs the merchant's command; without one it is a clear error.
    let lost = scenario_file(
        data.path(),
        "lost",
        "[[step]]\nkind = \"callback\"\nlost = true\n[[step]]\nkind = \"reconcile\"\nexpect = { booked = true }\n",
    );
    let base = scenario_command(&lost, &to, &mock.url(), &[]);
    let (code, _, stderr) = payhook(base.clone()).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("--reconcile-command"), "{stderr}");
    let mut with_command = base.clone();
    with_command.extend(args(&[
        "--reconcile-command",
        "echo {reference_id}: booked now",
    ]));
    let (code, stdout, stderr) = payhook(with_command).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("→ booked now"), "{stdout}");
    // What a command prints counts only when it ends well.
    let mut failing_command = base.clone();
    failing_command.extend(args(&[
        "--reconcile-command",
        "echo {reference_id}: booked now; exit 3",
    ]));
    let (code, stdout, stderr) = payhook(failing_command).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("the reconcile command failed"),
        "{stdout}{stderr}"
    );
    // A transaction the payment system has not finished: created in progress by its
    // validation, as the lookup shows, and reconciled without booking anything. A merchant
    // whose reconcile books it, or finds it booked, fails the step.
    let early = scenario_file(
        data.path(),
        "early",
        "[[step]]\nkind = \"transaction-validation\"\nexpect = { status = 200 }\n\
         [[step]]\nkind = \"lookup\"\nexpect = { in_progress = true, delivery_status = \"NotSent\" }\n\
         [[step]]\nkind = \"reconcile\"\nexpect = { in_progress = true }\n",
    );
    let reconciling = |says: &str| {
        let mut command = scenario_command(&early, &to, &mock.url(), &[]);
        command.extend(args(&["--reconcile-command", says]));
        command
    };
    let (code, stdout, stderr) = payhook(reconciling(
        "echo {reference_id}: not final yet, nothing to book",
    ))
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains(": 3 (pending) until its result")
            && stdout.contains("created after validation ")
            && stdout.contains("→ 3 (pending), callbackDeliveryStatus NotSent")
            && stdout.contains("→ still in progress, nothing booked"),
        "{stdout}"
    );
    for says in [
        "echo {reference_id}: booked now",
        "echo {reference_id}: already acknowledged",
    ] {
        let (code, stdout, stderr) = payhook(reconciling(says)).await;
        assert_eq!(code, 1, "{says}: {stdout}{stderr}");
        assert!(
            stdout.contains("✗ expected in_progress = true; the merchant's reconcile said: "),
            "{says}: {stdout}"
        );
    }
    // A transaction the merchant refused is never created at the gateway: a lookup that
    // expects a record fails the step (the run goes on to its verdict), and one that
    // expects none (`found = false`) passes.
    for (expect, code_wanted, said) in [
        (
            "in_progress = true",
            1,
            "✗ the gateway holds no transaction ",
        ),
        (
            "found = false",
            0,
            "→ 404, the gateway holds no such transaction",
        ),
    ] {
        let refused = scenario_file(
            data.path(),
            "refused-then-looked-up",
            &format!(
                "[payment]\namount = \"25000.00\"\nclient = \"client-42\"\n\
                 [[step]]\nkind = \"transaction-validation\"\nexpect = {{ status = 403 }}\n\
                 [[step]]\nkind = \"lookup\"\nexpect = {{ {expect} }}\n"
            ),
        );
        let (code, stdout, stderr) =
            payhook(scenario_command(&refused, &to, &mock.url(), &[])).await;
        assert_eq!(code, code_wanted, "{expect}: {stdout}{stderr}");
        assert!(stdout.contains(said), "{expect}: {stdout}");
    }
    // One that hangs is stopped, and the step fails saying so: it hung the run.
    let mut hanging = base;
    hanging.extend(args(&[
        "--reconcile-command",
        "sleep 600",
        "--command-timeout",
        "500ms",
    ]));
    let (code, stdout, stderr) =
        tokio::time::timeout(std::time::Duration::from_secs(60), payhook(hanging))
            .await
            .expect("the hanging command was stopped");
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("did not end within 500ms (--command-timeout)"),
        "{stdout}{stderr}"
    );
    merchant.kill();
}

/// A merchant that answers every transaction validation "postponed" and posts to the
/// gateway `results` (success, after how long) for it, in turn, whatever each answer —
/// `first` of them before it answers.
async fn merchant_posting(
    gateway: payhook::config::GatewayConfig,
    results: &'static [(bool, u64)],
    first: usize,
) -> SocketAddr {
    let client = GatewayClient::new(&gateway).unwrap();
    serve_http(move |request: hyper::Request<hyper::body::Incoming>| {
        let client = client.clone();
        async move {
            use http_body_util::BodyExt;
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let asked: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let validation_id = asked["validationId"].as_i64().unwrap();
            let post = move |client: GatewayClient, results: &'static [(bool, u64)]| async move {
                for &(success, after_ms) in results {
                    tokio::time::sleep(std::time::Duration::from_millis(after_ms)).await;
                    let result = payhook::model::PostponedValidationResult {
                        validation_id: validation_id.into(),
                        success,
                        description: String::new(),
                    };
                    let _ = client.post_validation_result(&result).await;
                }
            };
            post(client.clone(), &results[..first]).await;
            tokio::spawn(post(client, &results[first..]));
            hyper::Response::builder()
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                    br#"{"message":"validation postponed"}"#,
                )))
                .unwrap()
        }
    })
    .await
}

/// A merchant that posts its refused result again (a 403 is final) fails a step expecting
/// one refusal: it passed, the watch ending at the first. And one that posts the expected
/// result and then another fails a step expecting that result and no conflict. A postponed
/// validation's result decides whether the aggregator creates its transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_posted_again_after_its_refusal_or_contradicted_fails_the_step() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    let conflicting = vec![
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("scenarios/conflicting-result.toml")
            .display()
            .to_string(),
    ];
    let stubborn = merchant_posting(mock.gateway_config(), &[(true, 0), (true, 1_000)], 0).await;
    let to = format!("http://{stubborn}");
    let (code, stdout, stderr) =
        payhook(scenario_command(&conflicting, &to, &mock.url(), &[])).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("expected 1 refused result(s), saw 2"),
        "{stdout}"
    );

    let approve = scenario_file(
        data.path(),
        "approve",
        "[[step]]\nkind = \"transaction-validation\"\nexpect = { status = 200, result = \"allow\" }\n",
    );
    // Both posted before the validation is answered: the second is refused before the step
    // looks.
    let fickle = merchant_posting(mock.gateway_config(), &[(true, 0), (false, 0)], 2).await;
    let to = format!("http://{fickle}");
    let (code, stdout, stderr) = payhook(scenario_command(
        &approve,
        &to,
        &mock.url(),
        &["--allow-unchecked"],
    ))
    .await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stdout.contains("that the gateway refused (403"), "{stdout}");

    // A postponed validation denied: the aggregator creates no transaction, and a lookup
    // finds none. Allowed, it is created, in progress until its result.
    let looked_up = scenario_file(
        data.path(),
        "looked-up",
        "[[step]]\nkind = \"transaction-validation\"\nexpect = { status = 200 }\n\
         [[step]]\nkind = \"lookup\"\nexpect = { in_progress = true }\n",
    );
    let denying = merchant_posting(mock.gateway_config(), &[(false, 0)], 1).await;
    let to = format!("http://{denying}");
    let (code, stdout, stderr) = payhook(scenario_command(&looked_up, &to, &mock.url(), &[])).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(!stdout.contains("created after validation"), "{stdout}");
    assert!(
        stdout.contains("→ 404, the gateway holds no such transaction")
            && stdout.contains("✗ the gateway holds no transaction "),
        "{stdout}"
    );
    let allowing = merchant_posting(mock.gateway_config(), &[(true, 0)], 1).await;
    let to = format!("http://{allowing}");
    let (code, stdout, stderr) = payhook(scenario_command(&looked_up, &to, &mock.url(), &[])).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("created after validation "), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_redacts_credentials_and_refuses_contradicting_flags() {
    // Nothing listens on port 1: no answer is a failure, and the printed request keeps the
    // shared secret and the Basic credentials out of the terminal.
    let (code, stdout, stderr) = payhook(args(&[
        "trigger",
        "transaction-validation",
        "--to",
        "http://127.0.0.1:1",
        "-H",
        "X-Api-Key: s3cr3t-s3cr3t-s3cr3t",
        "-H",
        "Authorization: Basic c2hvcDpwYXNzd29yZA==",
    ]))
    .await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("no answer"), "{stderr}");
    assert!(
        stdout.contains("x-api-key: <redacted>") && stdout.contains("authorization: <redacted>"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("s3cr3t") && !stdout.contains("c2hvcDpwYXNzd29yZA"),
        "{stdout}"
    );
    // A header given wrong (`=` for `:`, a line break carried in from a file) is refused
    // without its value in the message: it is often the secret, and this runs in CI logs.
    for wrong in ["X-Api-Key=s3cr3t-typo", "X-Api-Key: s3cr3t\rcrlf"] {
        let (code, stdout, stderr) = payhook(args(&[
            "trigger",
            "transaction-validation",
            "--to",
            "http://127.0.0.1:1",
            "-H",
            wrong,
        ]))
        .await;
        assert_eq!(code, 2, "{stdout}{stderr}");
        assert!(stderr.contains("not shown"), "{stderr}");
        assert!(
            !stderr.contains("s3cr3t") && !stdout.contains("s3cr3t"),
            "{stderr}"
        );
    }

    let refusals = [
        (
            vec![
                "callback",
                "--set",
                "transactionStatus=-3",
                "--gateway",
                "http://127.0.0.1:1",
            ],
            "--gateway and --settings use the payment flags",
        ),
        (
            vec!["callback", "--set", "amount=1", "--fault", "reuse-nonce"],
            "--fault builds its own bodies",
        ),
        (
            vec!["callback", "--await", "--gateway", "http://127.0.0.1:1"],
            "--await waits for a postponed validation's result",
        ),
        // Faults judge their own requests: they neither await a result nor record the
        // transaction at the mock gateway, which these flags would otherwise promise.
        (
            vec![
                "transaction-validation",
                "--fault",
                "duplicate",
                "--await",
                "--gateway",
                "http://127.0.0.1:1",
            ],
            "--fault judges its own requests",
        ),
        (
            vec![
                "callback",
                "--fault",
                "duplicate",
                "--gateway",
                "http://127.0.0.1:1",
            ],
            "--fault judges its own requests",
        ),
        // The retry schedule is --settings' delivery's; one request has none.
        (vec!["callback", "--fast"], "--schedule and --fast pace"),
        (
            vec!["callback", "--schedule", "1s"],
            "--schedule and --fast pace",
        ),
    ];
    for (flags, reason) in refusals {
        let mut command = vec!["trigger"];
        command.extend(&flags);
        command.extend(["--to", "http://127.0.0.1:1"]);
        let (code, stdout, stderr) = payhook(args(&command)).await;
        assert_eq!(code, 2, "{flags:?}: {stdout}{stderr}");
        assert!(stderr.contains(reason), "{flags:?}: {stderr}");
        assert!(!stdout.contains('→'), "{flags:?} sent a request: {stdout}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_sends_to_the_merchants_configured_paths() {
    let (code, stdout, stderr) = payhook_with(
        args(&["trigger", "callback", "--to", "http://127.0.0.1:1"]),
        vec![("PAYHOOK_PATHS_CALLBACK".into(), "/hooks/payments".into())],
    )
    .await;
    assert_eq!(code, 1, "no answer on port 1: {stdout}{stderr}");
    assert!(
        stdout.contains("POST http://127.0.0.1:1/hooks/payments"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_from_a_file_is_sent_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("captured.json");
    // As captured: a trailing zero, keys out of order, the aggregator's spacing.
    let captured = r#"{"nonce": "n-captured", "amount": 10.50, "zeta": 1, "alpha": 2}"#;
    std::fs::write(&file, captured).unwrap();
    let send = || {
        payhook(args(&[
            "trigger",
            "callback",
            "--to",
            "http://127.0.0.1:1",
            "--file",
            file.to_str().unwrap(),
        ]))
    };
    let (code, stdout, stderr) = send().await;
    assert_eq!(code, 1, "no answer on port 1: {stdout}{stderr}");
    assert!(stdout.contains(captured), "{stdout}");
    // Not JSON: refused before anything is sent.
    std::fs::write(&file, "{not json").unwrap();
    let (code, stdout, _) = send().await;
    assert_ne!(code, 0);
    assert!(!stdout.contains('→'), "{stdout}");
}

/// `payhook demo --store URL`: the same story on PostgreSQL, in a schema of the demo's own
/// that it removes afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_on_postgres_and_leaves_nothing_behind() {
    let Some(db) = support::postgres::database("demo_on_postgres").await else {
        return;
    };
    let (code, stdout, stderr) = payhook(args(&["demo", "--store", &db.url])).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("all 14 scenarios passed"), "{stdout}");
    assert!(
        stdout.contains("(store: PostgreSQL, schema payhook_demo_"),
        "{stdout}"
    );
    let schema = stdout
        .split("schema ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap()
        .to_owned();
    let mut conn = db.connect().await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
        .bind(&schema)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0, "the demo's schema {schema} is removed");
}
