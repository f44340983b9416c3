//! Running an [`App`] on a TCP listener: HTTP/1.1 and HTTP/2, slow-client protection, and
//! graceful shutdown.

use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
};
use std::{convert::Infallible, future::Future, io, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::Semaphore};

use super::{App, PeerAddr, preface::PrefaceDeadline};

/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// HTTP/2: how often an idle connection's peer is pinged, and how long it has to answer
/// before the connection is closed (a peer that vanished without closing).
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` completes, then shuts down gracefully: stops
/// accepting, lets in-flight requests finish (up to `server.shutdown_grace`), and returns.
///
/// HTTP/1.1 and HTTP/2 (prior knowledge) are both served. A client that does not send its
/// request headers within `server.header_read_timeout` is disconnected — also one that
/// connects and sends nothing, and an HTTP/1 connection idle between requests for that long;
/// one that does not send its body within `server.request_timeout` gets 408. An HTTP/2
/// connection is pinged when idle and closed when its peer stops answering. At most
/// `server.max_connections` connections are served at once; more wait to be accepted.
///
/// Bind port 0 in tests and read the address from the listener:
///
/// ```no_run
/// # async fn run(app: payhook::App) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// println!("listening on {}", listener.local_addr()?);
/// payhook::serve(listener, app, payhook::shutdown_signal()).await
/// # }
/// ```
///
/// # Errors
///
/// Only an error of the listener that is not about one connection ends the loop early.
pub async fn serve(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let server = app.server_config().clone();
    app.start_background();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(server.max_connections));
    tracing::info!(address = ?listener.local_addr().ok(), "serving");

    tokio::pin!(shutdown);
    let mut saturated = false;
    loop {
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => {
                saturated = false;
                slot
            }
            Err(_) => {
                if !std::mem::replace(&mut saturated, true) {
                    tracing::warn!(
                        max_connections = server.max_connections,
                        "connection limit reached; new connections wait until one closes"
                    );
                }
                tokio::select! {
                    slot = Arc::clone(&slots).acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) if is_connection_error(&error) => continue,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let app = app.clone();
        let service = service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(PeerAddr(peer));
            let app = app.clone();
            async move { Ok::<_, Infallible>(app.handle(request).await) }
        });
        let stream = PrefaceDeadline::new(stream, server.header_read_timeout);
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
            drop(slot);
        });
    }

    drop(listener);
    app.begin_shutdown();
    tracing::info!(in_flight_connections = graceful.count(), "shutting down");
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(server.shutdown_grace) => {
            tracing::warn!(grace = ?server.shutdown_grace, "connections still open after the grace period; closing them");
        }
    }
    Ok(())
}

/// Errors of one connection's handshake, which say nothing about the listener.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Completes on SIGINT (Ctrl-C) or, on Unix, SIGTERM: pass it to [`serve`] in a binary.
pub async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => tracing::info!("interrupt received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}
