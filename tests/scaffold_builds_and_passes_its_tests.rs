//! `payhook new` end to end: a scaffolded crate builds against this checkout (offline, with
//! this lockfile's crates and this target directory, so compiled dependencies are reused) and
//! its own test — the service started and its scenario run against it — passes.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::path::Path;
use std::process::{Command, Output};

fn payhook(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(args)
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn bad_names_and_non_empty_directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("x");
    for bad in ["2shop", "my shop", "payhook", "type", "Tokio", "serde-json"] {
        let output = payhook(&["new", bad, "--path", target.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(2), "{bad}");
        assert!(
            text(&output).contains("not a valid crate name"),
            "{}",
            text(&output)
        );
    }
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("notes.txt"), "mine").unwrap();
    let output = payhook(&["new", "shop", "--path", target.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output).contains("--force"), "{}", text(&output));
    let output = payhook(&["new", "shop", "--path", target.to_str().unwrap(), "--force"]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(
        std::fs::read_to_string(target.join("notes.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn a_scaffolded_service_builds_offline_and_passes_its_own_test() {
    let dir = tempfile::tempdir().unwrap();
    let shop = dir.path().join("shop");
    let checkout = env!("CARGO_MANIFEST_DIR");
    let output = payhook(&[
        "new",
        "shop",
        "--path",
        shop.to_str().unwrap(),
        "--payhook-path",
        checkout,
    ]);
    assert!(output.status.success(), "{}", text(&output));
    for file in [
        "Cargo.toml",
        "Cargo.lock",
        "payhook.toml",
        "src/main.rs",
        "src/lib.rs",
        "tests/scenario.rs",
        "scenarios/deposit.toml",
        "README.md",
    ] {
        assert!(shop.join(file).exists(), "{file}");
    }
    let main = std::fs::read_to_string(shop.join("src/main.rs")).unwrap();
    assert!(!main.contains("todo!") && !main.contains("{{"), "{main}");
    // Unsigned callbacks are a choice the merchant makes, not one the scaffold makes.
    let settings = std::fs::read_to_string(shop.join("payhook.toml")).unwrap();
    assert!(
        !settings
            .lines()
            .any(|line| line.trim_start().starts_with("allow_unsigned")),
        "{settings}"
    );
    std::fs::write(shop.join("payhook.generated.toml"), &settings).unwrap();
    // As its README says to before production: the aggregator's key in payhook.toml. Its
    // own test must pass still (it signs with a key of its own).
    let key = support::signature_fixtures()
        .join("rsa2048")
        .join("public.pem");
    let production = settings.replace(
        "# keys = [{ id = \"aggregator-2026\", file = \"aggregator-public.pem\" }]",
        &format!(
            "keys = [{{ id = \"aggregator-2026\", file = {:?} }}]",
            key.display().to_string()
        ),
    );
    // …and an endpoint credential whose secret production gives in its environment
    // (PAYHOOK_AUTH_TRANSACTION_VALIDATION_SECRET), not in the file: the test, which never
    // reads that environment, still runs.
    let production = production.replacen(
        "# method = \"none\"                 # signature, shared_secret, basic",
        "method = \"shared_secret\"",
        1,
    );
    assert_ne!(production, settings);
    assert!(production.contains("keys = [{"), "{production}");
    assert!(
        production.contains("method = \"shared_secret\""),
        "{production}"
    );
    std::fs::write(shop.join("payhook.toml"), production).unwrap();

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["test", "--offline"])
        .current_dir(&shop)
        .env("CARGO_TARGET_DIR", Path::new(checkout).join("target"))
        // Built as this checkout builds its dependencies (no debug info), so that they
        // are the same artifacts, reused, not a second set of them beside the first.
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    let printed = text(&output);
    assert!(output.status.success(), "{printed}");
    assert!(
        printed.contains("test every_scenario_passes ... ok"),
        "{printed}"
    );

    // With the settings as generated (no aggregator key), the service does not start: it
    // says what to set rather than book callbacks anyone could forge.
    let service = Path::new(checkout).join("target/debug/shop");
    let mut start = Command::new(&service);
    start
        .current_dir(&shop)
        .env("PAYHOOK_CONFIG", shop.join("payhook.generated.toml"))
        .env("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0");
    let output = support::exited_within(start, std::time::Duration::from_secs(60));
    let printed = text(&output);
    assert!(!output.status.success(), "{printed}");
    assert!(printed.contains("signature.keys"), "{printed}");
}

/// `payhook new --store postgres`: the same service with payhook's `postgres` feature; its
/// own test runs on the PostgreSQL of `PAYHOOK_TEST_DATABASE_URL`, in a schema of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaffolded_postgres_service_passes_its_own_test_on_postgres() {
    let Some(db) = support::postgres::database("scaffold_on_postgres").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let shop = dir.path().join("pgshop");
    let checkout = env!("CARGO_MANIFEST_DIR");
    let output = payhook(&[
        "new",
        "pgshop",
        "--path",
        shop.to_str().unwrap(),
        "--payhook-path",
        checkout,
        "--store",
        "postgres",
    ]);
    assert!(output.status.success(), "{}", text(&output));
    let on = |database: Option<(String, String)>| {
        let (shop, cargo) = (
            shop.clone(),
            std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()),
        );
        tokio::task::spawn_blocking(move || {
            let mut test = Command::new(cargo);
            test.args(["test", "--offline"])
                .current_dir(&shop)
                .env("CARGO_TARGET_DIR", Path::new(checkout).join("target"))
                .env("CARGO_PROFILE_DEV_DEBUG", "false")
                .env_remove("PAYHOOK_TEST_DATABASE_URL")
                .env_remove("PAYHOOK_TEST_SCHEMA")
                .env_remove("RUSTFLAGS");
            if let Some((url, schema)) = database {
                test.env("PAYHOOK_TEST_DATABASE_URL", url)
                    .env("PAYHOOK_TEST_SCHEMA", schema);
            }
            let output = test.output().unwrap();
            let printed = text(&output);
            assert!(output.status.success(), "{printed}");
            assert!(
                printed.contains("test every_scenario_passes ... ok"),
                "{printed}"
            );
        })
    };
    on(Some((db.url.clone(), db.schema.clone()))).await.unwrap();
    // It ran on PostgreSQL: its ledger is in the schema, an entry for the scenario's
    // transaction and one for each of its test's three pairs of results; the failure
    // delivered after the newer success, the failure whose order is not known, the one after
    // a paid-out withdrawal, and the scenario's success of a deposit its validation denied
    // are set aside.
    let mut conn = db.connect().await;
    let count = |tree: &'static str| {
        format!(
            "SELECT count(*) FROM {}.trees WHERE tree = '{tree}'",
            db.schema
        )
    };
    let booked: i64 = sqlx::query_scalar(&count("ledger"))
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(booked, 4);
    let set_aside: i64 = sqlx::query_scalar(&count("set_aside"))
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(set_aside, 4);
    drop(conn);
    db.drop_schema().await;

    // The production database in payhook.toml (nothing listens there): without
    // PAYHOOK_TEST_DATABASE_URL the test books into a temporary directory, never there.
    let settings = std::fs::read_to_string(shop.join("payhook.toml")).unwrap();
    let production = settings.replace(
        "# url = \"postgres://payhook@db/payments?sslmode=verify-full\"",
        "url = \"postgres://payhook@127.0.0.1:1/production\"",
    );
    assert!(
        production.contains("\nurl = \"postgres://payhook@127.0.0.1:1/production\""),
        "{production}"
    );
    std::fs::write(shop.join("payhook.toml"), production).unwrap();
    on(None).await.unwrap();
}
