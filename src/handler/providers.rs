//! Helpers for the usual providers validation: keep the candidates that fit the request.

use crate::model::{Provider, ProviderCandidate, ProvidersValidationRequest};

/// The tag rule of spec 2.4: an empty `requested` list allows every provider; otherwise a
/// provider needs at least one of the requested tags (compared case-insensitively).
///
/// ```
/// use payhook::handler::tags_allow;
///
/// assert!(tags_allow(&[], &["crypto"]));
/// assert!(tags_allow(&["fiat".into()], &["FIAT", "eu"]));
/// assert!(!tags_allow(&["fiat".into()], &["crypto"]));
/// assert!(!tags_allow::<&str>(&["fiat".into()], &[]));
/// ```
pub fn tags_allow<S: AsRef<str>>(requested: &[String], provider_tags: &[S]) -> bool {
    requested.is_empty()
        || requested.iter().any(|wanted| {
            provider_tags
                .iter()
                .any(|tag| tag.as_ref().eq_ignore_ascii_case(wanted))
        })
}

/// Selects the candidates that can serve a transaction: the currency, the payment type, the
/// direction enabled right now, and the tag rule.
///
/// [`ProviderFilter::from_request`] takes every criterion from the request; the setters
/// narrow or widen it. Tags of a candidate come from its `tags` field, or from the merchant's
/// own mapping given to [`ProviderFilter::apply_with_tags`]. When the request asks for tags
/// and a candidate has none, the candidate is left out (fail closed), and a warning says how
/// many were: the spec's request table gives candidates no tags, so a merchant whose
/// aggregator sends none maps them with [`ProviderFilter::apply_with_tags`].
///
/// ```
/// use payhook::handler::ProviderFilter;
/// use payhook::model::ProvidersValidationRequest;
///
/// let request: ProvidersValidationRequest = serde_json::from_str(r#"{
///   "transactionData": {
///     "merchantData": {"merchantHash": "h", "clientId": "c"},
///     "paymentData": {"nonce": "n", "amount": 10, "currency": "EUR", "providerTags": [], "payType": "card"},
///     "cashIn": true},
///   "providers": [
///     {"id": 1, "name": "Card", "collabId": 3, "currencies": [{"id": 1, "code": "EUR"}],
///      "payTypes": [{"id": 5, "code": "card", "name": "Card", "cashIn": true, "cashOut": false,
///                    "isCashInEnabled": true, "isCashOutEnabled": false}]},
///     {"id": 2, "name": "Wire", "collabId": 4, "currencies": [{"id": 2, "code": "USD"}], "payTypes": []}]
/// }"#)?;
/// let allowed = ProviderFilter::from_request(&request).apply(&request.providers);
/// assert_eq!(allowed.iter().map(|p| p.id).collect::<Vec<_>>(), [1]);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct ProviderFilter {
    currency: Option<String>,
    pay_type: Option<String>,
    cash_in: Option<bool>,
    tags: Vec<String>,
}

impl ProviderFilter {
    /// A filter that allows every provider; add criteria with the setters.
    pub fn allow_all() -> Self {
        Self::default()
    }

    /// A filter with every criterion of the request: its currency, its `payType` (when
    /// present), its direction, and its `providerTags`.
    pub fn from_request(request: &ProvidersValidationRequest) -> Self {
        let payment = &request.transaction_data.payment_data;
        Self {
            currency: Some(payment.currency.clone()),
            pay_type: payment.pay_type.clone().filter(|t| !t.is_empty()),
            cash_in: Some(request.transaction_data.cash_in),
            tags: payment.provider_tags.clone(),
        }
    }

    /// Requires support of this ISO currency (`None`: any currency).
    pub fn currency(mut self, code: Option<&str>) -> Self {
        self.currency = code.map(str::to_owned);
        self
    }

    /// Requires this payment type, by code or name (`None`: any type).
    pub fn pay_type(mut self, pay_type: Option<&str>) -> Self {
        self.pay_type = pay_type.map(str::to_owned);
        self
    }

    /// Requires a payment type with this direction enabled: `Some(true)` deposit,
    /// `Some(false)` withdrawal, `None` either.
    pub fn direction(mut self, cash_in: Option<bool>) -> Self {
        self.cash_in = cash_in;
        self
    }

    /// Requires one of these tags (empty: no tag restriction).
    pub fn tags(mut self, tags: Vec<String>) -> Self {
        self.tags = tags;
        self
    }

    /// `true` when `provider`, whose tags are `provider_tags`, meets every criterion.
    pub fn allows<S: AsRef<str>>(&self, provider: &Provider, provider_tags: &[S]) -> bool {
        self.serves(provider) && tags_allow(&self.tags, provider_tags)
    }

