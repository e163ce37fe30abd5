//! Bytes a TLS listener's socket delivers, split at arbitrary points, through the worker's own
//! TLS path (see `src/tls.rs` of this crate for the input's layout).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_fuzz::tls::run(data);
});
