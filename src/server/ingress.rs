//! The ingress: what every request to an endpoint goes through before a handler is
//! considered — the client's address (behind trusted proxies), the endpoint's
//! authentication (address, credentials, the signature header), the body within `[server]`'s
//! limits, the signature over the raw body, then the parse, the identifiers' bounds and the
//! amounts' plausibility. Every refusal here is a [`Problem`]; nothing of an unauthenticated
//! body is interpreted.

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body::Body;
use serde::de::DeserializeOwned;
use std::{
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
};

use super::connection;
use super::metrics::{self, Metrics};
use super::problem::Problem;
use super::request::PeerAddr;
use super::request::{self, BodyLimits, parse_json};
use super::route::Endpoint;
use super::settings::ServerConfig;
use crate::auth::{AuthError, Cidr, Guard};
use crate::current::Current;
use crate::inspector::kept_identifier;
use crate::inspector::note::{self, SignatureNote};
use crate::logged::Logged;
use crate::model::{CallbackBody, ProvidersValidationRequest, TransactionValidationRequest};
use crate::signature::{RetiredKeys, SignedPair, VerifiedCache, Verifier};
use tracing::field;

/// The checks before the handlers, with what they need. Built once by the app's builder.
pub(super) struct Ingress {
    /// `[server]`: body limits, timeouts and rates, identifier bounds.
    limits: ServerConfig,
    /// Verifies callback signatures (and validation signatures where configured), with the
    /// keys as read last; `None` when no key is configured.
    verifying: Option<Current<Verifying>>,
    /// The header signatures are read from, when they are verified (the same for the life
    /// of the app).
    signature_header: Option<http::HeaderName>,
    /// The credentials and address rules of the two validation endpoints, as read last
    /// (`[auth]`, read again with the credentials).
    providers_guard: Current<Guard>,
    validation_guard: Current<Guard>,
    /// Proxies whose `X-Forwarded-For` is believed.
    trusted_proxies: Vec<Cidr>,
    metrics: Arc<Metrics>,
    /// The bytes of the bodies arriving, all connections together.
    body_memory: request::BodyMemory,
}

impl Ingress {
    pub(super) fn new(
        limits: ServerConfig,
        verifier: Option<Verifier>,
        (providers_guard, validation_guard): (Guard, Guard),
        trusted_proxies: Vec<Cidr>,
        metrics: Arc<Metrics>,
        retry_after: std::time::Duration,
    ) -> Self {
        Self {
            body_memory: request::BodyMemory::new(
                limits.body_memory_limit,
                limits.body_limit,
                limits.min_body_rate_grace,
                retry_after,
            ),
            limits,
            signature_header: verifier.as_ref().map(|v| v.header().clone()),
            verifying: verifier.map(|verifier| Current::new(Verifying::new(verifier))),
            providers_guard: Current::new(providers_guard),
            validation_guard: Current::new(validation_guard),
            trusted_proxies,
            metrics,
        }
    }

    /// The `[server]` settings the app was built with.
    pub(super) fn server_config(&self) -> &ServerConfig {
        &self.limits
    }

    /// The header signatures are read from, when they are verified.
    pub(super) fn signature_header(&self) -> Option<&http::HeaderName> {
        self.signature_header.as_ref()
    }

    /// The header `endpoint`'s signatures are read from, when it verifies them: on an
    /// endpoint that asks for credentials instead, that header may carry them (Basic
    /// credentials in `Authorization`, where the aggregator's signatures go too).
    pub(super) fn signature_header_of(&self, endpoint: Endpoint) -> Option<&http::HeaderName> {
        self.guard(endpoint)
            .is_none_or(|guard| guard.needs_signature())
            .then(|| self.signature_header())
            .flatten()
    }

    /// The credentials and address rules of `endpoint` as read last; none for callbacks (a
    /// signature).
    fn guard(&self, endpoint: Endpoint) -> Option<Arc<Guard>> {
        match endpoint {
            Endpoint::ProvidersValidation => Some(self.providers_guard.now()),
            Endpoint::TransactionValidation => Some(self.validation_guard.now()),
            Endpoint::Callback => None,
        }
    }

    /// From now on, the validation endpoints ask for the credentials of `providers` and
    /// `validation` (`[auth]` read again): a request checked after this is judged by them.
    pub(super) fn replace_guards(&self, (providers, validation): (Guard, Guard)) {
        self.providers_guard.replace(providers);
        self.validation_guard.replace(validation);
    }

