//! Shared test support: a payhook server on 127.0.0.1 port 0 with a scriptable test merchant,
//! a raw HTTP/1.1 client (so tests control every byte), and request bodies built from the
//! spec's field tables.
#![allow(
    dead_code,
    unreachable_pub,
    reason = "each test binary uses a part of the support module"
)]
#![allow(clippy::unwrap_used, reason = "tests")]

pub mod gateway;
pub mod postgres;
pub mod webdriver;

use payhook::handler::{
    CallbackContext, CallbackDecision, CallbackReceiver, ProviderFilter, ProvidersDecision,
    ProvidersValidator, RequestContext, TransactionValidator, ValidationDecision,
};
use payhook::model::{CallbackBody, ProvidersValidationRequest, TransactionValidationRequest};
use payhook::store::Store;
use payhook::{App, Config, HandlerError};
use serde_json::Value;
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{Notify, oneshot},
    task::JoinHandle,
};

/// Upper bound on any single network wait in tests: a hang fails the test instead of CI.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// One call the test merchant received.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub endpoint: &'static str,
    pub nonce: String,
    pub amount: String,
    pub request_id: String,
    pub peer: Option<SocketAddr>,
    /// For callbacks: the attempt number and the previously acknowledged status.
    pub attempt: u32,
    pub previous_status: Option<i32>,
}

/// A merchant whose behaviour is chosen by the request's client id:
/// `deny`, `fail`, `panic`, `postpone`, `retry`, `slow` (never answers), `gate` (answers when
/// the test releases it); any other client is allowed / acknowledged.
#[derive(Clone, Default)]
pub struct TestMerchant {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub gate: Arc<Notify>,
    pub entered_gate: Arc<Notify>,
}

impl TestMerchant {
    pub fn calls(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn record(&self, endpoint: &'static str, nonce: &str, amount: String, ctx: &RequestContext) {
        self.seen.lock().unwrap().push(Seen {
            endpoint,
            nonce: nonce.to_owned(),
            amount,
            request_id: ctx.request_id.clone(),
            peer: ctx.peer,
            attempt: 0,
            previous_status: None,
        });
    }

    /// The common scripted behaviours; `None` means "the normal answer".
    async fn script(&self, client_id: &str) -> Result<Option<()>, HandlerError> {
        match client_id {
            "fail" => Err(HandlerError::msg(
                "ledger database is down: secret-detail-42",
            )),
            "panic" => panic!("handler bug: secret-detail-43"),
            "slow" => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(None)
            }
            "gate" => {
                self.entered_gate.notify_one();
                self.gate.notified().await;
                Ok(None)
            }
            _ => Ok(Some(())),
        }
    }
}

impl ProvidersValidator for TestMerchant {
    async fn validate_providers(
        &self,
        request: ProvidersValidationRequest,
        ctx: RequestContext,
    ) -> Result<ProvidersDecision, HandlerError> {
        let payment = &request.transaction_data.payment_data;
        self.record(
            "providers_validation",
            &payment.nonce,
            payment.amount.to_string(),
            &ctx,
        );
        self.script(&request.transaction_data.merchant_data.client_id)
            .await?;
        let providers = ProviderFilter::from_request(&request).apply(&request.providers);
        Ok(ProvidersDecision {
            message: format!("{} provider(s) available", providers.len()),
            providers,
        })
    }
}

