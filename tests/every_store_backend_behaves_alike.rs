//! One suite of behaviour that every store backend passes unchanged: sled (the embedded
//! default) and PostgreSQL (the shared store). Each behaviour is a function over a
//! [`Backend`]; the `behaviour!` macro runs it once per backend.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::model::Nonce;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use payhook::model::{TransactionStatus, TransactionValidationRequest};
use payhook::postponed::{
    Decision, Delivery, PostponedState, PostponedValidation, Repeat, Resolution, ValidationResult,
};
use payhook::store::{
    Booking, CallbackBegin, CallbackFailure, Claim, ConfiguredStore, Effects, Fingerprint,
    HeldCallback, OutboxSummary, RecordedDecision, Store, StoreConfig, StoreError,
    ValidatedDecision, ValidationBegin,
};
use support::postgres::TestDb;

const STALE: Duration = Duration::from_secs(600);
const RETENTION: Duration = Duration::from_secs(3600);
const TREES: &[&str] = &["ledger"];

/// A store under test and what keeps it alive.
struct Backend {
    store: ConfiguredStore,
    shared: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
    db: Option<TestDb>,
}

impl Backend {
    async fn sled() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            path: dir.path().join("store"),
            retention: RETENTION,
            ..StoreConfig::default()
        };
        let store = ConfiguredStore::open(&config, TREES).await.unwrap();
        Self {
            shared: store.shared(),
            store,
            _dir: Some(dir),
            db: None,
        }
    }

    async fn postgres(test: &str) -> Option<Self> {
        let db = support::postgres::database(test).await?;
        let store = ConfiguredStore::open(&db.store_config(RETENTION), TREES)
            .await
            .unwrap();
        Some(Self {
            shared: store.shared(),
            store,
            _dir: None,
            db: Some(db),
        })
    }

    /// The configuration of this store, with `retention`.
    fn config_with(&self, retention: Duration) -> StoreConfig {
        match (&self._dir, &self.db) {
            (Some(dir), _) => StoreConfig {
                path: dir.path().join("store"),
                retention,
                ..StoreConfig::default()
            },
            (None, Some(db)) => db.store_config(retention),
            (None, None) => unreachable!("a backend is sled or PostgreSQL"),
        }
    }

    /// The same store closed, `meanwhile` run (sled lets one holder open it), and opened
    /// again with `retention`.
    async fn reopened(
        self,
        retention: Duration,
        meanwhile: impl std::future::Future<Output = ()>,
    ) -> Self {
        let config = self.config_with(retention);
        let Self {
            store,
            shared,
            _dir,
            db,
        } = self;
        drop(shared);
        drop(store);
        meanwhile.await;
        let store = ConfiguredStore::open(&config, TREES).await.unwrap();
        Self {
            shared: store.shared(),
            store,
            _dir,
            db,
        }
    }

    /// The same store, closed and opened again with `retention`.
    async fn opened_again_with(self, retention: Duration) -> Self {
        self.reopened(retention, async {}).await
    }

    async fn finish(self) {
        let db = self.db.clone();
        drop(self);
        if let Some(db) = db {
            db.drop_schema().await;
        }
    }

    async fn claim(&self, nonce: &str, status: TransactionStatus) -> (Claim, u32, Option<i32>) {
        match self
            .shared
            .begin_callback(&Nonce::from(nonce), status, STALE)
            .await
            .unwrap()
        {
            CallbackBegin::Claimed {
                claim,
                attempt,
                previous_status,
            } => (claim, attempt, previous_status.map(|s| s.code())),
            other => panic!("{nonce} not claimed: {other:?}"),
        }
    }

    async fn acknowledge(&self, nonce: &str, status: TransactionStatus, effects: Effects) {
        let (claim, ..) = self.claim(nonce, status).await;
        self.shared
            .finish_callback(&Nonce::from(nonce), claim, status, effects)
            .await
            .unwrap();
    }

    /// Effects adding `amount` to the balance of `client` (a read-modify-write).
    fn add(&self, client: &str, amount: i64) -> Effects {
        let ledger = self.store.tree("ledger").unwrap();
        let effects = Effects::default();
        let key = client.as_bytes().to_vec();
        effects.write(move |tx| {
            let balance = tx
                .get(&ledger, &key)?
                .map_or(0, |v| i64::from_be_bytes(v.try_into().unwrap_or_default()));
            tx.insert(&ledger, &key, &(balance + amount).to_be_bytes())
        });
        effects
    }

    async fn balance(&self, client: &str) -> i64 {
        let ledger = self.store.tree("ledger").unwrap();
        self.store
            .get(&ledger, client.as_bytes())
            .await
            .unwrap()
            .map_or(0, |v| i64::from_be_bytes(v.try_into().unwrap()))
    }
}

macro_rules! behaviour {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sled() {
                let backend = super::Backend::sled().await;
                super::$name(&backend).await;
                backend.finish().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(backend) = super::Backend::postgres(stringify!($name)).await else {
                    return;
                };
                super::$name(&backend).await;
                backend.finish().await;
            }
        }
    };
}

behaviour!(the_first_delivery_claims_and_a_repeat_is_a_duplicate);
async fn the_first_delivery_claims_and_a_repeat_is_a_duplicate(b: &Backend) {
    let (claim, attempt, previous) = b.claim("n-1", TransactionStatus::Success).await;
    assert_eq!((attempt, previous), (1, None));
    assert!(
        !b.shared
            .callback_acknowledged(&Nonce::from("n-1"), TransactionStatus::Success)
            .await
            .unwrap(),
        "claimed is not acknowledged"
    );
    b.shared
        .finish_callback(
            &Nonce::from("n-1"),
            claim,
            TransactionStatus::Success,
            b.add("c-1", 5),
        )
        .await
        .unwrap();
    assert!(
        b.shared
            .callback_acknowledged(&Nonce::from("n-1"), TransactionStatus::Success)
            .await
            .unwrap()
    );
    for _ in 0..3 {
        assert_eq!(
            b.shared
                .begin_callback(&Nonce::from("n-1"), TransactionStatus::Success, STALE)
                .await
                .unwrap(),
            CallbackBegin::Duplicate
        );
    }
    assert_eq!(b.balance("c-1").await, 5, "the effects were applied once");
}

behaviour!(nonces_are_told_apart_byte_for_byte_not_by_their_unicode_form);
/// The merchant issued its nonces: two spellings of one text in Unicode (composed and
/// decomposed) are two nonces, each booked once, neither a duplicate of the other.
async fn nonces_are_told_apart_byte_for_byte_not_by_their_unicode_form(b: &Backend) {
    let (composed, decomposed) = ("n-caf\u{e9}", "n-cafe\u{301}");
    b.acknowledge(composed, TransactionStatus::Success, b.add("c-1", 5))
        .await;
    let (_, attempt, previous) = b.claim(decomposed, TransactionStatus::Success).await;
    assert_eq!((attempt, previous), (1, None), "a nonce of its own");
    for nonce in [composed, decomposed] {
        assert_eq!(
            b.shared
                .callback_acknowledged(&Nonce::from(nonce), TransactionStatus::Success)
                .await
                .unwrap(),
            nonce == composed,
            "{nonce:?}"
        );
    }
}

behaviour!(a_new_status_runs_again_and_is_told_the_previous_one);
async fn a_new_status_runs_again_and_is_told_the_previous_one(b: &Backend) {
    b.acknowledge("n-1", TransactionStatus::Success, Effects::default())
        .await;
    let (claim, attempt, previous) = b.claim("n-1", TransactionStatus::Cancelled).await;
    assert_eq!(attempt, 2);
    assert_eq!(previous, Some(TransactionStatus::Success.code()));
    b.shared
        .finish_callback(
            &Nonce::from("n-1"),
            claim,
            TransactionStatus::Cancelled,
            Effects::default(),
        )
        .await
        .unwrap();
    for status in [TransactionStatus::Success, TransactionStatus::Cancelled] {
        assert_eq!(
            b.shared
                .begin_callback(&Nonce::from("n-1"), status, STALE)
                .await
                .unwrap(),
            CallbackBegin::Duplicate
        );
    }
    // A third status is told the last one acknowledged — whatever the handler made of it
    // (the example merchant may have quarantined it), not the one its books hold.
    let (claim, attempt, previous) = b.claim("n-1", TransactionStatus::PaymentSystemError).await;
    assert_eq!(attempt, 3);
    assert_eq!(previous, Some(TransactionStatus::Cancelled.code()));
    b.shared
        .release_callback(&Nonce::from("n-1"), claim)
        .await
        .unwrap();
}

behaviour!(concurrent_copies_of_a_nonce_claim_it_once);
async fn concurrent_copies_of_a_nonce_claim_it_once(b: &Backend) {
    let nonce = Nonce::from("n-1");
    let begins = futures_util::future::join_all((0..16).map(|_| {
        b.shared
            .begin_callback(&nonce, TransactionStatus::Success, STALE)
    }))
    .await;
    let claimed = begins
        .iter()
        .filter(|b| matches!(b, Ok(CallbackBegin::Claimed { .. })))
        .count();
    let busy = begins
        .iter()
        .filter(|b| matches!(b, Ok(CallbackBegin::Busy)))
        .count();
    assert_eq!((claimed, busy), (1, 15), "{begins:?}");
}

behaviour!(a_released_claim_is_claimed_again_with_the_attempt_counted);
async fn a_released_claim_is_claimed_again_with_the_attempt_counted(b: &Backend) {
    let (claim, attempt, _) = b.claim("n-1", TransactionStatus::Success).await;
    assert_eq!(attempt, 1);
    b.shared
        .release_callback(&Nonce::from("n-1"), claim)
        .await
        .unwrap();
    let (_, attempt, _) = b.claim("n-1", TransactionStatus::Success).await;
    assert_eq!(attempt, 2);
}

