//! The whole request path of all three protocols at once, through the deterministic `Sim`: the
//! input is a script of connects, sends, disconnects and clock advances (see `src/script.rs`);
//! lock-table invariants after every step, nothing left locked at the end.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_fuzz::script::run(data);
});