    /// `true` when `provider` meets every criterion but the tags.
    fn serves(&self, provider: &Provider) -> bool {
        let currency_ok = self
            .currency
            .as_deref()
            .is_none_or(|code| provider.supports_currency(code));
        let direction_ok = match (self.pay_type.as_deref(), self.cash_in) {
            (Some(pay_type), Some(cash_in)) => provider
                .pay_type(pay_type)
                .is_some_and(|t| t.enabled_for(cash_in)),
            (Some(pay_type), None) => provider.pay_type(pay_type).is_some(),
            (None, Some(cash_in)) => provider.enabled_for(cash_in),
            (None, None) => true,
        };
        currency_ok && direction_ok
    }

    /// The candidates that meet every criterion, in the response shape, tags read from each
    /// candidate's `tags` field.
    pub fn apply(&self, candidates: &[ProviderCandidate]) -> Vec<Provider> {
        self.select(candidates, |candidate| candidate.tags.clone(), true)
    }

    /// Like [`ProviderFilter::apply`], with the tags of each candidate given by `tags_of`
    /// (the merchant's own mapping of providers to tags).
    pub fn apply_with_tags<F>(&self, candidates: &[ProviderCandidate], tags_of: F) -> Vec<Provider>
    where
        F: Fn(&ProviderCandidate) -> Vec<String>,
    {
        self.select(candidates, tags_of, false)
    }

    /// The candidates that meet every criterion. With `say_untagged` (tags read from the
    /// candidates), those left out only for carrying no tags are counted in a warning: an
    /// aggregator that sends none would otherwise leave every client of a tagged request
    /// without a provider, silently. The merchant's own mapping is its own to tell.
    fn select<F>(
        &self,
        candidates: &[ProviderCandidate],
        tags_of: F,
        say_untagged: bool,
    ) -> Vec<Provider>
    where
        F: Fn(&ProviderCandidate) -> Vec<String>,
    {
        let mut untagged = 0usize;
        let allowed: Vec<Provider> = candidates
            .iter()
            .filter_map(|candidate| {
                let provider = candidate.to_provider();
                if !self.serves(&provider) {
                    return None;
                }
                let tags = tags_of(candidate);
                if tags_allow(&self.tags, &tags) {
                    return Some(provider);
                }
                untagged += usize::from(tags.is_empty());
                None
            })
            .collect();
        if say_untagged && untagged > 0 {
            tracing::warn!(
                requested = ?self.tags.iter().map(|tag| crate::Logged(tag).to_string()).collect::<Vec<_>>(),
                untagged,
                candidates = candidates.len(),
                "the request asks for provider tags, and candidates that would serve it otherwise carry none: they are left out; give the providers' tags with ProviderFilter::apply_with_tags"
            );
        }
        allowed
    }
}

/// The tags of providers as a merchant files them, by provider id: what
/// [`ProviderFilter::apply_with_tags`] matches a request's `providerTags` against, since the
/// spec's candidates carry no tags of their own (a candidate that does keeps its own). Read
/// from text as `ID=TAG,TAG;ID=TAG` (`MERCHANT_PROVIDER_TAGS` of `examples/merchant.rs`,
/// `PROVIDER_TAGS` of a service scaffolded by `payhook new`):
///
/// ```
/// use payhook::model::ProviderCandidate;
/// use payhook::handler::ProviderTags;
///
/// let tags: ProviderTags = "11=fiat,eu; 12=crypto".parse()?;
/// let candidate: ProviderCandidate = serde_json::from_str(r#"{"id": 11}"#)?;
/// assert_eq!(tags.of(&candidate), ["fiat", "eu"]);
/// let tagged: ProviderCandidate = serde_json::from_str(r#"{"id": 11, "tags": ["card"]}"#)?;
/// assert_eq!(tags.of(&tagged), ["card"], "a candidate's own tags come first");
/// assert!("11".parse::<ProviderTags>().is_err());
/// assert!("".parse::<ProviderTags>()?.is_empty() && !tags.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderTags(std::collections::BTreeMap<i64, Vec<String>>);

impl ProviderTags {
    /// Whether no provider is tagged: a request that asks for tags is then offered only
    /// candidates that carry tags of their own.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The tags of `candidate`: its own when it carries some, else this merchant's for its
    /// id (none when it has none).
    pub fn of(&self, candidate: &ProviderCandidate) -> Vec<String> {
        if candidate.tags.is_empty() {
            self.0.get(&candidate.id).cloned().unwrap_or_default()
        } else {
            candidate.tags.clone()
        }
    }
}

/// Text that is no `ID=TAG,TAG;…` list ([`ProviderTags`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{entry}` is not ID=TAG,TAG (a provider id, then its tags)")]
pub struct ProviderTagsError {
    entry: String,
}