impl TransactionValidator for TestMerchant {
    async fn validate_transaction(
        &self,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> Result<ValidationDecision, HandlerError> {
        self.record(
            "transaction_validation",
            request.nonce(),
            request.payment_data.amount.to_string(),
            &ctx,
        );
        let client = request.merchant_data.client_id.as_str();
        self.script(client).await?;
        Ok(match client {
            "deny" => ValidationDecision::deny("client is blocked"),
            "postpone" => ValidationDecision::Postpone,
            _ => ValidationDecision::Allow,
        })
    }
}

impl CallbackReceiver for TestMerchant {
    async fn receive_callback(
        &self,
        callback: CallbackBody,
        ctx: CallbackContext,
    ) -> Result<CallbackDecision, HandlerError> {
        self.record(
            "callback",
            &callback.nonce,
            callback.amount.to_string(),
            &ctx.request,
        );
        if let Some(seen) = self.seen.lock().unwrap().last_mut() {
            seen.attempt = ctx.attempt;
            seen.previous_status = ctx.previous_status.map(|s| s.code());
        }
        self.script(&callback.client_id).await?;
        Ok(match callback.client_id.as_str() {
            "retry" => CallbackDecision::retry_later("ledger is being migrated"),
            // Acknowledged, with an effect that aborts the booking.
            "abort" => {
                ctx.effects
                    .write(|_| Err(payhook::store::StoreError::abort("insufficient funds")));
                CallbackDecision::Ack
            }
            // Acknowledged, but held for a person instead of booked.
            "hold" => {
                ctx.effects.book(|_| {
                    Ok(payhook::store::Booking::held(
                        "the test merchant holds client hold",
                    ))
                });
                CallbackDecision::Ack
            }
            _ => CallbackDecision::Ack,
        })
    }
}

/// The validation id of [`TRANSACTION_VALIDATION`].
pub const POSTPONED_ID: i64 = 9_007_199_254_740_993;

impl TestServer {
    /// Sends [`TRANSACTION_VALIDATION`] for the client the [`TestMerchant`] postpones (the
    /// server must be Awaitable); returns its validation id.
    #[allow(dead_code, reason = "not every test binary postpones")]
    pub async fn postpone_validation(&self) -> i64 {
        self.postpone_another_validation("nonce-tv-1", POSTPONED_ID)
            .await
    }

    /// [`TestServer::postpone_validation`] under another nonce and validation id: `id`.
    #[allow(dead_code, reason = "not every test binary postpones")]
    pub async fn postpone_another_validation(&self, nonce: &str, id: i64) -> i64 {
        let body = with(
            TRANSACTION_VALIDATION,
            "/merchantData/clientId",
            Some(serde_json::json!("postpone")),
        );
        let body = with(&body, "/paymentData/nonce", Some(serde_json::json!(nonce)));
        let body = with(&body, "/validationId", Some(serde_json::json!(id)));
        let answer = self.post_json(VALIDATION_PATH, &body).await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        id
    }
}

/// A configuration fit for tests: unsigned callbacks allowed, everything else default.
pub fn test_config() -> Config {
    let mut config = Config::default();
    config.callback.allow_unsigned = true;
    config
}

/// A running server and the means to stop it.
pub struct TestServer {
    pub addr: SocketAddr,
    /// The store's data directory, removed when the test ends.
    pub data: tempfile::TempDir,
    pub merchant: TestMerchant,
    /// The app being served (a clone: it shares everything with the served one).
    pub app: App,
    shutdown: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    /// Starts a server with the default test configuration.
    pub async fn start() -> Self {
        Self::start_with(test_config()).await
    }

    /// Starts a server with `config`, all three endpoints served by one [`TestMerchant`].
    pub async fn start_with(mut config: Config) -> Self {
        let data = tempfile::tempdir().unwrap();
        config.store.path = data.path().join("store");
        Self::start_in(config, data, None).await
    }

    /// Starts a server like [`Self::start_with`] on `store`, which the test opened (a sled
    /// one at `config.store.path`, in `data`) to act on it while the server runs.
    #[allow(dead_code, reason = "not every test binary acts on the store")]
    pub async fn start_on(config: Config, data: tempfile::TempDir, store: impl Store) -> Self {
        Self::start_in(config, data, Some(Arc::new(store))).await
    }

    async fn start_in(
        config: Config,
        data: tempfile::TempDir,
        store: Option<Arc<dyn Store>>,
    ) -> Self {
        let merchant = TestMerchant::default();
        let mut builder = App::builder(config);
        if let Some(store) = store {
            builder = builder.shared_store(store);
        }
        let app = builder
            .providers_validator(merchant.clone())
            .transaction_validator(merchant.clone())
            .callback_receiver(merchant.clone())
            .build()
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(payhook::serve(listener, app.clone(), async move {
            let _ = rx.await;
        }));
        Self {
            addr,
            data,
            merchant,
            app,
            shutdown: Some(tx),
            task,
        }
    }