    /// `true` when signatures are verified (keys are configured).
    pub(super) fn verifies_signatures(&self) -> bool {
        self.verifying.is_some()
    }

    /// The verifier as read last; `None` when no key is configured.
    pub(super) fn verifier(&self) -> Option<Arc<Verifying>> {
        self.verifying.as_ref().map(Current::now)
    }

    /// From now on, `verifier` verifies signatures, and nothing verified before is taken for
    /// verified again: a pair verified under a key taken out is refused on its next
    /// delivery. Waits for the checks under way; calls that passed their check go on.
    /// Returns `verifier` back when the app verifies no signature (whether it does is set
    /// when it is built).
    pub(super) fn replace_verifier(&self, verifier: Verifier) -> Result<(), Verifier> {
        let Some(current) = &self.verifying else {
            return Err(verifier);
        };
        current.replace_with(|before| Some(before.replaced_by(verifier)));
        Ok(())
    }

    /// The client's address of `request` (see [`Ingress::client_of`]).
    pub(super) fn client_ip<B>(&self, request: &Request<B>) -> Option<std::net::IpAddr> {
        let peer = request.extensions().get::<PeerAddr>().map(|p| p.0);
        self.client_of(peer, request.headers())
    }

    /// Whether `request` carries a proxy's forwarding headers (`X-Forwarded-For`,
    /// `Forwarded`, `X-Real-IP`) from a peer that is not a trusted proxy: its client is then
    /// taken to be the peer, which for a proxy on this machine is this machine.
    pub(super) fn forwarded_by_stranger<B>(&self, request: &Request<B>) -> bool {
        let peer = request.extensions().get::<PeerAddr>().map(|p| p.0);
        self.forwarded_by_stranger_of(peer, request.headers())
    }

    /// [`Ingress::forwarded_by_stranger`] of a request from `peer` with `headers`.
    fn forwarded_by_stranger_of(&self, peer: Option<SocketAddr>, headers: &HeaderMap) -> bool {
        let forwarded = ["x-forwarded-for", "forwarded", "x-real-ip"]
            .iter()
            .any(|name| headers.contains_key(*name));
        forwarded && !peer.is_some_and(|peer| self.is_trusted_proxy(peer.ip()))
    }