behaviour!(a_claim_is_taken_over_when_stale_and_never_otherwise);
async fn a_claim_is_taken_over_when_stale_and_never_otherwise(b: &Backend) {
    let (first, ..) = b.claim("n-1", TransactionStatus::Success).await;
    assert_eq!(
        b.shared
            .begin_callback(&Nonce::from("n-1"), TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Busy,
        "a live claim is never taken over"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let CallbackBegin::Claimed { claim: second, .. } = b
        .shared
        .begin_callback(
            &Nonce::from("n-1"),
            TransactionStatus::Success,
            Duration::from_millis(10),
        )
        .await
        .unwrap()
    else {
        panic!("a stale claim is taken over");
    };
    // The first delivery comes back late: its claim is gone, and it writes nothing.
    let late = b
        .shared
        .finish_callback(
            &Nonce::from("n-1"),
            first,
            TransactionStatus::Success,
            b.add("c-1", 7),
        )
        .await;
    assert!(matches!(late, Err(StoreError::ClaimLost(_))), "{late:?}");
    b.shared
        .finish_callback(
            &Nonce::from("n-1"),
            second,
            TransactionStatus::Success,
            b.add("c-1", 7),
        )
        .await
        .unwrap();
    assert_eq!(b.balance("c-1").await, 7);
}

behaviour!(effects_that_abort_write_nothing_and_acknowledge_nothing);
async fn effects_that_abort_write_nothing_and_acknowledge_nothing(b: &Backend) {
    let (claim, ..) = b.claim("n-1", TransactionStatus::Success).await;
    let effects = b.add("c-1", 3);
    effects.write(|_| Err(StoreError::abort("insufficient funds")));
    let outcome = b
        .shared
        .finish_callback(
            &Nonce::from("n-1"),
            claim,
            TransactionStatus::Success,
            effects,
        )
        .await;
    assert!(
        matches!(outcome, Err(StoreError::Aborted { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        b.balance("c-1").await,
        0,
        "nothing of the effects is written"
    );
    assert!(
        !b.shared
            .callback_acknowledged(&Nonce::from("n-1"), TransactionStatus::Success)
            .await
            .unwrap()
    );
    // The claim ended with the failure: the retry claims it.
    let (_, attempt, _) = b.claim("n-1", TransactionStatus::Success).await;
    assert_eq!(attempt, 2);
}

behaviour!(a_result_its_effects_hold_is_acknowledged_with_what_they_wrote);
async fn a_result_its_effects_hold_is_acknowledged_with_what_they_wrote(b: &Backend) {
    let ledger = b.store.tree("ledger").unwrap();
    let effects = b.add("c-1", 3);
    effects.book(move |tx| {
        tx.insert(&ledger, b"aside|n-1", b"a currency not kept")?;
        Ok(Booking::held("a currency not kept"))
    });
    b.acknowledge("n-1", TransactionStatus::Success, effects.clone())
        .await;
    assert_eq!(effects.held().as_deref(), Some("a currency not kept"));
    assert_eq!(b.balance("c-1").await, 3, "what the effects wrote is kept");
    let aside = b.store.tree("ledger").unwrap();
    assert_eq!(
        b.store.get(&aside, b"aside|n-1").await.unwrap().as_deref(),
        Some(&b"a currency not kept"[..])
    );
    assert!(
        b.shared
            .callback_acknowledged(&Nonce::from("n-1"), TransactionStatus::Success)
            .await
            .unwrap()
    );
    let booked = b.add("c-1", 4);
    booked.book(|_| Ok(Booking::Booked));
    b.acknowledge("n-2", TransactionStatus::Success, booked.clone())
        .await;
    assert_eq!(booked.held(), None);
    assert_eq!(b.balance("c-1").await, 7);
}

/// A held result is kept with the mark, in the same write: listed, counted and found by
/// its (nonce, status) until a person resolves it — across a restart too — while a booked
/// one is never listed. Resolving it, once, keeps it with the note, durably, no longer
/// listed nor counted, and leaves the mark: the aggregator's retries stay duplicates.
async fn a_held_result_is_kept_until_a_person_resolves_it(b: Backend) {
    let hold = |reason: &'static str| {
        let effects = Effects::default();
        effects.book(move |_| Ok(Booking::held(reason)));
        effects
    };
    let (success, cancelled) = (TransactionStatus::Success, TransactionStatus::Cancelled);
    b.acknowledge("n-1", success, hold("a currency not kept"))
        .await;
    let booked = Effects::default();
    booked.book(|_| Ok(Booking::Booked));
    b.acknowledge("n-2", success, booked).await;
    b.acknowledge("n-1", cancelled, hold("a reversal of a held result"))
        .await;
    let listed = |held: &[HeldCallback]| {
        let mut pairs: Vec<(String, i32, String)> = held
            .iter()
            .map(|h| (h.nonce.to_string(), h.status, h.reason.clone()))
            .collect();
        pairs.sort();
        pairs
    };
    let both = vec![
        (
            "n-1".to_owned(),
            cancelled.code(),
            "a reversal of a held result".to_owned(),
        ),
        (
            "n-1".to_owned(),
            success.code(),
            "a currency not kept".to_owned(),
        ),
    ];
    let held = b.shared.held_callbacks(100).await.unwrap();
    assert_eq!(listed(&held), both);
    assert!(
        held.windows(2).all(|w| w[0].held_at >= w[1].held_at),
        "latest first"
    );
    assert_eq!(
        held[0].transaction_reference_id,
        uuid::Uuid::nil().to_string()
    );
    assert_eq!(b.shared.held_count().await.unwrap(), 2);
    assert_eq!(b.shared.held_callbacks(1).await.unwrap().len(), 1);
    let n1 = Nonce::from("n-1");
    let found = b.shared.held_callback(&n1, success).await.unwrap().unwrap();
    assert_eq!(found.reason, "a currency not kept");
    let n2 = Nonce::from("n-2");
    assert_eq!(b.shared.held_callback(&n2, success).await.unwrap(), None);

    let b = b.opened_again_with(RETENTION).await;
    assert_eq!(
        b.shared.held_count().await.unwrap(),
        2,
        "counted again at open"
    );
    assert_eq!(listed(&b.shared.held_callbacks(100).await.unwrap()), both);

    let note = "booked by hand, journal 42";
    let resolved = b
        .shared
        .resolve_held(&n1, success, note, Some("  Alice\n(ops)  "))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resolved.reason, "a currency not kept");
    assert_eq!(resolved.resolution, note);
    assert_eq!(
        resolved.resolved_by.as_deref(),
        Some("Alice\n(ops)"),
        "who, as said"
    );
    let at = resolved.resolved_at.expect("resolved now");
    assert!(at >= resolved.held_at);
    let again = b
        .shared
        .resolve_held(&n1, success, "again", Some("Bob"))
        .await
        .unwrap();
    assert_eq!(again, None, "once");
    assert_eq!(
        b.shared
            .resolve_held(&n2, success, note, None)
            .await
            .unwrap(),
        None
    );
    assert_eq!(b.shared.held_count().await.unwrap(), 1);
    let kept = b.shared.held_callback(&n1, success).await.unwrap().unwrap();
    assert_eq!(kept, resolved, "kept, resolved, as it was said");
    assert_eq!(
        listed(&b.shared.held_callbacks(100).await.unwrap()),
        both[..1]
    );
    assert_eq!(
        b.shared.begin_callback(&n1, success, STALE).await.unwrap(),
        CallbackBegin::Duplicate,
        "resolved is still acknowledged"
    );

    let b = b.opened_again_with(RETENTION).await;
    assert_eq!(b.shared.held_count().await.unwrap(), 1, "resolved durably");
    let kept = b.shared.held_callback(&n1, success).await.unwrap().unwrap();
    assert_eq!(
        (
            kept.resolved_at,
            kept.resolution.as_str(),
            kept.resolved_by.as_deref()
        ),
        (Some(at), note, Some("Alice\n(ops)"))
    );
    // Who is not said (or only blanks): none is kept.
    let unnamed = b
        .shared
        .resolve_held(&n1, cancelled, "reversed by hand", Some("   "))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(unnamed.resolved_by, None);
    let b = b.opened_again_with(RETENTION).await;
    let kept = b
        .shared
        .held_callback(&n1, cancelled)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (kept.resolution.as_str(), kept.resolved_by),
        ("reversed by hand", None)
    );
    assert_eq!(b.shared.held_count().await.unwrap(), 0);
    b.finish().await;
}

mod a_held_result_is_kept_until_a_person_resolves_it {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sled() {
        super::a_held_result_is_kept_until_a_person_resolves_it(super::Backend::sled().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        let Some(backend) = super::Backend::postgres("held_kept").await else {
            return;
        };
        super::a_held_result_is_kept_until_a_person_resolves_it(backend).await;
    }
}

behaviour!(concurrent_read_modify_writes_of_one_balance_lose_nothing);
async fn concurrent_read_modify_writes_of_one_balance_lose_nothing(b: &Backend) {
    let nonces: Vec<String> = (0..40).map(|i| format!("n-{i}")).collect();
    futures_util::future::join_all(nonces.iter().enumerate().map(|(i, nonce)| {
        let amount = i64::try_from(i).unwrap() + 1;
        b.acknowledge(nonce, TransactionStatus::Success, b.add("c-1", amount))
    }))
    .await;
    assert_eq!(b.balance("c-1").await, (1..=40).sum::<i64>());
}

fn validation(nonce: &str, validation_id: i64, amount: &str) -> TransactionValidationRequest {
    serde_json::from_value(serde_json::json!({
        "merchantData": {"merchantHash": "h", "clientId": "client-1"},
        "paymentData": {"nonce": nonce, "amount": amount, "currency": "EUR", "providerId": 1},
        "validationId": validation_id,
        "cashIn": true
    }))
    .unwrap()
}

behaviour!(a_validation_nonce_reused_for_another_payment_is_refused);
async fn a_validation_nonce_reused_for_another_payment_is_refused(b: &Backend) {
    let request = validation("v-1", 1, "10.50");
    let fingerprint = Fingerprint::of(&request);
    let ValidationBegin::Claimed { claim } = b
        .shared
        .begin_validation(&Nonce::from("v-1"), &fingerprint, STALE)
        .await
        .unwrap()
    else {
        panic!("not claimed");
    };
    assert_eq!(
        b.shared
            .begin_validation(&Nonce::from("v-1"), &fingerprint, STALE)
            .await
            .unwrap(),
        ValidationBegin::Busy
    );
    let deny = RecordedDecision::Deny {
        message: "limit".into(),
    };
    b.shared
        .finish_validation(&Nonce::from("v-1"), claim, &fingerprint, &deny, None)
        .await
        .unwrap();
    // The same payment (10.5 is 10.50) is answered from the record.
    let same = Fingerprint::of(&validation("v-1", 1, "10.5"));
    assert_eq!(
        b.shared
            .begin_validation(&Nonce::from("v-1"), &same, STALE)
            .await
            .unwrap(),
        ValidationBegin::Recorded(deny)
    );
    let other = Fingerprint::of(&validation("v-1", 1, "99"));
    assert_eq!(
        b.shared
            .begin_validation(&Nonce::from("v-1"), &other, STALE)
            .await
            .unwrap(),
        ValidationBegin::Mismatch
    );
}

/// Answers `request` with `decision` (not postponed).
async fn answer(b: &Backend, request: &TransactionValidationRequest, decision: &RecordedDecision) {
    answer_with(b, request, decision, None).await;
}

/// Claims `request`'s nonce for its validation, which it must win.
async fn claim_validation(b: &Backend, request: &TransactionValidationRequest) -> Claim {
    let ValidationBegin::Claimed { claim } = b
        .shared
        .begin_validation(request.nonce(), &Fingerprint::of(request), STALE)
        .await
        .unwrap()
    else {
        panic!("not claimed");
    };
    claim
}

/// Answers `request` with `decision`, and `postponed` with it (Awaitable mode).
async fn answer_with(
    b: &Backend,
    request: &TransactionValidationRequest,
    decision: &RecordedDecision,
    postponed: Option<PostponedValidation>,
) {
    let fingerprint = Fingerprint::of(request);
    let claim = claim_validation(b, request).await;
    b.shared
        .finish_validation(request.nonce(), claim, &fingerprint, decision, postponed)
        .await
        .unwrap();
}

behaviour!(a_validation_is_read_back_with_its_payment_and_decision);
/// What a callback handler reads of its nonce's validation: the payment as asked and the
/// decision — a postponed one's as it is taken — and nothing for a nonce never validated.
async fn a_validation_is_read_back_with_its_payment_and_decision(b: &Backend) {
    let read = |nonce: &'static str| {
        let shared = Arc::clone(&b.shared);
        async move { shared.validated_payment(&Nonce::from(nonce)).await.unwrap() }
    };
    assert_eq!(read("never-validated").await, None);

    answer(
        b,
        &validation("v-allowed", 1, "10.50"),
        &RecordedDecision::Allow,
    )
    .await;
    let allowed = read("v-allowed").await.unwrap();
    assert_eq!(allowed.amount, "10.5".parse().unwrap());
    assert_eq!(allowed.currency, "EUR");
    assert_eq!((allowed.provider_id, allowed.cash_in), (1, true));
    assert_eq!(allowed.client_id(), Some("client-1"));
    assert!(allowed.client_is("client-1") && !allowed.client_is("client-2"));
    assert_eq!(allowed.decision, ValidatedDecision::Allowed);
    assert_eq!(allowed.allowed(), Some(true));

    let deny = RecordedDecision::Deny {
        message: "limit".into(),
    };
    answer(b, &validation("v-denied", 2, "99"), &deny).await;
    let denied = read("v-denied").await.unwrap();
    assert_eq!(
        denied.decision,
        ValidatedDecision::Denied {
            message: "limit".into()
        }
    );
    assert_eq!(denied.allowed(), Some(false));

    // A client id longer than a record spells out is kept by its digest: still compared.
    let long_client = "c".repeat(300);
    let mut long = validation("v-long", 3, "5");
    long.merchant_data.client_id.clone_from(&long_client);
    answer(b, &long, &RecordedDecision::Allow).await;
    let kept = read("v-long").await.unwrap();
    assert_eq!(kept.client_id(), None);
    assert!(kept.client_is(&long_client) && !kept.client_is(&"d".repeat(300)));

    // Postponed: undecided, then as decided — for the original and its repeat alike.
    postpone(b, 70).await;
    let pending = read("p-70").await.unwrap();
    assert_eq!(pending.decision, ValidatedDecision::Awaiting);
    assert_eq!(
        repeated(b, "p-70", 71).await,
        Repeat::Recorded {
            of: 70.into(),
            decided: false
        }
    );
    b.shared
        .resolve(71.into(), &Decision::deny("blocked"), None, Utc::now())
        .await
        .unwrap();
    assert_eq!(
        read("p-70").await.unwrap().decision,
        ValidatedDecision::Reviewed { allowed: false }
    );
    decide(b, 72).await;
    assert_eq!(
        read("p-72").await.unwrap().decision,
        ValidatedDecision::Reviewed { allowed: true }
    );
}

behaviour!(a_delivery_reads_its_validation_through_its_claim);
/// What a callback's handler reads of its validation while its delivery holds the nonce's
/// claim (`CallbackContext::validated_payment`): what is read outside the claim, a postponed
/// validation's decision too; then the delivery books. On PostgreSQL the claim's own
/// connection reads it, in the claim's transaction: it is answered with every other
/// connection of the pool taken (here by the test), where a read of its own would wait for
/// one — and a pool whose last connections serve validations and the outbox would make
/// every callback in flight wait on them.
async fn a_delivery_reads_its_validation_through_its_claim(b: &Backend) {
    answer(b, &validation("v-1", 1, "10.50"), &RecordedDecision::Allow).await;
    decide(b, 70).await;
    // Every connection of a PostgreSQL pool taken, once the claims hold theirs.
    let pool = match &b.store {
        ConfiguredStore::Postgres(store) => Some(store.pool().clone()),
        _ => None,
    };
    for nonce in ["v-1", "p-70", "never-validated"] {
        let outside = b
            .shared
            .validated_payment(&Nonce::from(nonce))
            .await
            .unwrap();
        let (claim, ..) = b.claim(nonce, TransactionStatus::Success).await;
        let mut taken = Vec::new();
        if let Some(pool) = &pool {
            // The claim holds one (no other claim is held, nor kept spare).
            for _ in 1..pool.options().get_max_connections() {
                taken.push(pool.acquire().await.unwrap());
            }
        }
        let read = b
            .shared
            .validated_payment_in_claim(&Nonce::from(nonce), claim)
            .await
            .unwrap();
        assert_eq!(read, outside, "{nonce}");
        drop(taken);
        book(b.shared.as_ref(), &Nonce::from(nonce), claim).await;
        assert!(
            b.shared
                .callback_acknowledged(&Nonce::from(nonce), TransactionStatus::Success)
                .await
                .unwrap(),
            "{nonce}"
        );
    }
    let allowed = b
        .shared
        .validated_payment(&Nonce::from("v-1"))
        .await
        .unwrap();
    assert_eq!(allowed.unwrap().decision, ValidatedDecision::Allowed);
    let reviewed = b
        .shared
        .validated_payment(&Nonce::from("p-70"))
        .await
        .unwrap();
    assert_eq!(
        reviewed.unwrap().decision,
        ValidatedDecision::Reviewed { allowed: true }
    );
}

behaviour!(a_released_claim_reads_no_validation_through_it);
/// A claim released (or finished, or given up as held past its time) reads nothing through
/// it on PostgreSQL, whose claims hold the connection: the delivery is told the claim is
/// lost, as its booking would be.
async fn a_released_claim_reads_no_validation_through_it(b: &Backend) {
    answer(b, &validation("v-2", 2, "1"), &RecordedDecision::Allow).await;
    let (claim, ..) = b.claim("v-2", TransactionStatus::Success).await;
    b.shared
        .release_callback(&Nonce::from("v-2"), claim)
        .await
        .unwrap();
    let read = b
        .shared
        .validated_payment_in_claim(&Nonce::from("v-2"), claim)
        .await;
    match &b.store {
        ConfiguredStore::Postgres(_) => {
            assert!(matches!(read, Err(StoreError::ClaimLost(_))), "{read:?}");
        }
        // sled's claims hold no connection: the read is the store's, claim or not.
        _ => assert!(read.unwrap().is_some()),
    }
}

/// What the store makes of the aggregator asking about `nonce` again under validation
/// `id` (the payment of [`validation`] for 10), now.
async fn repeated(b: &Backend, nonce: &str, id: i64) -> Repeat {
    b.shared
        .repeat(&validation(nonce, id, "10"), Utc::now())
        .await
        .unwrap()
}

/// Postpones validation `id` (Awaitable mode): its record and the validation's decision.
async fn postpone(b: &Backend, id: i64) {
    postpone_request(b, validation(&format!("p-{id}"), id, "10")).await;
}

/// Postpones `request` (Awaitable mode): its record and the validation's decision.
async fn postpone_request(b: &Backend, request: TransactionValidationRequest) {
    postpone_until(b, request, Some(Utc::now() + TimeDelta::hours(1))).await;
}

/// Postpones `request` until `deadline` (none: for ever).
async fn postpone_until(
    b: &Backend,
    request: TransactionValidationRequest,
    deadline: Option<chrono::DateTime<Utc>>,
) {
    let record = PostponedValidation::new(request.clone(), Utc::now(), deadline);
    answer_with(b, &request, &RecordedDecision::Postponed, Some(record)).await;
}

behaviour!(the_first_decision_wins_and_is_queued_for_delivery);
async fn the_first_decision_wins_and_is_queued_for_delivery(b: &Backend) {
    postpone(b, 7).await;
    let pending = b.shared.postponed(7.into()).await.unwrap().unwrap();
    assert_eq!(pending.state(), PostponedState::Pending);
    assert!(
        b.shared
            .outbox_due(Utc::now())
            .await
            .unwrap()
            .now
            .is_empty()
    );
    let later = Utc::now() + TimeDelta::hours(2);
    assert_eq!(
        b.shared.deadlines_due(later).await.unwrap().now.len(),
        1,
        "undecided: its deadline falls due"
    );

    let now = Utc::now();
    let allow = Decision::allow("checked");
    assert_eq!(
        b.shared.resolve(7.into(), &allow, None, now).await.unwrap(),
        Resolution::Recorded
    );
    assert_eq!(
        b.shared.resolve(7.into(), &allow, None, now).await.unwrap(),
        Resolution::AlreadyRecorded
    );
    assert!(matches!(
        b.shared
            .resolve(7.into(), &Decision::deny("changed my mind"), None, now)
            .await
            .unwrap(),
        Resolution::Conflicting { success: true, .. }
    ));
    assert_eq!(
        b.shared.resolve(8.into(), &allow, None, now).await.unwrap(),
        Resolution::Unknown
    );
    assert!(b.shared.deadlines_due(later).await.unwrap().now.is_empty());
    let due = b.shared.outbox_due(Utc::now()).await.unwrap();
    assert_eq!(due.now.len(), 1);
    assert_eq!(b.shared.outbox_len().await.unwrap(), 1);
    deliver(b, 7).await;
    assert!(
        b.shared
            .outbox_due(Utc::now())
            .await
            .unwrap()
            .now
            .is_empty()
    );
    assert_eq!(b.shared.outbox_len().await.unwrap(), 0);
    assert_eq!(
        b.shared.postponed(7.into()).await.unwrap().unwrap().state(),
        PostponedState::Delivered
    );
}

behaviour!(a_postponed_validation_of_the_longest_nonce_is_kept_and_repeated);
/// A nonce as long as `server.max_identifier_chars` lets one be (4,096 characters, which
/// do not compress) is postponed and found again by a repeat under a new validation id: a
/// shared store indexes no nonce whole (a btree row holds about 2,700 bytes).
async fn a_postponed_validation_of_the_longest_nonce_is_kept_and_repeated(b: &Backend) {
    // A different character at every place: nothing for a compression to find.
    let nonce: String = (0..4096u32)
        .map(|i| char::from_u32(0x4E00 + (i * 7919) % 20_000).unwrap())
        .collect();
    assert!(nonce.len() > 12_000, "{} bytes", nonce.len());
    postpone_request(b, validation(&nonce, 60, "10")).await;
    assert_eq!(
        repeated(b, &nonce, 61).await,
        Repeat::Recorded {
            of: 60.into(),
            decided: false
        }
    );
    let kept = b.shared.postponed(60.into()).await.unwrap().unwrap();
    assert_eq!(kept.request.nonce().as_str(), nonce);
    assert_eq!(kept.repeats, [61.into()]);
}

behaviour!(a_repeat_under_a_new_validation_id_shares_the_decision_and_is_delivered_alone);
/// The aggregator asks again about a postponed nonce under new validation ids: each is
/// recorded once as a repeat of the original, a resolve of any of them decides all, and
/// each result is queued for its own delivery.
async fn a_repeat_under_a_new_validation_id_shares_the_decision_and_is_delivered_alone(
    b: &Backend,
) {
    postpone(b, 40).await;
    let now = Utc::now();
    let repeat = |id| validation("p-40", id, "10");
    assert_eq!(
        b.shared.repeat(&repeat(41), now).await.unwrap(),
        Repeat::Recorded {
            of: 40.into(),
            decided: false
        }
    );
    assert_eq!(
        b.shared.repeat(&repeat(41), now).await.unwrap(),
        Repeat::Known,
        "a retry of the repeat records nothing more"
    );
    assert_eq!(
        b.shared.repeat(&repeat(40), now).await.unwrap(),
        Repeat::Known,
        "a retry of the original records nothing"
    );
    assert!(matches!(
        b.shared.repeat(&repeat(42), now).await.unwrap(),
        Repeat::Recorded { decided: false, .. }
    ));
    let original = b.shared.postponed(40.into()).await.unwrap().unwrap();
    assert_eq!(original.repeats, [41.into(), 42.into()]);
    let first = b.shared.postponed(41.into()).await.unwrap().unwrap();
    assert_eq!(first.repeat_of, Some(40.into()));
    assert_eq!(first.request.validation_id, 41.into());
    assert_eq!(first.deadline, None, "the original's deadline decides it");
    let pending: Vec<i64> = b
        .shared
        .postponed_in(PostponedState::Pending)
        .await
        .unwrap()
        .iter()
        .map(|p| p.validation_id.get())
        .collect();
    assert_eq!(pending, [40, 41, 42]);
    let later = Utc::now() + TimeDelta::hours(2);
    assert_eq!(
        b.shared.deadlines_due(later).await.unwrap().now.len(),
        1,
        "only the original has a deadline"
    );

    // Deciding a repeat decides the original, and the original's other repeats.
    let deny = Decision::deny("documents missing");
    assert_eq!(
        b.shared.resolve(41.into(), &deny, None, now).await.unwrap(),
        Resolution::Recorded
    );
    assert!(matches!(
        b.shared
            .resolve(42.into(), &Decision::allow("too late"), None, now)
            .await
            .unwrap(),
        Resolution::Conflicting { success: false, .. }
    ));
    assert_eq!(
        b.shared.resolve(40.into(), &deny, None, now).await.unwrap(),
        Resolution::AlreadyRecorded
    );
    let due = b.shared.outbox_due(Utc::now()).await.unwrap();
    let results: Vec<(i64, bool, String)> = due
        .now
        .iter()
        .map(|p| {
            let result = p.result.as_ref().unwrap();
            (
                p.validation_id.get(),
                result.success,
                result.description.clone(),
            )
        })
        .collect();
    assert_eq!(
        results,
        [40, 41, 42].map(|id| (id, false, "documents missing".to_owned()))
    );
    assert!(b.shared.deadlines_due(later).await.unwrap().now.is_empty());

    // Each is delivered on its own.
    deliver(b, 41).await;
    let states: Vec<PostponedState> = states_of(b, &[40, 41, 42]).await;
    assert_eq!(
        states,
        [
            PostponedState::Queued,
            PostponedState::Delivered,
            PostponedState::Queued
        ]
    );

    // A repeat after the decision gets it at once, queued for its own delivery.
    assert_eq!(
        b.shared.repeat(&repeat(43), Utc::now()).await.unwrap(),
        Repeat::Recorded {
            of: 40.into(),
            decided: true
        }
    );
    let late = b.shared.postponed(43.into()).await.unwrap().unwrap();
    assert_eq!(late.state(), PostponedState::Queued);
    let result = late.result.unwrap();
    assert_eq!(
        (result.success, result.description.as_str()),
        (false, "documents missing")
    );
}

behaviour!(an_approval_no_postponed_validation_holds_is_recorded_afresh_under_a_new_id);
/// A nonce whose recorded decision no postponed validation holds (decided outside Awaitable
/// mode, or its postponed validation gone with the retention), asked about under a new
/// validation id: an approval, answered 200, which the aggregator waits on in Awaitable
/// mode, is recorded under the id as approved, its result queued, and becomes the
/// validation the nonce's later repeats repeat. A denial (answered 403) and a decision
/// recorded as postponed (refused with 409) record nothing.
async fn an_approval_no_postponed_validation_holds_is_recorded_afresh_under_a_new_id(b: &Backend) {
    answer(b, &validation("v-80", 80, "10"), &RecordedDecision::Allow).await;
    assert_eq!(repeated(b, "v-80", 81).await, Repeat::RecordedAfresh);
    let afresh = b.shared.postponed(81.into()).await.unwrap().unwrap();
    assert_eq!(
        (afresh.state(), afresh.repeat_of, afresh.deadline),
        (PostponedState::Queued, None, None)
    );
    assert_eq!(afresh.request.nonce().as_str(), "v-80");
    let result = afresh.result.unwrap();
    assert_eq!(
        (
            result.success,
            result.description.as_str(),
            result.decided_by
        ),
        (true, "client allowed", None)
    );
    assert_eq!(repeated(b, "v-80", 81).await, Repeat::Known, "a retry");
    assert_eq!(
        repeated(b, "v-80", 82).await,
        Repeat::Recorded {
            of: 81.into(),
            decided: true
        }
    );
    let linked = b.shared.postponed(81.into()).await.unwrap().unwrap();
    assert_eq!(linked.repeats, [82.into()]);
    let due = b.shared.outbox_due(Utc::now()).await.unwrap();
    let mut due: Vec<i64> = due.now.iter().map(|v| v.validation_id.get()).collect();
    due.sort_unstable();
    assert_eq!(due, [81, 82]);

    let deny = RecordedDecision::Deny {
        message: "limit".into(),
    };
    answer(b, &validation("v-90", 90, "10"), &deny).await;
    assert_eq!(repeated(b, "v-90", 91).await, Repeat::Unlinked);
    answer(
        b,
        &validation("v-95", 95, "10"),
        &RecordedDecision::Postponed,
    )
    .await;
    assert_eq!(repeated(b, "v-95", 96).await, Repeat::Unlinked);
    for id in [91, 96] {
        assert!(
            b.shared.postponed(id.into()).await.unwrap().is_none(),
            "{id}"
        );
    }
}

behaviour!(an_ended_session_is_kept_until_its_life_is_over);
/// An operating API session ended by logging out is kept as ended — past the retention
/// when its life is longer — and goes once its life is over; another session is not ended.
async fn an_ended_session_is_kept_until_its_life_is_over(b: &Backend) {
    let until = Utc::now() + TimeDelta::hours(12);
    assert!(!b.shared.session_ended("1700000000.ab12").await.unwrap());
    b.shared
        .end_session("1700000000.ab12", until)
        .await
        .unwrap();
    // Ended twice (two instances), kept once.
    b.shared
        .end_session("1700000000.ab12", until)
        .await
        .unwrap();
    assert!(b.shared.session_ended("1700000000.ab12").await.unwrap());
    assert!(!b.shared.session_ended("1700000000.cd34").await.unwrap());
    b.shared
        .purge_expired(Utc::now() + TimeDelta::hours(2))
        .await
        .unwrap();
    assert!(
        b.shared.session_ended("1700000000.ab12").await.unwrap(),
        "kept past the retention ({RETENTION:?}) while it could be presented"
    );
    b.shared
        .purge_expired(until + TimeDelta::hours(2))
        .await
        .unwrap();
    assert!(!b.shared.session_ended("1700000000.ab12").await.unwrap());
}

behaviour!(a_repeat_handed_over_keeps_its_nonce_past_an_approval_recorded_afresh);
/// An approval in Awaitable mode, its original delivered and gone with the retention while
/// a repeat of it still awaits delivery (sled hands that repeat to the nonce's record),
/// then asked about under another id, recorded afresh and delivered: the nonce's record
/// stays while the first repeat awaits — asked about again, the nonce gets its recorded
/// answer, not the handler — and goes once it is delivered.
async fn a_repeat_handed_over_keeps_its_nonce_past_an_approval_recorded_afresh(b: &Backend) {
    let request = validation("a-60", 60, "10");
    let now = Utc::now();
    let mut approved = PostponedValidation::new(request.clone(), now, None);
    approved.result = Some(ValidationResult {
        success: true,
        description: "client allowed".into(),
        decided: now,
        decided_by: None,
        delivery: Delivery::Queued {
            attempts: 0,
            next_attempt: now,
            last_error: None,
        },
    });
    answer_with(b, &request, &RecordedDecision::Allow, Some(approved)).await;
    assert_eq!(
        repeated(b, "a-60", 61).await,
        Repeat::Recorded {
            of: 60.into(),
            decided: true
        }
    );
    deliver(b, 60).await;
    let later = Utc::now() + TimeDelta::hours(2);
    b.shared.purge_expired(later).await.unwrap();
    assert!(b.shared.postponed(60.into()).await.unwrap().is_none());
    assert_eq!(repeated(b, "a-60", 62).await, Repeat::RecordedAfresh);
    deliver(b, 62).await;
    let asked_again = || async {
        b.shared
            .begin_validation(request.nonce(), &Fingerprint::of(&request), STALE)
            .await
            .unwrap()
    };
    b.shared
        .purge_expired(later + TimeDelta::hours(2))
        .await
        .unwrap();
    let begin = asked_again().await;
    assert!(matches!(begin, ValidationBegin::Recorded(_)), "{begin:?}");
    deliver(b, 61).await;
    b.shared
        .purge_expired(later + TimeDelta::hours(4))
        .await
        .unwrap();
    let begin = asked_again().await;
    assert!(
        matches!(begin, ValidationBegin::Claimed { .. }),
        "{begin:?}"
    );
}

/// Who decided a postponed validation is kept with the decision, by the original and by
/// each of its repeats, durably (across a reopen); the same decision by another leaves the
/// first decider, and a decision nobody named keeps none.
async fn who_decided_is_kept_with_the_decision_and_its_repeats(b: Backend) {
    postpone(&b, 50).await;
    postpone(&b, 60).await;
    let now = Utc::now();
    let repeat = validation("p-50", 51, "10");
    assert!(matches!(
        b.shared.repeat(&repeat, now).await.unwrap(),
        Repeat::Recorded { decided: false, .. }
    ));
    let allow = Decision::allow("documents checked");
    assert_eq!(
        b.shared
            .resolve(51.into(), &allow, Some("alice"), now)
            .await
            .unwrap(),
        Resolution::Recorded
    );
    assert_eq!(
        b.shared
            .resolve(50.into(), &allow, Some("bob"), now)
            .await
            .unwrap(),
        Resolution::AlreadyRecorded
    );
    assert_eq!(
        b.shared
            .resolve(60.into(), &allow, None, now)
            .await
            .unwrap(),
        Resolution::Recorded
    );
    let late = validation("p-50", 52, "10");
    assert!(matches!(
        b.shared.repeat(&late, now).await.unwrap(),
        Repeat::Recorded { decided: true, .. }
    ));
    let b = b.opened_again_with(RETENTION).await;
    let by = |id: i64| {
        let shared = b.shared.clone();
        async move {
            let record = shared.postponed(id.into()).await.unwrap().unwrap();
            record.result.unwrap().decided_by
        }
    };
    for id in [50, 51, 52] {
        assert_eq!(by(id).await.as_deref(), Some("alice"), "validation {id}");
    }
    assert_eq!(by(60).await, None);
    b.finish().await;
}

mod who_decided_is_kept_with_the_decision_and_its_repeats {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sled() {
        super::who_decided_is_kept_with_the_decision_and_its_repeats(super::Backend::sled().await)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        let Some(backend) = super::Backend::postgres("who_decided").await else {
            return;
        };
        super::who_decided_is_kept_with_the_decision_and_its_repeats(backend).await;
    }
}

/// The states of validations `ids`, in order.
async fn states_of(b: &Backend, ids: &[i64]) -> Vec<PostponedState> {
    let mut states = Vec::new();
    for id in ids {
        let record = b.shared.postponed((*id).into()).await.unwrap().unwrap();
        states.push(record.state());
    }
    states
}

behaviour!(a_repeat_of_a_validation_whose_record_holds_u0000_shares_its_decision);
/// A validation whose record holds U+0000 (the aggregator's `providerData`, a decision's
/// description), asked about again under a new id: the repeat is recorded and decided with
/// it, as any other. PostgreSQL cannot read inside a `json` value that holds `\u0000`, and
/// finding the original that way refused every such repeat for ever.
async fn a_repeat_of_a_validation_whose_record_holds_u0000_shares_its_decision(b: &Backend) {
    let request = |id| {
        let mut request = validation("p-nul", id, "10");
        request.provider_data = serde_json::json!({"note\u{0}": ["a\u{0}b"]});
        request
    };
    postpone_request(b, request(80)).await;
    assert_eq!(
        b.shared.repeat(&request(81), Utc::now()).await.unwrap(),
        Repeat::Recorded {
            of: 80.into(),
            decided: false
        }
    );
    let deny = Decision::deny("documents missing: a\u{0}b");
    assert_eq!(
        b.shared
            .resolve(81.into(), &deny, None, Utc::now())
            .await
            .unwrap(),
        Resolution::Recorded
    );
    // Decided, and its description holding U+0000 too: a later repeat gets the decision.
    assert_eq!(
        b.shared.repeat(&request(82), Utc::now()).await.unwrap(),
        Repeat::Recorded {
            of: 80.into(),
            decided: true
        }
    );
    for id in [80, 81, 82] {
        let record = b.shared.postponed(id.into()).await.unwrap().unwrap();
        assert_eq!(record.state(), PostponedState::Queued, "{id}");
        let result = record.result.unwrap();
        assert_eq!(
            (result.success, result.description.as_str()),
            (false, "documents missing: a\u{0}b"),
            "{id}"
        );
    }
}

behaviour!(a_repeat_whose_original_was_purged_keeps_its_own_decision);
/// An original delivered and purged with the retention while a repeat of it still waits for
/// delivery: the repeat keeps the decision it was given, a resolve of it answers from its own
/// record (the same decision unchanged, another a conflict), and it is delivered alone.
async fn a_repeat_whose_original_was_purged_keeps_its_own_decision(b: &Backend) {
    postpone(b, 60).await;
    let allow = Decision::allow("documents checked");
    assert_eq!(
        b.shared
            .resolve(60.into(), &allow, None, Utc::now())
            .await
            .unwrap(),
        Resolution::Recorded
    );
    assert_eq!(
        repeated(b, "p-60", 61).await,
        Repeat::Recorded {
            of: 60.into(),
            decided: true
        }
    );
    deliver(b, 60).await;
    let after_retention = Utc::now() + TimeDelta::hours(2);
    assert!(b.shared.purge_expired(after_retention).await.unwrap() >= 1);
    assert_eq!(
        b.shared.postponed(60.into()).await.unwrap(),
        None,
        "the delivered original is purged"
    );
    assert_eq!(states_of(b, &[61]).await, [PostponedState::Queued]);
    // A retention later, the repeat still waiting for its delivery: the nonce's record is
    // kept all the same, and the nonce asked about again gets the recorded answer, never
    // the handler a second time.
    let request = validation("p-60", 62, "10");
    for retentions in [4, 8] {
        let later = Utc::now() + TimeDelta::hours(retentions);
        b.shared.purge_expired(later).await.unwrap();
        let begin = b
            .shared
            .begin_validation(request.nonce(), &Fingerprint::of(&request), STALE)
            .await
            .unwrap();
        assert!(
            matches!(
                begin,
                ValidationBegin::Recorded(RecordedDecision::Postponed)
            ),
            "{begin:?}"
        );
    }

    assert_eq!(
        b.shared
            .resolve(61.into(), &allow, None, Utc::now())
            .await
            .unwrap(),
        Resolution::AlreadyRecorded
    );
    assert!(matches!(
        b.shared
            .resolve(
                61.into(),
                &Decision::deny("changed my mind"),
                None,
                Utc::now()
            )
            .await
            .unwrap(),
        Resolution::Conflicting { success: true, .. }
    ));
    deliver(b, 61).await;
    let repeat = b.shared.postponed(61.into()).await.unwrap().unwrap();
    assert_eq!(repeat.state(), PostponedState::Delivered);
    assert_eq!(
        repeat.result.map(|r| (r.success, r.description)),
        Some((true, "documents checked".to_owned()))
    );
}

behaviour!(a_validation_id_of_another_nonce_is_not_taken_as_a_repeat);
/// A validation of one nonce asked about under the id of another nonce's validation (the
/// aggregator's ids are its own: one of the two is not the aggregator's) is answered as a
/// taken id (the service refuses it, 403): neither validation is linked to the other or
/// changed, so the other's result is never posted for this nonce, nor this nonce's under
/// the other's id.
async fn a_validation_id_of_another_nonce_is_not_taken_as_a_repeat(b: &Backend) {
    postpone(b, 70).await;
    postpone(b, 71).await;
    let before = [
        b.shared.postponed(70.into()).await.unwrap(),
        b.shared.postponed(71.into()).await.unwrap(),
    ];
    assert_eq!(repeated(b, "p-70", 71).await, Repeat::Taken);
    let after = [
        b.shared.postponed(70.into()).await.unwrap(),
        b.shared.postponed(71.into()).await.unwrap(),
    ];
    assert_eq!(after, before);
    let other = after[1].as_ref().unwrap();
    assert_eq!(
        (other.request.nonce().as_str(), other.repeat_of),
        ("p-71", None)
    );
    // Deciding one leaves the other pending.
    b.shared
        .resolve(70.into(), &Decision::deny("no"), None, Utc::now())
        .await
        .unwrap();
    assert_eq!(
        states_of(b, &[70, 71]).await,
        [PostponedState::Queued, PostponedState::Pending]
    );
}

behaviour!(a_postponed_validation_under_an_id_held_for_another_nonce_writes_nothing);
/// Two validations of two nonces under one id (the aggregator never reuses one: one of them
/// is not the aggregator's) that both passed the service's check before their handlers ran:
/// the second to be written is refused, and nothing of it is written — neither a postponed
/// record nor its nonce's decision, so that the nonce asked again reaches a handler, and
/// the first keeps the id and its delivery.
async fn a_postponed_validation_under_an_id_held_for_another_nonce_writes_nothing(b: &Backend) {
    postpone(b, 80).await;
    let request = validation("other-80", 80, "10");
    let fingerprint = Fingerprint::of(&request);
    let claim = claim_validation(b, &request).await;
    let refused = b
        .shared
        .finish_validation(
            request.nonce(),
            claim,
            &fingerprint,
            &RecordedDecision::Postponed,
            Some(PostponedValidation::new(request.clone(), Utc::now(), None)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(refused, payhook::store::StoreError::ValidationIdTaken(80)),
        "{refused:?}"
    );
    b.shared
        .release_validation(request.nonce(), claim)
        .await
        .unwrap();
    assert!(matches!(
        b.shared
            .begin_validation(request.nonce(), &fingerprint, STALE)
            .await
            .unwrap(),
        ValidationBegin::Claimed { .. }
    ));
    let kept = b.shared.postponed(80.into()).await.unwrap().unwrap();
    assert_eq!(kept.request.nonce().as_str(), "p-80");
    assert_eq!(kept.state(), PostponedState::Pending);
}

behaviour!(a_repeat_without_a_postponed_original_is_not_recorded);
/// A nonce denied outside Awaitable mode has no postponed validation to repeat, nor has a
/// nonce with no record (an approval is recorded afresh, see
/// `an_approval_no_postponed_validation_holds_is_recorded_afresh_under_a_new_id`); and one
/// validation takes a bounded number of repeats.
async fn a_repeat_without_a_postponed_original_is_not_recorded(b: &Backend) {
    let deny = RecordedDecision::Deny {
        message: "limit".into(),
    };
    answer(b, &validation("v-plain", 50, "10"), &deny).await;
    let now = Utc::now();
    assert_eq!(
        b.shared
            .repeat(&validation("v-plain", 51, "10"), now)
            .await
            .unwrap(),
        Repeat::Unlinked
    );
    // Asked about only once its record is read: a record gone since (a sweep) records
    // nothing, and the caller is not answered on it.
    let gone = b
        .shared
        .repeat(&validation("never-seen", 52, "10"), now)
        .await;
    assert!(matches!(&gone, Err(StoreError::Backend { .. })), "{gone:?}");
    assert_eq!(b.shared.postponed_all().await.unwrap().len(), 0);

    postpone(b, 60).await;
    for id in 0..100 {
        assert!(matches!(
            b.shared
                .repeat(&validation("p-60", 1_000 + id, "10"), now)
                .await
                .unwrap(),
            Repeat::Recorded { .. }
        ));
    }
    assert_eq!(
        b.shared
            .repeat(&validation("p-60", 2_000, "10"), now)
            .await
            .unwrap(),
        Repeat::Full,
        "the original's record stays bounded"
    );
    let original = b.shared.postponed(60.into()).await.unwrap().unwrap();
    assert_eq!(original.repeats.len(), 100);
    assert!(b.shared.postponed(2_000.into()).await.unwrap().is_none());
}

behaviour!(the_outbox_summary_counts_what_awaits_delivery_and_its_oldest_decision);
/// What `/metrics` reads on every scrape: how many results await delivery, and when the
/// oldest of them was decided.
async fn the_outbox_summary_counts_what_awaits_delivery_and_its_oldest_decision(b: &Backend) {
    assert_eq!(
        b.shared.outbox_summary().await.unwrap(),
        OutboxSummary::default()
    );
    for id in [90, 91, 92] {
        postpone(b, id).await;
    }
    // Milliseconds, as both backends keep times.
    let at = |seconds: i64| chrono::DateTime::from_timestamp(1_700_000_000 + seconds, 0).unwrap();
    for (id, seconds) in [(91, 20), (90, 10)] {
        let decision = Decision::allow("approved");
        b.shared
            .resolve(id.into(), &decision, None, at(seconds))
            .await
            .unwrap();
    }
    let summary = b.shared.outbox_summary().await.unwrap();
    assert_eq!((summary.queued, summary.oldest_decided), (2, Some(at(10))));
    deliver(b, 90).await;
    let summary = b.shared.outbox_summary().await.unwrap();
    assert_eq!((summary.queued, summary.oldest_decided), (1, Some(at(20))));
    assert_eq!(summary.queued, b.shared.outbox_len().await.unwrap());
    // A result whose record holds U+0000 (a merchant's message quoting the wire, say), which
    // PostgreSQL cannot read inside a `json` value: counted and dated all the same.
    let decision = Decision::deny("documents missing: a\u{0}b");
    b.shared
        .resolve(92.into(), &decision, None, at(5))
        .await
        .unwrap();
    let summary = b.shared.outbox_summary().await.unwrap();
    assert_eq!((summary.queued, summary.oldest_decided), (2, Some(at(5))));
}

behaviour!(a_refused_result_is_final);
async fn a_refused_result_is_final(b: &Backend) {
    decide(b, 9).await;
    refuse(b, 9).await;
    b.shared
        .record_delivery(
            9.into(),
            Delivery::Delivered {
                attempts: 2,
                at: Utc::now(),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        b.shared.postponed(9.into()).await.unwrap().unwrap().state(),
        PostponedState::Conflict
    );
    assert!(
        b.shared
            .outbox_due(Utc::now())
            .await
            .unwrap()
            .now
            .is_empty()
    );
    assert_eq!(b.shared.postponed_all().await.unwrap().len(), 1);
}

behaviour!(an_operator_makes_a_result_due_now_and_sends_a_refused_one_again);
async fn an_operator_makes_a_result_due_now_and_sends_a_refused_one_again(b: &Backend) {
    // Undecided, or unknown: nothing to send.
    postpone(b, 12).await;
    assert!(!b.shared.make_due(12.into(), Utc::now()).await.unwrap());
    assert!(!b.shared.make_due(999.into(), Utc::now()).await.unwrap());
    // Delivered: sent already.
    decide(b, 13).await;
    deliver(b, 13).await;
    assert!(!b.shared.make_due(13.into(), Utc::now()).await.unwrap());

    decide(b, 10).await;
    refuse(b, 10).await;
    let now = Utc::now();
    assert!(b.shared.make_due(10.into(), now).await.unwrap());
    let record = b.shared.postponed(10.into()).await.unwrap().unwrap();
    assert_eq!(record.state(), PostponedState::Queued);
    let Some(Delivery::Queued { last_error, .. }) = record.result.map(|r| r.delivery) else {
        panic!("not queued");
    };
    assert!(
        last_error.is_some_and(|e| e.contains("queued again by an operator")),
        "the refusal is kept in the record"
    );
    let due = b.shared.outbox_due(now).await.unwrap();
    let due: Vec<i64> = due.now.iter().map(|v| v.validation_id.get()).collect();
    assert_eq!(due, [10], "due at once");
    // The refused attempt's outcome again (another instance's, late): it changes nothing.
    refuse(b, 10).await;
    assert_eq!(
        b.shared
            .postponed(10.into())
            .await
            .unwrap()
            .unwrap()
            .state(),
        PostponedState::Queued
    );
    // Queued: made due now again.
    assert!(b.shared.make_due(10.into(), Utc::now()).await.unwrap());
}

behaviour!(a_failed_delivery_is_retried_when_due);
async fn a_failed_delivery_is_retried_when_due(b: &Backend) {
    postpone(b, 11).await;
    b.shared
        .resolve(11.into(), &Decision::deny("no"), None, Utc::now())
        .await
        .unwrap();
    let next_attempt = Utc::now() + TimeDelta::seconds(30);
    b.shared
        .record_delivery(
            11.into(),
            Delivery::Queued {
                attempts: 1,
                next_attempt,
                last_error: Some("timeout".into()),
            },
        )
        .await
        .unwrap();
    let due = b.shared.outbox_due(Utc::now()).await.unwrap();
    assert!(due.now.is_empty());
    let next = due.next.unwrap();
    assert!((next - next_attempt).num_milliseconds().abs() < 2, "{next}");
    let due = b
        .shared
        .outbox_due(next_attempt + TimeDelta::seconds(1))
        .await
        .unwrap();
    assert_eq!(due.now.len(), 1);
}

/// Validations in every state, with negative ids among them: those of
/// [`each_state_lists_exactly_its_validations_and_the_settled_latest_first`].
async fn one_in_each_state(b: &Backend) {
    // Pending: 21 with a deadline, 22 without one (no deadline index entry to find it by).
    postpone(b, 21).await;
    postpone_without_deadline(b, 22).await;
    // Queued: decided, awaiting delivery; 24 after a failed attempt.
    for id in [23, 24, 25, 26] {
        decide(b, id).await;
    }
    let retry = Delivery::Queued {
        attempts: 1,
        next_attempt: Utc::now() + TimeDelta::seconds(30),
        last_error: Some("timeout".into()),
    };
    b.shared.record_delivery(24.into(), retry).await.unwrap();
    // Delivered, and refused (the aggregator holds another result).
    deliver(b, 25).await;
    refuse(b, 26).await;
    // A negative id (a `long` on the wire) is listed in the ids' order on every backend.
    decide(b, -27).await;
    refuse(b, -27).await;
    // And through the indexes of what waits: one pending, one queued.
    postpone(b, -28).await;
    decide(b, -29).await;
}

behaviour!(each_state_lists_exactly_its_validations_and_the_settled_latest_first);
async fn each_state_lists_exactly_its_validations_and_the_settled_latest_first(b: &Backend) {
    one_in_each_state(b).await;
    let all = b.shared.postponed_all().await.unwrap();
    let ids: Vec<i64> = all.iter().map(|v| v.validation_id.get()).collect();
    assert_eq!(ids, [-29, -28, -27, 21, 22, 23, 24, 25, 26], "by id");
    for (state, expected) in [
        (PostponedState::Pending, vec![-28, 21, 22]),
        (PostponedState::Queued, vec![-29, 23, 24]),
        (PostponedState::Delivered, vec![25]),
        (PostponedState::Conflict, vec![-27, 26]),
    ] {
        let listed = b.shared.postponed_in(state).await.unwrap();
        let ids: Vec<i64> = listed.iter().map(|v| v.validation_id.get()).collect();
        assert_eq!(ids, expected, "{state:?}");
        let from_all: Vec<_> = all.iter().filter(|v| v.state() == state).collect();
        assert_eq!(
            listed.iter().collect::<Vec<_>>(),
            from_all,
            "{state:?}: the same records as among every one"
        );
    }
    // The delivered and refused ones, the latest (highest id) first, up to a limit.
    let settled = |limit| async move {
        let listed = b.shared.postponed_settled(limit).await.unwrap();
        listed
            .iter()
            .map(|v| v.validation_id.get())
            .collect::<Vec<_>>()
    };
    assert_eq!(settled(10).await, [26, 25, -27]);
    assert_eq!(settled(1).await, [26]);
    assert!(settled(0).await.is_empty());
}

behaviour!(each_state_is_listed_a_page_at_a_time_by_id);
async fn each_state_is_listed_a_page_at_a_time_by_id(b: &Backend) {
    one_in_each_state(b).await;
    // The ends of the ids' range; and a delivered and a refused record holding U+0000,
    // which PostgreSQL cannot read inside a `json` value: a page never looks inside one.
    postpone(b, i64::MIN).await;
    decide(b, i64::MAX).await;
    for (id, delivered) in [(30, true), (31, false)] {
        let mut request = validation(&format!("p-nul-{id}"), id, "10");
        request.provider_data = serde_json::json!({"note\u{0}": ["a\u{0}b"]});
        postpone_request(b, request).await;
        b.shared
            .resolve(id.into(), &Decision::allow("ok"), None, Utc::now())
            .await
            .unwrap();
        if delivered {
            deliver(b, id).await;
        } else {
            refuse(b, id).await;
        }
    }
    let all = b.shared.postponed_all().await.unwrap();
    let ids: Vec<i64> = all.iter().map(|v| v.validation_id.get()).collect();
    assert_eq!(
        ids,
        [
            i64::MIN,
            -29,
            -28,
            -27,
            21,
            22,
            23,
            24,
            25,
            26,
            30,
            31,
            i64::MAX
        ]
    );
    let states = [None].into_iter().chain(PostponedState::ALL.map(Some));
    for state in states {
        let expected: Vec<i64> = all
            .iter()
            .filter(|v| state.is_none_or(|state| v.state() == state))
            .map(|v| v.validation_id.get())
            .collect();
        // Every start — before, at and between the ids, each sign, the ends of the range —
        // and every page size.
        let starts = [
            None,
            Some(i64::MIN),
            Some(-29),
            Some(-28),
            Some(-1),
            Some(0),
        ]
        .into_iter()
        .chain([Some(22), Some(25), Some(26), Some(30), Some(i64::MAX - 1)])
        .chain([Some(i64::MAX)]);
        for after in starts {
            let following: Vec<i64> = expected
                .iter()
                .copied()
                .filter(|id| after.is_none_or(|after| *id > after))
                .collect();
            // A limit of 0 is taken as 1.
            for limit in 0..=following.len() + 1 {
                let page = b
                    .shared
                    .postponed_page(state, after.map(Into::into), limit)
                    .await
                    .unwrap();
                let ids: Vec<i64> = page
                    .validations
                    .iter()
                    .map(|v| v.validation_id.get())
                    .collect();
                let at = format!("{state:?} after {after:?}, {limit} a page");
                let limit = limit.max(1);
                assert_eq!(ids, following[..limit.min(following.len())], "{at}");
                let next = (following.len() > limit).then(|| ids[limit - 1].into());
                assert_eq!(page.next, next, "{at}: the next page starts after its last");
                for listed in &page.validations {
                    let held = all.iter().find(|v| v.validation_id == listed.validation_id);
                    assert_eq!(Some(listed), held, "{at}: the record as held");
                }
            }
        }
        // Walked from the start, the pages hold the listing once, in order.
        let mut walked = Vec::new();
        let mut after = None;
        loop {
            let page = b.shared.postponed_page(state, after, 2).await.unwrap();
            walked.extend(page.validations.iter().map(|v| v.validation_id.get()));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(walked, expected, "{state:?} walked two at a time");
    }
}

/// Postpones validation `id` and allows it: its result is queued for delivery.
async fn decide(b: &Backend, id: i64) {
    postpone(b, id).await;
    b.shared
        .resolve(id.into(), &Decision::allow("ok"), None, Utc::now())
        .await
        .unwrap();
}

/// The aggregator refuses validation `id`'s result: it holds another.
async fn refuse(b: &Backend, id: i64) {
    let conflict = Delivery::Conflict {
        attempts: 1,
        message: "another result".into(),
        at: Utc::now(),
    };
    b.shared.record_delivery(id.into(), conflict).await.unwrap();
}

/// The aggregator accepts validation `id`'s result at the first attempt.
async fn deliver(b: &Backend, id: i64) {
    let delivered = Delivery::Delivered {
        attempts: 1,
        at: Utc::now(),
    };
    b.shared
        .record_delivery(id.into(), delivered)
        .await
        .unwrap();
}

/// Postpones validation `id` with no deadline: it waits for a decision for ever.
async fn postpone_without_deadline(b: &Backend, id: i64) {
    postpone_until(b, validation(&format!("p-{id}"), id, "10"), None).await;
}

fn failure(nonce: &str, reason: &str) -> CallbackFailure {
    CallbackFailure {
        nonce: nonce.into(),
        status: TransactionStatus::Success,
        reason: reason.into(),
        transaction_reference_id: uuid::Uuid::nil(),
        client_id: "c-1".into(),
        amount: rust_decimal::Decimal::new(1050, 2),
        currency: "EUR".into(),
        at: Utc::now(),
    }
}

/// Waits until `count` failing callbacks are listed (a backend may write them without
/// waiting).
async fn failing_until(b: &Backend, count: usize) -> Vec<payhook::store::FailingCallback> {
    for _ in 0..200 {
        let failing = b.shared.failing_callbacks().await.unwrap();
        if failing.len() == count {
            assert_eq!(b.shared.failing_count().await.unwrap(), count);
            return failing;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{count} failing callbacks were not listed");
}

/// Records a failure of each (nonce, status), that many seconds before `now`.
async fn fail_at(
    b: &Backend,
    now: chrono::DateTime<Utc>,
    failures: &[(&str, TransactionStatus, i64)],
) {
    for &(nonce, status, seconds_ago) in failures {
        b.shared
            .record_callback_failure(CallbackFailure {
                status,
                at: now - chrono::Duration::seconds(seconds_ago),
                ..failure(nonce, "handler failed")
            })
            .await
            .unwrap();
    }
}

/// The pairs listed, each as `nonce/status` (a nonce cut to its first 8 characters).
fn order(failing: &[payhook::store::FailingCallback]) -> Vec<String> {
    failing
        .iter()
        .map(|f| {
            let nonce: String = f.nonce.as_str().chars().take(8).collect();
            format!("{nonce}/{}", f.status)
        })
        .collect()
}

behaviour!(failures_are_counted_until_the_status_is_booked);
async fn failures_are_counted_until_the_status_is_booked(b: &Backend) {
    b.shared
        .record_callback_failure(failure("n-1", "first"))
        .await
        .unwrap();
    let failing = failing_until(b, 1).await;
    assert_eq!(failing[0].failures, 1);
    b.shared
        .record_callback_failure(failure("n-1", "second"))
        .await
        .unwrap();
    let mut counted = None;
    for _ in 0..200 {
        let failing = b.shared.failing_callbacks().await.unwrap();
        if failing[0].failures == 2 {
            counted = Some(failing[0].clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let counted = counted.expect("the second failure was counted");
    assert_eq!(counted.last_reason, "second");
    assert_eq!(counted.amount, "10.50");
    // Another status of the same nonce is another failing pair, and another nonce another.
    let pending = CallbackFailure {
        status: TransactionStatus::Pending,
        ..failure("n-1", "pending failed")
    };
    b.shared.record_callback_failure(pending).await.unwrap();
    b.shared
        .record_callback_failure(failure("n-2", "first"))
        .await
        .unwrap();
    failing_until(b, 3).await;
    b.acknowledge("n-1", TransactionStatus::Success, Effects::default())
        .await;
    failing_until(b, 2).await;
    b.acknowledge("n-1", TransactionStatus::Pending, Effects::default())
        .await;
    b.acknowledge("n-2", TransactionStatus::Success, Effects::default())
        .await;
    failing_until(b, 0).await;
    // A late copy's failure of a booked status is not recorded.
    b.shared
        .record_callback_failure(failure("n-1", "late"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(b.shared.failing_callbacks().await.unwrap().is_empty());
}

behaviour!(the_latest_failures_are_read_without_the_rest);
/// The inspector's panel reads the latest failing pairs every second: the first `limit` of
/// the whole list, in its order, as failures come, come again and are booked.
async fn the_latest_failures_are_read_without_the_rest(b: &Backend) {
    let at = |seconds_ago: i64| Utc::now() - chrono::Duration::seconds(seconds_ago);
    let failed = |nonce: &str, status, seconds_ago| CallbackFailure {
        status,
        at: at(seconds_ago),
        ..failure(nonce, "handler failed")
    };
    fail_at(
        b,
        Utc::now(),
        &[
            ("n-old", TransactionStatus::Success, 50),
            ("n-two", TransactionStatus::Success, 40),
            ("n-mid", TransactionStatus::Success, 30),
            ("n-two", TransactionStatus::Pending, 20),
            ("n-new", TransactionStatus::Success, 10),
        ],
    )
    .await;
    let all = order(&failing_until(b, 5).await);
    assert_eq!(all, ["n-new/4", "n-two/3", "n-mid/4", "n-two/4", "n-old/4"]);
    for limit in 0..=6 {
        let latest = b.shared.failing_latest(limit).await.unwrap();
        assert_eq!(order(&latest), all[..limit.min(5)], "the latest {limit}");
    }
    // The oldest fails again: now the latest.
    b.shared
        .record_callback_failure(failed("n-old", TransactionStatus::Success, 1))
        .await
        .unwrap();
    let mut latest = Vec::new();
    for _ in 0..200 {
        latest = order(&b.shared.failing_latest(2).await.unwrap());
        if latest[0] == "n-old/4" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(latest, ["n-old/4", "n-new/4"]);
    // A booked pair is no longer listed; its nonce's other pair still is, at its own time.
    b.acknowledge("n-two", TransactionStatus::Pending, Effects::default())
        .await;
    failing_until(b, 4).await;
    assert_eq!(
        order(&b.shared.failing_latest(3).await.unwrap()),
        ["n-old/4", "n-new/4", "n-mid/4"]
    );
    assert_eq!(
        order(&b.shared.failing_latest(4).await.unwrap()),
        ["n-old/4", "n-new/4", "n-mid/4", "n-two/4"]
    );
    // Failures of the same moment (an incident's are) are ordered by nonce, then status, in
    // the list and in its latest alike.
    let tie = at(5);
    for (nonce, status) in [
        ("t-b", TransactionStatus::Success),
        ("t-a", TransactionStatus::Success),
        ("t-c", TransactionStatus::Success),
        ("t-a", TransactionStatus::Pending),
    ] {
        b.shared
            .record_callback_failure(CallbackFailure {
                status,
                at: tie,
                ..failure(nonce, "handler failed")
            })
            .await
            .unwrap();
    }
    let all = order(&failing_until(b, 8).await);
    assert_eq!(
        all[1..5],
        ["t-a/3", "t-a/4", "t-b/4", "t-c/4"],
        "the failures of one moment: {all:?}"
    );
    for limit in 0..=9 {
        let latest = b.shared.failing_latest(limit).await.unwrap();
        assert_eq!(order(&latest), all[..limit.min(8)], "the latest {limit}");
    }
}

behaviour!(failing_pairs_are_listed_a_page_at_a_time);
/// The operating API lists an incident's failing pairs a page at a time: the pages, read in
/// turn, are the whole list in its order (pairs of one moment, a nonce's pairs at different
/// times and a nonce too long to be spelled out in a key included), whatever their size.
/// A pair that fails again while an operator pages moves to the top and is not listed twice,
/// a pair booked meanwhile is not listed, and a page after a pair booked since still starts
/// where that pair was.
async fn failing_pairs_are_listed_a_page_at_a_time(b: &Backend) {
    let now = Utc::now();
    let at = |seconds_ago: i64| now - chrono::Duration::seconds(seconds_ago);
    let long = "l".repeat(100);
    let failed = |nonce: &str, status, seconds_ago| CallbackFailure {
        status,
        at: at(seconds_ago),
        ..failure(nonce, "handler failed")
    };
    fail_at(
        b,
        now,
        &[
            ("n-a", TransactionStatus::Success, 30),
            ("n-a", TransactionStatus::Pending, 10),
            ("t-b", TransactionStatus::Success, 20),
            ("t-a", TransactionStatus::Success, 20),
            (long.as_str(), TransactionStatus::Success, 20),
            ("t-a", TransactionStatus::Pending, 20),
            ("n-c", TransactionStatus::Success, 40),
        ],
    )
    .await;
    let all = order(&failing_until(b, 7).await);
    assert_eq!(
        all,
        [
            "n-a/3",
            "llllllll/4",
            "t-a/3",
            "t-a/4",
            "t-b/4",
            "n-a/4",
            "n-c/4"
        ]
    );
    // Every page size, from one pair to more than there are.
    for size in 1..=8 {
        let (mut listed, mut pages, mut after) = (Vec::new(), 0, None);
        loop {
            let page = b.shared.failing_page(after, size).await.unwrap();
            assert!(page.failing.len() <= size, "a page of {size}");
            pages += 1;
            listed.extend(order(&page.failing));
            after = page.next;
            if after.is_none() {
                break;
            }
            assert_eq!(page.failing.len(), size, "only the last page is short");
        }
        assert_eq!(listed, all, "pages of {size}");
        assert_eq!(pages, all.len().div_ceil(size), "pages of {size}");
    }
    // While an operator pages: t-b fails again, n-a's Success is booked, and so is t-a's
    // Success, the last pair of the page read.
    let first = b.shared.failing_page(None, 4).await.unwrap();
    assert_eq!(order(&first.failing), all[..4]);
    b.shared
        .record_callback_failure(failed("t-b", TransactionStatus::Success, 1))
        .await
        .unwrap();
    b.acknowledge("n-a", TransactionStatus::Success, Effects::default())
        .await;
    b.acknowledge("t-a", TransactionStatus::Success, Effects::default())
        .await;
    let mut now_listed = Vec::new();
    for _ in 0..200 {
        now_listed = order(&b.shared.failing_callbacks().await.unwrap());
        if now_listed.first().map(String::as_str) == Some("t-b/4") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        now_listed,
        ["t-b/4", "n-a/3", "llllllll/4", "t-a/3", "n-c/4"]
    );
    let rest = b.shared.failing_page(first.next, 10).await.unwrap();
    assert_eq!(order(&rest.failing), ["n-c/4"]);
    assert_eq!(rest.next, None);
    // After the last pair: nothing, and no next page.
    let last = b.shared.failing_page(None, 5).await.unwrap();
    assert_eq!(last.next, None);
    let cursor = payhook::store::FailingCursor::after(last.failing.last().unwrap());
    let after_last = b.shared.failing_page(Some(cursor), 5).await.unwrap();
    assert!(after_last.failing.is_empty() && after_last.next.is_none());
}

behaviour!(a_failure_recorded_late_moves_neither_end_of_its_pair_back);
/// Failures of one pair can be recorded out of order (instances whose clocks differ, two
/// refusals of one body racing): each is counted, but the pair's last failure, and its
/// reason, stay the latest, and its first the earliest, so that a pair never moves down the
/// listing and an operator paging through it does not meet it twice.
async fn a_failure_recorded_late_moves_neither_end_of_its_pair_back(b: &Backend) {
    let now = Utc::now();
    let failed = |reason: &str, seconds_ago| CallbackFailure {
        at: now - chrono::Duration::seconds(seconds_ago),
        ..failure("n-late", reason)
    };
    for (reason, seconds_ago) in [("middle", 20), ("latest", 10), ("earliest", 30)] {
        b.shared
            .record_callback_failure(failed(reason, seconds_ago))
            .await
            .unwrap();
    }
    let mut pair = None;
    for _ in 0..200 {
        let listed = b.shared.failing_callbacks().await.unwrap();
        if listed.first().is_some_and(|f| f.failures == 3) {
            pair = Some(listed[0].clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pair = pair.expect("three failures counted");
    let ms = |seconds_ago| failed("", seconds_ago).at.timestamp_millis();
    assert_eq!(pair.last_reason, "latest");
    assert_eq!(pair.last_failed.timestamp_millis(), ms(10));
    assert_eq!(pair.first_failed.timestamp_millis(), ms(30));
}

behaviour!(u0000_outside_identifiers_is_kept);
/// JSON allows U+0000 in any string, and the wire refuses it only in identifiers (PostgreSQL
/// cannot hold it in `text`): in a postponed validation's free-form data it is kept as sent,
/// and a failure whose currency or reason carries it is still recorded.
async fn u0000_outside_identifiers_is_kept(b: &Backend) {
    let mut request = validation("p-nul", 31, "10");
    request.provider_data = serde_json::json!({"note\u{0}": ["a\u{0}b"]});
    request.merchant_data.additional_data = serde_json::json!({"c": "d\u{0}"});
    postpone_request(b, request.clone()).await;
    let kept = b.shared.postponed(31.into()).await.unwrap().unwrap();
    assert_eq!(kept.request, request);

    let mut failed = failure("n-nul", "refused: a\u{0}b");
    failed.currency = "EU\u{0}".into();
    b.shared.record_callback_failure(failed).await.unwrap();
    let listed = failing_until(b, 1).await;
    assert_eq!(listed[0].nonce, "n-nul");
    assert!(
        listed[0].last_reason.starts_with("refused: a") && listed[0].last_reason.ends_with('b'),
        "{:?}",
        listed[0].last_reason
    );
}

behaviour!(retention_purges_what_expired_and_nothing_else);
async fn retention_purges_what_expired_and_nothing_else(b: &Backend) {
    for i in 0..5 {
        b.acknowledge(
            &format!("n-{i}"),
            TransactionStatus::Success,
            Effects::default(),
        )
        .await;
    }
    assert_eq!(b.shared.purge_expired(Utc::now()).await.unwrap(), 0);
    assert_eq!(
        b.shared
            .begin_callback(&Nonce::from("n-0"), TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Duplicate
    );
    let after = Utc::now() + TimeDelta::hours(2);
    assert!(b.shared.purge_expired(after).await.unwrap() >= 5);
    assert_eq!(b.store.record_count().await.unwrap(), 0);
    // Beyond the retention a repeat is no longer recognised.
    b.claim("n-0", TransactionStatus::Success).await;
}

behaviour!(a_nonce_whose_validation_awaits_its_result_outlives_the_retention);
/// A validation waiting for its decision (or its decided result for delivery) past the
/// retention keeps its nonce's record: asked about again, the nonce is answered with the
/// recorded decision, not handed to the handler as new (which could decide it otherwise) —
/// so does a repeat's whose original was delivered, and an approval's recorded afresh under
/// a new id. Once every result is delivered, the
/// record goes at a later sweep (on sled, a retention after it was kept).
async fn a_nonce_whose_validation_awaits_its_result_outlives_the_retention(b: &Backend) {
    let long = format!("p-{}", "x".repeat(80));
    postpone_without_deadline(b, 50).await;
    postpone_until(b, validation(&long, 52, "10"), None).await;
    decide(b, 51).await;
    // An original delivered, its repeat under a new id (same nonce) not yet.
    decide(b, 53).await;
    let repeat = validation("p-53", 54, "10");
    let recorded = b.shared.repeat(&repeat, Utc::now()).await.unwrap();
    assert!(matches!(recorded, Repeat::Recorded { .. }), "{recorded:?}");
    deliver(b, 53).await;
    // An approval no postponed validation holds, recorded afresh under a new id.
    answer(b, &validation("v-56", 56, "10"), &RecordedDecision::Allow).await;
    let afresh = b
        .shared
        .repeat(&validation("v-56", 57, "10"), Utc::now())
        .await
        .unwrap();
    assert_eq!(afresh, Repeat::RecordedAfresh);
    let asked_again = |nonce: String, id: i64| async move {
        let request = validation(&nonce, id, "10");
        b.shared
            .begin_validation(request.nonce(), &Fingerprint::of(&request), STALE)
            .await
            .unwrap()
    };
    let nonces = [
        ("p-50".to_owned(), 50),
        ("p-51".to_owned(), 51),
        (long, 52),
        ("p-53".to_owned(), 55),
        ("v-56".to_owned(), 58),
    ];
    let later = Utc::now() + TimeDelta::hours(2);
    b.shared.purge_expired(later).await.unwrap();
    for (nonce, id) in nonces.clone() {
        let begin = asked_again(nonce.clone(), id).await;
        assert!(
            matches!(begin, ValidationBegin::Recorded(_)),
            "{nonce}: {begin:?}"
        );
    }
    for id in [50, 52] {
        b.shared
            .resolve(id.into(), &Decision::allow("ok"), None, Utc::now())
            .await
            .unwrap();
    }
    for id in [50, 51, 52, 54, 57] {
        deliver(b, id).await;
    }
    b.shared
        .purge_expired(later + TimeDelta::hours(2))
        .await
        .unwrap();
    for (nonce, id) in nonces {
        let begin = asked_again(nonce.clone(), id).await;
        assert!(
            matches!(begin, ValidationBegin::Claimed { .. }),
            "{nonce}: {begin:?}"
        );
    }
}

behaviour!(a_booking_beside_a_retention_sweep_is_kept);
/// A nonce whose record expired gets a new status: its booking renews the record. A sweep
/// meanwhile must not delete the renewed one (a repeat of the new status would run again):
/// on PostgreSQL it passes over the row the booking holds rather than wait for it (which
/// outlasted the statement timeout and failed the whole sweep), and each sweep says twice
/// what expired, should it pick a row just before a booking renews it.
async fn a_booking_beside_a_retention_sweep_is_kept(b: &Backend) {
    let (first, later) = (TransactionStatus::Success, TransactionStatus::Cancelled);
    b.acknowledge("n-1", first, Effects::default()).await;
    let acknowledged_by = Utc::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // On PostgreSQL a claim's transaction may have begun as the claim before it on its
    // connection ended, and its `now()` dates the renewed record: another booking first.
    b.acknowledge("n-2", first, Effects::default()).await;
    let (claim, ..) = b.claim("n-1", later).await;
    // After the first booking's expiry, before the renewed one's.
    let sweep_at =
        acknowledged_by + TimeDelta::from_std(RETENTION).unwrap() + TimeDelta::milliseconds(50);
    b.shared.purge_expired(sweep_at).await.unwrap();
    b.shared
        .finish_callback(&Nonce::from("n-1"), claim, later, Effects::default())
        .await
        .unwrap();
    b.shared.purge_expired(sweep_at).await.unwrap();
    for status in [first, later] {
        assert_eq!(
            b.shared
                .begin_callback(&Nonce::from("n-1"), status, STALE)
                .await
                .unwrap(),
            CallbackBegin::Duplicate,
            "{status:?}"
        );
    }
}

behaviour!(long_nonces_are_answered_exactly_once);
async fn long_nonces_are_answered_exactly_once(b: &Backend) {
    let long = "n".repeat(10_000);
    let other = format!("{}x", "n".repeat(9_999));
    b.acknowledge(&long, TransactionStatus::Success, Effects::default())
        .await;
    assert_eq!(
        b.shared
            .begin_callback(&Nonce::from(&long), TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Duplicate
    );
    b.claim(&other, TransactionStatus::Success).await;
}

/// PostgreSQL only: several instances share the database, and an instance that dies leaves
/// claims behind; they are taken over at once, not after their lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_an_instance_that_died_is_taken_over_at_once() {
    let Some(db) = support::postgres::database("a_claim_of_an_instance_that_died").await else {
        return;
    };
    let config = db.store_config(RETENTION);
    let (one, other) = (
        ConfiguredStore::open(&config, TREES)
            .await
            .unwrap()
            .shared(),
        ConfiguredStore::open(&config, TREES)
            .await
            .unwrap()
            .shared(),
    );
    let CallbackBegin::Claimed { .. } = one
        .begin_callback(&Nonce::from("n-1"), TransactionStatus::Success, STALE)
        .await
        .unwrap()
    else {
        panic!("not claimed");
    };
    assert_eq!(
        other
            .begin_callback(&Nonce::from("n-1"), TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Busy,
        "a live instance's claim stands"
    );
    drop(one); // the instance goes away, and its connections with it
    let (claim, attempt) = claimed_once_free(other.as_ref(), "n-1").await;
    // The claim taken over books the callback.
    book(other.as_ref(), &Nonce::from("n-1"), claim).await;
    assert!(
        other
            .callback_acknowledged(&Nonce::from("n-1"), TransactionStatus::Success)
            .await
            .unwrap()
    );
    // A delivery cut off with its instance is not counted (as a crash on sled): its
    // transaction, which would have counted it, rolled back.
    assert_eq!(attempt, 1);
    drop(other);
    db.drop_schema().await;
}

/// Books `nonce`'s success under `claim`, with no effects.
async fn book(store: &dyn Store, nonce: &Nonce, claim: Claim) {
    finish_success(store, nonce, claim).await.unwrap();
}

/// The booking of (`nonce`, success) under `claim`, without effects, as the store answers it.
fn finish_success<'a>(
    store: &'a dyn Store,
    nonce: &'a Nonce,
    claim: Claim,
) -> payhook::store::DurableFuture<'a> {
    store.finish_callback(nonce, claim, TransactionStatus::Success, Effects::default())
}

/// The claim of (`nonce`, success) and its attempt, once the nonce is free: a connection
/// closed with its claim (an instance gone, a claim's connection dropped open) releases it
/// when the database sees it closed, a moment after. Panics after [`support::DEADLINE`].
async fn claimed_once_free(store: &dyn Store, nonce: &str) -> (Claim, u32) {
    let deadline = tokio::time::Instant::now() + support::DEADLINE;
    loop {
        match store
            .begin_callback(&Nonce::from(nonce), TransactionStatus::Success, STALE)
            .await
            .unwrap()
        {
            CallbackBegin::Claimed { claim, attempt, .. } => return (claim, attempt),
            CallbackBegin::Busy if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("{nonce} not claimed: {other:?}"),
        }
    }
}

/// A PostgreSQL store of `pool_size` connections that waits 300 ms for one, sweeping
/// every `sweep_interval`.
async fn small_pool(db: &TestDb, pool_size: u32, sweep_interval: Duration) -> Arc<dyn Store> {
    let config = StoreConfig {
        pool_size,
        connect_timeout: Duration::from_millis(300),
        sweep_interval,
        ..db.store_config(RETENTION)
    };
    ConfiguredStore::open(&config, TREES)
        .await
        .unwrap()
        .shared()
}

/// Claims new nonces (never finishing them) until a claim is refused for want of a
/// connection; at least one is claimed.
async fn claim_until_refused(store: &dyn Store, stale: Duration) -> Vec<(Nonce, Claim)> {
    let mut claims = Vec::new();
    let refused = loop {
        let nonce = Nonce::from(format!("n-{}", claims.len()));
        match store
            .begin_callback(&nonce, TransactionStatus::Success, stale)
            .await
        {
            Ok(CallbackBegin::Claimed { claim, .. }) => claims.push((nonce, claim)),
            Ok(other) => panic!("a new nonce answered {other:?}"),
            Err(error) => break error,
        }
        assert!(claims.len() < 16, "claims were never refused");
    };
    assert!(!claims.is_empty(), "no claim at all: {refused}");
    claims
}

/// PostgreSQL only: callbacks in flight never hold the whole pool. With every connection
/// callbacks may hold taken, another callback waits (and fails after the pool's timeout),
/// but a validation still finds a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_in_flight_leave_connections_for_the_stores_other_work() {
    let Some(db) = support::postgres::database("callbacks_leave_connections").await else {
        return;
    };
    let store = small_pool(&db, 4, StoreConfig::default().sweep_interval).await;
    let mut claims = claim_until_refused(store.as_ref(), STALE).await;
    assert!(claims.len() < 4, "callbacks took every connection");
    let request = validation("v-1", 1, "10.5");
    let fingerprint = Fingerprint::of(&request);
    assert!(matches!(
        store
            .begin_validation(&Nonce::from("v-1"), &fingerprint, STALE)
            .await,
        Ok(ValidationBegin::Claimed { .. })
    ));
    // Once one callback is booked, the next one claims.
    let (nonce, claim) = claims.remove(0);
    book(store.as_ref(), &nonce, claim).await;
    assert!(matches!(
        store
            .begin_callback(&Nonce::from("n-next"), TransactionStatus::Success, STALE)
            .await,
        Ok(CallbackBegin::Claimed { .. })
    ));
    drop(store);
    db.drop_schema().await;
}

/// PostgreSQL only: the store's own statements (`PgStore::indexed_reads`) read what waits
/// through its partial index and the latest failing callbacks through theirs (a page after
/// a cursor from the cursor's time down, not the pages before it), and the
/// index of pending
/// validations — which has no schema version, so that an older payhook still opens the
/// database — is built by the open of a schema that lacks it, as one upgraded from a
/// payhook before it; so is the count of failing callbacks the database keeps, counted from
/// the rows there are then, and kept and folded since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_validations_and_the_latest_failures_are_read_through_their_indexes() {
    use payhook::store::prelude::*;
    use sqlx::Row;
    let Some(db) = support::postgres::database("waiting_read_by_index").await else {
        return;
    };
    let store = payhook::store::PgStore::open(&db.store_config(RETENTION), TREES)
        .await
        .unwrap();
    // The store's own statements, not copies: a change to one that loses its index fails
    // here.
    let reads = store.indexed_reads();
    drop(store);
    let mut conn = db.connect().await;
    sqlx::raw_sql("SET enable_seqscan = off")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut planned = Vec::new();
    for read in &reads {
        let (types, values): (Vec<_>, Vec<_>) = read.parameters.iter().copied().unzip();
        let (types, values) = if types.is_empty() {
            (String::new(), String::new())
        } else {
            (
                format!("({})", types.join(", ")),
                format!("({})", values.join(", ")),
            )
        };
        sqlx::raw_sql(&format!("PREPARE indexed_read {types} AS {}", read.sql))
            .execute(&mut conn)
            .await
            .unwrap();
        let lines: Vec<String> = sqlx::query(&format!("EXPLAIN EXECUTE indexed_read {values}"))
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        sqlx::raw_sql("DEALLOCATE indexed_read")
            .execute(&mut conn)
            .await
            .unwrap();
        assert!(
            lines.iter().any(|line| line.contains(read.index)),
            "{}: {lines:#?}",
            read.sql
        );
        if let Some(condition) = read.condition {
            assert!(
                lines.iter().any(|line| line.contains(condition)),
                "{} does not begin its scan at `{condition}`: {lines:#?}",
                read.sql
            );
        }
        planned.push(read.index);
    }
    assert_eq!(
        planned,
        [
            "postponed_pending",
            "postponed_queued",
            "postponed_pending",
            "postponed_queued",
            "postponed_pkey",
            "postponed_nonce_hash",
            "postponed_outbox",
            "postponed_leased",
            "callback_failures_latest",
            "callback_failures_latest"
        ],
        "every indexed read was planned"
    );
    // A schema without the indexes and the count of failing callbacks (as a payhook before
    // them left it; its function left behind, as a build that failed half-way would not
    // leave it but a hand might) gets them at the next open, the count counted from the
    // rows there are.
    let store = payhook::store::PgStore::open(&db.store_config(RETENTION), TREES)
        .await
        .unwrap();
    for nonce in ["n-1", "n-2", "n-3"] {
        store
            .record_callback_failure(failure(nonce, "handler failed"))
            .await
            .unwrap();
    }
    drop(store);
    sqlx::raw_sql(&format!(
        "DROP INDEX {0}.postponed_pending; DROP INDEX {0}.postponed_queued; \
         DROP INDEX {0}.postponed_nonce_hash; CREATE INDEX postponed_nonce ON {0}.postponed (nonce); \
         DROP INDEX {0}.postponed_leased; \
         DROP INDEX {0}.callback_failures_latest; DROP TABLE {0}.callback_failures_count; \
         DROP TRIGGER callback_failures_counted ON {0}.callback_failures",
        db.schema
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let store = payhook::store::PgStore::open(&db.store_config(RETENTION), TREES)
        .await
        .unwrap();
    assert_eq!(store.failing_count().await.unwrap(), 3);
    // Kept as rows come and go, and each sweep folds the count's rows into one.
    store
        .record_callback_failure(failure("n-4", "handler failed"))
        .await
        .unwrap();
    assert_eq!(store.failing_count().await.unwrap(), 4);
    store.purge_expired(Utc::now()).await.unwrap();
    assert_eq!(store.failing_count().await.unwrap(), 4);
    let rows: i64 = sqlx::query(&format!(
        "SELECT count(*) FROM {}.callback_failures_count",
        db.schema
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap()
    .get(0);
    assert_eq!(rows, 1, "the count's rows folded into one");
    drop(store);
    for index in [
        "postponed_pending",
        "postponed_queued",
        "postponed_nonce_hash",
        "postponed_leased",
        "callback_failures_latest",
    ] {
        let built: bool = sqlx::query(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
        )
        .bind(&db.schema)
        .bind(index)
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0);
        assert!(built, "{index} built again, and valid");
    }
    assert!(
        !relation_exists(&mut conn, &db.schema, "postponed_nonce").await,
        "the btree of whole nonces an earlier payhook built is dropped"
    );
    drop(conn);
    db.drop_schema().await;
}

/// Whether `schema` holds a relation (a table, an index) named `name`.
async fn relation_exists(conn: &mut sqlx::PgConnection, schema: &str, name: &str) -> bool {
    let found: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind(schema)
    .bind(name)
    .fetch_optional(conn)
    .await
    .unwrap();
    found.is_some()
}

/// PostgreSQL only: the btree of whole nonces an earlier payhook built is dropped at open —
/// but a drop that cannot have its table's lock within the migrations' wait (a long
/// transaction reads `postponed`) neither holds the open nor fails it: the next open drops
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_index_whose_table_is_busy_is_dropped_by_a_later_open() {
    let Some(db) = support::postgres::database("retired_index_busy").await else {
        return;
    };
    let config = db.store_config(RETENTION);
    drop(payhook::store::PgStore::open(&config, TREES).await.unwrap());
    let mut conn = db.connect().await;
    let retired = format!(
        "CREATE INDEX postponed_nonce ON {}.postponed (nonce)",
        db.schema
    );
    sqlx::raw_sql(&retired).execute(&mut conn).await.unwrap();
    let reading = db.lock("postponed", "ACCESS SHARE").await;
    drop(payhook::store::PgStore::open(&config, TREES).await.unwrap());
    let left = relation_exists(&mut conn, &db.schema, "postponed_nonce").await;
    assert!(left, "left while the table was busy");
    reading.release().await;
    drop(payhook::store::PgStore::open(&config, TREES).await.unwrap());
    let left = relation_exists(&mut conn, &db.schema, "postponed_nonce").await;
    assert!(!left, "dropped by the next open");
    drop(conn);
    db.drop_schema().await;
}

/// PostgreSQL only: the connection of a claim that ended is kept, with the next claim's
/// transaction begun on it. Should the database close it meanwhile (here its
/// `idle_in_transaction_session_timeout`), the next claim takes a pooled connection
/// instead of failing. A pool whose connections are so closed is warned of when the store
/// opens on it: a claim idles in its transaction while its handler runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_connection_the_database_closed_is_replaced() {
    let Some(db) = support::postgres::database("a_kept_connection_closed").await else {
        return;
    };
    let pool = support::postgres::pool_at(
        &db.url,
        4,
        &[("idle_in_transaction_session_timeout", "200")],
    )
    .await;
    let logs = support::captured_logs(tracing::Level::WARN);
    let store: Arc<dyn Store> = Arc::new(
        payhook::store::PgStore::with_pool(pool, &db.store_config(RETENTION), TREES)
            .await
            .unwrap(),
    );
    let logged = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        logged.lines().any(|line| line.contains("WARN")
            && line.contains("closed after idling in a transaction")
            && line.contains("idle_in_transaction_session_timeout=200ms")),
        "{logged}"
    );
    for (round, nonce) in ["n-1", "n-2", "n-3"].into_iter().enumerate() {
        if round > 0 {
            // Longer than the timeout: the kept connection is closed by the database.
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        let nonce = Nonce::from(nonce);
        let CallbackBegin::Claimed { claim, .. } = store
            .begin_callback(&nonce, TransactionStatus::Success, STALE)
            .await
            .unwrap()
        else {
            panic!("not claimed");
        };
        book(store.as_ref(), &nonce, claim).await;
    }
    drop(store);
    db.drop_schema().await;
}

/// PostgreSQL only: a read of the validation cut off in the claim's transaction (the
/// handler's timeout; here the test's, while the table is locked) leaves the claim held,
/// so that its release counts the attempt: the next delivery is the second. The release
/// does not wait for the statement cut off (still waiting for the lock here): it closes the
/// claim's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_read_cut_off_leaves_the_claim_to_its_release() {
    let Some(db) = support::postgres::database("a_read_cut_off").await else {
        return;
    };
    let store = ConfiguredStore::open(&db.store_config(RETENTION), TREES)
        .await
        .unwrap()
        .shared();
    let nonce = Nonce::from("v-1");
    let (claim, attempt) = claimed_once_free(store.as_ref(), "v-1").await;
    assert_eq!(attempt, 1);
    let locked = db.lock("validations", "ACCESS EXCLUSIVE").await;
    let read = tokio::time::timeout(
        Duration::from_millis(200),
        store.validated_payment_in_claim(&nonce, claim),
    )
    .await;
    assert!(read.is_err(), "the read waits for the lock: {read:?}");
    store.release_callback(&nonce, claim).await.unwrap();
    locked.release().await;
    // The closed connection's transaction ends once its statement gets the lock and finds
    // no one to answer: until then the nonce is still claimed there.
    let (_, attempt) = claimed_once_free(store.as_ref(), "v-1").await;
    assert_eq!(attempt, 2, "the first attempt is counted");
    drop(store);
    db.drop_schema().await;
}

/// PostgreSQL only: the claim's connection serves one read at a time. Two reads at once
/// (one handler joining them) are both answered, the second on the pool; a claim finished
/// while a read holds it (a read left running in a task of the handler's own) is not
/// booked — the finish is told the claim is lost, and the claim is rolled back once the read
/// is over, leaving the nonce to the next delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_serves_one_read_at_a_time_and_is_not_booked_while_lent() {
    let Some(b) = Backend::postgres("one_read_at_a_time").await else {
        return;
    };
    let (store, db) = (Arc::clone(&b.shared), b.db.clone().unwrap());
    answer(&b, &validation("v-1", 1, "10.50"), &RecordedDecision::Allow).await;
    let nonce = Nonce::from("v-1");
    let (claim, _) = claimed_once_free(store.as_ref(), "v-1").await;
    let (one, other) = tokio::join!(
        store.validated_payment_in_claim(&nonce, claim),
        store.validated_payment_in_claim(&nonce, claim),
    );
    let (one, other) = (one.unwrap().unwrap(), other.unwrap().unwrap());
    assert_eq!(one, other);
    assert_eq!(one.decision, ValidatedDecision::Allowed);
    // Booked: its transaction, which read the table, no longer holds it.
    book(store.as_ref(), &nonce, claim).await;

    let nonce = Nonce::from("v-2");
    answer(&b, &validation("v-2", 2, "1"), &RecordedDecision::Allow).await;
    let (claim, _) = claimed_once_free(store.as_ref(), "v-2").await;
    let locked = db.lock("validations", "ACCESS EXCLUSIVE").await;
    let reading = tokio::spawn({
        let store = Arc::clone(&store);
        async move {
            store
                .validated_payment_in_claim(&Nonce::from("v-2"), claim)
                .await
        }
    });
    // The read holds the claim once it waits for the lock.
    let waiting = format!(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
         WHERE c.relname = 'validations' AND c.relnamespace = '{}'::regnamespace \
         AND NOT l.granted",
        db.schema
    );
    db.until_counted(&waiting, "the read waiting for the lock", || false)
        .await;
    let booked = finish_success(store.as_ref(), &nonce, claim).await;
    assert!(
        matches!(booked, Err(StoreError::ClaimLost(_))),
        "{booked:?}"
    );
    locked.release().await;
    assert!(reading.await.unwrap().unwrap().is_some());
    assert!(
        !store
            .callback_acknowledged(&nonce, TransactionStatus::Success)
            .await
            .unwrap()
    );
    let (claim, _) = claimed_once_free(store.as_ref(), "v-2").await;
    book(store.as_ref(), &nonce, claim).await;
    drop(store);
    b.finish().await;
}

/// PostgreSQL only: a read of the validation that fails in the claim's transaction (here at
/// the statement timeout, the table locked by the test) leaves that transaction able to
/// book nothing: the booking says so, rather than run effects that fail for it, nothing is
/// acknowledged, and the next delivery is the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_read_that_fails_in_the_claim_books_nothing_and_says_why() {
    let Some(db) = support::postgres::database("a_read_that_fails").await else {
        return;
    };
    let config = StoreConfig {
        statement_timeout: Duration::from_millis(300),
        ..db.store_config(RETENTION)
    };
    let store = ConfiguredStore::open(&config, TREES)
        .await
        .unwrap()
        .shared();
    let nonce = Nonce::from("v-1");
    let (claim, _) = claimed_once_free(store.as_ref(), "v-1").await;
    let locked = db.lock("validations", "ACCESS EXCLUSIVE").await;
    let read = store.validated_payment_in_claim(&nonce, claim).await;
    assert!(matches!(read, Err(StoreError::Backend { .. })), "{read:?}");
    locked.release().await;
    let booked = finish_success(store.as_ref(), &nonce, claim).await;
    let said = payhook::Report::new(&booked.unwrap_err()).to_string();
    assert!(
        said.contains("the validation's read failed in the claim's transaction"),
        "{said}"
    );
    assert!(
        !store
            .callback_acknowledged(&nonce, TransactionStatus::Success)
            .await
            .unwrap()
    );
    // The claim ended with it.
    let read = store.validated_payment_in_claim(&nonce, claim).await;
    assert!(matches!(read, Err(StoreError::ClaimLost(_))), "{read:?}");
    // Its connection was closed: the nonce is free once the database sees it.
    let (claim, attempt) = claimed_once_free(store.as_ref(), "v-1").await;
    assert_eq!(attempt, 2, "the first attempt is counted");

    // Released rather than finished: the attempt is counted all the same.
    let locked = db.lock("validations", "ACCESS EXCLUSIVE").await;
    let read = store.validated_payment_in_claim(&nonce, claim).await;
    assert!(matches!(read, Err(StoreError::Backend { .. })), "{read:?}");
    locked.release().await;
    store.release_callback(&nonce, claim).await.unwrap();
    let (_, attempt) = claimed_once_free(store.as_ref(), "v-1").await;
    assert_eq!(attempt, 3, "the second attempt is counted");
    drop(store);
    db.drop_schema().await;
}

/// PostgreSQL only: a claim's transaction is READ COMMITTED and commits synchronously
/// whatever the defaults of a pool the merchant gave: under SERIALIZABLE (or REPEATABLE
/// READ) the claim would
/// read with a snapshot taken before the nonce's lock, and with `synchronous_commit = off`
/// a booking would be acknowledged before it is durable (a crash of the database then loses
/// it, and the aggregator, answered 200, never sends it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_commits_durably_whatever_the_pools_defaults() {
    let Some(db) = support::postgres::database("a_booking_durably").await else {
        return;
    };
    // A pool that commits asynchronously has its bookings commit synchronously; one that
    // waits for the standby to apply keeps that.
    for (pool_commit, booking_commit) in [("off", "on"), ("remote_apply", "remote_apply")] {
        let pool = support::postgres::pool_at(
            &db.url,
            4,
            &[
                ("default_transaction_isolation", "serializable"),
                ("synchronous_commit", pool_commit),
            ],
        )
        .await;
        let store: Arc<dyn Store> = Arc::new(
            payhook::store::PgStore::with_pool(pool, &db.store_config(RETENTION), TREES)
                .await
                .unwrap(),
        );
        let seen = settings_of_two_bookings(store.as_ref(), pool_commit).await;
        let expected = ("read committed".to_owned(), booking_commit.to_owned());
        assert_eq!(
            seen,
            vec![expected.clone(), expected],
            "a pool committing {pool_commit}"
        );
    }
    db.drop_schema().await;
}

/// PostgreSQL only: payhook's own pool (`PgStore::open`) sets `synchronous_commit = on` on
/// each connection, which its role's defaults do not override, and its claims begin READ
/// COMMITTED: no statement is spent per booking on either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payhook_s_own_pool_books_durably_whatever_its_role_s_defaults() {
    let Some(db) = support::postgres::database("own_pool_durably").await else {
        return;
    };
    let (role, url) = db.own_role().await;
    let mut admin = db.connect().await;
    sqlx::raw_sql(&format!(
        "ALTER ROLE {role} SET default_transaction_isolation = 'serializable'; \
         ALTER ROLE {role} SET synchronous_commit = off"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    let mut config = db.store_config(RETENTION);
    config.url = Some(url.as_str().into());
    let store: Arc<dyn Store> =
        Arc::new(payhook::store::PgStore::open(&config, TREES).await.unwrap());
    let seen = settings_of_two_bookings(store.as_ref(), "own").await;
    let expected = ("read committed".to_owned(), "on".to_owned());
    assert_eq!(seen, vec![expected.clone(), expected]);
    drop(store);
    db.drop_schema().await;
    sqlx::raw_sql(&format!("DROP ROLE {role}"))
        .execute(&mut admin)
        .await
        .unwrap();
}

/// Books two callbacks on `store` (the first begins its claim's transaction, the second
/// finds one its COMMIT began), each with an effect that reads the isolation and the
/// `synchronous_commit` of the transaction it runs in.
async fn settings_of_two_bookings(store: &dyn Store, prefix: &str) -> Vec<(String, String)> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    for nonce in ["n-1", "n-2"] {
        let nonce = Nonce::from(format!("{prefix}-{nonce}"));
        let CallbackBegin::Claimed { claim, .. } = store
            .begin_callback(&nonce, TransactionStatus::Success, STALE)
            .await
            .unwrap()
        else {
            panic!("not claimed");
        };
        let effects = Effects::default();
        let seen = Arc::clone(&seen);
        effects.postgres(move |conn| {
            let seen = Arc::clone(&seen);
            Box::pin(async move {
                let settings: (String, String) = sqlx::query_as(
                    "SELECT current_setting('transaction_isolation'), \
                     current_setting('synchronous_commit')",
                )
                .fetch_one(&mut *conn)
                .await?;
                seen.lock().unwrap().push(settings);
                Ok(())
            })
        });
        store
            .finish_callback(&nonce, claim, TransactionStatus::Success, effects)
            .await
            .unwrap();
    }
    seen.lock().unwrap().clone()
}

/// PostgreSQL only: a result another live instance has leased is not due here, and falls
/// due when that lease runs out (an instance that stalls mid-post gives it up then), not
/// never; one this instance could take counts from when it falls due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_leased_to_another_live_instance_falls_due_when_its_lease_runs_out() {
    let Some(b) = Backend::postgres("leased_elsewhere").await else {
        return;
    };
    postpone(&b, 21).await;
    b.shared
        .resolve(21.into(), &Decision::allow("checked"), None, Utc::now())
        .await
        .unwrap();
    let leased = b.shared.outbox_due(Utc::now()).await.unwrap();
    assert_eq!(leased.now.len(), 1, "leased here");
    let config = b.db.as_ref().unwrap().store_config(RETENTION);
    let other = payhook::store::PgStore::open(&config, TREES).await.unwrap();
    let before = Utc::now();
    let seen = payhook::store::PostponedStore::outbox_due(&other, before)
        .await
        .unwrap();
    assert!(
        seen.now.is_empty(),
        "leased to a live instance: {:?}",
        seen.now
    );
    let next = seen.next.expect("the leased result is never due elsewhere");
    let lease = TimeDelta::from_std(payhook::store::OUTBOX_LEASE).unwrap();
    assert!(
        next > before + lease / 2 && next <= Utc::now() + lease + TimeDelta::seconds(1),
        "due at {next}, not when the lease of {lease} from {before} runs out"
    );
    drop(other);
    b.finish().await;
}

/// PostgreSQL only: a repeat under an id that another nonce's validation is writing at the
/// same moment (both past the service's check before the handler) is a taken id and links
/// nothing: the id stays that payment's, and a decision of the repeated nonce decides its own validations
/// alone. The repeat's insert met the other's row and did nothing, and the id was linked all
/// the same: allowing the repeated nonce approved the other payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_racing_another_nonces_validation_for_its_id_links_nothing() {
    let Some(b) = Backend::postgres("repeat_races_an_id").await else {
        return;
    };
    let db = b.db.as_ref().unwrap();
    postpone(&b, 90).await;
    postpone(&b, 91).await;
    // Validation 91 of the other nonce, written again in a transaction not yet committed: a
    // repeat's read does not see it, and its insert waits for it.
    let mut writer = db.connect().await;
    let table = format!("{}.postponed", db.schema);
    for statements in [
        format!(
            "CREATE TEMP TABLE written AS SELECT * FROM {table} WHERE validation_id = 91; \
             DELETE FROM {table} WHERE validation_id = 91"
        ),
        format!("BEGIN; INSERT INTO {table} SELECT * FROM written"),
    ] {
        sqlx::raw_sql(&statements)
            .execute(&mut writer)
            .await
            .unwrap();
    }
    let store = b.shared.clone();
    let repeat = tokio::spawn(async move {
        store
            .repeat(&validation("p-90", 91, "10"), Utc::now())
            .await
    });
    let behind_the_writer = format!(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid' \
         AND pid <> pg_backend_pid() AND EXISTS (SELECT 1 FROM pg_stat_activity a \
           WHERE a.pid = pg_locks.pid AND a.query LIKE '%INSERT INTO {table}%')"
    );
    db.until_counted(
        &behind_the_writer,
        "the repeat waiting for the other insert",
        || repeat.is_finished(),
    )
    .await;
    sqlx::raw_sql("COMMIT").execute(&mut writer).await.unwrap();
    assert_eq!(repeat.await.unwrap().unwrap(), Repeat::Taken);
    let original = b.shared.postponed(90.into()).await.unwrap().unwrap();
    assert!(original.repeats.is_empty(), "{:?}", original.repeats);
    let other = b.shared.postponed(91.into()).await.unwrap().unwrap();
    assert_eq!(
        (other.request.nonce().as_str(), other.repeat_of),
        ("p-91", None)
    );
    b.shared
        .resolve(90.into(), &Decision::allow("checked"), None, Utc::now())
        .await
        .unwrap();
    assert_eq!(
        states_of(&b, &[90, 91]).await,
        [PostponedState::Queued, PostponedState::Pending],
        "the other payment is still undecided"
    );
    drop(writer);
    b.finish().await;
}

/// PostgreSQL only: a nonce validated again once its record expired (a new payment under
/// it; the earlier validation's record, touched later, is kept longer), under a lower id
/// than before — the aggregator's ids need not grow with time. A repeat of it is linked to
/// the validation received last, which holds the nonce's decision; it was linked to the one
/// of the higher id, and that other payment's result was posted under the repeat's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_is_linked_to_its_nonces_latest_validation_whatever_the_ids() {
    let Some(b) = Backend::postgres("repeat_of_the_latest").await else {
        return;
    };
    postpone_request(&b, validation("reused", 200, "10")).await;
    b.shared
        .resolve(200.into(), &Decision::allow("checked"), None, Utc::now())
        .await
        .unwrap();
    // The nonce's record expired and was purged.
    let mut conn = b.db.as_ref().unwrap().connect().await;
    let schema = &b.db.as_ref().unwrap().schema;
    sqlx::raw_sql(&format!(
        "DELETE FROM {schema}.validations WHERE nonce_key = 'reused'; \
         DELETE FROM {schema}.validation_claims WHERE nonce_key = 'reused'"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    drop(conn);
    postpone_request(&b, validation("reused", 100, "20")).await;
    assert_eq!(
        b.shared
            .repeat(&validation("reused", 300, "20"), Utc::now())
            .await
            .unwrap(),
        Repeat::Recorded {
            of: 100.into(),
            decided: false
        }
    );
    let earlier = b.shared.postponed(200.into()).await.unwrap().unwrap();
    assert!(earlier.repeats.is_empty(), "{:?}", earlier.repeats);
    b.finish().await;
}

/// PostgreSQL only: a sweep passes over a callback's record that a claim holds (a new
/// status of an expired nonce, its handler running) rather than wait for it: the wait
/// outlasted the statement timeout and failed the whole sweep, every other table's expired
/// rows and the failing count's fold with it. The record goes at a later sweep, once free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_passes_over_a_record_a_claim_holds() {
    let Some(db) = support::postgres::database("sweep_passes_a_claim").await else {
        return;
    };
    let mut config = db.store_config(RETENTION);
    config.statement_timeout = Duration::from_millis(500);
    // Opened on a task of its own, as a service that opens its store off `main` does: the
    // open's future is `Send` (its migrations' statements were not, before).
    let opened = tokio::spawn(async move { payhook::store::PgStore::open(&config, TREES).await });
    let store: Arc<dyn Store> = Arc::new(opened.await.unwrap().unwrap());
    for nonce in ["n-held", "n-free"] {
        let nonce = Nonce::from(nonce);
        let CallbackBegin::Claimed { claim, .. } = store
            .begin_callback(&nonce, TransactionStatus::Success, STALE)
            .await
            .unwrap()
        else {
            panic!("not claimed");
        };
        book(store.as_ref(), &nonce, claim).await;
    }
    let held = Nonce::from("n-held");
    let returned = TransactionStatus::from_code(-2);
    let CallbackBegin::Claimed { claim, .. } =
        store.begin_callback(&held, returned, STALE).await.unwrap()
    else {
        panic!("the new status was not claimed");
    };
    let expired = Utc::now() + TimeDelta::from_std(RETENTION).unwrap() + TimeDelta::hours(1);
    let purged = store.purge_expired(expired).await.unwrap();
    assert_eq!(purged, 1, "the free record, not the held one");
    store
        .finish_callback(&held, claim, returned, Effects::default())
        .await
        .unwrap();
    assert!(store.callback_acknowledged(&held, returned).await.unwrap());
    assert_eq!(store.purge_expired(expired).await.unwrap(), 1, "once free");
    drop(store);
    db.drop_schema().await;
}

/// PostgreSQL only: claims are per schema. Two services sharing one database, each in its
/// own schema, claim and book the same nonce independently: a claim's lock is named by
/// the schema as well as the nonce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_in_two_schemas_of_one_database_claim_the_same_nonce_independently() {
    let (Some(first), Some(second)) = (
        support::postgres::database("two_schemas_first").await,
        support::postgres::database("two_schemas_second").await,
    ) else {
        return;
    };
    let open = |db: &TestDb| {
        let config = db.store_config(RETENTION);
        async move {
            ConfiguredStore::open(&config, TREES)
                .await
                .unwrap()
                .shared()
        }
    };
    let (one, other) = (open(&first).await, open(&second).await);
    let nonce = Nonce::from("n-1");
    let (CallbackBegin::Claimed { claim: a, .. }, CallbackBegin::Claimed { claim: b, .. }) = (
        one.begin_callback(&nonce, TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        other
            .begin_callback(&nonce, TransactionStatus::Success, STALE)
            .await
            .unwrap(),
    ) else {
        panic!("a claim in one schema held the nonce in the other");
    };
    for (store, claim) in [(&one, a), (&other, b)] {
        book(store.as_ref(), &nonce, claim).await;
        assert!(
            store
                .callback_acknowledged(&nonce, TransactionStatus::Success)
                .await
                .unwrap()
        );
    }
    drop((one, other));
    first.drop_schema().await;
    second.drop_schema().await;
}

/// PostgreSQL only: a callback's claim holds a pooled connection until its COMMIT. A claim
/// neither finished nor released (a delivery lost to a bug) holds it only until it has
/// outlived its stale time: the sweeper gives it up (its transaction rolls back, its
/// connection closes), and new deliveries find connections again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_never_finished_gives_its_connection_back_once_stale() {
    let Some(db) = support::postgres::database("a_claim_never_finished").await else {
        return;
    };
    let store = small_pool(&db, 2, Duration::from_millis(100)).await;
    // Longer than a wait for a connection, so that none is given up while claiming; the
    // claims are never finished.
    let stale = Duration::from_millis(1500);
    let held = claim_until_refused(store.as_ref(), stale).await;
    assert!(held.len() <= 2, "more claims than connections");
    let mut claimed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(CallbackBegin::Claimed { .. }) = store
            .begin_callback(&Nonce::from("n-later"), TransactionStatus::Success, stale)
            .await
        {
            claimed = true;
            break;
        }
    }
    assert!(
        claimed,
        "the stale claims were never given up: no connection came back"
    );
    drop(store);
    db.drop_schema().await;
}

/// A table of the merchant's own in the backend's schema (PostgreSQL), its name, and a
/// connection of the test's to read it.
async fn merchant_rows(b: &Backend) -> (String, sqlx::PgConnection) {
    let db = b.db.as_ref().unwrap();
    let table = format!("{}.merchant_rows", db.schema);
    let mut conn = db.connect().await;
    sqlx::raw_sql(&format!("CREATE TABLE {table} (nonce text PRIMARY KEY)"))
        .execute(&mut conn)
        .await
        .unwrap();
    (table, conn)
}

/// SQL effects are PostgreSQL's: a statement the database refuses is the effect's failure
/// (nothing written, not acknowledged), and on sled such an effect is refused as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_effects_commit_with_the_mark_or_fail_as_the_effects_failure() {
    let sled = Backend::sled().await;
    let effects = Effects::default();
    effects.postgres(|_| Box::pin(async { Ok(()) }));
    let (claim, ..) = sled.claim("n-1", TransactionStatus::Success).await;
    let refused = sled
        .shared
        .finish_callback(
            &Nonce::from("n-1"),
            claim,
            TransactionStatus::Success,
            effects,
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Unsupported(_))),
        "{refused:?}"
    );
    sled.finish().await;

    let Some(b) = Backend::postgres("sql_effects").await else {
        return;
    };
    let (table, mut conn) = merchant_rows(&b).await;
    let insert = |nonce: &'static str, table: String| {
        let effects = Effects::default();
        effects.postgres(move |conn| {
            let table = table.clone();
            Box::pin(async move {
                sqlx::query(&format!("INSERT INTO {table} (nonce) VALUES ($1)"))
                    .bind(nonce)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        });
        effects
    };
    let (claim, ..) = b.claim("n-1", TransactionStatus::Success).await;
    b.shared
        .finish_callback(
            &Nonce::from("n-1"),
            claim,
            TransactionStatus::Success,
            insert("n-1", table.clone()),
        )
        .await
        .unwrap();
    // The same row again violates the key: the effect's failure, and nothing is marked.
    refused_without_a_trace(&b, &mut conn, &table, "n-2", insert("n-1", table.clone())).await;
    // An effect that swallows its statement's error leaves the transaction failed, which
    // PostgreSQL would answer COMMIT for by rolling back: not acknowledged either, and
    // what the effect wrote before is gone.
    let swallowing = insert("n-3", table.clone());
    let again = table.clone();
    swallowing.postgres(move |conn| {
        let table = again.clone();
        Box::pin(async move {
            let _ignored = sqlx::query(&format!("INSERT INTO {table} (nonce) VALUES ('n-1')"))
                .execute(&mut *conn)
                .await;
            Ok(())
        })
    });
    refused_without_a_trace(&b, &mut conn, &table, "n-3", swallowing).await;
    // An effect that panics after its statement fails its callback as one that aborts, as
    // a tree effect's panic does: it used to unwind the delivery past its failure's record.
    let panicking = insert("n-4", table.clone());
    panicking.postgres(|_| Box::pin(async { panic!("the merchant's effect panicked") }));
    refused_without_a_trace(&b, &mut conn, &table, "n-4", panicking).await;
    drop(conn);
    b.finish().await;
}

/// PostgreSQL only: SQL that holds a result instead of booking it writes what it wrote with
/// the mark, and says why; SQL that books it says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_that_holds_a_result_commits_it_with_the_mark_and_says_why() {
    let Some(b) = Backend::postgres("sql_holds").await else {
        return;
    };
    let (table, mut conn) = merchant_rows(&b).await;
    let aside = |nonce: &'static str, hold: bool| {
        let effects = Effects::default();
        let table = table.clone();
        effects.postgres_book(move |conn| {
            let table = table.clone();
            Box::pin(async move {
                sqlx::query(&format!("INSERT INTO {table} (nonce) VALUES ($1)"))
                    .bind(nonce)
                    .execute(&mut *conn)
                    .await?;
                Ok(if hold {
                    Booking::held("a currency these books do not keep")
                } else {
                    Booking::Booked
                })
            })
        });
        effects
    };
    let held = aside("n-held", true);
    b.acknowledge("n-held", TransactionStatus::Success, held.clone())
        .await;
    assert_eq!(
        held.held().as_deref(),
        Some("a currency these books do not keep")
    );
    let booked = aside("n-booked", false);
    b.acknowledge("n-booked", TransactionStatus::Success, booked.clone())
        .await;
    assert_eq!(booked.held(), None);
    let rows: Vec<(String,)> = sqlx::query_as(&format!("SELECT nonce FROM {table} ORDER BY nonce"))
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, [("n-booked".to_owned(),), ("n-held".to_owned(),)]);
    for nonce in ["n-held", "n-booked"] {
        assert!(
            b.shared
                .callback_acknowledged(&Nonce::from(nonce), TransactionStatus::Success)
                .await
                .unwrap()
        );
    }
    let kept = b.shared.held_callbacks(10).await.unwrap();
    assert_eq!(
        kept.iter()
            .map(|h| (h.nonce.as_str(), h.reason.as_str()))
            .collect::<Vec<_>>(),
        [("n-held", "a currency these books do not keep")],
        "kept with the mark, by SQL effects too"
    );
    drop(conn);
    b.finish().await;
}

/// A statement of a booking that outlasts `store.statement_timeout` (here the merchant's
/// insert, waiting on a row another transaction holds) fails the callback, not the store:
/// nothing of the booking is written or acknowledged, and once the other transaction is
/// gone the next delivery books it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_inside_a_booking_writes_nothing_and_the_next_delivery_books_once() {
    let Some(db) = support::postgres::database("statement_timeout").await else {
        return;
    };
    let mut config = db.store_config(RETENTION);
    config.statement_timeout = Duration::from_millis(300);
    let store = ConfiguredStore::open(&config, TREES).await.unwrap();
    let b = Backend {
        shared: store.shared(),
        store,
        _dir: None,
        db: Some(db.clone()),
    };
    let (table, mut conn) = merchant_rows(&b).await;
    let insert = || {
        let effects = Effects::default();
        let table = table.clone();
        effects.postgres(move |conn| {
            let table = table.clone();
            Box::pin(async move {
                sqlx::query(&format!("INSERT INTO {table} (nonce) VALUES ('n-1')"))
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        });
        effects
    };
    // Another transaction holds the row the booking's insert needs, uncommitted.
    let mut holder = db.connect().await;
    sqlx::raw_sql(&format!(
        "BEGIN; INSERT INTO {table} (nonce) VALUES ('n-1')"
    ))
    .execute(&mut holder)
    .await
    .unwrap();
    let nonce = Nonce::from("n-1");
    let (claim, attempt, _) = b.claim("n-1", TransactionStatus::Success).await;
    assert_eq!(attempt, 1);
    let timed_out = b
        .shared
        .finish_callback(&nonce, claim, TransactionStatus::Success, insert())
        .await;
    let error = payhook::Report::new(&timed_out.unwrap_err()).to_string();
    assert!(error.contains("statement timeout"), "{error}");
    assert!(
        !b.shared
            .callback_acknowledged(&nonce, TransactionStatus::Success)
            .await
            .unwrap()
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();
    let count = format!("SELECT count(*) FROM {table}");
    let rows: i64 = sqlx::query_scalar(&count)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the timed-out booking wrote nothing");

    let (claim, attempt, _) = b.claim("n-1", TransactionStatus::Success).await;
    assert_eq!(attempt, 2, "the failed delivery is counted");
    b.shared
        .finish_callback(&nonce, claim, TransactionStatus::Success, insert())
        .await
        .unwrap();
    assert!(
        b.shared
            .callback_acknowledged(&nonce, TransactionStatus::Success)
            .await
            .unwrap()
    );
    assert_eq!(
        b.shared
            .begin_callback(&nonce, TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Duplicate
    );
    let rows: i64 = sqlx::query_scalar(&count)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, 1, "booked once");
    drop((conn, holder));
    b.finish().await;
}

/// An effect that ends payhook's transaction (sqlx's `begin()` on the connection, whose
/// `rollback()` is then a ROLLBACK of the whole booking, mark included) is refused, never
/// acknowledged: a 200 would leave a callback without its mark, to be run again. Savepoints
/// of the effect's own work as expected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_that_ends_the_transaction_of_its_booking_is_refused() {
    let Some(b) = Backend::postgres("an_effect_that_ends").await else {
        return;
    };
    let (table, _conn) = merchant_rows(&b).await;
    let effects = |nonce: &'static str, end_with: &'static str| {
        let effects = Effects::default();
        let table = table.clone();
        effects.postgres(move |conn| {
            let table = table.clone();
            Box::pin(async move {
                let insert = format!("INSERT INTO {table} (nonce) VALUES ($1)");
                match end_with {
                    "savepoint" => {
                        sqlx::query("SAVEPOINT attempt").execute(&mut *conn).await?;
                        let _duplicate = sqlx::query(&insert).bind("n-0").execute(&mut *conn).await;
                        sqlx::query("ROLLBACK TO SAVEPOINT attempt")
                            .execute(&mut *conn)
                            .await?;
                    }
                    nested => {
                        let mut nested_tx = sqlx::Connection::begin(&mut *conn).await?;
                        let _duplicate = sqlx::query(&insert)
                            .bind("n-0")
                            .execute(&mut *nested_tx)
                            .await;
                        if nested == "rollback" {
                            nested_tx.rollback().await?;
                        } else {
                            nested_tx.commit().await?;
                        }
                    }
                }
                sqlx::query(&insert).bind(nonce).execute(&mut *conn).await?;
                Ok(())
            })
        });
        effects
    };
    b.acknowledge(
        "n-0",
        TransactionStatus::Success,
        effects("n-0", "savepoint"),
    )
    .await;
    for (nonce, end_with) in [("n-1", "rollback"), ("n-2", "commit")] {
        let (claim, ..) = b.claim(nonce, TransactionStatus::Success).await;
        let refused = b
            .shared
            .finish_callback(
                &Nonce::from(nonce),
                claim,
                TransactionStatus::Success,
                effects(nonce, end_with),
            )
            .await;
        let Err(StoreError::Aborted { reason }) = &refused else {
            panic!("{end_with}: {refused:?}");
        };
        assert!(reason.contains("ended by one of its effects"), "{reason}");
    }
    // The booking whose effect rolled its transaction back left no mark: a repeat runs the
    // handler again (what the effect wrote after its ROLLBACK committed on its own, as the
    // refusal says).
    assert!(
        !b.shared
            .callback_acknowledged(&Nonce::from("n-1"), TransactionStatus::Success)
            .await
            .unwrap()
    );
    b.finish().await;
}

/// An effect whose own transaction commits (sqlx's `begin()` and `commit()` on the
/// connection it is given, as code written for a pool does) would commit payhook's: the mark
/// with what the effect wrote so far, every retry then a duplicate (200) while the effects
/// staged after it never run. Its COMMIT is refused instead (migration 6): nothing is
/// written, nothing acknowledged, and a repeat runs the handler again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_cannot_commit_the_transaction_of_its_booking() {
    let Some(b) = Backend::postgres("an_effect_cannot_commit").await else {
        return;
    };
    let (table, mut conn) = merchant_rows(&b).await;
    let effects = Effects::default();
    let insert = |row: &'static str| format!("INSERT INTO {table} (nonce) VALUES ('{row}')");
    let (first, then) = (insert("committed"), insert("after"));
    effects.postgres(move |conn| {
        let first = first.clone();
        Box::pin(async move {
            let mut own = sqlx::Connection::begin(&mut *conn).await?;
            sqlx::query(&first).execute(&mut *own).await?;
            own.commit().await?;
            Ok(())
        })
    });
    effects.postgres(move |conn| {
        let then = then.clone();
        Box::pin(async move {
            sqlx::query(&then).execute(&mut *conn).await?;
            Ok(())
        })
    });
    let nonce = Nonce::from("n-commits");
    let (claim, ..) = b.claim("n-commits", TransactionStatus::Success).await;
    let refused = b
        .shared
        .finish_callback(&nonce, claim, TransactionStatus::Success, effects)
        .await;
    let Err(StoreError::Aborted { reason }) = &refused else {
        panic!("{refused:?}");
    };
    assert!(reason.contains("payhook commits it"), "{reason}");
    assert!(
        !b.shared
            .callback_acknowledged(&nonce, TransactionStatus::Success)
            .await
            .unwrap(),
        "acknowledged with its effects half run"
    );
    let rows: Vec<String> = sqlx::query_scalar(&format!("SELECT nonce FROM {table}"))
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert!(rows.is_empty(), "{rows:?} committed");
    // The repeat claims the pair again: its handler runs.
    let (claim, ..) = b.claim("n-commits", TransactionStatus::Success).await;
    book(b.shared.as_ref(), &nonce, claim).await;
    drop(conn);
    b.finish().await;
}

/// After an effect that ended payhook's transaction, nothing more is written: neither the
/// booking's own tree writes (which would otherwise commit on their own, each statement its
/// own transaction, before the refusal) nor a later effect's SQL. A repeat runs the handler
/// again, and whatever such writes had committed would be booked twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_written_after_an_effect_ended_the_transaction_of_its_booking() {
    let Some(b) = Backend::postgres("nothing_after_an_ended").await else {
        return;
    };
    let (table, mut conn) = merchant_rows(&b).await;
    let effects = |then: &str| {
        let effects = Effects::default();
        if then == "tree first" {
            // Staged before the effect that ends the transaction: written with the booking's
            // own statement, after it.
            let ledger = b.store.tree("ledger").unwrap();
            effects.write(move |tx| tx.insert(&ledger, b"c-before", &7i64.to_be_bytes()));
        }
        effects.postgres(|conn| {
            Box::pin(async move {
                // The common shape: begin, find the work done already, return (dropped: a
                // ROLLBACK of payhook's transaction, sent before the next statement).
                let _nested = sqlx::Connection::begin(&mut *conn).await?;
                Ok(())
            })
        });
        if then == "tree" {
            let ledger = b.store.tree("ledger").unwrap();
            effects.write(move |tx| tx.insert(&ledger, b"c-after", &5i64.to_be_bytes()));
        } else if then == "sql" {
            let table = table.clone();
            effects.postgres(move |conn| {
                let table = table.clone();
                Box::pin(async move {
                    sqlx::query(&format!("INSERT INTO {table} (nonce) VALUES ('after')"))
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                })
            });
        }
        effects
    };
    for (nonce, then) in [
        ("n-tree", "tree"),
        ("n-sql", "sql"),
        ("n-tree-first", "tree first"),
    ] {
        let (claim, ..) = b.claim(nonce, TransactionStatus::Success).await;
        let refused = b
            .shared
            .finish_callback(
                &Nonce::from(nonce),
                claim,
                TransactionStatus::Success,
                effects(then),
            )
            .await;
        let Err(StoreError::Aborted { reason }) = &refused else {
            panic!("{then}: {refused:?}");
        };
        assert!(reason.contains("ended by one of its effects"), "{reason}");
    }
    assert_eq!(b.balance("c-after").await, 0, "the tree write committed");
    assert_eq!(
        b.balance("c-before").await,
        0,
        "the earlier tree write committed"
    );
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the later effect's SQL committed");
    drop(conn);
    b.finish().await;
}

/// Claims `nonce` and finishes it with `effects`, which must fail as the effects' failure:
/// not acknowledged, and `table` still holds its one row.
async fn refused_without_a_trace(
    b: &Backend,
    conn: &mut sqlx::PgConnection,
    table: &str,
    nonce: &str,
    effects: Effects,
) {
    let (claim, ..) = b.claim(nonce, TransactionStatus::Success).await;
    let nonce = Nonce::from(nonce);
    let refused = b
        .shared
        .finish_callback(&nonce, claim, TransactionStatus::Success, effects)
        .await;
    assert!(
        matches!(refused, Err(StoreError::Aborted { .. })),
        "{refused:?}"
    );
    assert!(
        !b.shared
            .callback_acknowledged(&nonce, TransactionStatus::Success)
            .await
            .unwrap()
    );
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(rows, 1, "the refused transaction wrote nothing");
    // The refused delivery is counted: the next one is the second attempt.
    let (claim, attempt, _) = b.claim(nonce.as_str(), TransactionStatus::Success).await;
    assert_eq!(attempt, 2);
    b.shared.release_callback(&nonce, claim).await.unwrap();
}

/// TLS to the database (managed PostgreSQL requires it), on rustls: `sslmode=require`
/// encrypts every connection of the store; `sslmode=verify-full` refuses a server whose
/// certificate no trusted root signed (here: the test server's self-signed one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_to_the_database_use_tls_and_verify_it_when_asked() {
    let Some(db) = support::postgres::database("tls_to_the_database").await else {
        return;
    };
    let mut conn = db.connect().await;
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    if ssl != "on" {
        assert!(
            std::env::var_os("CI").is_none(),
            "the test PostgreSQL has ssl = {ssl}: CI must test TLS (Debian's default is on)"
        );
        support::announce_skip(
            "connections_to_the_database_use_tls",
            &format!("the test PostgreSQL has ssl = {ssl}"),
        );
        return;
    }
    let separator = if db.url.contains('?') { '&' } else { '?' };
    let mut config = db.store_config(RETENTION);
    config.url = Some(format!("{}{separator}sslmode=require", db.url).into());
    let store = payhook::store::PgStore::open(&config, &[]).await.unwrap();
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    shared
        .begin_callback(&Nonce::from("tls-1"), TransactionStatus::Success, STALE)
        .await
        .unwrap();
    // The store's own connection, as the database sees it.
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert!(encrypted, "the store's connection is encrypted");
    drop((shared, store));

    config.url = Some(format!("{}{separator}sslmode=verify-full", db.url).into());
    config.connect_timeout = Duration::from_secs(2);
    let refused = payhook::store::PgStore::open(&config, &[]).await;
    assert!(refused.is_err(), "an untrusted certificate is refused");
    drop(conn);
    db.drop_schema().await;
}

behaviour!(a_failure_recorded_while_its_status_is_being_booked_is_not_listed_after);
async fn a_failure_recorded_while_its_status_is_being_booked_is_not_listed_after(b: &Backend) {
    // A refused body of the pair arrives while a delivery (or a reconcile) books it: the
    // failure, recorded beside the open booking, does not outlive it in the listing, and
    // the sweep removes it.
    let nonce = Nonce::from("n-racing");
    let (claim, _, _) = b.claim("n-racing", TransactionStatus::Success).await;
    b.shared
        .record_callback_failure(failure("n-racing", "body refused"))
        .await
        .unwrap();
    book(b.shared.as_ref(), &nonce, claim).await;
    // A backend may write the failure without waiting: give it the time to land.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(b.shared.failing_callbacks().await.unwrap().is_empty());
    assert!(b.shared.failing_latest(10).await.unwrap().is_empty());
    b.shared.purge_expired(Utc::now()).await.unwrap();
    assert_eq!(b.shared.failing_count().await.unwrap(), 0);
}

behaviour!(a_failure_recorded_beside_a_booking_is_forgotten_once_it_commits);
async fn a_failure_recorded_beside_a_booking_is_forgotten_once_it_commits(b: &Backend) {
    // A delivery that gave up waiting for the pair's booking records it as failing; the
    // booking then commits. Asked to forget the failure of a booked pair, every backend
    // leaves it neither listed nor counted; a pair not booked keeps its failure.
    let nonce = Nonce::from("n-beside");
    let (claim, _, _) = b.claim("n-beside", TransactionStatus::Success).await;
    b.shared
        .record_callback_failure(failure("n-beside", "still being processed"))
        .await
        .unwrap();
    b.shared
        .record_callback_failure(failure("n-unbooked", "handler failed"))
        .await
        .unwrap();
    failing_until(b, 2).await;
    book(b.shared.as_ref(), &nonce, claim).await;
    for pair in ["n-beside", "n-unbooked"] {
        b.shared
            .forget_failure_if_booked(&Nonce::from(pair), TransactionStatus::Success)
            .await
            .unwrap();
    }
    let failing = b.shared.failing_callbacks().await.unwrap();
    assert_eq!(failing.len(), 1, "{failing:?}");
    assert_eq!(failing[0].nonce.as_str(), "n-unbooked");
    assert_eq!(
        b.shared.failing_count().await.unwrap(),
        1,
        "the count follows"
    );
}

behaviour!(a_body_refused_while_its_status_is_being_booked_is_not_counted_as_failing);
async fn a_body_refused_while_its_status_is_being_booked_is_not_counted_as_failing(b: &Backend) {
    // A copy of the pair whose body is refused (400) arrives while a reconcile books it:
    // its failure is recorded after the booking ends, which its check then sees.
    let nonce = Nonce::from("n-refused");
    let (claim, _, _) = b.claim("n-refused", TransactionStatus::Success).await;
    let refused = tokio::spawn({
        let store = Arc::clone(&b.shared);
        async move {
            store
                .record_refused_callback(failure("n-refused", "body refused"))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    book(b.shared.as_ref(), &nonce, claim).await;
    refused.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(b.shared.failing_callbacks().await.unwrap().is_empty());
    assert_eq!(b.shared.failing_count().await.unwrap(), 0, "nor counted");
}

/// The schema is written into every statement payhook sends: one that is no plain
/// identifier is refused before anything is sent, also when the configuration was built in
/// code (where `Config`'s validation never ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_that_is_no_plain_identifier_is_refused_however_the_configuration_was_made() {
    let Some(db) = support::postgres::database("schema_refused").await else {
        return;
    };
    let mut config = db.store_config(RETENTION);
    config.schema = format!("{}; DROP SCHEMA {} CASCADE; --", db.schema, db.schema);
    let opened = payhook::store::PgStore::open(&config, &[]).await;
    let Err(refused) = opened else {
        panic!("a schema of SQL was opened");
    };
    assert!(refused.to_string().contains("store.schema"), "{refused}");
    let refused = payhook::store::PgStore::migrate(&config).await.unwrap_err();
    assert!(refused.to_string().contains("store.schema"), "{refused}");
    db.drop_schema().await;
}

/// Migrating waits as long as it needs, not `store.statement_timeout`: an instance that
/// starts while another migrates waits for it (here the migrations' lock is held past the
/// timeout), where it used to fail to open — as a rewrite of a large table stopped by the
/// timeout would fail on every start. The pool's connections keep their limit after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_is_not_bounded_by_the_statement_timeout() {
    let Some(db) = support::postgres::database("migrating_unbounded").await else {
        return;
    };
    let mut config = db.store_config(Duration::from_secs(3600));
    config.statement_timeout = Duration::from_millis(500);
    let mut holder = db.connect().await;
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
        .bind(format!("payhook migrations {}", db.schema))
        .execute(&mut holder)
        .await
        .unwrap();
    let release = async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        sqlx::query("SELECT pg_advisory_unlock_all()")
            .execute(&mut holder)
            .await
            .unwrap();
    };
    let (opened, ()) = tokio::join!(payhook::store::PgStore::open(&config, &[]), release);
    let store = opened.unwrap();
    let timeout: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(timeout, "500ms", "the pool's limit is kept");
    drop((store, holder));
    db.drop_schema().await;
}

/// An open given up while it migrates (its future dropped: a start-up deadline, a service
/// shutting down) leaves nothing on the merchant's pool: the connection it migrated on had
/// its statements unbounded and was waiting for (or holding) the migrations' lock; back in
/// the pool, its next user ran unbounded and a later instance's migration waited on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_given_up_while_migrating_leaves_the_pool_as_it_was() {
    let Some(db) = support::postgres::database("migrating_given_up").await else {
        return;
    };
    let pool = support::postgres::pool_at(&db.url, 1, &[("statement_timeout", "5000")]).await;
    let mut holder = db.connect().await;
    let lock = format!("payhook migrations {}", db.schema);
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
        .bind(&lock)
        .execute(&mut holder)
        .await
        .unwrap();
    // The migrations' lock as pg_locks shows it (a bigint key: its halves).
    let on_lock = format!(
        "locktype = 'advisory' AND objsubid = 1 \
           AND classid = ((hashtextextended('{lock}', 0) >> 32) & 4294967295)::oid \
           AND objid = (hashtextextended('{lock}', 0) & 4294967295)::oid"
    );
    let config = db.store_config(RETENTION);
    let mut opening = Box::pin(payhook::store::PgStore::with_pool(
        pool.clone(),
        &config,
        TREES,
    ));
    let waiting = format!("SELECT count(*) FROM pg_locks WHERE {on_lock} AND NOT granted");
    tokio::select! {
        opened = &mut opening => panic!("opened while the lock is held: {:?}", opened.err()),
        () = db.until_counted(&waiting, "the open waiting for the migrations' lock", || false) => {}
    }
    // Given up while waiting for the lock, its statements unbounded.
    drop(opening);
    sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut holder)
        .await
        .unwrap();
    let timeout: String = sqlx::query_scalar("SELECT current_setting('statement_timeout')")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(timeout, "5s", "the pool's connection keeps its limit");
    // The given-up connection's backend takes the lock it was waiting for, finds its
    // client gone and ends, letting it go.
    db.until_counted(
        &format!("SELECT 1 - count(*) FROM pg_locks WHERE {on_lock}"),
        "the migrations' lock let go by everyone",
        || false,
    )
    .await;
    let store = payhook::store::PgStore::with_pool(pool, &config, TREES)
        .await
        .unwrap();
    drop((store, holder));
    db.drop_schema().await;
}