    /// `started`, as this server runs it: its store where [`Self::start_with`] put it.
    #[allow(
        dead_code,
        reason = "not every test binary reads a configuration again"
    )]
    pub fn as_run(&self, started: &Config) -> Config {
        let mut config = started.clone();
        config.store.path = self.data.path().join("store");
        config
    }

    /// Begins graceful shutdown.
    pub fn shut_down(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Waits (within [`DEADLINE`]) for `serve()` to return, and checks that it returned `Ok`.
    pub async fn stopped(&mut self) {
        tokio::time::timeout(DEADLINE, &mut self.task)
            .await
            .expect("serve() returned within the deadline")
            .unwrap()
            .unwrap();
    }

    /// The value of `name`'s sample (a metric without labels) on `/metrics`, if there.
    #[allow(dead_code, reason = "not every test binary reads metrics")]
    pub async fn metric(&self, name: &str) -> Option<f64> {
        self.metrics_text()
            .await
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// Reads `/metrics` and checks that each of `lines` is one of its lines, exactly.
    #[allow(dead_code, reason = "not every test binary reads metrics")]
    pub async fn assert_metrics(&self, lines: &[&str]) {
        let text = self.metrics_text().await;
        for line in lines {
            assert!(text.lines().any(|l| l == *line), "{line} in\n{text}");
        }
    }

    /// `/metrics`' text, answered 200.
    #[allow(dead_code, reason = "not every test binary reads metrics")]
    async fn metrics_text(&self) -> String {
        let response = self.send(&request("GET", "/metrics", &[], None)).await;
        let text = String::from_utf8_lossy(&response.body).into_owned();
        assert_eq!(response.status, 200, "{text}");
        text
    }

    /// POSTs a JSON body to `path`.
    pub async fn post_json(&self, path: &str, body: &str) -> RawResponse {
        self.send(&post(
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        ))
        .await
    }

    /// Sends raw request bytes and reads the whole answer.
    pub async fn send(&self, request: &[u8]) -> RawResponse {
        exchange(self.addr, request).await
    }

    /// The operating API's answer to `method` `path` with `body` (JSON), as a bearer of
    /// `token` (none: no `Authorization`).
    #[allow(dead_code, reason = "not every test binary calls the operating API")]
    pub async fn admin(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> RawResponse {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(bearer) = &bearer {
            headers.push(("authorization", bearer.as_str()));
        }
        self.send(&request(method, path, &headers, body.map(str::as_bytes)))
            .await
    }

    /// The inspector's session cookie (`payhook_admin=…`) a login with `token` gets.
    #[allow(dead_code, reason = "not every test binary opens the inspector")]
    pub async fn inspector_session(&self, token: &str) -> String {
        let login = self
            .send(&post(
                "/payhook/admin/inspector/login",
                &[("content-type", "application/x-www-form-urlencoded")],
                format!("token={token}").as_bytes(),
            ))
            .await;
        assert_eq!(
            login.status,
            303,
            "{}",
            String::from_utf8_lossy(&login.body)
        );
        let cookie = login.header("set-cookie").unwrap();
        assert!(!cookie.contains(token), "the cookie is no token: {cookie}");
        cookie.split(';').next().unwrap().to_owned()
    }

    /// A call of the operating API as the inspector's page makes it in the browser holding
    /// `session`: the session's cookie, and for a change its JSON `body` and the header a
    /// cross-site form cannot send.
    #[allow(dead_code, reason = "not every test binary opens the inspector")]
    pub async fn as_the_page(
        &self,
        session: &str,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> RawResponse {
        let mut headers = vec![("cookie", session)];
        if method != "GET" {
            headers.extend([
                ("content-type", "application/json"),
                ("x-payhook-inspector", "1"),
            ]);
        }
        self.send(&request(method, path, &headers, body.map(str::as_bytes)))
            .await
    }

    /// The inspector's page, as the browser holding `session` gets it (its HTML).
    #[allow(dead_code, reason = "not every test binary opens the inspector")]
    pub async fn inspector_page(&self, session: &str) -> String {
        let page = self
            .send(&request(
                "GET",
                "/payhook/admin/inspector",
                &[("cookie", session)],
                None,
            ))
            .await;
        assert_eq!(page.status, 200);
        String::from_utf8_lossy(&page.body).into_owned()
    }

    /// How the held result of (`nonce`, success) was resolved: the note and who.
    #[allow(dead_code, reason = "not every test binary holds results")]
    pub async fn resolution_of(&self, nonce: &str) -> (String, Option<String>) {
        let kept = self
            .app
            .store()
            .unwrap()
            .held_callback(&nonce.into(), payhook::model::TransactionStatus::Success)
            .await
            .unwrap()
            .unwrap();
        (kept.resolution, kept.resolved_by)
    }
}

/// Bytes of a `POST` with `Content-Length` and `Connection: close`.
pub fn post(path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    request("POST", path, headers, Some(body))
}

/// Bytes of a request; `body: None` sends no body and no `Content-Length`.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.unwrap_or_default());
    bytes
}

/// An HTTP answer as read off the socket.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The `message` of a `{"message": ...}` body, checking that the body has that shape.
    pub fn message(&self) -> String {
        let json = self.json();
        let object = json
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {json}"));
        assert_eq!(object.len(), 1, "error body has exactly one field: {json}");
        assert_eq!(self.header("content-type"), Some("application/json"));
        object["message"]
            .as_str()
            .unwrap_or_else(|| panic!("message is not a string: {json}"))
            .to_owned()
    }
}

/// Writes `request` on a new connection and reads until the server closes it.
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> RawResponse {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_response(&mut stream).await
}

/// Reads one whole answer (the server closes the connection after it).
pub async fn read_response(stream: &mut TcpStream) -> RawResponse {
    let mut raw = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut raw))
        .await
        .expect("answer within the deadline")
        .unwrap();
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> RawResponse {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete answer: {text:?}"));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    RawResponse {
        status,
        headers,
        body: body.as_bytes().to_vec(),
    }
}