    fn is_trusted_proxy(&self, ip: std::net::IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(ip))
    }

    /// Whether the browser reached the service over HTTPS, as a trusted proxy says
    /// (`X-Forwarded-Proto`). payhook serves plain HTTP itself, so a request from anyone else
    /// came over HTTP. The value read is the client's hop's: each proxy appends one address
    /// to `X-Forwarded-For` and, when it appends, one scheme here, so the client's scheme
    /// stands as many places from the right as trusted proxies stand right of the client in
    /// `X-Forwarded-For` (see [`Ingress::client_of`]) — the left-most value when fewer are
    /// there (a proxy that replaces the header). Not the left-most alone: a client's own
    /// `https`, to which a proxy appended the `http` it saw, was believed.
    pub(super) fn forwarded_https<B>(&self, request: &Request<B>) -> bool {
        let peer = request.extensions().get::<PeerAddr>().map(|p| p.0);
        if !peer.is_some_and(|peer| self.is_trusted_proxy(peer.ip())) {
            return false;
        }
        // Without X-Forwarded-For, the proxy in front named no client: its own scheme.
        let trusted_hops = self
            .forwarded_client(request.headers())
            .map_or(0, |(_, hops)| hops);
        let Ok(lines) = request
            .headers()
            .get_all("x-forwarded-proto")
            .iter()
            .map(|line| line.to_str())
            .collect::<Result<Vec<_>, _>>()
        else {
            return false;
        };
        let said: Vec<&str> = lines.iter().flat_map(|line| line.split(',')).collect();
        said.len()
            .checked_sub(1)
            .map(|last| said[last.saturating_sub(trusted_hops)])
            .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
    }

    /// Whether `request`, whose client is `client` ([`Ingress::client_ip`]), came from this
    /// machine: its socket's peer is a loopback address, and so is the client a trusted proxy
    /// there forwards for. Nothing it sent crossed a network.
    pub(super) fn came_from_this_machine<B>(
        &self,
        request: &Request<B>,
        client: Option<std::net::IpAddr>,
    ) -> bool {
        let loopback = |ip: std::net::IpAddr| ip.to_canonical().is_loopback();
        request
            .extensions()
            .get::<PeerAddr>()
            .is_some_and(|peer| loopback(peer.0.ip()))
            && client.is_some_and(loopback)
    }

    /// The client's address: the socket's peer, or — when the peer is a trusted proxy — the
    /// right-most `X-Forwarded-For` address that is not a trusted proxy. `None` when unknown
    /// (no peer; a trusted proxy that sent no `X-Forwarded-For`, a malformed one, or one
    /// naming only trusted proxies): allow-lists then refuse. A proxy that forwards without
    /// the header must not make every client look like the proxy itself.
    pub(super) fn client_of(
        &self,
        peer: Option<SocketAddr>,
        headers: &HeaderMap,
    ) -> Option<std::net::IpAddr> {
        let peer = peer?.ip();
        if !self.is_trusted_proxy(peer) {
            return Some(peer);
        }
        self.forwarded_client(headers).map(|(client, _)| client)
    }

    /// The right-most address of `X-Forwarded-For` that is not a trusted proxy (of a request
    /// a trusted proxy sent), with how many trusted ones stand right of it; `None` when the
    /// header is absent or unreadable, an entry is not an address, or every one is trusted.
    fn forwarded_client(&self, headers: &HeaderMap) -> Option<(std::net::IpAddr, usize)> {
        let forwarded: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .map(|value| value.to_str().ok())
            .collect::<Option<_>>()?;
        let hops = forwarded.iter().flat_map(|v| v.split(',')).rev();
        for (trusted_hops, hop) in hops.enumerate() {
            let client = hop.trim().parse().ok()?;
            if !self.is_trusted_proxy(client) {
                return Some((client, trusted_hops));
            }
        }
        None
    }

    /// The client's address of a request's `parts` (see [`Ingress::client_of`]).
    pub(super) fn client_of_parts(&self, parts: &http::request::Parts) -> Option<std::net::IpAddr> {
        let peer = parts.extensions.get::<PeerAddr>().map(|p| p.0);
        self.client_of(peer, &parts.headers)
    }

    /// Reads a request's body within `[server]`'s limits, as `client`'s (its share of the
    /// body memory); while it arrives, the connection counts as receiving (see
    /// `connection.rs`), not working.
    pub(super) async fn read_body<B>(
        &self,
        parts: &http::request::Parts,
        body: B,
        client: Option<std::net::IpAddr>,
    ) -> Result<Bytes, Problem>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let server = &self.limits;
        let limits = BodyLimits {
            limit: server.body_limit,
            timeout: server.request_timeout,
            min_rate: server.min_body_rate,
            grace: server.min_body_rate_grace,
        };
        let receiving = parts
            .extensions
            .get::<Arc<connection::Activity>>()
            .map(connection::Activity::receiving);
        let client = client.map(connection::network_of);
        let read =
            request::read_body(&parts.headers, body, limits, (&self.body_memory, client)).await;
        drop(receiving);
        match read {
            Err(Problem::BodyTooSlow { .. }) => {
                self.metrics.count_shed(metrics::ShedReason::SlowBody);
            }
            Err(Problem::BodyShed { .. }) => {
                self.metrics.count_shed(metrics::ShedReason::BodyMemory);
            }
            _ => {}
        }
        read
    }

    /// Authenticates the caller from its address and headers (`client`, from `peer`'s
    /// request: see [`Ingress::client_of`]). Returns the signature to check over the body,
    /// when the endpoint requires one. An allow-list refuses a request a proxy forwarded
    /// from a peer not in `server.trusted_proxies`: the client would be taken to be the
    /// proxy, and a proxy whose address is allowed would let in everyone it forwards.
    pub(super) fn admit(
        &self,
        endpoint: Endpoint,
        (peer, client): (Option<SocketAddr>, Option<std::net::IpAddr>),
        headers: &HeaderMap,
    ) -> Result<Option<Vec<u8>>, Problem> {
        let guard = self.guard(endpoint);
        if let Some(guard) = &guard {
            if guard.has_allow_list() && self.forwarded_by_stranger_of(peer, headers) {
                return Err(Problem::ForwardedByStranger);
            }
            guard
                .check_peer(client)
                .map_err(|error| refused(&error, false))?;
            guard
                .check_headers(headers)
                .map_err(|error| refused(&error, guard.is_basic()))?;
        }
        let wants_signature = guard.as_deref().is_none_or(Guard::needs_signature);
        match (self.verifying.as_ref().map(Current::hold), wants_signature) {
            (Some(verifying), true) => verifying
                .verifier
                .read_signature(headers)
                .map(Some)
                .map_err(|error| {
                    self.metrics.refused_signature(&error);
                    unauthorized(error)
                }),
            // Only callbacks want a signature without a verifier: the build step allowed it
            // because `callback.allow_unsigned` is set; `callback` logs each one.
            (None, true) | (_, false) => Ok(None),
        }
    }

    /// Verifies `signature` over `body`, unless the pair verified before under the keys as
    /// read last. Returns the pair when pairs are remembered (see [`VerifiedCache`]), for the
    /// delivery to look up and mark.
    pub(super) fn check_signature(
        &self,
        body: &[u8],
        signature: &[u8],
    ) -> Result<Option<SignedPair>, Problem> {
        let Some(current) = &self.verifying else {
            return Ok(None);
        };
        // Held through the check: keys read again wait for the checks under way, so that
        // none under keys taken out ends after they are replaced (a public-key operation
        // per key listed at most; the guard is not held across an await).
        let verifying = current.hold();
        // A retry carries the same bytes and signature: no public-key operation for it.
        let metrics = &self.metrics;
        let verified = &verifying.verified;
        let pair = SignedPair::of(verified, signature, body);
        if pair.as_ref().is_some_and(SignedPair::verified_before) {
            tracing::debug!("signature verified before (a retry)");
            note::with(|n| n.signature = Some(SignatureNote::VerifiedBefore));
            metrics.signatures_reused.fetch_add(1, Ordering::Relaxed);
            return Ok(pair);
        }
        match verifying.verifier.check(body, signature) {
            Ok(key_id) => {
                tracing::info!(key_id = key_id.unwrap_or("-"), "signature verified");
                note::kept(|n| {
                    n.signature = Some(SignatureNote::Verified(key_id.map(str::to_owned)));
                });
                metrics.signatures_verified.fetch_add(1, Ordering::Relaxed);
                if let Some(pair) = &pair {
                    pair.remember_verified();
                }
                Ok(pair)
            }
            Err(error) => {
                // Refused whatever follows: the keys taken out are looked at without holding
                // up keys read again.
                let retired = Arc::clone(&verifying.retired);
                drop(verifying);
                let error = match retired.verifying(body, signature) {
                    Some(key) => crate::signature::Error::RetiredKey(key.to_owned()),
                    None => error,
                };
                metrics.refused_signature(&error);
                Err(unauthorized(error))
            }
        }
    }
}

