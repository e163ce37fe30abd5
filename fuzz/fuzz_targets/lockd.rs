//! old lock-daemon frames: parse arbitrary bytes in a loop, check lengths, the name rule, and
//! that a version-1 frame re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_fuzz::fuzz_lockd(data);
});
