//! The exact-amount and time readers: any text gives a value or an error, never a panic;
//! an amount read is written back as text that reads to the same amount.
#![no_main]

use libfuzzer_sys::fuzz_target;
use payhook::model::{parse_amount, parse_utc};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(amount) = parse_amount(text) {
        let again = parse_amount(&amount.to_string()).expect("an amount reads its own text");
        assert_eq!(amount, again);
        assert_eq!(amount.scale(), again.scale());
    }
    if let Ok(time) = parse_utc(text) {
        let written = time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        assert_eq!(parse_utc(&written).expect("a time reads its own text"), time);
    }
});
