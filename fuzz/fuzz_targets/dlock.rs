//! dlock frames and protobuf Requests (and the client's Response decoder): parse arbitrary bytes
//! in a loop, check lengths and key counts, and that a decoded Request re-encodes to the same
//! fields (by a field-exact encoder and by the crate's own `encode_request`). The same bytes
//! then drive the dlock lock table (both versions' operations; `fuzz_dlock_table`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let max_message = if first & 1 != 0 { 64 } else { 1 << 20 };
    holdfast_fuzz::fuzz_dlock(rest, max_message);
    holdfast_fuzz::fuzz_dlock_table(data);
});
