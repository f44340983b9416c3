//! A merchant whose servers reach the internet through an egress proxy, whose aggregator
//! endpoint has a certificate from a private CA, and which must present a client certificate
//! (mutual TLS), can still log in: the gateway client tunnels through the proxy with CONNECT,
//! trusts `gateway.ca_file`, and presents `gateway.client_cert_file`. Without the CA, or
//! without the client certificate, the call fails and says why.
//!
//! On loopback: the mock gateway (plain HTTP) behind a TLS front that requires a client
//! certificate of the private CA, and a CONNECT proxy that counts its tunnels.
#![allow(clippy::unwrap_used, reason = "tests")]

use payhook::config::GatewayConfig;
use payhook::gateway::GatewayClient;
use payhook::sim::{MockGateway, MockGatewayConfig};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The private CA and what it signed, as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    server_chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    server_key: rustls::pki_types::PrivateKeyDer<'static>,
    ca_der: rustls::pki_types::CertificateDer<'static>,
}

/// A new CA (its certificate and key) and a client certificate it signed (with its key).
fn ca_and_client() -> ((rcgen::Certificate, KeyPair), (rcgen::Certificate, KeyPair)) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client = CertificateParams::new(vec!["merchant.example".to_owned()])
        .unwrap()
        .signed_by(&client_key, &ca, &ca_key)
        .unwrap();
    ((ca, ca_key), (client, client_key))
}

