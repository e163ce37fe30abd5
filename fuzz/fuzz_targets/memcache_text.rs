//! memcached text requests: parse arbitrary bytes in a loop as the daemon does (the first byte
//! picks how many bytes arrive at a time and the item size limit), check consumed lengths, key
//! limits, incremental = fresh parsing, and that a re-encoded request parses back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let chunk = 1 + usize::from(first & 0x3f);
    let max_value = if first & 0x40 != 0 { 1024 } else { 1 << 20 };
    holdfast_fuzz::fuzz_text(rest, chunk, max_value);
});
