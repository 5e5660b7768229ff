//! The binary decoder on arbitrary bytes: a clear error or a module that encodes back to the
//! same bytes, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracepass_ir::codec;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = codec::decode(data) {
        let bytes = codec::encode(&m).expect("a decoded module encodes");
        let back = codec::decode(&bytes).expect("re-encoded bytes decode");
        assert_eq!(back, m);
    }
});