impl Pki {
    fn new() -> Self {
        let ((ca, ca_key), (client, client_key)) = ca_and_client();
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&server_key, &ca, &ca_key)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("client.pem"), client.pem()).unwrap();
        std::fs::write(
            dir.path().join("client-key.pem"),
            client_key.serialize_pem(),
        )
        .unwrap();
        Self {
            server_chain: vec![server.der().clone()],
            server_key: rustls::pki_types::PrivateKeyDer::try_from(server_key.serialize_der())
                .unwrap(),
            ca_der: ca.der().clone(),
            dir,
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// A TLS front on loopback for `backend` (plain HTTP), requiring a client certificate of the
/// private CA; returns its port.
async fn tls_front(pki: &Pki, backend: std::net::SocketAddr) -> u16 {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der.clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(pki.server_chain.clone(), pki.server_key.clone_key())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A handshake without the client certificate fails here, as it should.
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    port
}

/// A CONNECT proxy on loopback that counts the tunnels it opened; returns its port.
async fn connect_proxy(tunnels: Arc<AtomicUsize>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let tunnels = Arc::clone(&tunnels);
            tokio::spawn(async move {
                let mut reader = BufReader::new(socket);
                let mut request = String::new();
                reader.read_line(&mut request).await.unwrap();
                let target = request
                    .strip_prefix("CONNECT ")
                    .and_then(|rest| rest.split_whitespace().next())
                    .unwrap()
                    .to_owned();
                loop {
                    let mut header = String::new();
                    reader.read_line(&mut header).await.unwrap();
                    if header == "\r\n" {
                        break;
                    }
                }
                let mut client = reader.into_inner();
                let target = target.replace("localhost", "127.0.0.1");
                let Ok(mut upstream) = TcpStream::connect(&target).await else {
                    let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                    return;
                };
                tunnels.fetch_add(1, Ordering::SeqCst);
                client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    port
}

fn config(front: u16, proxy: u16, pki: &Pki, mock: &GatewayConfig) -> GatewayConfig {
    let url = format!("https://localhost:{front}");
    GatewayConfig {
        auth_url: Some(url.clone()),
        gateway_url: Some(url),
        proxy: Some(format!("http://127.0.0.1:{proxy}").into()),
        // Every host through the proxy, whatever NO_PROXY the machine exports.
        no_proxy: Some(String::new()),
        ca_file: Some(pki.file("ca.pem")),
        client_cert_file: Some(pki.file("client.pem")),
        client_key_file: Some(pki.file("client-key.pem")),
        ..mock.clone()
    }
}

struct Setup {
    pki: Pki,
    mock: MockGateway,
    front: u16,
    proxy: u16,
    tunnels: Arc<AtomicUsize>,
}

async fn setup() -> Setup {
    let pki = Pki::new();
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let backend = mock.url().trim_start_matches("http://").parse().unwrap();
    let front = tls_front(&pki, backend).await;
    let tunnels = Arc::new(AtomicUsize::new(0));
    let proxy = connect_proxy(Arc::clone(&tunnels)).await;
    Setup {
        pki,
        mock,
        front,
        proxy,
        tunnels,
    }
}

#[tokio::test]
async fn login_goes_through_the_proxy_to_a_private_ca_with_a_client_certificate() {
    let s = setup().await;
    let client =
        GatewayClient::new(&config(s.front, s.proxy, &s.pki, &s.mock.gateway_config())).unwrap();
    let session = client.login().await.unwrap();
    assert!(!session.access_token.expose().is_empty());
    assert!(
        s.tunnels.load(Ordering::SeqCst) >= 1,
        "the call went through the proxy"
    );
}

/// Why a login with `config` failed, as payhook prints errors: a report with the causes
/// (the TLS reason is a cause of the gateway's error).
async fn login_refused(config: &payhook::gateway::GatewayConfig) -> String {
    let error = GatewayClient::new(config)
        .unwrap()
        .login()
        .await
        .unwrap_err();
    payhook::Report::new(&error).to_string()
}

#[tokio::test]
async fn without_the_private_ca_the_server_is_not_trusted() {
    let s = setup().await;
    let mut config = config(s.front, s.proxy, &s.pki, &s.mock.gateway_config());
    config.ca_file = None;
    let error = login_refused(&config).await;
    assert!(error.to_lowercase().contains("certificate"), "{error}");
}

#[tokio::test]
async fn without_the_client_certificate_the_aggregator_refuses_the_connection() {
    let s = setup().await;
    let mut config = config(s.front, s.proxy, &s.pki, &s.mock.gateway_config());
    config.client_cert_file = None;
    config.client_key_file = None;
    let error = login_refused(&config).await;
    assert!(error.to_lowercase().contains("certificate"), "{error}");
}

#[test]
fn unusable_transport_settings_are_named() {
    let pki = Pki::new();
    let base = GatewayConfig {
        auth_url: Some("https://aggregator.example".into()),
        gateway_url: Some("https://aggregator.example".into()),
        username: Some("shop".into()),
        password: Some("password".into()),
        ..GatewayConfig::default()
    };
    let refused = |config: GatewayConfig| GatewayClient::new(&config).unwrap_err().to_string();

    let only_cert = GatewayConfig {
        client_cert_file: Some(pki.file("client.pem")),
        ..base.clone()
    };
    assert!(refused(only_cert).contains("client_key_file"));

    let missing_ca = GatewayConfig {
        ca_file: Some(Path::new("/nonexistent/ca.pem").to_path_buf()),
        ..base.clone()
    };
    let error = refused(missing_ca);
    assert!(
        error.contains("gateway.ca_file") && error.contains("/nonexistent/ca.pem"),
        "{error}"
    );

    let not_a_ca = GatewayConfig {
        ca_file: Some(pki.file("client-key.pem")),
        ..base.clone()
    };
    assert!(refused(not_a_ca).contains("gateway.ca_file"));

    let socks = GatewayConfig {
        proxy: Some("socks5://user:hunter2@127.0.0.1:1080".into()),
        ..base
    };
    let error = refused(socks);
    assert!(
        error.contains("gateway.proxy") && !error.contains("hunter2"),
        "{error}"
    );
}

/// A client certificate and its key as PEM text, from a CA of its own: one the TLS front
/// does not trust.
fn foreign_client_certificate() -> (String, String) {
    let (_, (certificate, key)) = ca_and_client();
    (certificate.pem(), key.serialize_pem())
}

/// A client certificate renewed in place (the same paths, new contents) is presented from
/// the next connection on once the files are read again — at once, though the session's
/// renewals were paused after the refused handshake; files read again unchanged change
/// nothing, and a file that cannot be used is refused while the client goes on with the ones
/// it had.
#[tokio::test]
async fn a_client_certificate_renewed_in_place_is_presented_once_read_again() {
    let s = setup().await;
    let good = |name: &str| std::fs::read(s.pki.file(name)).unwrap();
    let (good_cert, good_key) = (good("client.pem"), good("client-key.pem"));
    let (foreign_cert, foreign_key) = foreign_client_certificate();
    std::fs::write(s.pki.file("client.pem"), foreign_cert).unwrap();
    std::fs::write(s.pki.file("client-key.pem"), foreign_key).unwrap();
    let config = config(s.front, s.proxy, &s.pki, &s.mock.gateway_config());
    let client = GatewayClient::new(&config).unwrap();
    // A lookup logs in first; the mock aggregator knows no such transaction (404) once in.
    let look_up = || client.transaction(uuid::Uuid::nil());
    // The front refuses the handshake of a certificate its CA did not sign; renewals pause.
    for _ in 0..2 {
        let error = look_up().await.unwrap_err();
        assert!(
            matches!(error, payhook::gateway::GatewayError::Network { .. }),
            "{error:?}"
        );
    }

    std::fs::write(s.pki.file("client.pem"), &good_cert).unwrap();
    std::fs::write(s.pki.file("client-key.pem"), &good_key).unwrap();
    assert!(client.clone().read_tls_files_again(&config).unwrap());
    let error = look_up().await.unwrap_err();
    assert_eq!(error.status(), Some(404), "logged in: {error:?}");
    assert!(!client.read_tls_files_again(&config).unwrap(), "unchanged");

    std::fs::write(s.pki.file("client.pem"), "not a certificate").unwrap();
    let error = client.read_tls_files_again(&config).unwrap_err();
    assert!(
        error.to_string().contains("gateway.client_cert_file"),
        "{error}"
    );
    client.login().await.unwrap();
}
