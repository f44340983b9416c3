//! Public keys in every format payhook reads (PEM, DER, .NET XML, JWK, JWKS): any bytes give
//! keys or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use payhook::signature::PublicKey;

fuzz_target!(|data: &[u8]| {
    let _ = PublicKey::parse(data);
});
