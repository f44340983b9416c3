//! payhook mounted inside an existing axum application: the app's own routes stay as they
//! are, and every other path is answered by payhook's endpoints (which answer 404 JSON for
//! paths that are not theirs).
//!
//! Run it (listens on 127.0.0.1:8081) with the aggregator's public key — or, for a local
//! trial without one, with unsigned callbacks allowed explicitly; without either it refuses
//! to start:
//!
//! ```text
//! PAYHOOK_CALLBACK_ALLOW_UNSIGNED=true cargo run --example axum_mount
//! curl -s localhost:8081/                              # the application's own route
//! curl -s -XPOST localhost:8081/payhook/callback \
//!      -H 'content-type: application/json' -d '{}'     # payhook: 400 naming the missing field
//! ```
//!
//! What a mount leaves to the application: payhook's own server (`payhook::serve`) gives
//! each request its peer address, header and idle timeouts, the connection cap that keeps
//! slow clients from starving callbacks, graceful shutdown and `server.listen`. Under
//! `axum::serve` these are axum's and the application's to set. The peer address is set
//! here ([`with_peer`]): without it every allow-list (`auth`, `/metrics`) refuses, and
//! handlers see no caller's address.

use axum::{Router, extract::ConnectInfo, routing::get};
use payhook::handler::{CallbackContext, CallbackDecision, CallbackReceiver};
use payhook::model::CallbackBody;
use payhook::server::PeerAddr;
use payhook::store::{ConfiguredStore, Tree};
use payhook::{App, Config, HandlerError};
use std::net::SocketAddr;

/// The tree the shop keeps its receipts in.
const RECEIPTS: &str = "receipts";

/// The shop's record of each result received: `nonce|status` → the callback as received.
/// A real ledger books amounts by status and direction (`src/sim/example_merchant.rs`);
/// what matters here is *where* the write goes: into `ctx.effects`, which the store writes
/// in the one transaction that records the callback as acknowledged. A crash, a timeout or
/// the aggregator's retry can then neither lose it nor write it twice, as a write of the
/// handler's own (to a database of its own, before `Ack`) could.
struct Receipts {
    tree: Tree,
}

impl CallbackReceiver for Receipts {
    async fn receive_callback(
        &self,
        callback: CallbackBody,
        ctx: CallbackContext,
    ) -> Result<CallbackDecision, HandlerError> {
        let key = format!("{}|{}", callback.nonce, callback.transaction_status.code());
        let value = serde_json::to_vec(&callback)?;
        let tree = self.tree.clone();
        ctx.effects
            .write(move |tx| tx.insert(&tree, key.as_bytes(), &value));
        Ok(CallbackDecision::Ack)
    }
}

/// payhook's endpoints for the shop, on `store` (opened with [`RECEIPTS`]).
fn payhook(config: Config, store: &ConfiguredStore) -> Result<App, Box<dyn std::error::Error>> {
    let receipts = Receipts {
        tree: store.tree(RECEIPTS)?,
    };
    Ok(App::builder(config)
        .shared_store(store.shared())
        .callback_receiver(receipts)
        .build()?)
}

/// The whole application: its own routes plus payhook's.
fn router(payhook: App) -> Router {
    Router::new()
        .route("/", get(|| async { "the shop's own page" }))
        .fallback_service(payhook)
        .layer(axum::middleware::map_request(with_peer))
}

/// Gives payhook the caller's address as `payhook::serve` does: axum's connection info
/// (served with `into_make_service_with_connect_info`) as a [`PeerAddr`].
async fn with_peer(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: axum::extract::Request,
) -> axum::extract::Request {
    request.extensions_mut().insert(PeerAddr(peer));
    request
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    // Signatures as configured: `PAYHOOK_SIGNATURE_KEYS`, or the explicit opt-out
    // `PAYHOOK_CALLBACK_ALLOW_UNSIGNED=true`; with neither, `build` refuses.
    let config = Config::from_env()?;
    let store = ConfiguredStore::open(&config.store, &[RECEIPTS]).await?;
    let payhook = payhook(config, &store)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8081").await?;
    tracing::info!(address = %listener.local_addr()?, "shop with payhook mounted");
    let app = router(payhook).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn both_the_apps_routes_and_payhooks_are_served_and_receipts_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.callback.allow_unsigned = true;
        config.store.path = dir.path().join("data");
        let store = ConfiguredStore::open(&config.store, &[RECEIPTS])
            .await
            .unwrap();
        let app = router(payhook(config, &store).unwrap());
        let peer = ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 50_000)));
        let own = app
            .clone()
            .oneshot(
                axum::http::Request::get("/")
                    .extension(peer)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(own.status(), 200);
        // The caller's address reaches payhook: `/metrics` answers a loopback caller.
        let metrics = app
            .clone()
            .oneshot(
                axum::http::Request::get("/metrics")
                    .extension(peer)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(metrics.status(), 200);
        let post = |body: &'static str| {
            axum::http::Request::post("/payhook/callback")
                .extension(peer)
                .header("content-type", "application/json")
                .body(axum::body::Body::from(body))
                .unwrap()
        };
        let answer = app.clone().oneshot(post("{}")).await.unwrap();
        assert_eq!(answer.status(), 400);
        let callback = r#"{"id":1001,"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e",
            "nonce":"n-1","providerId":11,"transactionType":1,"transactionStatus":4,
            "clientId":"client-42","amount":10.5,"currency":"EUR"}"#;
        for _ in 0..2 {
            let answer = app.clone().oneshot(post(callback)).await.unwrap();
            assert_eq!(answer.status(), 200);
        }
        let tree = store.tree(RECEIPTS).unwrap();
        let kept = store.get(&tree, b"n-1|4").await.unwrap().unwrap();
        let kept: CallbackBody = serde_json::from_slice(&kept).unwrap();
        assert_eq!(kept.amount.to_string(), "10.5");
    }
}