/// Default paths.
pub const PROVIDERS_PATH: &str = "/payhook/providers-validation";
pub const VALIDATION_PATH: &str = "/payhook/transaction-validation";
pub const CALLBACK_PATH: &str = "/payhook/callback";

/// A providers validation request with every field of spec 4.2 / 2.2–2.4.
pub const PROVIDERS_VALIDATION: &str = r#"{
  "transactionData": {
    "merchantData": {
      "merchantHash": "6f1c2b1e-8a8f-4d55-9a3e-1c2b3d4e5f60",
      "clientId": "client-42",
      "additionalData": {"email": "client@example.com"}
    },
    "paymentData": {
      "nonce": "nonce-pv-1",
      "amount": 10.50,
      "currency": "EUR",
      "providerTags": [],
      "providerId": 0,
      "payType": "card"
    },
    "cashIn": true
  },
  "providers": [
    {"id": 11, "name": "CardPay", "collabId": 3,
     "currencies": [{"id": 1, "code": "EUR"}, {"id": 2, "code": "USD"}],
     "payTypes": [{"id": 5, "code": "card", "name": "Bank card", "cashIn": true, "cashOut": true,
                   "isCashInEnabled": true, "isCashOutEnabled": true}]},
    {"id": 12, "name": "DollarWire", "collabId": 4,
     "currencies": [{"id": 2, "code": "USD"}],
     "payTypes": [{"id": 6, "code": "card", "name": "Bank card", "cashIn": true, "cashOut": true,
                   "isCashInEnabled": true, "isCashOutEnabled": true}]},
    {"id": 13, "name": "PayoutOnly", "collabId": 5,
     "currencies": [{"id": 1, "code": "EUR"}],
     "payTypes": [{"id": 7, "code": "card", "name": "Bank card", "cashIn": false, "cashOut": true,
                   "isCashInEnabled": false, "isCashOutEnabled": true}]}
  ]
}"#;

