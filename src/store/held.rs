//! Results the merchant acknowledged but held instead of booking, kept durably until a
//! person resolves them.
//!
//! A booking effect that returns [`Booking::Held`](super::Booking::Held) (a quarantine) has
//! the callback acknowledged: the aggregator stops retrying, and what the merchant's books
//! lack now depends on a person. So the store writes a [`HeldCallback`] per (nonce, status)
//! in the same atomic write as the callback's mark and the merchant's effects: either all of
//! it is durable or none of it. It waits for a person, who says when the merchant's books
//! are right (`POST /payhook/admin/callbacks/held/resolve`, `payhook callbacks resolve`,
//! the inspector), with a note: the record then keeps when, what was said, and who as they
//! named themselves (one token serves every operator: a name is their word, not a login).
//! It is never purged with the retention, resolved or not: `/metrics` counts the unresolved
//! ones (`payhook_callbacks_held_unresolved`), which an alert follows until it is zero, and
//! a reconcile of a held result says it is held, not booked — or resolved, when, by whom,
//! and the note — after a restart too. A result is held once: the first record of a (nonce,
//! status) stands.
//!
//! Key `h\0` status (4 bytes BE) · the nonce's identifier while it waits, `r\0` and the
//! same once resolved (moved in one batch); value: JSON of [`HeldCallback`]. Held results
//! are exceptions a person resolves one by one: the embedded store counts the waiting ones
//! once at open and then as each batch changes them, and reads them all (never the resolved
//! ones, which only grow) to list them. A record that does not decode is neither listed nor
//! counted (logged).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::StoreError;
use super::failing::{CallbackFailure, REASON_BYTES, readable};
use super::keys;
use super::record::{decode_named, encode};
use super::staging::Overlay;
use crate::logged::cut_bytes;
use crate::model::TransactionStatus;

/// A result acknowledged but held by the merchant's effects, not booked: waiting for a
/// person, or resolved by one (`resolved_at`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldCallback {
    /// The callback's nonce.
    pub nonce: crate::model::Nonce,
    /// The status code the merchant held.
    pub status: i32,
    /// Why, as the merchant's effect said (cut after 512 bytes, with `…`).
    pub reason: String,
    /// When it was acknowledged and held (UTC).
    #[serde(rename = "heldMs", with = "super::epoch_ms")]
    pub held_at: DateTime<Utc>,
    /// The aggregator's reference of the transaction (`payhook reconcile --ref`).
    pub transaction_reference_id: String,
    /// The merchant's client.
    pub client_id: String,
    /// The amount, as received.
    pub amount: String,
    /// The currency.
    pub currency: String,
    /// When a person said the merchant's books were put right; `None` while it waits.
    #[serde(
        rename = "resolvedMs",
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::epoch_ms::option"
    )]
    pub resolved_at: Option<DateTime<Utc>>,
    /// What they said of it (cut after 512 bytes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resolution: String,
    /// Who resolved it, as they named themselves (`payhook callbacks resolve --by`, the
    /// inspector's prompt, the API's `by`; cut after 128 bytes); `None` when not said.
    /// The operating API has one token: a name is a person's word, not a login.
    #[serde(
        rename = "resolvedBy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub resolved_by: Option<String>,
}

/// How many bytes of a resolver's name are kept.
pub(crate) const NAME_BYTES: usize = 128;

/// What a person says when they resolve a held result: what was done (needed), and who
/// they are (when they say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolving {
    pub(crate) note: String,
    pub(crate) by: Option<String>,
}

impl Resolving {
    /// `note` by `by`, kept as the stores keep them: cut, U+0000 as U+FFFD, a name of
    /// blanks taken as none.
    pub(crate) fn new(note: &str, by: Option<&str>) -> Self {
        Self {
            note: kept_text(note),
            by: person(by),
        }
    }
}

