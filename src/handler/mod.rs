//! The three traits a merchant implements, and the decisions they return.
//!
//! Each trait has one async method; write it as a plain `async fn`. payhook calls it with
//! the typed request (already authenticated and parsed) and a [`RequestContext`], and turns
//! the returned decision into the HTTP answer the aggregator expects:
//!
//! | trait | decision | on the wire |
//! |---|---|---|
//! | [`ProvidersValidator`] | [`ProvidersDecision`] | 200 `{providers, message}` |
//! | [`TransactionValidator`] | [`ValidationDecision::Allow`] | 200 |
//! | | [`ValidationDecision::Deny`] | 403 `{message}` |
//! | | [`ValidationDecision::Postpone`] | 200 on an Awaitable endpoint; otherwise 500 and an error log (never a silent 200) |
//! | [`CallbackReceiver`] | [`CallbackDecision::Ack`] | 200 |
//! | | [`CallbackDecision::RetryLater`] | 503 with `Retry-After` |
//! | any | `Err(HandlerError)` | 500 (validations) or 503 + `Retry-After` (callbacks), generic message; the detail goes to the log only |
//!
//! Handlers run on their own task: a client that disconnects does not cancel a handler
//! half-way, and a panic in a handler is an error answer, not a dropped connection.
//!
//! A handler still running at `server.handler_timeout` is dropped at its next `.await`, its
//! claim on the nonce released and the delivery answered 503 for a retry; what it staged in
//! [`Effects`] is never written, so the retry's run books alone. Work it handed elsewhere (a
//! `tokio::spawn`, a `spawn_blocking`, a call to another service already sent) is not
//! stopped, and may run beside the retry's: book through `Effects`, or make such work
//! idempotent by the nonce and status.

mod providers;

use chrono::{DateTime, Utc};
use http::HeaderMap;
use std::{fmt, future::Future, net::SocketAddr, pin::Pin, sync::Arc};

use crate::model::{
    CallbackBody, Provider, ProvidersValidationRequest, TransactionStatus,
    TransactionValidationRequest,
};
use crate::store::{Claim, Effects, Store, StoreError, ValidatedPayment};

pub use providers::{ProviderFilter, ProviderTags, ProviderTagsError, tags_allow};

/// What payhook knows about the HTTP request a handler is called for.
///
/// Its `Debug` output names every header but shows the values of harmless ones only
/// ([`RequestContext::SHOWN_HEADERS`]): `Authorization` and a shared-secret header carry
/// credentials, and a context logged with `?ctx` must not leak them.
///
/// ```
/// use payhook::handler::RequestContext;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("authorization", "Basic c2hvcDpwYXNzd29yZA==".parse().unwrap());
/// headers.insert("x-api-key", "s3cr3t-s3cr3t-s3cr3t".parse().unwrap());
/// headers.insert("content-type", "application/json".parse().unwrap());
/// let ctx = RequestContext {
///     request_id: "r-1".into(),
///     peer: None,
///     received_at: chrono::Utc::now(),
///     headers,
/// };
/// let printed = format!("{ctx:?}");
/// assert!(!printed.contains("c2hvcDpwYXNzd29yZA") && !printed.contains("s3cr3t"));
/// assert!(printed.contains("application/json") && printed.contains("x-api-key"));
/// ```
#[derive(Clone)]
pub struct RequestContext {
    /// Id of this request: the caller's `X-Request-Id` when it sent a sane one, else a new
    /// UUID. It is echoed in the response's `X-Request-Id` and carried by every log line.
    pub request_id: String,
    /// Address of the connection's other end, when payhook serves the socket itself:
    /// behind a proxy, the proxy (the client it forwards for is what `allow_ips` and the
    /// per-client limits judge, from its `X-Forwarded-For` when the proxy is trusted).
    pub peer: Option<SocketAddr>,
    /// When the request had been read and its credentials checked (before its claim on the
    /// nonce, and any wait for another delivery of it).
    pub received_at: DateTime<Utc>,
    /// The request's headers.
    pub headers: HeaderMap,
}

