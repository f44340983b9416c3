//! The example merchant (`payhook::sim::example_merchant`, which `examples/merchant.rs` serves) serves the three endpoints as its docs promise.
#![allow(clippy::unwrap_used, reason = "tests")]

use payhook::sim::example_merchant as merchant;
mod support;

use rust_decimal::Decimal;
use serde_json::json;
use support::*;

/// The example's app on port 0, with its store in a temp dir.
struct Example {
    addr: String,
    ledger: merchant::Ledger,
    _data: tempfile::TempDir,
}

async fn start() -> Example {
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.store.path = data.path().join("store");
    let store = merchant::open_store(&config).await.unwrap();
    let merchant = merchant::Merchant {
        max_amount: Decimal::from(1000),
        review_above: None,
        provider_tags: "11=fiat,eu;12=crypto;13=fiat".parse().unwrap(),
    };
    let ledger = merchant::Ledger::of(&store).unwrap();
    let app = merchant::app(config, merchant, store).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(payhook::serve(listener, app, std::future::pending()));
    Example {
        addr,
        ledger,
        _data: data,
    }
}

impl Example {
    async fn entry(&self, nonce: &str) -> Option<merchant::Entry> {
        self.ledger.entry(nonce).await.unwrap()
    }

    async fn balance(&self, client: &str, currency: &str) -> Decimal {
        self.ledger.balance(client, currency).await.unwrap()
    }

    /// Posts a callback body; its status.
    async fn callback(&self, body: &str) -> u16 {
        post_to(&self.addr, CALLBACK_PATH, body).await.status
    }
}

async fn post_to(addr: &str, path: &str, body: &str) -> RawResponse {
    exchange(
        addr.parse().unwrap(),
        &post(
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        ),
    )
    .await
}

#[tokio::test]
async fn the_example_offers_only_providers_fit_for_the_request() {
    let example = start().await;
    let addr = &example.addr;
    let response = post_to(addr, PROVIDERS_PATH, PROVIDERS_VALIDATION).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["providers"].as_array().unwrap().len(), 1);
    assert_eq!(response.json()["message"], "1 of 3 providers available");
}

