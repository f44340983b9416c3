//! Two `payhook demo --data DIR` on one directory at once: the second refuses the directory
//! before it writes anything in it — it used to replace the first one's key, and the first
//! then failed its scenarios with 401s.
#![allow(clippy::unwrap_used, reason = "tests")]

use std::process::Command;

#[test]
fn a_demo_refuses_a_data_directory_another_demo_holds_and_leaves_its_key_alone() {
    let dir = tempfile::tempdir().unwrap();
    // What a running demo holds for its lifetime: its store (and with it the store's lock),
    // and the key its merchant verifies with.
    let mut config = payhook::Config::default();
    config.store.path = dir.path().join("store");
    let running = payhook::store::SledStore::open(&config.store, &[]).unwrap();
    let key = dir.path().join("aggregator-public.pem");
    std::fs::write(&key, "the first demo's key").unwrap();

    let output = Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(["demo", "--data"])
        .arg(dir.path())
        .env_clear()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("{} is in use", dir.path().display())),
        "{stderr}"
    );
    assert!(stderr.contains("--data"), "the fix: {stderr}");
    assert_eq!(
        std::fs::read_to_string(&key).unwrap(),
        "the first demo's key",
        "the running demo's key is untouched"
    );
    drop(running);
}