impl RequestContext {
    /// Headers whose values `Debug` shows; any other value prints as `<redacted>`.
    pub const SHOWN_HEADERS: &'static [&'static str] = &[
        "content-type",
        "content-length",
        "host",
        "user-agent",
        "x-request-id",
        "x-forwarded-for",
        "x-signature",
        "traceparent",
    ];

    /// `true` for a header whose value may be shown ([`Self::SHOWN_HEADERS`]): a credential
    /// may be in any other (this `Debug`, and the inspector, show no other).
    pub(crate) fn shows(name: &http::HeaderName) -> bool {
        Self::SHOWN_HEADERS.contains(&name.as_str())
    }

    /// `value` as printed for header `name`: itself for [`Self::SHOWN_HEADERS`], else
    /// `<redacted>` (a credential may be in any other header).
    pub(crate) fn shown_value<'a>(
        name: &http::HeaderName,
        value: &'a http::HeaderValue,
    ) -> &'a str {
        if Self::shows(name) {
            value.to_str().unwrap_or("<not text>")
        } else {
            "<redacted>"
        }
    }
}

impl std::fmt::Debug for RequestContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        struct Headers<'a>(&'a HeaderMap);
        impl std::fmt::Debug for Headers<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_map()
                    .entries(self.0.iter().map(|(name, value)| {
                        (name.as_str(), RequestContext::shown_value(name, value))
                    }))
                    .finish()
            }
        }
        f.debug_struct("RequestContext")
            .field("request_id", &self.request_id)
            .field("peer", &self.peer)
            .field("received_at", &self.received_at)
            .field("headers", &Headers(&self.headers))
            .finish()
    }
}

/// What a callback handler is told besides the callback itself; and where it reads what
/// payhook recorded of the callback's validation ([`Self::validated_payment`]).
///
/// payhook makes it for each delivery; [`Self::new`] makes one for a handler's own tests.
#[derive(Debug, Clone)]
pub struct CallbackContext {
    /// The HTTP request.
    pub request: RequestContext,
    /// Deliveries of this nonce that reached a handler, this one included: 1 on the first
    /// delivery, more after failures or `RetryLater`s. A delivery cut off before it ended
    /// (its process killed; on PostgreSQL, also its database connection lost) is not
    /// counted.
    pub attempt: u32,
    /// The status acknowledged last for this nonce, when this callback brings a new one
    /// (e.g. a success, later a reversal). Acknowledged is not booked: a handler that
    /// acknowledged a result without booking it (held it, [`Booking::Held`](crate::store::Booking::Held):
    /// the example merchant's quarantine of a late retry of an older failure) is told that
    /// status here, not the one its books hold.
    /// What stands is in the handler's own books; read them.
    pub previous_status: Option<TransactionStatus>,
    /// Writes to apply atomically with the mark that this callback is done; see [`Effects`].
    pub effects: Effects,
    /// The store the validations are read from.
    validations: Validations,
}

impl CallbackContext {
    /// The context of a first delivery of `request` (attempt 1, no previous status, no
    /// effects staged) with no store: [`Self::validated_payment`] finds no validation.
    /// For a handler's own tests.
    ///
    /// ```
    /// use payhook::handler::{CallbackContext, RequestContext};
    ///
    /// let ctx = CallbackContext::new(RequestContext {
    ///     request_id: "r-1".into(),
    ///     peer: None,
    ///     received_at: chrono::Utc::now(),
    ///     headers: http::HeaderMap::new(),
    /// });
    /// assert_eq!(ctx.attempt, 1);
    /// assert!(ctx.effects.is_empty());
    /// ```
    pub fn new(request: RequestContext) -> Self {
        Self {
            request,
            attempt: 1,
            previous_status: None,
            effects: Effects::default(),
            validations: Validations(None),
        }
    }

    /// The context payhook makes for a delivery booked through `store`.
    pub(crate) fn delivered(
        request: RequestContext,
        attempt: u32,
        previous_status: Option<TransactionStatus>,
        effects: Effects,
        claimed: Option<(Arc<dyn Store>, Claim)>,
    ) -> Self {
        Self {
            request,
            attempt,
            previous_status,
            effects,
            validations: Validations(claimed),
        }
    }

