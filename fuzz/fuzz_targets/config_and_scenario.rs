//! Configuration files and scenario files: any text gives a value or an error, never a
//! panic; and an error never quotes the text it was given (it could hold a secret).
#![no_main]

use libfuzzer_sys::fuzz_target;
use payhook::Config;
use payhook::sim::scenario::Scenario;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Config::from_toml(text);
    let _ = Scenario::parse(text, "fuzz.toml");
});