/// A transaction validation request with every field of spec 4.2.
pub const TRANSACTION_VALIDATION: &str = r#"{
  "merchantData": {
    "merchantHash": "6f1c2b1e-8a8f-4d55-9a3e-1c2b3d4e5f60",
    "clientId": "client-42",
    "additionalData": {"accountNumber": "ACC-1"}
  },
  "paymentData": {"nonce": "nonce-tv-1", "amount": 250.00, "currency": "EUR", "providerId": 11},
  "providerData": {"cardBin": "411111"},
  "validationId": 9007199254740993,
  "cashIn": true
}"#;

/// A callback body with every field of spec 2.7. Its transaction is dated ahead: a callback
/// whose transaction last changed longer ago than the store's retention is refused (409),
/// and the suite must pass whatever day it runs.
pub const CALLBACK: &str = r#"{
  "id": 1001,
  "transactionReferenceId": "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e",
  "nonce": "nonce-cb-1",
  "providerId": 11,
  "providerTransactionId": "pt-9",
  "transactionType": 1,
  "transactionStatus": 4,
  "transactionStatusMessage": "Success",
  "transactionInternalMessage": "Thank you",
  "clientId": "client-42",
  "additionalData": {"orderId": "o-1"},
  "amount": 0.1,
  "currency": "EUR",
  "destinationAmount": 10.50,
  "destinationCurrency": "EUR",
  "createdUtc": "2099-01-02T03:04:05.1234567",
  "updatedUtc": "2099-01-02T03:04:06Z"
}"#;

/// `body` with the JSON value at `pointer` replaced (or removed when `value` is `None`).
pub fn with(body: &str, pointer: &str, value: Option<Value>) -> String {
    let mut json: Value = serde_json::from_str(body).unwrap();
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let object = json
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .unwrap();
    match value {
        Some(value) => object.insert(key.to_owned(), value),
        None => object.remove(key),
    };
    json.to_string()
}

/// Directory of the independent signature test vectors and keys.
pub fn signature_fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/signatures")
}

/// A signing key of the fixtures (`rsa2048`, `rsa3072`, `p256`, `p384`, `ed25519`).
pub fn fixture_signer(
    key: &str,
    algorithm: payhook::signature::Algorithm,
) -> payhook::signature::SigningKey {
    let pem = std::fs::read(signature_fixtures().join(key).join("private.pem")).unwrap();
    payhook::signature::SigningKey::from_pkcs8(&pem, algorithm).unwrap()
}

/// A test configuration whose callbacks must be signed by the fixture key(s) `keys`
/// (RSA PKCS#1 v1.5 SHA-256, base64, `X-Signature`).
pub fn signed_config(keys: &[&str]) -> Config {
    let mut config = Config::default();
    config.signature.keys = keys
        .iter()
        .map(|key| payhook::config::KeySource {
            id: Some((*key).to_owned()),
            file: Some(signature_fixtures().join(key).join("public.pem")),
            ..Default::default()
        })
        .collect();
    config
}

/// Sends `signal` (`INT`, `TERM`, …) to process `pid` through the shell's own `kill`: no
/// `kill` program needed (Debian's is in `procps`, which a minimal machine lacks).
#[allow(dead_code, reason = "not every test binary signals a process")]
pub fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("sh")
        .args(["-c", &format!("kill -{signal} {pid}")])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}: {status}");
}

/// The example merchant's binary, built by `cargo test` next to the test binaries.
pub fn example_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let debug_dir = exe.parent().and_then(std::path::Path::parent).unwrap();
    let binary = debug_dir.join("examples").join("merchant");
    assert!(
        binary.exists(),
        "{} is missing: run the suite with `cargo test`",
        binary.display()
    );
    binary
}