/// A person's name as the stores keep it with what they did (a held result resolved, a
/// postponed validation decided): trimmed, cut after 128 bytes, U+0000 as U+FFFD; blanks
/// are no name.
pub(crate) fn person(by: Option<&str>) -> Option<String> {
    by.map(str::trim)
        .filter(|by| !by.is_empty())
        .map(|by| readable(&cut_bytes(by, NAME_BYTES)).into_owned())
}

/// What the server knows of a callback it hands to the store with its effects: the
/// payment an operator needs to resolve it, should it fail or be held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Subject {
    pub(crate) transaction_reference_id: uuid::Uuid,
    pub(crate) client_id: String,
    pub(crate) amount: rust_decimal::Decimal,
    /// As a failure record keeps it ([`CallbackFailure::kept_currency`]).
    pub(crate) currency: String,
}

impl Subject {
    /// The failure of this callback's (`nonce`, `status`), for `reason`, now.
    pub(crate) fn failure(
        &self,
        nonce: &crate::model::Nonce,
        status: TransactionStatus,
        reason: String,
    ) -> CallbackFailure {
        CallbackFailure {
            nonce: nonce.clone(),
            status,
            reason,
            transaction_reference_id: self.transaction_reference_id,
            client_id: self.client_id.clone(),
            amount: self.amount,
            currency: self.currency.clone(),
            at: Utc::now(),
        }
    }
}

impl HeldCallback {
    /// The held result of (`nonce`, `status`) for `reason`, at `at`, of the payment
    /// `subject` (what could not be known of it left empty: the nil reference, a zero
    /// amount, an empty client and currency). Text a person reads is kept as both stores
    /// can: the reason cut after 512 bytes, U+0000 as U+FFFD.
    pub(crate) fn new(
        nonce: &str,
        status: i32,
        reason: &str,
        subject: Option<&Subject>,
        at: DateTime<Utc>,
    ) -> Self {
        let text = |s: &str| readable(s).into_owned();
        Self {
            nonce: nonce.into(),
            status,
            reason: kept_text(reason),
            held_at: to_the_millisecond(at),
            transaction_reference_id: subject
                .map_or(uuid::Uuid::nil(), |s| s.transaction_reference_id)
                .to_string(),
            client_id: subject.map_or_else(String::new, |s| text(&s.client_id)),
            amount: subject
                .map_or(rust_decimal::Decimal::ZERO, |s| s.amount)
                .to_string(),
            currency: subject.map_or_else(String::new, |s| text(&s.currency)),
            resolved_at: None,
            resolution: String::new(),
            resolved_by: None,
        }
    }

    /// Whether it still waits for a person.
    pub fn unresolved(&self) -> bool {
        self.resolved_at.is_none()
    }

    /// This result, resolved at `at` (never before it was held: clocks differ) as
    /// `resolving` says.
    pub(crate) fn resolved(mut self, at: DateTime<Utc>, resolving: &Resolving) -> Self {
        self.resolved_at = Some(to_the_millisecond(at).max(self.held_at));
        self.resolution.clone_from(&resolving.note);
        self.resolved_by.clone_from(&resolving.by);
        self
    }
}

/// Why a note cannot resolve a held result: it says nothing. A resolution is a person's
/// word that the books were put right, read later by whoever reconciles the transaction.
pub(crate) fn note_refused(note: &str) -> Option<&'static str> {
    note.trim()
        .is_empty()
        .then_some("a note saying what was done in the merchant's books is needed")
}

/// Logs, at warn level, that a person resolved `held`, who as they said (`resolver`), and
/// how (`by`: the operating API from an address, or a stopped store's command line).
pub(crate) fn log_resolved(held: &HeldCallback, by: &str) {
    tracing::warn!(
        nonce = %crate::logged::Logged(held.nonce.as_str()),
        status = held.status,
        reason = %crate::Escaped(&held.reason),
        resolution = %crate::Escaped(&held.resolution),
        resolver = %crate::logged::Logged(held.resolved_by.as_deref().unwrap_or("(not said)")),
        by,
        "a held result was resolved by a person: no longer listed nor counted as waiting"
    );
}