/// A verifier with the (signature, body) pairs it verified, so that retries skip the
/// public-key operation (shared with the deliveries, which mark the pairs they booked).
/// Replaced when the keys are read again, with a new set of pairs — a pair verified under a
/// key taken out is not verified under the keys that stay — and the keys taken out added to
/// those it kept.
pub(super) struct Verifying {
    pub(super) verifier: Verifier,
    verified: Arc<VerifiedCache>,
    /// The keys taken out while the service ran, to name them when a signature only they
    /// verify arrives.
    retired: Arc<RetiredKeys>,
}

impl Verifying {
    fn new(verifier: Verifier) -> Self {
        Self {
            verifier,
            verified: Arc::default(),
            retired: Arc::default(),
        }
    }

    /// What verifies once `verifier`'s keys replace these: nothing verified before is
    /// taken for verified, and the keys `verifier` no longer lists are kept as taken out.
    fn replaced_by(&self, verifier: Verifier) -> Self {
        Self {
            retired: Arc::new(RetiredKeys::after(&self.verifier, &self.retired, &verifier)),
            ..Self::new(verifier)
        }
    }
}

/// A refused signature: 401, logged (with the request id of the span, never the body). One
/// only a key taken out verifies is named so in the log and on the inspector, with what to
/// do; its answer says no more than a forgery's, which tells a sender nothing of the keys.
fn unauthorized(error: crate::signature::Error) -> Problem {
    let message = match &error {
        crate::signature::Error::RetiredKey(key) => {
            tracing::warn!(
                key = %Logged(key),
                "signature made with a key taken out of signature.keys: refused (401). The \
                 aggregator still signs with it, or retries what it signed before: list it \
                 again beside the new one (SIGHUP reads it), and take it out once the \
                 aggregator signs with the new one and its retries are over — unless it was \
                 taken out because its private key leaked: then these are forgeries"
            );
            crate::signature::Error::InvalidSignature.to_string()
        }
        _ => {
            tracing::warn!(%error, "callback signature refused");
            error.to_string()
        }
    };
    note::kept(|n| {
        n.signature = Some(SignatureNote::Refused(error.to_string()));
    });
    Problem::Unauthorized {
        message,
        basic: false,
    }
}

