//! The crate-level error: what a merchant's `main` may get from payhook as a whole, and how
//! to show it to a person.
//!
//! Modules have precise error types of their own ([`ConfigError`], [`BuildError`], the
//! model's parse errors); this enum wraps them at the boundary so that a binary can use one
//! `?` for all of them.
//!
//! An error is shown to a person once, as its message and its causes — never as `Debug`
//! (`Os { code: 98, kind: AddrInUse, .. }` tells an operator nothing). [`Report`] renders any
//! error that way: what failed (naming the address, file or key), the chain of causes, and
//! what to do about it where payhook knows.

use std::net::SocketAddr;

use crate::report::Report;

use crate::config::ConfigError;
use crate::server::BuildError;
use crate::store::StoreError;

/// Any error payhook returns to an application.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration could not be loaded or is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The app could not be built from its handlers and configuration.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The listening socket could not be bound (see [`bind`](crate::bind)).
    #[error("cannot listen on {address}{}", bind_hint(source))]
    Bind {
        /// The address of `server.listen`.
        address: SocketAddr,
        /// Why the operating system refused it.
        source: std::io::Error,
    },
    /// Binding or serving the socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Error {
    /// This error as a person should read it: its message and each cause not already
    /// part of it, one per line (see [`Report`]).
    ///
    /// ```
    /// let error = payhook::Error::from(payhook::Config::load(
    ///     Some("no-such-file.toml".as_ref()),
    ///     std::iter::empty(),
    /// ).unwrap_err());
    /// let text = error.report().to_string();
    /// assert!(text.contains("no-such-file.toml"), "{text}");
    /// assert!(!text.contains("Os {"), "no Debug dump: {text}");
    /// ```
    pub fn report(&self) -> Report<'_> {
        Report::new(self)
    }
}

/// What to do about a bind error, where the cause is a common one.
fn bind_hint(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => {
            "; another process listens there: stop it, or choose another address with \
             server.listen (PAYHOOK_SERVER_LISTEN)"
        }
        std::io::ErrorKind::PermissionDenied => {
            "; ports below 1024 need privileges: choose another port with server.listen \
             (PAYHOOK_SERVER_LISTEN)"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            "; no network interface of this machine has that address: fix server.listen \
             (PAYHOOK_SERVER_LISTEN)"
        }
        _ => "",
    }
}

/// Binds the listening socket of `address` (`server.listen`), so that a failure names the
/// address and what to do.
///
/// Its queue of connections not yet accepted holds 4,096 (the kernel may cap
/// it lower: `net.core.somaxconn`). A longer queue than tokio's 1,024 matters under a
/// connection flood: while the server sheds the attack's connections, their reconnections
/// wait in this queue, and when it is full the kernel drops a genuine client's SYN, which
/// then waits a second for its retransmission.
///
/// ```no_run
/// # async fn run() -> Result<(), payhook::Error> {
/// let config = payhook::Config::from_env()?;
/// let listener = payhook::bind(config.server.listen).await?;
/// # let _ = listener; Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::Bind`] with the address and the operating system's reason (e.g. the address is
/// in use).
pub async fn bind(address: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    let listen = || {
        let socket = if address.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As `TcpListener::bind` does: a restarted service can bind while old connections
        // linger in TIME_WAIT.
        #[cfg(unix)]
        socket.set_reuseaddr(true)?;
        socket.bind(address)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().map_err(|source| Error::Bind { address, source })
}

/// How many connections [`bind`]'s socket queues before they are accepted.
const LISTEN_BACKLOG: u32 = 4096;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::InLine;
    use std::error::Error as StdError;

    /// Every cause is printed once: in the report's "caused by" lines, never also inside the
    /// message above them (a printer that walks `source()` would show it twice).
    #[test]
    fn errors_keep_their_cause_as_source_and_print_it_once() {
        let reason = "address already in use by pid 42";
        let cases: Vec<Box<dyn StdError>> = vec![
            Box::new(Error::Bind {
                address: "127.0.0.1:8080".parse().unwrap(),
                source: std::io::Error::new(std::io::ErrorKind::AddrInUse, reason),
            }),
            Box::new(ConfigError::Read {
                path: "payhook.toml".into(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, reason),
            }),
            Box::new(StoreError::backend(
                "cannot open the store",
                std::io::Error::other(reason),
            )),
            Box::new(crate::signature::Error::PrivateKey.in_setting("signature.keys[0]")),
        ];
        for error in &cases {
            assert!(error.source().is_some(), "{error}: no source");
            assert!(
                !error.to_string().contains(reason),
                "{error}: cause in the message"
            );
            let report = Report::new(error.as_ref()).to_string();
            let cause = error.source().unwrap().to_string();
            assert_eq!(report.matches(&cause).count(), 1, "{report}");
            // Logs get the same on one line.
            let line = InLine(error.as_ref()).to_string();
            assert!(line.contains(&cause) && !line.contains('\n'), "{line}");
        }
    }
}
