//! Running an [`App`] on a TCP listener: HTTP/1.1 and HTTP/2, slow-client protection, and
//! graceful shutdown.

use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
};
use std::{
    convert::Infallible,
    future::Future,
    io,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::net::TcpListener;

use super::connection::{Admission, Connections, Limits};
use super::request::PeerAddr;
use super::{App, preface::PrefaceDeadline};

/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// While every connection is working, how often the waiting one looks for a place again.
const FULL_RECHECK: Duration = Duration::from_millis(50);

/// HTTP/2: how often an idle connection's peer is pinged, and how long it has to answer
/// before the connection is closed (a peer that vanished without closing).
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2: requests one connection may have open at once (hyper's default is 200). One
/// connection's streams take their part of `server.body_memory_limit` like as many
/// connections would; beyond this many, a client waits for one to end.
const H2_MAX_STREAMS: u32 = 32;
/// HTTP/1: the most a request's head may take while it arrives (hyper's default is about
/// 400 KiB). A connection that sends its head quickly is never behind the pace, so this is
/// what each connection may hold until `header_read_timeout`: with `max_connections` of
/// them, 32 MiB at most instead of 200. A longer head (a URI included) is answered 431 by
/// hyper. It also caps a read from the socket, so a large body arrives in frames of at
/// most this.
const H1_MAX_HEAD: usize = 64 * 1024;

/// Serves `app` on `listener` until `shutdown` completes, then shuts down gracefully: stops
/// accepting, lets in-flight requests finish (up to `server.shutdown_grace`), and returns.
///
/// HTTP/1.1 and HTTP/2 (prior knowledge) are both served. A client that does not send its
/// request headers within `server.header_read_timeout` is disconnected — also one that
/// connects and sends nothing, and an HTTP/1 connection idle between requests for that long
/// (an HTTP/2 connection whose first request's head is still arriving is closed after
/// `server.idle_timeout`, as one with no request in progress, its heads held to 64 KiB as
/// HTTP/1's: a longer one is refused, 431 without a body or the stream reset);
/// one that does not send its body within `server.request_timeout`, or sends it slower than
/// `server.min_body_rate`, gets 408. A connection with no request in progress for
/// `server.idle_timeout` is closed, HTTP/2 included; an HTTP/2 connection is also pinged and
/// closed when its peer stops answering. At most `server.max_connections` connections are
/// served at once, and `server.max_connections_per_address` from one address: a new one
/// takes the place of the least active connection whose handler is not running, and waits
/// only when every connection is working (the rules are in `src/server/connection.rs`).
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
    app.start_automatic_background();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout)
        .max_buf_size(H1_MAX_HEAD)
        // A client that shuts its sending side once its request is out (`nc -N`, some
        // proxies' health checks) is still answered: without it hyper takes the end of
        // input for a request cut short, and closes the connection unanswered.
        .half_close(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        // As much head as HTTP/1 takes (h2's own default is 16 KiB): a request is not
        // refused by one protocol and served by the other.
        .max_header_list_size(H1_MAX_HEAD as u32)
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    let graceful = GracefulShutdown::new();
    let connections = Connections::new(
        Limits {
            max: server.max_connections,
            per_address: server.max_connections_per_address,
            idle_timeout: server.idle_timeout,
            // With the minimum rate off, a connection silent for a second is behind.
            pace: server.min_body_rate.max(1),
            patience: server.min_body_rate_grace,
        },
        Arc::clone(&app.inner.metrics),
    );
    let janitor = tokio::spawn(close_idle(Arc::clone(&connections)));
    tracing::info!(address = ?listener.local_addr().ok(), "serving");

    tokio::pin!(shutdown);
    let mut warned = Warned::default();
    'accept: loop {
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
        let slot = loop {
            match connections.admit(peer.ip()) {
                Admission::Admitted(slot) => break Some(slot),
                Admission::AddressFull => {
                    warned.address_full(peer, server.max_connections_per_address);
                    break None;
                }
                Admission::Full => {
                    warned.full(server.max_connections);
                    // A slot frees when a connection closes, or becomes sheddable when a
                    // handler answers: look again at either.
                    tokio::select! {
                        () = connections.freed() => {}
                        () = tokio::time::sleep(FULL_RECHECK) => {}
                        () = &mut shutdown => break 'accept,
                    }
                }
            }
        };
        let Some(slot) = slot else {
            // Closed at once: its address holds its limit, all of them working.
            drop(stream);
            continue;
        };
        let activity = Arc::clone(&slot.activity);
        let app = app.clone();
        let service = service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(PeerAddr(peer));
            request.extensions_mut().insert(Arc::clone(&activity));
            let busy = activity.request();
            let app = app.clone();
            async move {
                let response = app.handle(request).await;
                drop(busy);
                Ok::<_, Infallible>(response)
            }
        });
        let activity = Arc::clone(&slot.activity);
        let stream =
            PrefaceDeadline::new(stream, server.header_read_timeout, Arc::clone(&activity));
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            tokio::select! {
                ended = connection => if let Err(error) = ended {
                    tracing::debug!(%peer, %error, "connection ended with an error");
                },
                () = activity.shed() => {}
            }
            drop(slot);
        });
    }

    drop(listener);
    janitor.abort();
    app.begin_shutdown();
    tracing::info!(in_flight_connections = graceful.count(), "shutting down");
    let grace_ends = tokio::time::Instant::now() + server.shutdown_grace;
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections closed"),
        () = tokio::time::sleep_until(grace_ends) => {
            tracing::warn!(grace = ?server.shutdown_grace, "connections still open after the grace period; closing them");
        }
    }
    if tokio::time::timeout_at(grace_ends, app.late_handlers_finished())
        .await
        .is_err()
    {
        tracing::warn!(grace = ?server.shutdown_grace, "validation handlers still deciding after their time budget at the end of the grace period; their validations stay pending until decided or their deadline");
    }
    Ok(())
}

/// Closes idle connections, every [`Connections::idle_check_interval`], until aborted.
async fn close_idle(connections: Arc<Connections>) {
    let mut tick = tokio::time::interval(connections.idle_check_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        connections.close_idle();
    }
}

/// Warnings about refused or waiting connections, at most one a minute each: an attack
/// must not fill the log.
#[derive(Default)]
struct Warned {
    full: Option<Instant>,
    address_full: Option<Instant>,
}

impl Warned {
    const EVERY: Duration = Duration::from_secs(60);

    fn due(last: &mut Option<Instant>) -> bool {
        let due = last.is_none_or(|at| at.elapsed() >= Self::EVERY);
        if due {
            *last = Some(Instant::now());
        }
        due
    }

    fn full(&mut self, max_connections: usize) {
        if Self::due(&mut self.full) {
            tracing::warn!(
                max_connections,
                "every connection is working; new connections wait until one closes"
            );
        }
    }

    fn address_full(&mut self, peer: SocketAddr, per_address: usize) {
        if Self::due(&mut self.address_full) {
            tracing::warn!(
                address = %peer.ip(),
                max_connections_per_address = per_address,
                "an address holds its limit of working connections; its new connections are closed (at most one such warning a minute)"
            );
        }
    }
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