/// What a held result is, in words, as it came (escape it to print it): its reason, and
/// when it was resolved and how.
pub(crate) fn told(held: &HeldCallback) -> String {
    match held.resolved_at {
        None => held.reason.clone(),
        Some(at) => format!(
            "{} — resolved {}{}: {}",
            held.reason,
            at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            held.resolved_by
                .as_deref()
                .map_or_else(String::new, |by| format!(" by {by}")),
            held.resolution
        ),
    }
}

/// A time as both stores keep a held result's (and order by it): to the millisecond.
pub(crate) fn to_the_millisecond(at: DateTime<Utc>) -> DateTime<Utc> {
    super::time_from_ms(super::ms_from_time(at))
}

/// Text of a held result a person wrote or reads: cut after 512 bytes, U+0000 as U+FFFD.
pub(crate) fn kept_text(text: &str) -> String {
    readable(&cut_bytes(text, REASON_BYTES)).into_owned()
}

/// Latest first, then by nonce and status: the order every listing of held results has.
pub(crate) fn sort_latest_first(held: &mut [HeldCallback]) {
    held.sort_by(|a, b| {
        b.held_at
            .cmp(&a.held_at)
            .then_with(|| a.nonce.as_str().cmp(b.nonce.as_str()))
            .then_with(|| a.status.cmp(&b.status))
    });
}

/// The key of (`nonce`, `status`)'s held result while it waits for a person.
pub(crate) fn key(nonce: &str, status: i32) -> Vec<u8> {
    key_under(keys::HELD_PREFIX, nonce, status)
}

/// The key of (`nonce`, `status`)'s held result once a person resolved it.
pub(crate) fn resolved_key(nonce: &str, status: i32) -> Vec<u8> {
    key_under(keys::RESOLVED_PREFIX, nonce, status)
}

fn key_under(prefix: &[u8], nonce: &str, status: i32) -> Vec<u8> {
    [prefix, &status.to_be_bytes(), &keys::identifier(nonce)].concat()
}

/// A key and the value to write under it.
pub(crate) type Write = (Vec<u8>, Vec<u8>);

/// A held result as resolved, and the batch's writes that move it there (a removal, an
/// insert).
pub(crate) type Resolution = (HeldCallback, [(Vec<u8>, Option<Vec<u8>>); 2]);

/// The write that keeps `held` (key, value), unless (nonce, status) was held before in
/// `tree` or the batch `overlay`: the first record stands, resolved or not. Only reads, so
/// that a caller can find out before it writes anything.
pub(crate) fn write_of(
    tree: &sled::Tree,
    overlay: &Overlay,
    held: &HeldCallback,
) -> Result<Option<Write>, StoreError> {
    let (nonce, status) = (held.nonce.as_str(), held.status);
    let resolved = super::staging::read(tree, overlay, &resolved_key(nonce, status))?;
    let key = key(nonce, status);
    let waiting = super::staging::read(tree, overlay, &key)?;
    Ok((waiting.is_none() && resolved.is_none()).then(|| (key, encode(held))))
}

/// The held result of (`nonce`, `status`) in `tree`, waiting or resolved, if one is kept.
pub(crate) fn get(
    tree: &sled::Tree,
    nonce: &str,
    status: i32,
) -> Result<Option<HeldCallback>, StoreError> {
    let kept = match tree.get(key(nonce, status))? {
        Some(waiting) => Some(waiting),
        None => tree.get(resolved_key(nonce, status))?,
    };
    kept.map(|bytes| decode_named(&bytes, || describe(nonce, status)))
        .transpose()
}

