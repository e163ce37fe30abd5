//! Command entries and state snapshots (what a replicated log and its snapshots hold): decode
//! arbitrary bytes, re-encode what decodes, apply it, restore what restores.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_fuzz::fuzz_command(data);
});