    /// What payhook recorded of the transaction validation of `callback`'s nonce: the
    /// payment it was asked about and the merchant's decision (see
    /// [`ValidatedPayment`], and [`ValidatedPayment::differences`] to compare). `None` when
    /// no validation of the nonce is recorded: this service did not answer it (another did,
    /// or the aggregator validated without the merchant), it was answered longer ago than
    /// `store.retention`, or the app has no store. One read of the store (two for a
    /// postponed validation: its postponed record too), made only when asked; on PostgreSQL
    /// through the connection the delivery's claim holds, in its transaction
    /// ([`DedupStore::validated_payment_in_claim`](crate::store::DedupStore::validated_payment_in_claim)).
    ///
    /// A signed callback whose payment differs from the one validated — another amount,
    /// currency, client or direction — or that reports a success of a payment the merchant
    /// denied, is the aggregator's word against the merchant's decision: hold it for a
    /// person ([`Booking::Held`](crate::store::Booking::Held)) rather than book it, as the
    /// example merchant does.
    ///
    /// # Errors
    ///
    /// The store's: it failed, a record does not decode, or it is a store of the merchant's
    /// own that cannot read its validations back ([`StoreError::Unsupported`]).
    pub async fn validated_payment(
        &self,
        callback: &CallbackBody,
    ) -> Result<Option<ValidatedPayment>, StoreError> {
        match &self.validations.0 {
            Some((store, claim)) => {
                store
                    .validated_payment_in_claim(&callback.nonce, *claim)
                    .await
            }
            None => Ok(None),
        }
    }

    /// Why `callback` should be held for a person rather than booked, against what payhook
    /// recorded of its validation: [`ValidatedPayment::hold_reason`] (a success that is not
    /// the payment validated, that the merchant denied, or whose postponed validation it has
    /// not decided yet), or that the validation's record does not decode (it would not on a
    /// retry either). `None` when it may be booked: not a success (nothing is read then), no
    /// validation recorded, the payment validated and allowed — or a store of the merchant's
    /// own that cannot read its validations back ([`StoreError::Unsupported`], warned about
    /// once): the callback alone then decides, as it did before stores read them. The
    /// example merchant and `payhook new`'s service call it.
    ///
    /// # Errors
    ///
    /// The store's, other than those above: fail the delivery, and the aggregator's retry
    /// asks again.
    pub async fn hold_against_validation(
        &self,
        callback: &CallbackBody,
    ) -> Result<Option<String>, StoreError> {
        if !callback.transaction_status.is_success() {
            return Ok(None);
        }
        held_against(self.validated_payment(callback).await, callback)
    }
}

/// [`CallbackContext::hold_against_validation`] of what the store answered.
fn held_against(
    read: Result<Option<ValidatedPayment>, StoreError>,
    callback: &CallbackBody,
) -> Result<Option<String>, StoreError> {
    static WARNED: std::sync::Once = std::sync::Once::new();
    match read {
        Ok(validated) => Ok(validated.and_then(|validated| validated.hold_reason(callback))),
        Err(StoreError::Corrupt { reason, .. }) => Ok(Some(format!(
            "its validation's record cannot be read ({reason})"
        ))),
        Err(StoreError::Unsupported(what)) => {
            WARNED.call_once(|| {
                tracing::warn!(
                    store = %what,
                    "the store cannot read validations back: callbacks are not compared with \
                     their validations"
                );
            });
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// The store a [`CallbackContext`] reads validations from, and the claim its delivery holds
/// on the nonce there: none for a context made by [`CallbackContext::new`] or in an app
/// without a store.
#[derive(Clone)]
struct Validations(Option<(Arc<dyn Store>, Claim)>);

impl fmt::Debug for Validations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "store" } else { "none" })
    }
}

/// The merchant's answer to a providers validation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProvidersDecision {
    /// Providers available to this client (response shape of spec 2.2).
    pub providers: Vec<Provider>,
    /// Additional information for the aggregator.
    pub message: String,
}

/// The merchant's answer to a transaction validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValidationDecision {
    /// The client may make this transaction: 200.
    Allow,
    /// The client may not: 403 with `{"message": message}`.
    Deny {
        /// Why, as the aggregator will see it.
        message: String,
    },
    /// Decide later and post the result to the aggregator: 200 now. Only valid on an
    /// endpoint declared Awaitable; anywhere else it is a configuration error (500).
    Postpone,
}

impl ValidationDecision {
    /// A [`ValidationDecision::Deny`] with `message`.
    pub fn deny(message: impl Into<String>) -> Self {
        Self::Deny {
            message: message.into(),
        }
    }
}

