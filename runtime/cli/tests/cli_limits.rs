//! Extreme values through the real binary: durations, rates and sizes past what the machine or
//! the types hold are refused with a message, never a panic, an abort or an OOM kill.

mod common;

use common::{model, run, stderr};
use std::path::Path;
use std::process::Output;

/// The command was refused (exit 1, or 2 where clap read the value) with every one of `want`
/// in its message, and did not panic.
fn refused(o: &Output, want: &[&str]) {
    let err = stderr(o);
    assert!(matches!(o.status.code(), Some(1 | 2)), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for w in want {
        assert!(err.contains(w), "missing `{w}` in: {err}");
    }
}

#[test]
fn durations_and_rates_past_their_types_are_refused() {
    for v in ["1e20", "1e19", "1e10"] {
        let o = run(&["train", "--steps", "1", "--collective-timeout", v]);
        refused(
            &o,
            &["--collective-timeout", "too large (at most 1e9 seconds"],
        );
    }
    for v in ["nan", "inf", "0"] {
        let o = run(&["train", "--steps", "1", "--collective-timeout", v]);
        refused(&o, &["must be a positive number of seconds"]);
    }
    let o = run(&["rendezvous-check", "--timeout", "1e20"]);
    refused(&o, &["--timeout", "too large"]);
    let mlp = model("mlp");
    for (link, want) in [
        (
            "1,1e-300",
            "bandwidth must be a finite number of at least 1e-9 Gb/s",
        ),
        ("1e300,1", "latency must be between 0 and 1e9 us"),
    ] {
        let o = run(&["train", "--steps", "1", "--world-size", "2", "--link", link]);
        refused(&o, &["--link", want]);
        let o = run(&[
            "simulate",
            mlp.to_str().unwrap(),
            "--world-size",
            "2",
            "--link",
            link,
        ]);
        refused(&o, &["--link", want]);
    }
    // the slowest link allowed: its all-reduce is longer than the timeout, and says so
    let o = run(&[
        "train",
        "--steps",
        "1",
        "--world-size",
        "2",
        "--link",
        "1e9,1e-9",
    ]);
    refused(&o, &["longer than --collective-timeout 60 s"]);
    // and simulate predicts it without overflow
    let o = run(&[
        "simulate",
        mlp.to_str().unwrap(),
        "--world-size",
        "2",
        "--link",
        "1e9,1e-9",
        "--passes",
        "ddp(world_size=2),sort-waits",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A safetensors file whose header declares one f32 tensor of `elements`, its data a hole (a
/// sparse file: nothing is written to disk).
fn sparse_safetensors(path: &Path, name: &str, elements: u64) {
    let mut header = format!(
        r#"{{"{name}":{{"dtype":"F32","shape":[{elements}],"data_offsets":[0,{}]}}}}"#,
        elements * 4
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(bytes.len() as u64 + elements * 4).unwrap();
}

#[test]
fn sizes_past_memory_are_refused_before_allocating() {
    // a 1 TiB tensor: the file is mapped and its size checked, never read whole
    let tmp = tempfile::tempdir().unwrap();
    let big = tmp.path().join("big.safetensors");
    sparse_safetensors(&big, "l1.weight", 1 << 38);
    let o = run(&["train", "--steps", "1", "--params", big.to_str().unwrap()]);
    refused(&o, &["big.safetensors: its tensors does not fit in memory"]);
    let o = run(&["train", "--steps", "1", "--data", big.to_str().unwrap()]);
    refused(&o, &["does not fit in memory"]);
    // a deep MLP counted before its traces are built, the count overflow-checked
    for m in [
        "deep-mlp:4294967296,4,4",
        "deep-mlp:100000000,1,1",
        "deep-mlp:18446744073709551615,4,4",
        "deep-mlp:4,4294967296,4294967296",
    ] {
        let o = run(&["train", "--steps", "1", "--model", m]);
        refused(&o, &[m, "does not fit in memory"]);
    }
    // ranks are threads: more than the kernel gives is refused before the first one starts
    let o = run(&["train", "--steps", "1", "--world-size", "100000"]);
    refused(&o, &["--world-size 100000", "this machine allows at most"]);
}