/// A migration that must lock a table requests hold (migration 6 adds a trigger to
/// `callbacks`, whose rows each booking writes while its handler runs) waits for it a
/// moment at a time: while it waits, every request's statement on that table waits behind
/// it, so it gives way and tries again rather than stall the service's bookings for as
/// long as the longest booking in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_gives_way_to_requests_while_it_waits_for_its_lock() {
    use sqlx::Connection as _;
    let Some(db) = support::postgres::database("migration_gives_way").await else {
        return;
    };
    let config = db.store_config(Duration::from_secs(3600));
    payhook::store::PgStore::migrate(&config).await.unwrap();
    // The schema as version 5 left it.
    let mut admin = db.connect().await;
    sqlx::raw_sql(&format!(
        "DROP TRIGGER booking_committed_by_payhook ON {0}.callbacks; \
         DELETE FROM {0}.schema_migrations WHERE version = 6",
        db.schema
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    // A booking in flight holds `callbacks` until the test lets it go.
    let lock = format!("LOCK TABLE {}.callbacks IN ROW EXCLUSIVE MODE", db.schema);
    let mut in_flight = db.connect().await;
    let mut holding = in_flight.begin().await.unwrap();
    sqlx::raw_sql(&lock).execute(&mut *holding).await.unwrap();
    let migrating = tokio::spawn({
        let config = config.clone();
        async move { payhook::store::PgStore::migrate(&config).await }
    });
    let beside = async {
        // The migration waits for its lock...
        let waiting = format!(
            "SELECT count(*) FROM pg_locks \
             WHERE NOT granted AND relation = '{}.callbacks'::regclass",
            db.schema
        );
        db.until_counted(&waiting, "the migration's wait", || migrating.is_finished())
            .await;
        // ... and a new booking's statement on the table gets through meanwhile.
        let mut next = db.connect().await;
        let mut booking = next.begin().await.unwrap();
        tokio::time::timeout(
            support::DEADLINE,
            sqlx::raw_sql(&lock).execute(&mut *booking),
        )
        .await
        .expect("a new booking waited behind the migration")
        .unwrap();
        booking.rollback().await.unwrap();
        holding.rollback().await.unwrap();
    };
    beside.await;
    assert_eq!(migrating.await.unwrap().unwrap(), [6]);
    drop((admin, in_flight));
    db.drop_schema().await;
}

/// A schema held results were kept in before who resolved them was (no `callbacks_held_by`)
/// gets the table at the next open, and a resolution keeps its name from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_from_before_names_were_kept_keeps_them_once_reopened() {
    let Some(b) = Backend::postgres("a_schema_from_before_names").await else {
        return;
    };
    let effects = Effects::default();
    effects.book(|_| Ok(Booking::held("kept aside")));
    b.acknowledge("n-1", TransactionStatus::Success, effects)
        .await;
    let db = b.db.clone().unwrap();
    let mut conn = db.connect().await;
    sqlx::query(&format!("DROP TABLE {}.callbacks_held_by", db.schema))
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);
    let b = b.opened_again_with(RETENTION).await;
    let resolved = b
        .shared
        .resolve_held(
            &Nonce::from("n-1"),
            TransactionStatus::Success,
            "booked by hand",
            Some("Frank"),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resolved.resolved_by.as_deref(), Some("Frank"));
    b.finish().await;
}