/// The merchant's answer to a callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackDecision {
    /// The result is booked — or held aside for a person, when the staged effects say so
    /// ([`Effects::book`](crate::store::Effects::book)): 200, the aggregator stops retrying.
    Ack,
    /// Not now (a dependency is down, say): 503 with `Retry-After`, the aggregator retries.
    RetryLater {
        /// Why, as the aggregator will see it.
        reason: String,
    },
}

impl CallbackDecision {
    /// A [`CallbackDecision::RetryLater`] with `reason`.
    pub fn retry_later(reason: impl Into<String>) -> Self {
        Self::RetryLater {
            reason: reason.into(),
        }
    }
}

/// Decides which providers a client may use for a transaction (spec 4.2).
///
/// ```
/// use payhook::handler::{
///     ProviderFilter, ProviderTags, ProvidersDecision, ProvidersValidator, RequestContext,
/// };
/// use payhook::model::ProvidersValidationRequest;
/// use payhook::HandlerError;
///
/// struct Providers {
///     /// The merchant's tags of its providers ("11=fiat;12=crypto"): the spec's candidates
///     /// carry none, and a request that asks for tags is offered only those tagged so.
///     tags: ProviderTags,
/// }
///
/// impl ProvidersValidator for Providers {
///     async fn validate_providers(
///         &self,
///         request: ProvidersValidationRequest,
///         _ctx: RequestContext,
///     ) -> Result<ProvidersDecision, HandlerError> {
///         let providers = ProviderFilter::from_request(&request)
///             .apply_with_tags(&request.providers, |candidate| self.tags.of(candidate));
///         Ok(ProvidersDecision { message: format!("{} available", providers.len()), providers })
///     }
/// }
/// ```
pub trait ProvidersValidator: Send + Sync + 'static {
    /// Returns the providers available for this request.
    fn validate_providers(
        &self,
        request: ProvidersValidationRequest,
        ctx: RequestContext,
    ) -> impl Future<Output = Result<ProvidersDecision, HandlerError>> + Send;
}

/// Accepts or refuses a client's transaction right before it is created (spec 4.2).
///
/// ```
/// use payhook::handler::{RequestContext, TransactionValidator, ValidationDecision};
/// use payhook::model::TransactionValidationRequest;
/// use payhook::HandlerError;
///
/// struct Limits;
///
/// impl TransactionValidator for Limits {
///     async fn validate_transaction(
///         &self,
///         request: TransactionValidationRequest,
///         _ctx: RequestContext,
///     ) -> Result<ValidationDecision, HandlerError> {
///         if request.payment_data.amount > rust_decimal::Decimal::from(1000) {
///             return Ok(ValidationDecision::deny("amount above the client's limit"));
///         }
///         Ok(ValidationDecision::Allow)
///     }
/// }
/// ```
pub trait TransactionValidator: Send + Sync + 'static {
    /// Decides whether the client may make this transaction.
    fn validate_transaction(
        &self,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> impl Future<Output = Result<ValidationDecision, HandlerError>> + Send;
}

/// Books a transaction result (spec 2.7, 6).
///
/// ```
/// use payhook::handler::{CallbackContext, CallbackDecision, CallbackReceiver};
/// use payhook::model::CallbackBody;
/// use payhook::HandlerError;
///
/// struct Ledger {
///     /// A tree of the store's, declared at open (`SledStore::tree`).
///     entries: payhook::store::Tree,
/// }
///
/// impl CallbackReceiver for Ledger {
///     async fn receive_callback(
///         &self,
///         callback: CallbackBody,
///         ctx: CallbackContext,
///     ) -> Result<CallbackDecision, HandlerError> {
///         // One entry per (nonce, status): a later status of the nonce (a success, then -2:
///         // money returned) is a result of its own, and runs the handler again.
///         let key = format!("{}|{}", callback.nonce, callback.transaction_status.code());
///         let entry = format!("{} {}", callback.amount, callback.currency);
///         // Written in the same atomic write as the mark that this (nonce, status) is done.
///         let entries = self.entries.clone();
///         ctx.effects.write(move |tx| tx.insert(&entries, key.as_bytes(), entry.as_bytes()));
///         Ok(CallbackDecision::Ack)
///     }
/// }
/// ```
///
/// The handler runs at most once per acknowledged (nonce, status): a repeat of an
/// acknowledged delivery is answered 200 without calling it. Until the acknowledgement is
/// durable it may run again (a crash, an error, `RetryLater`), so book through
/// [`CallbackContext::effects`] — atomically with the mark — or keyed by (nonce, status):
/// keyed by the nonce alone, a later status of it (a reversal) would be dropped as a repeat.
pub trait CallbackReceiver: Send + Sync + 'static {
    /// Books the result; return [`CallbackDecision::Ack`] only once it is booked (or staged
    /// in `ctx.effects`).
    fn receive_callback(
        &self,
        callback: CallbackBody,
        ctx: CallbackContext,
    ) -> impl Future<Output = Result<CallbackDecision, HandlerError>> + Send;
}

