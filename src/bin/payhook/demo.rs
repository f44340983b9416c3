//! `payhook demo`: the example merchant and a mock gateway in one process, on loopback, with
//! the shipped scenarios run against them and told as a story.

use payhook::Config;
use payhook::HandlerError;
use payhook::gateway::GatewayClient;
use payhook::model::{Nonce, TransactionStatus};
use payhook::server::Reconciled;
use payhook::signature::{Algorithm, SigningKey, generate_key_pair};
use payhook::sim::scenario::{Observed, Reconciler, Reconciliation, Scenario, Target};
use payhook::sim::{MockGateway, MockGatewayConfig, Signer, Trigger};
use payhook::store::Store;
use rust_decimal::Decimal;
use std::{path::PathBuf, sync::Arc, time::Duration};

use crate::Failure;
use payhook::sim::example_merchant as merchant;

/// Runs the demo; the data goes to `data` (kept) or to a temporary directory (removed).
/// With `store` (a PostgreSQL address), the records go to a schema of the demo's own in that
/// database, removed afterwards unless `data` is given.
pub(crate) fn run(
    data: Option<PathBuf>,
    store: Option<String>,
    inspect: bool,
) -> Result<(), Failure> {
    let keep = data.is_some();
    let dir = data.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("payhook-demo-{}", uuid::Uuid::new_v4().simple()))
    });
    std::fs::create_dir_all(&dir).map_err(|e| Failure::msg(format!("{}: {e}", dir.display())))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let postgres = store.map(|url| {
        let schema = format!(
            "payhook_demo_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        (url, schema)
    });
    let outcome = runtime.block_on(async {
        let outcome = demo(&dir, postgres.clone(), inspect).await;
        if let Some((url, schema)) = postgres.filter(|_| !keep) {
            drop_schema(&url, &schema).await;
        }
        outcome
    });
    drop(runtime);
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

/// Removes the demo's schema (what it wrote in the merchant's database).
async fn drop_schema(url: &str, schema: &str) {
    use sqlx::Connection;
    if let Ok(mut conn) = sqlx::PgConnection::connect(url).await {
        let _ = sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .execute(&mut conn)
            .await;
    }
}

async fn demo(
    dir: &std::path::Path,
    postgres: Option<(String, String)>,
    inspect: bool,
) -> Result<(), Failure> {
    let mut config = Config::default();
    config.store.path = dir.join("store");
    let where_kept = match postgres {
        Some((url, schema)) => {
            config.store.url = Some(url.into());
            config.store.schema.clone_from(&schema);
            format!("PostgreSQL, schema {schema}")
        }
        None => config.store.path.display().to_string(),
    };
    // The store is opened first: its lock (an OS advisory lock, held until the demo ends)
    // makes this demo the directory's only user before anything in it is written. A second
    // demo on the same directory stops here instead of replacing this one's key.
    let store = merchant::open_store(&config).await.map_err(|error| {
        if error.to_string().contains("in use") {
            Failure(
                format!(
                    "{} is in use by another payhook demo (or a service using its store): \
                     wait for it to finish, or give this one another --data DIR",
                    dir.display()
                ),
                2,
            )
        } else {
            Failure(
                format!(
                    "the demo's store ({where_kept}): {}",
                    payhook::Report::new(&error)
                ),
                2,
            )
        }
    })?;
    let mock = MockGateway::start(MockGatewayConfig::default()).await?;

    // The simulated aggregator signs callbacks with a key the merchant is given.
    let pair = generate_key_pair(Algorithm::Ed25519)?;
    let public_key = dir.join("aggregator-public.pem");
    std::fs::write(&public_key, &pair.public_pem)?;
    config.signature.algorithm = Algorithm::Ed25519;
    config.signature.keys = vec![payhook::config::KeySource {
        id: Some("demo".into()),
        file: Some(public_key),
        ..Default::default()
    }];
    config.gateway = mock.gateway_config();
    // The simulated aggregator calls from this machine: the validation endpoints answer no
    // one else (a service sets a method or the aggregator's addresses).
    let auth = &mut config.auth;
    for endpoint in [
        &mut auth.providers_validation,
        &mut auth.transaction_validation,
    ] {
        endpoint.allow_ips = vec!["127.0.0.1/32".to_owned(), "::1/128".to_owned()];
    }
    config.validation.awaitable = true;
    config.validation.retry_schedule = vec![Duration::from_millis(100)];
    // The inspector's token: made up for this run, printed with its address.
    let admin_token = format!("demo-{}", uuid::Uuid::new_v4().simple());
    config.admin.token = Some(admin_token.clone().into());

    let shop = merchant::Merchant {
        max_amount: Decimal::from(10_000),
        review_above: Some(Decimal::from(1_000)),
        provider_tags: merchant::ProviderTags::default(),
    };
    let app = merchant::app(config.clone(), shop, store.clone())?;
    if let Some(resolver) = app.resolver() {
        tokio::spawn(merchant::review(resolver, Duration::from_millis(100)));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base_url = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(payhook::serve(listener, app.clone(), async move {
        let _ = stopped.await;
    }));
    println!("payhook demo — everything on loopback, nothing leaves this machine");
    println!("  example merchant  {base_url}  (store: {where_kept})");
    println!(
        "  mock aggregator   {}  (login, results, lookup)\n",
        mock.url()
    );

    let key = SigningKey::from_pkcs8(pair.private_pem.as_bytes(), Algorithm::Ed25519)?;
    let gateway = GatewayClient::new(&mock.gateway_config())?;
    let reconciler: Reconciler = {
        let (app, gateway) = (app.clone(), gateway.clone());
        Arc::new(move |reference_id| {
            let (app, gateway) = (app.clone(), gateway.clone());
            Box::pin(async move {
                let outcome = app.reconcile(&gateway, &[reference_id]).await;
                match outcome.into_iter().next().map(|(_, o)| o) {
                    Some(Ok(Reconciled::Booked(_))) => Ok(Reconciliation::BookedNow),
                    Some(Ok(Reconciled::Held { reason, .. })) => {
                        Err(HandlerError::msg(format!("held, not booked: {reason}")))
                    }
                    Some(Ok(Reconciled::AlreadyBooked(_) | Reconciled::AlreadyHeld { .. })) => {
                        Ok(Reconciliation::AlreadyBooked)
                    }
                    Some(Ok(Reconciled::NotFinal(_))) => Ok(Reconciliation::InProgress),
                    Some(Ok(other)) => Err(HandlerError::msg(format!("{other:?}"))),
                    Some(Err(error)) => Err(HandlerError::from(error)),
                    None => Err(HandlerError::msg("nothing reconciled")),
                }
            })
        })
    };
    let ledger = merchant::Ledger::of(&store)?;
    let shared = store.shared();
    let target = Target {
        base_url: base_url.clone(),
        paths: config.paths.clone(),
        trigger: Trigger::new(Some(Signer::new(key, &config.signature)?))?,
        gateway: mock.gateway_config(),
        await_timeout: Duration::from_secs(10),
        reconciler: Some(reconciler),
        observer: Some(Arc::new(move |nonce: String| {
            let (ledger, shared) = (ledger.clone(), Arc::clone(&shared));
            Box::pin(async move { booked(&ledger, shared.as_ref(), &nonce).await })
        })),
    };

    let mut failed = Vec::new();
    for (file, text) in payhook::sim::scenario::SHIPPED {
        let scenario = Scenario::parse(text, file)?;
        let report = payhook::sim::scenario::run(&scenario, &target).await?;
        println!("{}", report.render());
        // The demo's observer sees the example's books: an expectation it could not check
        // (its ledger unreadable) is a failure here, not a pass.
        if !report.passed() || report.unchecked() > 0 {
            failed.push(scenario.name);
        }
    }
    let total = payhook::sim::scenario::SHIPPED.len();
    let outcome = if failed.is_empty() {
        println!("all {total} scenarios passed");
        Ok(())
    } else {
        Err(Failure(
            format!(
                "{} of {total} scenarios failed: {}",
                failed.len(),
                failed.join(", ")
            ),
            1,
        ))
    };
    if inspect {
        println!(
            "\nthe service stays up: its inspector (deliveries, failing callbacks, held results, postponed validations, outbox)"
        );
        println!("  {base_url}/payhook/admin/inspector#token={admin_token}");
        println!("  (the link fills the token in; press Open)");
        println!("  PAYHOOK_ADMIN_TOKEN={admin_token} payhook tail --admin-url {base_url}");
        println!("stop with Ctrl-C");
        payhook::shutdown_signal().await;
    }
    let _ = stop.send(());
    let _ = server.await;
    outcome
}

/// The ledger entry of `nonce`, told in a line with the results of it held in quarantine
/// (and whether payhook's store keeps each for a person), and how many results it booked;
/// `None` when the ledger cannot be read.
async fn booked(ledger: &merchant::Ledger, store: &dyn Store, nonce: &str) -> Option<Observed> {
    let mut observed = booked_entry(ledger, nonce).await?;
    for (held, quarantined) in ledger.quarantined_all().await.ok()? {
        if held == nonce {
            let status = TransactionStatus::from_code(quarantined.status);
            let kept = match store.held_callback(&Nonce::from(nonce), status).await {
                Ok(Some(kept)) if kept.unresolved() => {
                    " (payhook lists it among the held results until a person resolves it: \
                     payhook callbacks held, payhook callbacks resolve)"
                }
                _ => "",
            };
            observed.summary.push_str(&format!(
                "; held in quarantine, not booked: {quarantined}{kept}"
            ));
        }
    }
    Some(observed)
}

/// The ledger entry of `nonce`, told in a line, and how many results it booked; `None` when
/// the ledger cannot be read.
async fn booked_entry(ledger: &merchant::Ledger, nonce: &str) -> Option<Observed> {
    let Some(entry) = ledger.entry(nonce).await.ok()? else {
        return Some(Observed {
            summary: format!("{nonce}: nothing booked"),
            bookings: Some(0),
            moved: Some(rust_decimal::Decimal::ZERO),
        });
    };
    let balance = ledger
        .balance(&entry.client_id, &entry.currency)
        .await
        .unwrap_or_default();
    Some(Observed {
        summary: format!(
            "{} booked {} {} (status {}, {} booking(s)); balance of {} now {balance} {}",
            nonce,
            entry.balance_effect,
            entry.currency,
            entry.status,
            entry.bookings,
            entry.client_id,
            entry.currency
        ),
        bookings: Some(entry.bookings),
        moved: Some(entry.balance_effect),
    })
}