/// A validation whose postponed record does not decode is read back as an error — a success
/// is not booked past it — not as a decision no longer known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_whose_postponed_record_does_not_decode_is_not_read_as_unknown() {
    let Some(b) = Backend::postgres("a_validation_whose_postponed").await else {
        return;
    };
    postpone(&b, 31).await;
    spoil_postponed(&b, 31).await;
    let read = b.shared.validated_payment(&Nonce::from("p-31")).await;
    assert!(matches!(read, Err(StoreError::Corrupt { .. })), "{read:?}");
    b.finish().await;
}

/// Writes over postponed validation `id`'s record (PostgreSQL) with JSON that is no record.
async fn spoil_postponed(b: &Backend, id: i64) {
    let db = b.db.as_ref().unwrap();
    let mut conn = db.connect().await;
    sqlx::query(&format!(
        "UPDATE {}.postponed SET record = '{{\"not\": \"a record\"}}'::json \
         WHERE validation_id = {id}",
        db.schema
    ))
    .execute(&mut conn)
    .await
    .unwrap();
}

/// A postponed record the database holds but payhook cannot decode (written by hand, or by a
/// newer payhook) is left out of what is due, and moved an hour on, rather than failing
/// every pass of the outbox or coming first in every batch: the other results go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_postponed_record_keeps_no_other_result_from_delivery() {
    let Some(b) = Backend::postgres("an_unreadable_postponed").await else {
        return;
    };
    for id in [21, 22] {
        postpone(&b, id).await;
        let allow = Decision::allow("checked");
        assert_eq!(
            b.shared
                .resolve(id.into(), &allow, None, Utc::now())
                .await
                .unwrap(),
            Resolution::Recorded
        );
    }
    spoil_postponed(&b, 21).await;
    let db = b.db.as_ref().unwrap();
    let mut conn = db.connect().await;
    let due = b.shared.outbox_due(Utc::now()).await.unwrap();
    let ids: Vec<i64> = due.now.iter().map(|r| r.validation_id.get()).collect();
    assert_eq!(ids, [22]);
    let left_for: f64 = sqlx::query_scalar(&format!(
        "SELECT extract(epoch FROM deliver_at - now())::float8 FROM {}.postponed \
         WHERE validation_id = 21",
        db.schema
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!((3_500.0..=3_600.0).contains(&left_for), "{left_for}");
    drop(conn);
    b.finish().await;
}

/// A tree name no backend can keep (a NUL byte: PostgreSQL's `text` cannot hold it) is
/// refused when the store opens, on both backends, not at the first callback that writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_name_with_a_nul_byte_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let sled = StoreConfig {
        path: dir.path().join("store"),
        ..StoreConfig::default()
    };
    let refused = payhook::store::SledStore::open(&sled, &["ledger\0x"])
        .unwrap_err()
        .to_string();
    assert!(refused.contains("NUL byte"), "{refused}");
    let Some(db) = support::postgres::database("nul_tree_name").await else {
        return;
    };
    let refused = payhook::store::PgStore::open(&db.store_config(RETENTION), &["ledger\0x"])
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("NUL byte"), "{refused}");
    db.drop_schema().await;
}

