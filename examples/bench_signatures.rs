//! Cost of verifying (and making) a callback signature, per algorithm, on this machine.
//!
//! Run it in release mode:
//!
//! ```text
//! cargo run --release --example bench_signatures
//! ```
//!
//! Each algorithm gets a fresh key (RSA: 2048 bits) and a 500-byte callback body; the
//! verification of one signature is repeated for about half a second and the mean is
//! printed in µs per operation, with signing cost beside it.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    reason = "a benchmark prints and may panic"
)]

use payhook::signature::{Algorithm, SigningKey, generate_key_pair};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Time spent on each measurement.
const BUDGET: Duration = Duration::from_millis(500);

/// Mean µs per call of `op`, running it for about [`BUDGET`].
fn micros_per_op(mut op: impl FnMut()) -> f64 {
    for _ in 0..10 {
        op();
    }
    let started = Instant::now();
    let mut runs = 0u64;
    while started.elapsed() < BUDGET {
        for _ in 0..10 {
            op();
        }
        runs += 10;
    }
    started.elapsed().as_secs_f64() * 1e6 / runs as f64
}

fn main() {
    let body = format!(
        r#"{{"id":1001,"nonce":"nonce-bench","padding":"{}"}}"#,
        "x".repeat(450)
    );
    let body = body.as_bytes();
    println!(
        "payhook signature cost, {} byte body, release build: {}",
        body.len(),
        !cfg!(debug_assertions)
    );
    println!("{:<26} {:>12} {:>12}", "algorithm", "verify µs", "sign µs");
    for algorithm in Algorithm::ALL {
        let pair = generate_key_pair(algorithm).unwrap();
        let signer = SigningKey::from_pkcs8(pair.private_pem.as_bytes(), algorithm).unwrap();
        let public = signer.public_key();
        let signature = signer.sign(body).unwrap();
        assert!(public.verifies(algorithm, body, &signature));
        let verify = micros_per_op(|| {
            assert!(black_box(&public).verifies(algorithm, black_box(body), &signature))
        });
        let sign = micros_per_op(|| {
            black_box(signer.sign(black_box(body)).unwrap());
        });
        println!("{:<26} {verify:>12.1} {sign:>12.1}", algorithm.name());
    }
}