/// Refused credentials or address: 401 or 403, logged.
fn refused(error: &AuthError, basic: bool) -> Problem {
    tracing::warn!(%error, "caller refused");
    match error {
        AuthError::AddressRefused => Problem::AddressRefused,
        AuthError::Missing | AuthError::Wrong => Problem::Unauthorized {
            message: error.to_string(),
            basic,
        },
    }
}

impl Ingress {
    /// Parses a request, checks its identifiers, records them on the current span, and
    /// refuses an amount that is no payment (see [`Plausible`]).
    pub(super) fn parse<T: DeserializeOwned + Traced + Plausible>(
        &self,
        bytes: &[u8],
    ) -> Result<T, Problem> {
        let request = parse_json::<T>(bytes)?;
        let max_chars = self.limits.max_identifier_chars;
        note::kept(|n| {
            n.nonce = Some(kept_identifier(request.nonce().1, max_chars));
            n.client = Some(kept_identifier(request.client_id().1, max_chars));
        });
        check_identifiers(&request, max_chars)?;
        request.trace(&tracing::Span::current());
        if let Some(why) = request.overfull(self.limits.body_limit) {
            return Err(Problem::BadRequest(why));
        }
        check_plausible(&request)?;
        Ok(request)
    }
}

/// What a well-formed request is refused for (400) before any handler: identifiers payhook
/// cannot key or keep, and values that are no payment. A lost callback rebuilt from the
/// aggregator's lookup is held to it too.
pub(super) fn admissible(
    request: &(impl Traced + Plausible),
    max_chars: usize,
) -> Result<(), Problem> {
    check_identifiers(request, max_chars)?;
    check_plausible(request)
}

/// Refuses a value that is no payment (see [`Plausible`]).
fn check_plausible(request: &impl Plausible) -> Result<(), Problem> {
    match request.implausible() {
        Some(reason) => Err(Problem::BadRequest(reason)),
        None => Ok(()),
    }
}

/// Refuses a blank nonce (it keys deduplication: every blank nonce would share one record),
/// identifiers carrying U+0000 and identifiers longer than `max_chars` characters. Blank is
/// empty or only JSON's own whitespace (space, tab, line feed, carriage return), as the
/// OpenAPI document's pattern `[^ \t\n\r]` says in any regex dialect. U+0000 is in no
/// identifier the aggregator issues, and PostgreSQL cannot store it in `text`: a shared
/// store would answer 503 to every retry of such a callback until the aggregator gave up.
fn check_identifiers(request: &impl Traced, max_chars: usize) -> Result<(), Problem> {
    let (field, nonce) = request.nonce();
    if is_blank(nonce) {
        return Err(Problem::BadRequest(format!(
            "invalid field `{field}`: a nonce must not be empty or blank"
        )));
    }
    let currency = request.currency();
    for (field, value) in [(field, nonce), request.client_id()]
        .into_iter()
        .chain(currency)
    {
        if let Some(why) = unkeepable(value, max_chars) {
            return Err(Problem::BadRequest(format!(
                "invalid field `{field}`: {why}"
            )));
        }
    }
    Ok(())
}

