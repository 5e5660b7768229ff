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
    bytes[8..12].copy_from_slice(&6u32.to_le_bytes());
    assert_eq!(
        codec::decode(&bytes).unwrap_err().to_string(),
        "unsupported format version 6 (this build reads versions 1 to 5)"
    );
}

/// Version 4 only added a binding (the nested left-hand side): a file without one is a
/// version-3 file but for its header, and reads the same under either version.
#[test]
fn version_3_files_still_decode() {
    let v4 = std::fs::read(compat("mlp_frozen.v4.tpb")).unwrap();
    let m = codec::decode(&v4).unwrap();
    let mut bytes = v4.clone();
    bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
    assert!(codec::decode(&bytes).unwrap() == m);
}

/// Version 5 added the parameters' shard placement (`fsdp`): a version-4 program (written by
/// tracepass before it) reads with every parameter unsharded, and is written back as
/// version 5 the same.
#[test]
fn version_4_programs_still_decode_unsharded() {
    let v4 = std::fs::read(compat("mlp_frozen.v4.tpb")).unwrap();
    assert_eq!(version_of(&v4), 4);
    let Module::Program(p) = codec::decode(&v4).unwrap() else {
        panic!("mlp_frozen.v4.tpb holds a program");
    };
    let fqns: Vec<&str> = p.params.iter().map(|x| x.fqn.as_str()).collect();
    assert_eq!(
        fqns,
        [
            "fc1.bias",
            "fc1.weight",
            "fc2.bias",
            "fc2.weight",
            "fc3.bias",
            "fc3.weight",
            "norm1.bias",
            "norm1.weight",
            "norm2.bias",
            "norm2.weight"
        ]
    );
    // the export freezes some of them: both kinds read back
    assert!(p.params.iter().any(|x| x.requires_grad));
    assert!(p.params.iter().any(|x| !x.requires_grad));
    assert!(p.params.iter().all(|x| x.shard.is_none()));
    let m = Module::Program(p);
    let v5 = codec::encode(&m).unwrap();
    assert_eq!(version_of(&v5), codec::FORMAT_VERSION);
    assert_eq!(codec::FORMAT_VERSION, 5);
    assert!(codec::decode(&v5).unwrap() == m);
}

/// A shard placement survives the binary format and JSON.
#[test]
fn shard_placements_round_trip() {
    let mut p = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    p.params[0].shard = Some(tracepass_ir::ParamShard {
        bucket: "b0".into(),
        offset: 3,
        numel: 10,
        bucket_numel: 13,
        padding: 3,
        world_size: 4,
    });
    assert_eq!(p.params[0].shard.as_ref().unwrap().shard_numel(), 4);
    let m = Module::Program(p);
    assert!(codec::decode(&codec::encode(&m).unwrap()).unwrap() == m);
    let json = serde_json::to_string(&m).unwrap();
    assert!(serde_json::from_str::<Module>(&json).unwrap() == m);
}

/// JSON of every version reads too: a parameter written before `buffer` (version 3) and
/// `shard` (version 5) existed has neither field, and reads as an unsharded parameter.
#[test]
fn json_parameters_without_later_fields_read_with_their_defaults() {
    let p = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    let m = Module::Program(p);
    let mut json: serde_json::Value = serde_json::to_value(&m).unwrap();
    let params = json["Program"]["params"].as_array_mut().unwrap();
    assert!(!params.is_empty());
    for x in params.iter_mut() {
        let x = x.as_object_mut().unwrap();
        assert!(x.remove("buffer").is_some() && x.remove("shard").is_some());
    }
    let back: Module = serde_json::from_value(json).unwrap();
    assert!(back == m);
}