/// A request that asks for provider tags is matched against the tags the merchant files its
/// providers under (the spec's candidates carry none), or a candidate's own where it has
/// some: never left with no provider only because the aggregator sends no tags.
#[tokio::test]
async fn the_example_offers_the_providers_its_tags_allow() {
    let example = start().await;
    let offered = |tags: serde_json::Value, own: Option<serde_json::Value>| {
        let mut body = with(
            PROVIDERS_VALIDATION,
            "/transactionData/paymentData/providerTags",
            Some(tags),
        );
        if let Some(own) = own {
            body = with(&body, "/providers/0/tags", Some(own));
        }
        let addr = example.addr.clone();
        async move {
            let response = post_to(&addr, PROVIDERS_PATH, &body).await;
            assert_eq!(response.status, 200, "{}", response.message());
            response.json()["providers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["id"].as_i64().unwrap())
                .collect::<Vec<_>>()
        }
    };
    // 11 is the one EUR card provider for deposits; the merchant files it as fiat and eu.
    assert_eq!(offered(json!(["EU"]), None).await, [11]);
    assert_eq!(offered(json!(["crypto"]), None).await, Vec::<i64>::new());
    // A candidate's own tags come first.
    assert_eq!(
        offered(json!(["crypto"]), Some(json!(["crypto"]))).await,
        [11]
    );
    assert_eq!(
        offered(json!(["eu"]), Some(json!(["crypto"]))).await,
        Vec::<i64>::new()
    );
}

#[tokio::test]
async fn the_example_denies_amounts_above_its_limit_with_a_message() {
    let example = start().await;
    let addr = example.addr.clone();
    assert_eq!(
        post_to(&addr, VALIDATION_PATH, TRANSACTION_VALIDATION)
            .await
            .status,
        200
    );
    let body = with(
        TRANSACTION_VALIDATION,
        "/paymentData/amount",
        Some(json!(1000.01)),
    );
    let body = with(&body, "/paymentData/nonce", Some(json!("nonce-tv-2")));
    let response = post_to(&addr, VALIDATION_PATH, &body).await;
    assert_eq!(response.status, 403);
    assert_eq!(
        response.message(),
        "amount 1000.01 EUR is above the limit of 1000 per transaction"
    );
}

#[tokio::test]
async fn the_example_books_a_callback_once_however_often_it_is_delivered() {
    let example = start().await;
    for _ in 0..3 {
        assert_eq!(
            post_to(&example.addr, CALLBACK_PATH, CALLBACK).await.status,
            200
        );
    }
    let entry = example.entry("nonce-cb-1").await.expect("booked");
    assert_eq!(
        (
            entry.bookings,
            entry.status,
            entry.amount.to_string().as_str()
        ),
        (1, 4, "0.1")
    );
    assert_eq!(example.balance("client-42", "EUR").await.to_string(), "0.1");
}

#[tokio::test]
async fn the_example_corrects_the_balance_when_a_success_is_reversed() {
    let example = start().await;
    assert_eq!(
        post_to(&example.addr, CALLBACK_PATH, CALLBACK).await.status,
        200
    );
    let reversed = at(CALLBACK, -2, "2099-01-02T03:04:07Z");
    assert_eq!(
        post_to(&example.addr, CALLBACK_PATH, &reversed)
            .await
            .status,
        200
    );
    let entry = example.entry("nonce-cb-1").await.unwrap();
    assert_eq!((entry.bookings, entry.status), (2, -2));
    assert_eq!(example.balance("client-42", "EUR").await, Decimal::ZERO);
    // A late retry of the success changes nothing: it was acknowledged before.
    assert_eq!(
        post_to(&example.addr, CALLBACK_PATH, CALLBACK).await.status,
        200
    );
    assert_eq!(example.entry("nonce-cb-1").await.unwrap().bookings, 2);
}

#[tokio::test]
async fn the_example_acknowledges_callbacks() {
    let example = start().await;
    let addr = example.addr.clone();
    assert_eq!(post_to(&addr, CALLBACK_PATH, CALLBACK).await.status, 200);
}

/// A callback of `CALLBACK`'s shape for `nonce`, `client`, `kind` (1 deposit, 2 withdrawal)
/// and the exact amount text `amount`.
fn callback(nonce: &str, client: &str, kind: i32, amount: &str) -> String {
    let body = with(CALLBACK, "/nonce", Some(json!(nonce)));
    let body = with(&body, "/clientId", Some(json!(client)));
    let body = with(&body, "/transactionType", Some(json!(kind)));
    let replaced = body.replace("\"amount\":0.1", &format!("\"amount\":{amount}"));
    assert_ne!(replaced, body, "the amount was replaced");
    replaced
}

#[tokio::test]
async fn the_example_quarantines_what_would_overflow_a_balance_and_keeps_booking() {
    let example = start().await;
    let max = "79228162514264337593543950335";
    assert_eq!(
        example
            .callback(&callback("whale-1", "whale", 1, max))
            .await,
        200
    );
    assert_eq!(example.balance("whale", "EUR").await, Decimal::MAX);

    // The next deposit cannot be added: acknowledged (never a 503 that would come back
    // forever), kept in quarantine, the balance untouched.
    assert_eq!(
        example
            .callback(&callback("whale-2", "whale", 1, "10"))
            .await,
        200
    );
    assert_eq!(example.balance("whale", "EUR").await, Decimal::MAX);
    assert!(example.entry("whale-2").await.is_none(), "not booked");
    let quarantined = example
        .ledger
        .quarantined("whale-2", 4)
        .await
        .unwrap()
        .expect("quarantined");
    assert_eq!(
        (quarantined.client_id.as_str(), quarantined.amount),
        ("whale", Decimal::from(10))
    );
    assert!(
        quarantined.reason.contains("cannot take"),
        "{quarantined:?}"
    );
    // Its retry is a duplicate: acknowledged once, quarantined once.
    assert_eq!(
        example
            .callback(&callback("whale-2", "whale", 1, "10"))
            .await,
        200
    );

    // Everything else keeps booking: the same client's withdrawal, and other clients.
    assert_eq!(
        example
            .callback(&callback("whale-3", "whale", 2, "5"))
            .await,
        200
    );
    assert_eq!(
        example.balance("whale", "EUR").await,
        Decimal::MAX - Decimal::from(5)
    );
    assert_eq!(
        example
            .callback(&callback("minnow-1", "minnow", 1, "10.50"))
            .await,
        200
    );
    assert_eq!(example.balance("minnow", "EUR").await.to_string(), "10.50");
}

#[tokio::test]
async fn the_example_quarantines_a_success_whose_direction_it_does_not_know() {
    let example = start().await;
    // Type 3 is neither a deposit nor a withdrawal: not credited as one.
    assert_eq!(
        example.callback(&callback("odd-1", "odd", 3, "500")).await,
        200
    );
    assert_eq!(example.balance("odd", "EUR").await, Decimal::ZERO);
    assert!(example.entry("odd-1").await.is_none(), "not booked");
    let quarantined = example
        .ledger
        .quarantined("odd-1", 4)
        .await
        .unwrap()
        .expect("quarantined");
    assert!(
        quarantined.reason.contains("transaction type 3"),
        "{quarantined:?}"
    );
}

/// The balance key joins client and currency with `|`: a client id `a|EUR` paying in USD
/// would share the balance of client `a` in `EUR|USD`. Such a result is held, not booked
/// into another client's balance.
#[tokio::test]
async fn a_client_or_currency_with_the_key_separator_is_quarantined() {
    let example = start().await;
    let body = callback("pipe-1", "a|EUR", 1, "10");
    let body = with(&body, "/currency", Some(json!("USD")));
    assert_eq!(example.callback(&body).await, 200);
    let body = callback("pipe-2", "a", 1, "5");
    let body = with(&body, "/currency", Some(json!("EUR|USD")));
    assert_eq!(example.callback(&body).await, 200);
    assert_eq!(example.balance("a|EUR", "USD").await, Decimal::ZERO);
    assert_eq!(example.balance("a", "EUR|USD").await, Decimal::ZERO);
    for nonce in ["pipe-1", "pipe-2"] {
        assert!(example.entry(nonce).await.is_none(), "{nonce} booked");
        let held = example
            .ledger
            .quarantined(nonce, 4)
            .await
            .unwrap()
            .expect("quarantined");
        assert!(held.reason.contains("`|`"), "{held:?}");
    }
}

#[tokio::test]
async fn a_later_status_naming_another_client_corrects_the_balance_first_booked() {
    let example = start().await;
    assert_eq!(
        example
            .callback(&callback("n-moved", "first", 1, "10"))
            .await,
        200
    );
    assert_eq!(example.balance("first", "EUR").await, Decimal::from(10));
    // The same nonce reversed, the result naming another client: the first client's
    // deposit is undone, and nothing is taken from the other.
    let reversed = at(
        &callback("n-moved", "second", 1, "10"),
        -2,
        "2099-01-02T03:04:07Z",
    );
    assert_eq!(example.callback(&reversed).await, 200);
    assert_eq!(example.balance("first", "EUR").await, Decimal::ZERO);
    assert_eq!(example.balance("second", "EUR").await, Decimal::ZERO);
    let entry = example.entry("n-moved").await.unwrap();
    assert_eq!((entry.client_id.as_str(), entry.bookings), ("second", 2));
}

/// `body` with its status and the time it last changed on the payment system.
fn at(body: &str, status: i32, updated: &str) -> String {
    let body = with(body, "/transactionStatus", Some(json!(status)));
    with(&body, "/updatedUtc", Some(json!(updated)))
}

impl Example {
    async fn quarantined(&self, nonce: &str, status: i32) -> merchant::Quarantined {
        self.ledger
            .quarantined(nonce, status)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{nonce}|{status} was not quarantined"))
    }
}

#[tokio::test]
async fn a_status_that_is_no_final_result_leaves_the_booked_one_alone() {
    let example = start().await;
    let withdrawal = callback("w-1", "payee", 2, "100");
    assert_eq!(
        example
            .callback(&at(&withdrawal, 4, "2099-01-02T03:04:06Z"))
            .await,
        200
    );
    assert_eq!(example.balance("payee", "EUR").await, Decimal::from(-100));
    // Pending (3) and a code the spec does not define (99), later than the success:
    // acknowledged, neither pays the withdrawal back.
    for status in [3, 99] {
        assert_eq!(
            example
                .callback(&at(&withdrawal, status, "2099-01-02T03:05:00Z"))
                .await,
            200
        );
        let kept = example.quarantined("w-1", status).await;
        assert!(kept.reason.contains("no final result"), "{kept:?}");
    }
    assert_eq!(example.balance("payee", "EUR").await, Decimal::from(-100));
    let entry = example.entry("w-1").await.unwrap();
    assert_eq!((entry.status, entry.bookings), (4, 1));
}

/// The aggregator's failure is answered 503 (or lost), its success follows and is booked,
/// then the failure's retry arrives: it is older than the success and must not undo it.
#[tokio::test]
async fn a_late_retry_of_an_older_failure_does_not_undo_the_success_that_followed_it() {
    let example = start().await;
    for (nonce, kind) in [("d-late", 1), ("w-late", 2)] {
        let body = callback(nonce, "late", kind, "40");
        assert_eq!(
            example
                .callback(&at(&body, 4, "2099-01-02T03:04:06Z"))
                .await,
            200
        );
        assert_eq!(
            example
                .callback(&at(&body, -3, "2099-01-02T03:04:01Z"))
                .await,
            200
        );
        let kept = example.quarantined(nonce, -3).await;
        assert!(kept.reason.contains("older"), "{kept:?}");
        let entry = example.entry(nonce).await.unwrap();
        assert_eq!((entry.status, entry.bookings), (4, 1), "{nonce}");
    }
    // The deposit's credit and the withdrawal's debit both stand.
    assert_eq!(example.balance("late", "EUR").await, Decimal::ZERO);
    assert_eq!(
        example.entry("d-late").await.unwrap().balance_effect,
        Decimal::from(40)
    );
    assert_eq!(
        example.entry("w-late").await.unwrap().balance_effect,
        Decimal::from(-40)
    );
}

/// A success whose `updatedUtc` is a sender's unset date (year 1) is booked without a time:
/// the failure that preceded it, retried late with its real time, is not taken for newer
/// and does not take the deposit back (it was: year 1 is older than anything).
#[tokio::test]
async fn a_success_with_an_unset_date_is_not_undone_by_a_late_failure() {
    let example = start().await;
    let body = callback("d-unset", "unset", 1, "40");
    assert_eq!(
        example.callback(&at(&body, 4, "0001-01-01T00:00:00")).await,
        200
    );
    assert_eq!(
        example
            .callback(&at(&body, -4, "2099-01-02T03:04:01Z"))
            .await,
        200
    );
    let kept = example.quarantined("d-unset", -4).await;
    assert!(kept.reason.contains("not known to be newer"), "{kept:?}");
    assert_eq!(example.balance("unset", "EUR").await, Decimal::from(40));
    let entry = example.entry("d-unset").await.unwrap();
    assert_eq!((entry.status, entry.bookings), (4, 1));
}

#[tokio::test]
async fn a_later_failure_takes_back_a_deposit_but_pays_back_a_withdrawal_only_on_minus_2() {
    let example = start().await;
    // A deposit's credit is taken back by any later failure: the merchant's safe side.
    let deposit = callback("d-1", "both", 1, "30");
    assert_eq!(
        example
            .callback(&at(&deposit, 4, "2099-01-02T03:04:06Z"))
            .await,
        200
    );
    assert_eq!(
        example
            .callback(&at(&deposit, -3, "2099-01-02T03:04:07Z"))
            .await,
        200
    );
    assert_eq!(example.balance("both", "EUR").await, Decimal::ZERO);
    assert_eq!(example.entry("d-1").await.unwrap().status, -3);

    // A withdrawal said to be paid out is not paid back on a generic failure...
    let withdrawal = callback("w-1", "both", 2, "25");
    assert_eq!(
        example
            .callback(&at(&withdrawal, 4, "2099-01-02T03:04:06Z"))
            .await,
        200
    );
    assert_eq!(example.balance("both", "EUR").await, Decimal::from(-25));
    assert_eq!(
        example
            .callback(&at(&withdrawal, -3, "2099-01-02T03:04:07Z"))
            .await,
        200
    );
    let kept = example.quarantined("w-1", -3).await;
    assert!(kept.reason.contains("paid out"), "{kept:?}");
    assert_eq!(example.balance("both", "EUR").await, Decimal::from(-25));
    // ...but when the money has to be returned (-2), it is.
    assert_eq!(
        example
            .callback(&at(&withdrawal, -2, "2099-01-02T03:04:08Z"))
            .await,
        200
    );
    assert_eq!(example.balance("both", "EUR").await, Decimal::ZERO);
    let entry = example.entry("w-1").await.unwrap();
    assert_eq!((entry.status, entry.bookings), (-2, 2));
}

#[tokio::test]
async fn a_sum_a_decimal_would_round_is_quarantined_not_booked_rounded() {
    let example = start().await;
    assert_eq!(
        example
            .callback(&callback("fine-1", "fine", 1, "100000000000000000000"))
            .await,
        200
    );
    // 10^20 + 10^-27 needs 48 digits; a Decimal keeps 28, and would drop the fraction.
    let tiny = "0.000000000000000000000000001";
    assert_eq!(
        example.callback(&callback("fine-2", "fine", 1, tiny)).await,
        200
    );
    let kept = example.quarantined("fine-2", 4).await;
    assert!(kept.reason.contains("exactly"), "{kept:?}");
    assert!(example.entry("fine-2").await.is_none());
    let books = example.ledger.books().await.unwrap();
    assert!(books.balanced(), "{books:?}");
    assert_eq!(
        example.balance("fine", "EUR").await,
        Decimal::from(100_000_000_000_000_000_000_u128)
    );
}

/// A failure after a booked success, when which came last is not known: the same
/// `updatedUtc`, or none. A late retry of the failure that came before the success would
/// look the same, so neither undoes the success.
#[tokio::test]
async fn a_failure_not_known_to_be_newer_than_the_booked_success_leaves_it() {
    let example = start().await;
    let deposit = callback("d-same", "same", 1, "30");
    let booked_at = "2099-01-02T03:04:06Z";
    assert_eq!(example.callback(&at(&deposit, 4, booked_at)).await, 200);
    let same_time = at(&deposit, -3, booked_at);
    let no_time = with(&at(&deposit, -2, booked_at), "/updatedUtc", None);
    for (status, body) in [(-3, same_time), (-2, no_time)] {
        assert_eq!(example.callback(&body).await, 200);
        let kept = example.quarantined("d-same", status).await;
        assert!(kept.reason.contains("not known to be newer"), "{kept:?}");
    }
    assert_eq!(example.balance("same", "EUR").await, Decimal::from(30));
    assert_eq!(example.entry("d-same").await.unwrap().status, 4);
}

/// A success after a booked failure, when which came last is not known: a late retry of
/// the success that came before the failure (money returned, a cancellation) would look the
/// same, and crediting it would pay the client for a payment that did not stand. With a
/// newer `updatedUtc`, the success replaces the failure.
#[tokio::test]
async fn a_success_not_known_to_be_newer_than_the_booked_failure_leaves_it() {
    let example = start().await;
    let deposit = callback("d-back", "back", 1, "30");
    let booked_at = "2099-01-02T03:04:06Z";
    assert_eq!(example.callback(&at(&deposit, -1, booked_at)).await, 200);
    let no_time = with(&at(&deposit, 4, booked_at), "/updatedUtc", None);
    assert_eq!(example.callback(&no_time).await, 200);
    let kept = example.quarantined("d-back", 4).await;
    assert!(kept.reason.contains("not known to be newer"), "{kept:?}");
    assert_eq!(example.balance("back", "EUR").await, Decimal::ZERO);
    assert_eq!(example.entry("d-back").await.unwrap().status, -1);

    let later = callback("d-later", "later", 1, "30");
    assert_eq!(example.callback(&at(&later, -3, booked_at)).await, 200);
    let newer = at(&later, 4, "2099-01-02T03:04:07Z");
    assert_eq!(example.callback(&newer).await, 200);
    assert_eq!(example.balance("later", "EUR").await, Decimal::from(30));
    assert_eq!(example.entry("d-later").await.unwrap().status, 4);
}

/// A failure without `updatedUtc` replaces the failure booked before it (no money moves),
/// and keeps that one's time: the success that follows, newer than it, is booked. (The
/// booked time was erased, and the success was quarantined as not known to be newer.)
#[tokio::test]
async fn a_result_without_a_time_keeps_the_time_booked_before() {
    let example = start().await;
    let deposit = callback("d-untimed", "untimed", 1, "30");
    assert_eq!(
        example
            .callback(&at(&deposit, -3, "2099-01-02T03:04:06Z"))
            .await,
        200
    );
    let untimed = with(
        &at(&deposit, -1, "2099-01-02T03:04:06Z"),
        "/updatedUtc",
        None,
    );
    assert_eq!(example.callback(&untimed).await, 200);
    let entry = example.entry("d-untimed").await.unwrap();
    assert_eq!((entry.status, entry.bookings), (-1, 2));
    assert_eq!(
        example
            .callback(&at(&deposit, 4, "2099-01-02T03:04:07Z"))
            .await,
        200
    );
    assert_eq!(example.entry("d-untimed").await.unwrap().status, 4);
    assert_eq!(example.balance("untimed", "EUR").await, Decimal::from(30));
}

/// A balance back at zero keeps the scale of what was booked ("0.0"); a sum with it is
/// exact whatever the other amount's decimals.
#[tokio::test]
async fn a_balance_back_at_zero_takes_any_amount() {
    let example = start().await;
    let first = callback("z-1", "zero", 1, "12.50");
    assert_eq!(
        example
            .callback(&at(&first, 4, "2099-01-02T03:04:06Z"))
            .await,
        200
    );
    assert_eq!(
        example
            .callback(&at(&first, -3, "2099-01-02T03:04:07Z"))
            .await,
        200
    );
    let zero = example.balance("zero", "EUR").await;
    assert!(zero.is_zero() && zero.scale() > 0, "{zero}");
    assert_eq!(
        example.callback(&callback("z-2", "zero", 1, "5")).await,
        200
    );
    assert_eq!(example.balance("zero", "EUR").await, Decimal::from(5));
    assert!(
        example.entry("z-2").await.is_some(),
        "booked, not quarantined"
    );
}

/// A transaction validation of `nonce`: `amount` EUR, a deposit of client-42 through
/// provider 11.
fn validation_of(nonce: &str, amount: &str) -> String {
    let body = with(
        TRANSACTION_VALIDATION,
        "/paymentData/nonce",
        Some(json!(nonce)),
    );
    with(
        &body,
        "/paymentData/amount",
        Some(serde_json::from_str(amount).unwrap()),
    )
}

#[tokio::test]
async fn a_success_unlike_its_validation_is_held_not_credited() {
    let example = start().await;
    let validated = |nonce: &str| (nonce.to_owned(), "250.00");
    // Each a deposit of 250.00 EUR by client-42 through provider 11, allowed.
    for nonce in [
        "v-same",
        "v-amount",
        "v-client",
        "v-currency",
        "v-type",
        "v-provider",
        "v-failed",
    ] {
        let (nonce, amount) = validated(nonce);
        let answer = post_to(
            &example.addr,
            VALIDATION_PATH,
            &validation_of(&nonce, amount),
        )
        .await;
        assert_eq!(answer.status, 200, "{nonce}: {}", answer.message());
    }
    let denied = post_to(
        &example.addr,
        VALIDATION_PATH,
        &validation_of("v-denied", "1000.01"),
    )
    .await;
    assert_eq!(denied.status, 403);

    let success = |nonce: &str, amount: &str| callback(nonce, "client-42", 1, amount);
    let booked_as_validated = [
        // The same payment: its amount in another scale, its currency in lower case.
        with(&success("v-same", "250"), "/currency", Some(json!("eur"))),
        // Another provider moved the same money.
        with(
            &success("v-provider", "250.00"),
            "/providerId",
            Some(json!(12)),
        ),
        // No validation of it is recorded: the callback is all there is to go by.
        success("never-validated", "40.00"),
        // A failure moves no money: booked as such, whatever it says.
        with(
            &success("v-failed", "9999"),
            "/transactionStatus",
            Some(json!(-1)),
        ),
    ];
    for body in &booked_as_validated {
        assert_eq!(example.callback(body).await, 200, "{body}");
    }
    let held = [
        (
            success("v-amount", "2500.00"),
            "v-amount",
            "amount 2500.00, validated 250.00",
        ),
        (
            callback("v-client", "client-7", 1, "250.00"),
            "v-client",
            "client client-7, validated client-42",
        ),
        (
            with(
                &success("v-currency", "250.00"),
                "/currency",
                Some(json!("USD")),
            ),
            "v-currency",
            "currency USD, validated EUR",
        ),
        (
            callback("v-type", "client-42", 2, "250.00"),
            "v-type",
            "a withdrawal, validated a deposit",
        ),
        (
            success("v-denied", "1000.01"),
            "v-denied",
            "a success of a payment the merchant denied at its validation \
             (amount 1000.01 EUR is above the limit of 1000 per transaction)",
        ),
    ];
    for (body, nonce, reason) in &held {
        // Acknowledged: the aggregator stops retrying; kept for a person.
        assert_eq!(example.callback(body).await, 200, "{nonce}");
        assert_eq!(example.entry(nonce).await, None, "{nonce} not booked");
        let quarantined = example.ledger.quarantined(nonce, 4).await.unwrap();
        let quarantined = quarantined.unwrap_or_else(|| panic!("{nonce} held"));
        assert!(
            quarantined.reason.ends_with(reason),
            "{nonce}: {}",
            quarantined.reason
        );
    }
    for nonce in ["v-same", "v-provider", "never-validated", "v-failed"] {
        assert!(example.entry(nonce).await.is_some(), "{nonce} booked");
    }
    // `eur` and `EUR` are one balance: 250 + 250 + 40, the failure moving nothing.
    assert_eq!(
        example.balance("client-42", "EUR").await,
        Decimal::from(540)
    );
    assert_eq!(
        example.balance("client-42", "eur").await,
        Decimal::from(540)
    );
    let books = example.ledger.books().await.unwrap();
    assert!(books.balanced(), "{books:?}");
    assert_eq!(books.balances.len(), 1, "{books:?}");
}
