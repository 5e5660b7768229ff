//! Binary files of every format version this build reads decode to the same modules, and are
//! written back in the current version.

use std::path::{Path, PathBuf};
use tracepass_ir::{codec, parse_trace, synth, Module};

fn compat(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/compat")
        .join(name)
}

fn version_of(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}

fn check_v1(file: &str, expected: &Module) {
    let v1 = std::fs::read(compat(file)).unwrap();
    assert_eq!(version_of(&v1), 1, "{file} is a version-1 file");
    let decoded = codec::decode(&v1).unwrap();
    assert!(decoded == *expected, "{file} decodes to a different module");
    let v2 = codec::encode(&decoded).unwrap();
    assert_eq!(version_of(&v2), codec::FORMAT_VERSION);
    assert!(codec::decode(&v2).unwrap() == *expected);
}

#[test]
fn version_1_programs_still_decode() {
    let seed = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    check_v1("seed_mlp.v1.tpb", &Module::Program(seed));
}

#[test]
fn version_1_thunder_traces_still_decode() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/thunder/mlp/backward.trace"),
    )
    .unwrap();
    let t = parse_trace(&text).unwrap();
    assert!(t
        .nodes()
        .any(|(_, n)| n.callee().is_some() && !n.kwargs().is_empty()));
    check_v1("thunder_mlp_backward.v1.tpb", &Module::Trace(t));
}

/// Version 2 stores traces in columns: a version-2 payload read as version 1 (rows) is an
/// error, not a trace, so the version in the header is what decides the layout.
#[test]
fn the_header_version_decides_the_layout() {
    let t = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    let mut bytes = codec::encode(&Module::Program(t)).unwrap();
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    assert!(codec::decode(&bytes).is_err());
    bytes[8..12].copy_from_slice(&5u32.to_le_bytes());
    assert_eq!(
        codec::decode(&bytes).unwrap_err().to_string(),
        "unsupported format version 5 (this build reads versions 1 to 4)"
    );
}

/// Version 4 only added a binding (the nested left-hand side): a file without one is a
/// version-3 file but for its header, and reads the same under either version.
#[test]
fn version_3_files_still_decode() {
    let t = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    let m = Module::Program(t);
    let mut bytes = codec::encode(&m).unwrap();
    assert_eq!(version_of(&bytes), 4);
    bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
    assert!(codec::decode(&bytes).unwrap() == m);
}