/// The batch's writes that resolve (`nonce`, `status`)'s held result at `at` as
/// `resolving` says — its record moved from waiting to resolved — and the result as kept
/// then; `None` when none waits.
pub(crate) fn resolve(
    tree: &sled::Tree,
    overlay: &Overlay,
    (nonce, status): (&str, i32),
    at: DateTime<Utc>,
    resolving: &Resolving,
) -> Result<Option<Resolution>, StoreError> {
    let key = key(nonce, status);
    let Some(bytes) = super::staging::read(tree, overlay, &key)? else {
        return Ok(None);
    };
    let held: HeldCallback = decode_named(&bytes, || describe(nonce, status))?;
    let resolved = held.resolved(at, resolving);
    let value = encode(&resolved);
    Ok(Some((
        resolved,
        [(key, None), (resolved_key(nonce, status), Some(value))],
    )))
}

/// Every result in `tree` held and not resolved yet, latest first.
pub(crate) fn unresolved(tree: &sled::Tree) -> Result<Vec<HeldCallback>, StoreError> {
    let mut held = Vec::new();
    for entry in tree.scan_prefix(keys::HELD_PREFIX) {
        let (key, bytes) = entry?;
        held.extend(readable_record(&key, &bytes));
    }
    sort_latest_first(&mut held);
    Ok(held)
}

/// How many results `tree` holds unresolved.
pub(crate) fn count(tree: &sled::Tree) -> Result<usize, StoreError> {
    let mut n = 0;
    for entry in tree.scan_prefix(keys::HELD_PREFIX) {
        let (key, bytes) = entry?;
        n += usize::from(waits(&key, Some(&bytes)));
    }
    Ok(n)
}

/// The unresolved held results a batch's writes add to the store and take away from it.
pub(crate) fn changed(tree: &sled::Tree, writes: &Overlay) -> Result<(usize, usize), StoreError> {
    let (mut added, mut removed) = (0, 0);
    let held = writes
        .range(keys::HELD_PREFIX.to_vec()..)
        .take_while(|(key, _)| key.starts_with(keys::HELD_PREFIX));
    for (key, value) in held {
        let before = waits(key, tree.get(key)?.as_deref());
        match (before, waits(key, value.as_deref())) {
            (false, true) => added += 1,
            (true, false) => removed += 1,
            _ => {}
        }
    }
    Ok((added, removed))
}

/// Whether the record at `key` (if any) is a held result waiting for a person.
fn waits(key: &[u8], bytes: Option<&[u8]>) -> bool {
    bytes
        .and_then(|bytes| readable_record(key, bytes))
        .is_some_and(|held| held.unresolved())
}

/// The record at `key`; one that does not decode is logged and left out.
fn readable_record(key: &[u8], bytes: &[u8]) -> Option<HeldCallback> {
    match decode_named(bytes, || key_name(key)) {
        Ok(held) => Some(held),
        Err(error) => {
            tracing::error!(error = %crate::report::InLine(&error), "a held result's record does not decode; it is neither listed nor counted");
            None
        }
    }
}

fn describe(nonce: &str, status: i32) -> String {
    format!("held {} {status}", crate::logged::Logged(nonce))
}

