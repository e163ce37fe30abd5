//! memcached binary requests: parse arbitrary bytes in a loop (refused frames skipped), check
//! consumed lengths, key and value limits, and that re-encoding a request gives its frame back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let max_value = if first & 1 != 0 { 16 } else { 1 << 20 };
    holdfast_fuzz::fuzz_binary(rest, max_value);
});
