//! yrmcds counter requests: parse arbitrary bytes in a loop, check every outcome against the
//! header and that decoded bodies re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_fuzz::fuzz_counter(data);
});