fn key_name(key: &[u8]) -> String {
    let status = key
        .get(2..6)
        .and_then(|b| b.try_into().ok())
        .map_or(0, i32::from_be_bytes);
    let identifier = key.get(6..).unwrap_or_default();
    format!("held {} {status}", keys::describe(identifier))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolver_s_name_is_kept_trimmed_cut_and_without_u0000_or_not_at_all_when_blank() {
        let kept = |by: &str| Resolving::new("done", Some(by)).by;
        assert_eq!(kept("  Alice  ").as_deref(), Some("Alice"));
        assert_eq!(kept(" \t "), None);
        assert_eq!(kept("a\0b").as_deref(), Some("a\u{fffd}b"));
        let long = kept(&"é".repeat(100)).unwrap();
        assert!(long.len() <= NAME_BYTES + '…'.len_utf8(), "{}", long.len());
        assert!(long.ends_with('…') && long.starts_with("éé"));
        assert_eq!(Resolving::new("done", None).by, None);
    }

    #[test]
    fn the_kept_text_is_cut_and_readable_and_an_unknown_payment_left_empty() {
        let at = Utc::now();
        let long = "x".repeat(600);
        let held = HeldCallback::new("n-1", 1, &long, None, at);
        assert_eq!(held.reason, format!("{}…", "x".repeat(REASON_BYTES)));
        assert_eq!(held.transaction_reference_id, uuid::Uuid::nil().to_string());
        assert_eq!((held.client_id.as_str(), held.amount.as_str()), ("", "0"));

        let subject = Subject {
            transaction_reference_id: uuid::Uuid::from_u128(7),
            client_id: "a\0b".into(),
            amount: rust_decimal::Decimal::new(1050, 2),
            currency: "EUR".into(),
        };
        let held = HeldCallback::new("n-1", -2, "why\0", Some(&subject), at);
        assert_eq!(held.reason, "why\u{fffd}");
        assert_eq!(held.client_id, "a\u{fffd}b");
        assert_eq!(
            (held.amount.as_str(), held.currency.as_str()),
            ("10.50", "EUR")
        );
    }

    /// A pair held again (only a takeover could, its mark being there) keeps its first
    /// record, resolved or not, as PostgreSQL's `ON CONFLICT DO NOTHING` does; and only the
    /// unresolved ones count.
    #[test]
    fn the_first_record_of_a_pair_stands_and_only_the_waiting_count() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        let at = Utc::now();
        let first = HeldCallback::new("n-1", 4, "first", None, at);
        let (key, value) = write_of(&tree, &Overlay::new(), &first).unwrap().unwrap();
        let mut overlay = Overlay::new();
        overlay.insert(key.clone(), Some(value.clone()));
        let second = HeldCallback::new("n-1", 4, "second", None, at);
        assert_eq!(
            write_of(&tree, &overlay, &second).unwrap(),
            None,
            "in the batch"
        );
        assert_eq!(changed(&tree, &overlay).unwrap(), (1, 0));
        tree.insert(&key, value).unwrap();
        assert_eq!(
            write_of(&tree, &Overlay::new(), &second).unwrap(),
            None,
            "in the tree"
        );
        assert_eq!(count(&tree).unwrap(), 1);

        let earlier = at - chrono::TimeDelta::seconds(5);
        let (resolved, writes) = resolve(
            &tree,
            &Overlay::new(),
            ("n-1", 4),
            earlier,
            &Resolving::new("done", None),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            resolved.resolved_at,
            Some(first.held_at),
            "never before it was held"
        );
        let overlay: Overlay = writes.into_iter().collect();
        assert_eq!(changed(&tree, &overlay).unwrap(), (0, 1));
        for (key, value) in overlay {
            match value {
                Some(value) => tree.insert(key, value).map(drop).unwrap(),
                None => tree.remove(key).map(drop).unwrap(),
            }
        }
        assert_eq!(count(&tree).unwrap(), 0);
        assert_eq!(unresolved(&tree).unwrap(), []);
        assert_eq!(get(&tree, "n-1", 4).unwrap(), Some(resolved));
        let again = resolve(
            &tree,
            &Overlay::new(),
            ("n-1", 4),
            at,
            &Resolving::new("again", None),
        )
        .unwrap();
        assert!(again.is_none(), "resolved once");
        assert_eq!(
            write_of(&tree, &Overlay::new(), &second).unwrap(),
            None,
            "resolved"
        );
        tree.insert(super::key("n-2", 4), b"{".to_vec()).unwrap();
        assert_eq!(
            (count(&tree).unwrap(), unresolved(&tree).unwrap().len()),
            (0, 0)
        );
    }

    #[test]
    fn keys_of_two_statuses_of_one_nonce_differ_and_name_both() {
        assert_ne!(key("n-1", 1), key("n-1", -2));
        assert_eq!(key_name(&key("n-1", -2)), "held n-1 -2");
    }
}