/// That `reach` is `expected`, or less by the time taken since it was recorded (a minute at
/// most): the records written then have come that much closer to their expiry.
fn assert_reach_near(reach: Duration, expected: Duration) {
    assert!(
        reach <= expected && reach + Duration::from_secs(60) > expected,
        "{reach:?}, not {expected:?}"
    );
}

/// A store opened again with a longer retention reaches back only as far as the records
/// written before were kept (each keeps the expiry it was written with), opened again with
/// the same still so, and with a shorter one reaches that. A missing record proves nothing
/// beyond the reach: a callback or a reconcile older than it is not booked again. An
/// operator's command that opens the store with a shorter retention reads the record and
/// leaves it, and writes with the store's, so that what it books is kept as long as the
/// service vouches for: the service opened again with its own finds what it wrote.
async fn a_longer_retention_reaches_back_only_as_far_as_the_records_kept(b: Backend) {
    let near = assert_reach_near;
    near(b.shared.reach(), RETENTION);
    let shorter = b.config_with(RETENTION / 2);
    let b = b
        .reopened(RETENTION, async move {
            let operator = ConfiguredStore::open_existing(&shorter, TREES)
                .await
                .unwrap();
            assert_eq!(operator.shared().retention(), RETENTION);
            near(operator.shared().reach(), RETENTION);
        })
        .await;
    near(b.shared.reach(), RETENTION);
    let b = b.opened_again_with(48 * RETENTION).await;
    near(b.shared.reach(), RETENTION);
    assert_eq!(b.shared.retention(), 48 * RETENTION);
    let b = b.opened_again_with(48 * RETENTION).await;
    near(b.shared.reach(), RETENTION);
    let b = b.opened_again_with(RETENTION / 2).await;
    near(b.shared.reach(), RETENTION / 2);
    b.finish().await;
}