/// A failure inside a handler: a database down, a bug. It becomes a generic error answer on
/// the wire (500, or 503 for callbacks so that the aggregator retries); its text goes to the
/// log only.
///
/// Any `std::error::Error` converts into it, so `?` works in handlers:
///
/// ```
/// use payhook::HandlerError;
///
/// fn read_limit(text: &str) -> Result<u32, HandlerError> {
///     Ok(text.parse::<u32>()?)
/// }
/// assert!(read_limit("ten").is_err());
/// assert!(HandlerError::msg("ledger unavailable").to_string().contains("ledger"));
/// ```
pub struct HandlerError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl HandlerError {
    /// An error with a message of its own.
    pub fn msg(message: impl fmt::Display) -> Self {
        Self(message.to_string().into())
    }

    /// The underlying error.
    pub fn source_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self(Box::new(error))
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A boxed, `'static` handler future: what the server stores and spawns.
pub(crate) type BoxFuture<T> =
    Pin<Box<dyn Future<Output = Result<T, HandlerError>> + Send + 'static>>;

/// The three handlers with their types erased, so the server holds them behind `Arc<dyn _>`
/// without generic parameters leaking into its public type.
pub(crate) trait ErasedProviders: Send + Sync + 'static {
    fn call(
        self: Arc<Self>,
        request: ProvidersValidationRequest,
        ctx: RequestContext,
    ) -> BoxFuture<ProvidersDecision>;
}

pub(crate) trait ErasedValidation: Send + Sync + 'static {
    fn call(
        self: Arc<Self>,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> BoxFuture<ValidationDecision>;
}

pub(crate) trait ErasedCallback: Send + Sync + 'static {
    fn call(
        self: Arc<Self>,
        callback: CallbackBody,
        ctx: CallbackContext,
    ) -> BoxFuture<CallbackDecision>;
}

impl<H: ProvidersValidator> ErasedProviders for H {
    fn call(
        self: Arc<Self>,
        request: ProvidersValidationRequest,
        ctx: RequestContext,
    ) -> BoxFuture<ProvidersDecision> {
        Box::pin(async move { self.validate_providers(request, ctx).await })
    }
}

impl<H: TransactionValidator> ErasedValidation for H {
    fn call(
        self: Arc<Self>,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> BoxFuture<ValidationDecision> {
        Box::pin(async move { self.validate_transaction(request, ctx).await })
    }
}

impl<H: CallbackReceiver> ErasedCallback for H {
    fn call(
        self: Arc<Self>,
        callback: CallbackBody,
        ctx: CallbackContext,
    ) -> BoxFuture<CallbackDecision> {
        Box::pin(async move { self.receive_callback(callback, ctx).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_validation_that_cannot_be_read_is_held_retried_or_passed_by_what_failed() {
        let callback: CallbackBody = serde_json::from_str(
            r#"{"id":1,"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-000000000001",
                "nonce":"n-1","transactionType":1,"transactionStatus":4,
                "clientId":"client-42","amount":40,"currency":"EUR"}"#,
        )
        .unwrap();
        assert_eq!(held_against(Ok(None), &callback).unwrap(), None);
        // Undecodable: held, as a retry would read the same.
        let corrupt = StoreError::Corrupt {
            key: "n-1".into(),
            reason: "expected value".into(),
        };
        assert_eq!(
            held_against(Err(corrupt), &callback).unwrap().as_deref(),
            Some("its validation's record cannot be read (expected value)")
        );
        // A store that keeps none: the callback alone decides, as before.
        let unsupported = StoreError::Unsupported("a store of the merchant's own".into());
        assert_eq!(held_against(Err(unsupported), &callback).unwrap(), None);
        // Anything else may pass: the delivery fails and is retried.
        assert!(matches!(
            held_against(Err(StoreError::Stopped), &callback),
            Err(StoreError::Stopped)
        ));
    }
}