impl std::str::FromStr for ProviderTags {
    type Err = ProviderTagsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut tags = std::collections::BTreeMap::new();
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let refused = || ProviderTagsError {
                entry: entry.to_owned(),
            };
            let (id, names) = entry.split_once('=').ok_or_else(refused)?;
            let id: i64 = id.trim().parse().map_err(|_| refused())?;
            let names: Vec<String> = names
                .split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect();
            if names.is_empty() {
                return Err(refused());
            }
            tags.entry(id).or_insert_with(Vec::new).extend(names);
        }
        Ok(Self(tags))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Currency, PaymentType};

    fn provider(
        id: i64,
        currency: &str,
        cash_in_enabled: bool,
        cash_out_enabled: bool,
    ) -> Provider {
        Provider {
            id,
            name: format!("p{id}"),
            collab_id: 1,
            currencies: vec![Currency {
                id: 1,
                code: currency.into(),
            }],
            pay_types: vec![PaymentType {
                id: 10,
                code: "card".into(),
                name: "Card".into(),
                cash_in: true,
                cash_out: true,
                is_cash_in_enabled: cash_in_enabled,
                is_cash_out_enabled: cash_out_enabled,
            }],
        }
    }

    const NO_TAGS: &[&str] = &[];

    #[test]
    fn currency_must_be_supported() {
        let filter = ProviderFilter::allow_all().currency(Some("EUR"));
        assert!(filter.allows(&provider(1, "eur", true, true), NO_TAGS));
        assert!(!filter.allows(&provider(1, "USD", true, true), NO_TAGS));
    }

    #[test]
    fn direction_must_be_supported_and_enabled() {
        let deposit = ProviderFilter::allow_all().direction(Some(true));
        let withdrawal = ProviderFilter::allow_all().direction(Some(false));
        let only_deposits = provider(1, "EUR", true, false);
        assert!(deposit.allows(&only_deposits, NO_TAGS));
        assert!(!withdrawal.allows(&only_deposits, NO_TAGS));
    }

    #[test]
    fn pay_type_must_exist_and_be_enabled_for_the_direction() {
        let card_out = ProviderFilter::allow_all()
            .pay_type(Some("card"))
            .direction(Some(false));
        assert!(card_out.allows(&provider(1, "EUR", false, true), NO_TAGS));
        assert!(!card_out.allows(&provider(1, "EUR", true, false), NO_TAGS));
        assert!(
            !ProviderFilter::allow_all()
                .pay_type(Some("sepa"))
                .allows(&provider(1, "EUR", true, true), NO_TAGS)
        );
    }

    #[test]
    fn requested_tags_fail_closed_for_untagged_providers() {
        let fiat = ProviderFilter::allow_all().tags(vec!["fiat".into()]);
        assert!(fiat.allows(&provider(1, "EUR", true, true), &["fiat"]));
        assert!(!fiat.allows(&provider(1, "EUR", true, true), NO_TAGS));
        assert!(ProviderFilter::allow_all().allows(&provider(1, "EUR", true, true), NO_TAGS));
    }

    /// Candidates left out for want of tags are said in the log: an aggregator that sends
    /// none would otherwise leave every tagged request without a provider, silently.
    #[test]
    fn untagged_candidates_left_out_are_said() {
        use std::sync::{Arc, Mutex};
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let candidates: Vec<ProviderCandidate> = serde_json::from_str(
            r#"[{"id":1,"currencies":["EUR"],"payTypes":[]},
                {"id":2,"currencies":["EUR"],"payTypes":[],"tags":["fiat"]}]"#,
        )
        .unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let said_of = |select: &dyn Fn() -> Vec<Provider>| {
            logs.lock().unwrap().clear();
            let sink = Arc::clone(&logs);
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || Sink(Arc::clone(&sink)))
                .finish();
            let allowed = tracing::subscriber::with_default(subscriber, select);
            let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
            (allowed.iter().map(|p| p.id).collect::<Vec<_>>(), text)
        };
        let said = |filter: ProviderFilter| said_of(&|| filter.apply(&candidates));
        let (allowed, text) = said(ProviderFilter::allow_all().tags(vec!["fiat".into()]));
        assert_eq!(allowed, [2]);
        assert!(
            text.contains("carry none") && text.contains("untagged=1"),
            "{text}"
        );
        let (allowed, text) = said(ProviderFilter::allow_all());
        assert_eq!(allowed, [1, 2]);
        assert!(
            text.is_empty(),
            "nothing to say without requested tags: {text}"
        );
        // Left out for its currency first: nothing to say of its tags.
        let (allowed, text) = said(
            ProviderFilter::allow_all()
                .tags(vec!["crypto".into()])
                .currency(Some("USD")),
        );
        assert!(allowed.is_empty());
        assert!(text.is_empty(), "{text}");
        // The merchant's own mapping is its own to tell.
        let fiat = ProviderFilter::allow_all().tags(vec!["fiat".into()]);
        let (allowed, text) = said_of(&|| fiat.apply_with_tags(&candidates, |_| Vec::new()));
        assert!(allowed.is_empty());
        assert!(text.is_empty(), "{text}");
    }
}