mod a_longer_retention_reaches_back_only_as_far_as_the_records_kept {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sled() {
        super::a_longer_retention_reaches_back_only_as_far_as_the_records_kept(
            super::Backend::sled().await,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        let Some(backend) = super::Backend::postgres("longer_retention_reach").await else {
            return;
        };
        super::a_longer_retention_reaches_back_only_as_far_as_the_records_kept(backend).await;
    }
}

/// A schema written by a payhook that kept no record of its retention is taken to have been
/// written with the retention it is opened with, as before there was one (upgrade first,
/// raise the retention afterwards): guessing from its newest record would refuse every
/// callback of a schema whose records had all expired. Opened again, what it recorded then
/// stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_that_kept_no_record_of_its_retention_is_taken_at_its_retention() {
    let Some(b) = Backend::postgres("no_record_of_retention").await else {
        return;
    };
    b.acknowledge("n-upgraded", TransactionStatus::Success, Effects::default())
        .await;
    let db = b.db.clone().unwrap();
    let b = b
        .reopened(RETENTION, async {
            sqlx::query(&format!("DELETE FROM {}.vouched", db.schema))
                .execute(&mut db.connect().await)
                .await
                .unwrap();
        })
        .await;
    assert_eq!(b.shared.reach(), RETENTION);
    let b = b.opened_again_with(48 * RETENTION).await;
    assert_reach_near(b.shared.reach(), RETENTION);
    b.finish().await;
}

