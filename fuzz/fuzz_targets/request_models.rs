//! The three request bodies the aggregator sends, as the server reads them: any bytes give a
//! model or an error, never a panic; a model read back from its own JSON is the same model.
#![no_main]

use libfuzzer_sys::fuzz_target;
use payhook::model::{CallbackBody, ProvidersValidationRequest, TransactionValidationRequest};

fn round_trip<T>(data: &[u8])
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    if let Ok(model) = serde_json::from_slice::<T>(data) {
        let json = serde_json::to_vec(&model).expect("a model serialises");
        let again: T = serde_json::from_slice(&json).expect("a model reads its own JSON");
        assert_eq!(model, again);
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip::<CallbackBody>(data);
    round_trip::<TransactionValidationRequest>(data);
    round_trip::<ProvidersValidationRequest>(data);
});
