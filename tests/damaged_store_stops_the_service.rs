//! The service, and the `payhook` command line, on a store that lost acknowledged writes:
//! the example merchant refuses to start (non-zero exit, an error naming the store, what is
//! missing and what to do), `payhook store check` reports the same without serving, and only
//! after `payhook store accept-loss` does the service start.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::config::StoreConfig;
use payhook::model::Nonce;
use payhook::model::TransactionStatus;
use payhook::store::{CallbackBegin, DedupStore, Effects, SledStore};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn payhook(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_payhook"))
        .env_clear()
        .args(args)
        .output()
        .unwrap()
}

/// Runs the example merchant on `data` until it exits (it must, within a minute).
fn merchant_exit(data: &Path) -> Output {
    let mut child = Command::new(support::example_binary())
        .env_clear()
        .envs(support::ed25519_example_env())
        .env("PAYHOOK_STORE_PATH", data)
        .env("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the merchant served on a damaged store");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

async fn acknowledged_store(path: &Path, count: usize) {
    let config = StoreConfig {
        path: path.to_path_buf(),
        ..StoreConfig::default()
    };
    let store = SledStore::open(&config, &[]).unwrap();
    for i in 0..count {
        let nonce = format!("n-{i}");
        let CallbackBegin::Claimed { claim, .. } = store
            .begin_callback(
                &Nonce::from(&nonce),
                TransactionStatus::Success,
                Duration::from_secs(60),
            )
            .await
            .unwrap()
        else {
            panic!("not claimed");
        };
        store
            .finish_callback(
                &Nonce::from(&nonce),
                claim,
                TransactionStatus::Success,
                Effects::default(),
            )
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_refuses_a_damaged_store_until_an_operator_accepts_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("store");
    acknowledged_store(&data, 100).await;
    let db = data.join("db");
    let length = std::fs::metadata(&db).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(length / 2)
        .unwrap();
    let path = data.display().to_string();

    let exit = merchant_exit(&data);
    let stderr = String::from_utf8_lossy(&exit.stderr);
    assert!(!exit.status.success(), "{stderr}");
    assert!(stderr.contains(&path), "{stderr}");
    assert!(
        stderr.contains("acknowledged commits are missing"),
        "{stderr}"
    );
    assert!(stderr.contains("payhook store accept-loss"), "{stderr}");

    let check = payhook(&["store", "check", "--data", &path]);
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&path) && stderr.contains("acknowledged commits are missing"),
        "{stderr}"
    );

    let accept = payhook(&["store", "accept-loss", "--data", &path]);
    let stdout = String::from_utf8_lossy(&accept.stdout);
    assert!(
        accept.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&accept.stderr)
    );
    assert!(stdout.contains("given up"), "{stdout}");
    assert!(
        std::fs::read_to_string(data.join("payhook.audit.log"))
            .unwrap()
            .contains("acknowledged commits are missing")
    );

    let check = payhook(&["store", "check", "--data", &path]);
    assert!(check.status.success());
    assert!(String::from_utf8_lossy(&check.stdout).contains("is sound"));
    let mut env = support::ed25519_example_env();
    env.push(("PAYHOOK_STORE_PATH", path.clone()));
    env.push(("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0".to_owned()));
    let (_merchant, _address) = support::spawn_example(&env);
}

#[test]
fn store_check_on_a_directory_without_a_store_says_so_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("nowhere");
    let check = payhook(&["store", "check", "--data", &nowhere.display().to_string()]);
    assert_eq!(check.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&check.stderr).contains("there is no store at"));
    assert!(!nowhere.exists());
}
