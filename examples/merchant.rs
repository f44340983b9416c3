//! A small but complete merchant: the three endpoints of the aggregator, served by payhook.
//!
//! * providers validation: offers the providers that support the request's currency, payment
//!   type and direction (and its provider tags);
//! * transaction validation: denies amounts above a configured limit, with a message;
//! * callbacks: logs each transaction result and acknowledges it.
//!
//! Run it (listens on 127.0.0.1:8080; `RUST_LOG=debug` for every request):
//!
//! ```text
//! cargo run --example merchant
//! ```
//!
//! Settings: `PAYHOOK_CONFIG=payhook.toml` and the `PAYHOOK_*` variables of the README;
//! `MERCHANT_MAX_AMOUNT` (default 10000) is this merchant's own limit per transaction.

use payhook::handler::{
    CallbackDecision, CallbackReceiver, ProviderFilter, ProvidersDecision, ProvidersValidator,
    RequestContext, TransactionValidator, ValidationDecision,
};
use payhook::model::{
    CallbackBody, ProvidersValidationRequest, TransactionValidationRequest, parse_amount,
};
use payhook::{App, Config, HandlerError};
use rust_decimal::Decimal;

/// The merchant's own business rules. Cloned into each endpoint; clones share nothing mutable.
#[derive(Debug, Clone)]
pub struct Merchant {
    /// Largest amount a client may deposit or withdraw in one transaction.
    pub max_amount: Decimal,
}

impl ProvidersValidator for Merchant {
    async fn validate_providers(
        &self,
        request: ProvidersValidationRequest,
        ctx: RequestContext,
    ) -> Result<ProvidersDecision, HandlerError> {
        let providers = ProviderFilter::from_request(&request).apply(&request.providers);
        tracing::info!(
            request_id = %ctx.request_id,
            client = %request.transaction_data.merchant_data.client_id,
            offered = request.providers.len(),
            allowed = providers.len(),
            "providers validated"
        );
        let message = format!(
            "{} of {} providers available",
            providers.len(),
            request.providers.len()
        );
        Ok(ProvidersDecision { providers, message })
    }
}

impl TransactionValidator for Merchant {
    async fn validate_transaction(
        &self,
        request: TransactionValidationRequest,
        _ctx: RequestContext,
    ) -> Result<ValidationDecision, HandlerError> {
        let payment = &request.payment_data;
        if payment.amount > self.max_amount {
            tracing::info!(nonce = %payment.nonce, amount = %payment.amount, "denied: above the limit");
            return Ok(ValidationDecision::deny(format!(
                "amount {} {} is above the limit of {} per transaction",
                payment.amount, payment.currency, self.max_amount
            )));
        }
        tracing::info!(nonce = %payment.nonce, amount = %payment.amount, "allowed");
        Ok(ValidationDecision::Allow)
    }
}

impl CallbackReceiver for Merchant {
    async fn receive_callback(
        &self,
        callback: CallbackBody,
        _ctx: RequestContext,
    ) -> Result<CallbackDecision, HandlerError> {
        tracing::info!(
            nonce = %callback.nonce,
            reference = %callback.transaction_reference_id,
            client = %callback.client_id,
            kind = %callback.transaction_type,
            status = %callback.transaction_status,
            amount = %callback.amount,
            currency = %callback.currency,
            "transaction result"
        );
        Ok(CallbackDecision::Ack)
    }
}

/// The merchant's app: its rules behind payhook's three endpoints.
///
/// # Errors
///
/// When the configuration is invalid.
pub fn app(config: Config, merchant: Merchant) -> Result<App, payhook::server::BuildError> {
    App::builder(config)
        .providers_validator(merchant.clone())
        .transaction_validator(merchant.clone())
        .callback_receiver(merchant)
        .build()
}

#[allow(
    dead_code,
    reason = "tests include this file for its merchant, not its main"
)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let max_amount = match std::env::var("MERCHANT_MAX_AMOUNT") {
        Ok(text) => parse_amount(&text)?,
        Err(_) => Decimal::from(10_000),
    };
    let mut config = Config::from_env()?;
    if config.signature.keys.is_empty() {
        // No aggregator public key is configured (PAYHOOK_SIGNATURE_KEYS or [signature] in
        // PAYHOOK_CONFIG), so this demo opts out of verification explicitly. A real merchant
        // configures the aggregator's key instead, and every callback must then be signed.
        config.callback.allow_unsigned = true;
    }
    let listener = tokio::net::TcpListener::bind(config.server.listen).await?;
    let app = app(config, Merchant { max_amount })?;
    tracing::info!(address = %listener.local_addr()?, %max_amount, "example merchant ready");
    payhook::serve(listener, app, payhook::shutdown_signal()).await?;
    Ok(())
}
