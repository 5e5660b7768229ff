//! The text parser on arbitrary input: errors are fine, panics are not; a trace that parses and
//! verifies prints to text that parses back to the same trace.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracepass_ir::{parse_trace, print_trace, verify};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(t) = parse_trace(text) else { return };
    let printed = print_trace(&t);
    if verify(&t).is_ok() {
        let again = parse_trace(&printed).expect("a printed valid trace parses");
        assert_eq!(
            print_trace(&again),
            printed,
            "printing is not a fixed point"
        );
    }
});