/// Empty, or only JSON's own whitespace.
pub(super) fn is_blank(value: &str) -> bool {
    value.chars().all(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
}

/// Why `value` cannot be kept as an identifier (it carries U+0000, or more than
/// `max_chars` characters); `None` when it can.
pub(super) fn unkeepable(value: &str, max_chars: usize) -> Option<String> {
    if value.contains('\0') {
        return Some("an identifier must not carry U+0000".to_owned());
    }
    // Counting stops past the limit: a megabyte of nonce is not walked to the end.
    let chars = value.chars().take(max_chars.saturating_add(1)).count();
    (chars > max_chars).then(|| {
        format!("longer than the {max_chars} characters accepted (server.max_identifier_chars)")
    })
}

/// What the wire types cannot say about amounts (spec 2.4, 2.7): an amount is what is
/// deposited or withdrawn, and the direction is a field of its own (`cashIn`,
/// `transactionType`), so an amount is never negative. A validation asks about a payment
/// to be made: its amount must be above zero. A callback reports a result, and a failed
/// payment may report nothing moved: zero is accepted there.
pub(crate) trait Plausible {
    /// Why the request cannot be a payment, as the 400 message; `None` when it can.
    fn implausible(&self) -> Option<String>;
}

fn positive(field: &str, amount: rust_decimal::Decimal, direction: &str) -> Option<String> {
    (amount <= rust_decimal::Decimal::ZERO).then(|| {
        format!(
            "invalid field `{field}`: {amount} is not an amount to pay; it must be greater than \
             zero (the direction is `{direction}`)"
        )
    })
}

impl Plausible for ProvidersValidationRequest {
    fn implausible(&self) -> Option<String> {
        positive(
            "transactionData.paymentData.amount",
            self.transaction_data.payment_data.amount,
            "transactionData.cashIn",
        )
    }
}

impl Plausible for TransactionValidationRequest {
    fn implausible(&self) -> Option<String> {
        positive("paymentData.amount", self.payment_data.amount, "cashIn")
    }
}

impl Plausible for CallbackBody {
    fn implausible(&self) -> Option<String> {
        (self.amount < rust_decimal::Decimal::ZERO).then(|| {
            format!(
                "invalid field `amount`: {} is negative; an amount is never negative (the \
                 direction is `transactionType`)",
                self.amount
            )
        })
    }
}

/// A request whose identifiers go on the request's span, so every log line carries them.
pub(super) trait Traced {
    /// The nonce and the path of its field.
    fn nonce(&self) -> (&'static str, &str);
    /// The client id and the path of its field.
    fn client_id(&self) -> (&'static str, &str);
    /// The currency and the path of its field, where a record keeps it (a transaction
    /// validation's fingerprint): held to the identifiers' rules, so that what a record holds
    /// does not grow with what a sender chose. A providers validation's is kept nowhere,
    /// and a callback's is not refused (that would lose the payment's result): its failure
    /// record keeps it cut (`CallbackFailure::kept_currency`).
    fn currency(&self) -> Option<(&'static str, &str)> {
        None
    }

    /// Why the request holds more parsed values than a body of at most `body_limit` bytes
    /// may keep while its handler runs; `None` when it does not (a providers validation's
    /// candidates are bounded; the free-form objects are bounded as they are read).
    fn overfull(&self, _body_limit: usize) -> Option<String> {
        None
    }

    fn trace(&self, span: &tracing::Span) {
        span.record("nonce", field::display(Logged(self.nonce().1)));
    }
}

impl Traced for ProvidersValidationRequest {
    fn nonce(&self) -> (&'static str, &str) {
        ("transactionData.paymentData.nonce", Self::nonce(self))
    }

    fn overfull(&self, body_limit: usize) -> Option<String> {
        use crate::model::{
            BODY_BYTES_PER_CANDIDATE_VALUE, MIN_CANDIDATE_VALUES, candidates_within,
            max_candidate_values,
        };
        let limit = max_candidate_values(body_limit);
        (!candidates_within(&self.providers, limit)).then(|| {
            format!(
                "invalid field `providers`: candidates holding more than {limit} JSON values \
                 together (one for each {BODY_BYTES_PER_CANDIDATE_VALUE} bytes of \
                 server.body_limit, at least {MIN_CANDIDATE_VALUES})"
            )
        })
    }

    fn client_id(&self) -> (&'static str, &str) {
        (
            "transactionData.merchantData.clientId",
            &self.transaction_data.merchant_data.client_id,
        )
    }
}

impl Traced for TransactionValidationRequest {
    fn nonce(&self) -> (&'static str, &str) {
        ("paymentData.nonce", Self::nonce(self))
    }

    fn client_id(&self) -> (&'static str, &str) {
        ("merchantData.clientId", &self.merchant_data.client_id)
    }

    fn currency(&self) -> Option<(&'static str, &str)> {
        Some(("paymentData.currency", &self.payment_data.currency))
    }

    fn trace(&self, span: &tracing::Span) {
        span.record("nonce", field::display(Logged(Self::nonce(self))));
        span.record("validation_id", self.validation_id.get());
    }
}

impl Traced for CallbackBody {
    fn nonce(&self) -> (&'static str, &str) {
        ("nonce", &self.nonce)
    }

    fn client_id(&self) -> (&'static str, &str) {
        ("clientId", &self.client_id)
    }

    fn trace(&self, span: &tracing::Span) {
        span.record("nonce", field::display(Logged(&self.nonce)));
        span.record(
            "reference_id",
            field::display(&self.transaction_reference_id),
        );
    }
}
