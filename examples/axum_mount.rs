//! payhook mounted inside an existing axum application: the app's own routes stay as they
//! are, and every other path is answered by payhook's endpoints (which answer 404 JSON for
//! paths that are not theirs).
//!
//! Run it (listens on 127.0.0.1:8081):
//!
//! ```text
//! cargo run --example axum_mount
//! curl -s localhost:8081/                              # the application's own route
//! curl -s -XPOST localhost:8081/payhook/callback \
//!      -H 'content-type: application/json' -d '{}'     # payhook: 400 naming the missing field
//! ```

use axum::{Router, routing::get};
use payhook::handler::{CallbackContext, CallbackDecision, CallbackReceiver};
use payhook::model::CallbackBody;
use payhook::{App, Config, HandlerError};

struct Ledger;

impl CallbackReceiver for Ledger {
    async fn receive_callback(
        &self,
        callback: CallbackBody,
        _ctx: CallbackContext,
    ) -> Result<CallbackDecision, HandlerError> {
        tracing::info!(nonce = %payhook::Logged(&callback.nonce), status = %callback.transaction_status, "booked");
        Ok(CallbackDecision::Ack)
    }
}

/// The whole application: its own routes plus payhook's.
fn router(payhook: App) -> Router {
    Router::new()
        .route("/", get(|| async { "the shop's own page" }))
        .fallback_service(payhook)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let mut config = Config::from_env()?;
    // No aggregator key in this example: unsigned callbacks are accepted deliberately.
    config.callback.allow_unsigned = true;
    let payhook = App::builder(config).callback_receiver(Ledger).build()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8081").await?;
    tracing::info!(address = %listener.local_addr()?, "shop with payhook mounted");
    axum::serve(listener, router(payhook)).await?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn both_the_apps_routes_and_payhooks_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.callback.allow_unsigned = true;
        config.store.path = dir.path().join("data");
        let app = router(
            App::builder(config)
                .callback_receiver(Ledger)
                .build()
                .unwrap(),
        );
        let own = app
            .clone()
            .oneshot(
                axum::http::Request::get("/")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(own.status(), 200);
        let hook = axum::http::Request::post("/payhook/callback")
            .header("content-type", "application/json")
            .body(axum::body::Body::from("{}"))
            .unwrap();
        let answer = app.oneshot(hook).await.unwrap();
        assert_eq!(answer.status(), 400);
    }
}