/// A transaction that holds the record of the retention and stalls (an instance frozen
/// between its lock and its commit) does not stop another instance from opening: the
/// record is read, not moved on, after the lock's short wait. (Without the wait the open
/// hung; without the fallback it failed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_lock_on_the_record_of_the_retention_does_not_stop_an_open() {
    let Some(b) = Backend::postgres("stalled_retention_lock").await else {
        return;
    };
    let db = b.db.clone().unwrap();
    let mut stalled = db.connect().await;
    sqlx::raw_sql(&format!(
        "BEGIN; LOCK TABLE {}.vouched IN SHARE ROW EXCLUSIVE MODE",
        db.schema
    ))
    .execute(&mut stalled)
    .await
    .unwrap();
    let beside_the_stalled_lock = |config: StoreConfig| async move {
        let other = tokio::time::timeout(
            Duration::from_secs(30),
            ConfiguredStore::open(&config, TREES),
        )
        .await
        .expect("the open waited for the stalled lock")
        .unwrap();
        assert_reach_near(other.shared().reach(), RETENTION);
    };
    beside_the_stalled_lock(db.store_config(48 * RETENTION)).await;
    // Nor with a statement timeout shorter than the lock's wait (the LOCK is cancelled
    // first).
    beside_the_stalled_lock(StoreConfig {
        statement_timeout: Duration::from_millis(500),
        ..db.store_config(48 * RETENTION)
    })
    .await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut stalled)
        .await
        .unwrap();
    drop(stalled);
    b.finish().await;
}