/// Starts the example merchant's binary in a clean environment with `env` (logging only
/// errors); returns it and its address once it prints `listening on`.
pub fn spawn_example(env: &[(&str, String)]) -> (Spawned, SocketAddr) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(example_binary())
        .env_clear()
        .env("RUST_LOG", "error")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let address = loop {
        let line = lines
            .next()
            .expect("the merchant printed its address")
            .unwrap();
        if let Some(address) = line.strip_prefix("listening on ") {
            break address.parse().unwrap();
        }
    };
    (Spawned(child), address)
}

/// Runs the example merchant's binary in a clean environment with `env` (logging only
/// errors) and `args` until it exits on its own — for start-ups that must fail. Panics if it
/// is still running after [`DEADLINE`].
pub fn run_example_to_exit(env: &[(&str, String)], args: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new(example_binary());
    command
        .env_clear()
        .env("RUST_LOG", "error")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(args);
    exited_within(command, DEADLINE)
}

/// `command`'s output once it exits on its own — for start-ups that must fail. Panics,
/// with what it printed, if it is still running after `limit` (a service that started would
/// serve forever).
pub fn exited_within(mut command: std::process::Command, limit: Duration) -> std::process::Output {
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "{command:?} did not exit within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A child process that is killed (SIGKILL) when dropped, so that a failing test leaves no
/// server running behind it.
pub struct Spawned(pub std::process::Child);

impl Spawned {
    /// Kills the process (SIGKILL: no shutdown, no flush) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The settings that make the example merchant verify the Ed25519 fixture key.
pub fn ed25519_example_env() -> Vec<(&'static str, String)> {
    let key = signature_fixtures().join("ed25519/public.pem");
    vec![
        ("PAYHOOK_SIGNATURE_ALGORITHM", "ed25519".to_owned()),
        (
            "PAYHOOK_SIGNATURE_KEYS",
            format!("[{{id = \"test\", file = \"{}\"}}]", key.display()),
        ),
    ]
}

/// The `PAYHOOK_GATEWAY_*` variables of a `[gateway]` section, for a child process.
pub fn gateway_env(gateway: &payhook::config::GatewayConfig) -> Vec<(&'static str, String)> {
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    vec![
        ("PAYHOOK_GATEWAY_AUTH_URL", text(&gateway.auth_url)),
        ("PAYHOOK_GATEWAY_GATEWAY_URL", text(&gateway.gateway_url)),
        ("PAYHOOK_GATEWAY_USERNAME", text(&gateway.username)),
        (
            "PAYHOOK_GATEWAY_PASSWORD",
            gateway
                .password
                .as_ref()
                .map(|p| p.expose().to_owned())
                .unwrap_or_default(),
        ),
    ]
}

/// `env` with owned names, as `Command::envs` in a moved closure wants them.
pub fn owned_env(env: &[(&str, String)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

/// What `open` opens once the holder of a store's lock in this process lets go of it (sled
/// does a moment after its holder is dropped): tried again while its error says `busy`,
/// within five seconds.
#[allow(dead_code, reason = "not every test binary opens a store again")]
pub async fn once_let_go<T, E: std::fmt::Display>(
    mut open: impl FnMut() -> Result<T, E>,
    busy: &str,
) -> T {
    let mut tries = 0;
    loop {
        match open() {
            Ok(opened) => return opened,
            Err(error) if tries < 250 => {
                assert!(error.to_string().contains(busy), "{error}");
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("{error}"),
        }
    }
}

/// Says that a test was skipped, and why, where a person running the tests sees it: libtest
/// hides what a passing test prints through `eprintln!`, but not a direct write to stderr.
pub fn announce_skip(test: &str, why: &str) {
    announce(&format!("SKIPPED {test}: {why}"));
}

/// A line for the person running the tests (a test's figures), shown even when it passes.
pub fn announce(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A small deterministic generator (xorshift), so that a run is the same every time.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The whole HTTP request of a callback ([`CALLBACK`] with `nonce`, `status`, `amount` and
/// `client`), signed by `signer` in the `X-Signature` header (base64).
pub fn signed_callback(
    signer: &payhook::signature::SigningKey,
    nonce: &str,
    status: i32,
    amount: &str,
    client: &str,
) -> Vec<u8> {
    signed_callback_changed_at(
        signer,
        nonce,
        status,
        amount,
        client,
        "2099-01-02T03:04:06Z",
    )
}

/// [`signed_callback`] whose transaction last changed at `updated` (`updatedUtc`): a later
/// status of a transaction carries a later time.
pub fn signed_callback_changed_at(
    signer: &payhook::signature::SigningKey,
    nonce: &str,
    status: i32,
    amount: &str,
    client: &str,
    updated: &str,
) -> Vec<u8> {
    let body = CALLBACK
        .replace(
            "\"updatedUtc\": \"2099-01-02T03:04:06Z\"",
            &format!("\"updatedUtc\": \"{updated}\""),
        )
        .replace("\"nonce-cb-1\"", &format!("\"{nonce}\""))
        .replace(
            "\"transactionStatus\": 4",
            &format!("\"transactionStatus\": {status}"),
        )
        .replace("\"amount\": 0.1", &format!("\"amount\": {amount}"))
        .replace(
            "\"clientId\": \"client-42\"",
            &format!("\"clientId\": \"{client}\""),
        );
    signed_post(signer, &body)
}

/// The whole HTTP request of the callback `body`, signed by `signer` in the `X-Signature`
/// header (base64).
pub fn signed_post(signer: &payhook::signature::SigningKey, body: &str) -> Vec<u8> {
    let signature = signer
        .header_value(body.as_bytes(), payhook::signature::Encoding::Base64, None)
        .unwrap();
    post(
        CALLBACK_PATH,
        &[
            ("Content-Type", "application/json"),
            ("X-Signature", &signature),
        ],
        body.as_bytes(),
    )
}

/// Everything this test binary logs from now on at `max_level` and above, as text: the
/// first call installs the binary's subscriber (later calls share it, whatever level).
pub fn captured_logs(
    max_level: tracing::Level,
) -> &'static std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    use std::sync::{Arc, Mutex, OnceLock};
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logs);
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(max_level)
            .with_writer(move || LogSink(Arc::clone(&sink)))
            .init();
        logs
    })
}

struct LogSink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Serves `handle` over HTTP/1.1 on 127.0.0.1 port 0, every connection on a task of its
/// own, for as long as the test runs: a peer of payhook's that a test scripts (a merchant's
/// callback URL, a trace collector). Returns the address.
pub async fn serve_http<F, R>(handle: F) -> SocketAddr
where
    F: Fn(hyper::Request<hyper::body::Incoming>) -> R + Clone + Send + Sync + 'static,
    R: std::future::Future<Output = hyper::Response<http_body_util::Full<bytes::Bytes>>>
        + Send
        + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let handle = handle.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let answer = handle(request);
                    async move { Ok::<_, std::convert::Infallible>(answer.await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// How many times the test merchant's callback handler was called for `nonce`.
pub fn callbacks_handled(server: &TestServer, nonce: &str) -> usize {
    server
        .merchant
        .calls()
        .iter()
        .filter(|seen| seen.endpoint == "callback" && seen.nonce == nonce)
        .count()
}

/// The failing callbacks the operating API lists, read with the admin bearer `token`.
pub async fn failing_listed(server: &TestServer, token: &str) -> Vec<Value> {
    let response = server
        .send(&request(
            "GET",
            "/payhook/admin/callbacks/failing",
            &[("Authorization", &format!("Bearer {token}"))],
            None,
        ))
        .await;
    assert_eq!(response.status, 200, "{}", response.message());
    response.json().as_array().unwrap().clone()
}

/// sled's database at `path`, opened directly (a test reading or damaging what payhook
/// wrote), once a store of this process that used it has let it go: sled releases the
/// directory's lock only when its last I/O thread ends, a moment after the store was
/// dropped — as `SledStore::open` waits for it too.
pub fn sled_when_free(path: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(error)
                if error.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => panic!("cannot open sled at {}: {error}", path.display()),
        }
    }
}
