//! Behind a reverse proxy: `X-Forwarded-For` is believed only from `server.trusted_proxies`,
//! and the client is the right-most forwarded address that is not a trusted proxy — so a
//! client cannot put an allowed address in the header and be let in.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use support::*;

/// Transaction validations allowed from 203.0.113.0/24 only.
fn config(trusted: &[&str]) -> payhook::Config {
    let mut config = test_config();
    config.auth.transaction_validation.allow_ips = vec!["203.0.113.0/24".into()];
    config.server.trusted_proxies = trusted.iter().map(|t| (*t).to_owned()).collect();
    config
}

/// `config` with the proxy's own address (this machine: the test connects from it) allowed
/// too.
fn proxy_host_allowed(mut config: payhook::Config) -> payhook::Config {
    config
        .auth
        .transaction_validation
        .allow_ips
        .push("127.0.0.1".into());
    config
}

async fn validate(server: &TestServer, forwarded: &[&str]) -> u16 {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(forwarded.iter().map(|f| ("x-forwarded-for", *f)));
    server
        .send(&post(
            VALIDATION_PATH,
            &headers,
            TRANSACTION_VALIDATION.as_bytes(),
        ))
        .await
        .status
}

#[tokio::test]
async fn a_trusted_proxy_forwards_the_client_address() {
    // The test client connects from 127.0.0.1: the proxy.
    let server = TestServer::start_with(config(&["127.0.0.1/32"])).await;
    assert_eq!(validate(&server, &["203.0.113.9"]).await, 200);
    assert_eq!(validate(&server, &["198.51.100.1"]).await, 403);
    // Proxies append: the left part is whatever the client sent, the right part is true.
    assert_eq!(validate(&server, &["203.0.113.9, 198.51.100.7"]).await, 403);
    assert_eq!(validate(&server, &["198.51.100.7, 203.0.113.9"]).await, 200);
    // Several headers read as one list, in order.
    assert_eq!(
        validate(&server, &["198.51.100.7", "203.0.113.9"]).await,
        200
    );
    // A header that cannot be read from a trusted proxy leaves the client unknown: refused.
    assert_eq!(validate(&server, &["not-an-address"]).await, 403);
    // No header: the client is unknown.
    assert_eq!(validate(&server, &[]).await, 403);
}

#[tokio::test]
async fn a_proxy_that_forwards_no_client_address_does_not_stand_in_for_its_clients() {
    // The proxy's own address is allowed too (say, a health check from the proxy host)...
    let server = TestServer::start_with(proxy_host_allowed(config(&["127.0.0.1/32"]))).await;
    assert_eq!(validate(&server, &["203.0.113.9"]).await, 200);
    // ...but a request it forwards without saying from whom is not the proxy's own: every
    // client behind a proxy that sets no X-Forwarded-For would otherwise be let in.
    assert_eq!(validate(&server, &[]).await, 403);
    // Nor is one whose header names only trusted proxies.
    assert_eq!(validate(&server, &["127.0.0.1"]).await, 403);
}

#[tokio::test]
async fn without_trusted_proxies_the_header_is_ignored() {
    let server = TestServer::start_with(config(&[])).await;
    assert_eq!(validate(&server, &["203.0.113.9"]).await, 403);

    let mut bad = config(&["a-proxy"]);
    bad.callback.allow_unsigned = true;
    let error = payhook::App::builder(bad)
        .transaction_validator(TestMerchant::default())
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("server.trusted_proxies"), "{error}");
}

/// A proxy on this machine left out of `server.trusted_proxies`, whose own address is in
/// `allow_ips` (loopback, or an ingress's network): every client it forwards would be taken
/// to be the proxy, and let in. A request with forwarding headers from a peer that is not a
/// trusted proxy is refused, saying why; without them it is the peer's own. (It was let in.)
#[tokio::test]
async fn a_proxy_left_out_of_trusted_proxies_does_not_pass_its_clients_as_itself() {
    let server = TestServer::start_with(proxy_host_allowed(config(&[]))).await;
    let forwarded = server
        .send(&post(
            VALIDATION_PATH,
            &[
                ("content-type", "application/json"),
                ("x-forwarded-for", "198.51.100.1"),
            ],
            TRANSACTION_VALIDATION.as_bytes(),
        ))
        .await;
    assert_eq!(forwarded.status, 403);
    assert!(
        forwarded
            .message()
            .starts_with("the call was forwarded by a proxy that is not in server.trusted_proxies"),
        "{}",
        forwarded.message()
    );
    for header in ["forwarded", "x-real-ip"] {
        let forwarded = server
            .send(&post(
                VALIDATION_PATH,
                &[
                    ("content-type", "application/json"),
                    (header, "198.51.100.1"),
                ],
                TRANSACTION_VALIDATION.as_bytes(),
            ))
            .await;
        assert_eq!(forwarded.status, 403, "{header}");
    }
    // The proxy host's own call (a health check): its address is allowed.
    assert_eq!(validate(&server, &[]).await, 200);
    // An endpoint without allow_ips takes the forwarded request as before: no address is
    // believed or checked.
    let open = TestServer::start_with(test_config()).await;
    assert_eq!(validate(&open, &["198.51.100.1"]).await, 200);
}
