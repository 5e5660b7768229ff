//! The binary decoder on arbitrary bytes: a clear error or a module that encodes back to the
//! same module, never a panic. An odd first byte means "the rest is a payload": it gets a valid
//! header (with its checksum), so the fuzzer explores the bincode payload instead of stopping
//! at the checksum. The header says the current format version, or version 1 (rows) when the
//! byte's second bit is set too.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracepass_ir::codec;

fn with_header(version: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = b"TRACEPB\0".to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&crc32fast_hash(payload).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// CRC-32 (IEEE), as the codec's header uses.
fn crc32fast_hash(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fuzz_target!(|data: &[u8]| {
    let bytes = match data.first() {
        Some(b) if b & 3 == 3 => with_header(1, &data[1..]),
        Some(b) if b & 1 == 1 => with_header(codec::FORMAT_VERSION, &data[1..]),
        _ => data.to_vec(),
    };
    if let Ok(m) = codec::decode(&bytes) {
        let again = codec::encode(&m).expect("a decoded module encodes");
        let back = codec::decode(&again).expect("re-encoded bytes decode");
        assert_eq!(back, m);
    }
});
