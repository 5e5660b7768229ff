//! Every Thunder-printed trace in testdata parses, verifies, prints deterministically and
//! round-trips through text, binary and JSON.

use std::path::{Path, PathBuf};
use tracepass_ir::*;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata")
}

fn trace_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![testdata()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "trace") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Thunder traces of computations (prologues are read by `parse_prologue`, below).
fn all_traces() -> Vec<PathBuf> {
    let out: Vec<PathBuf> = trace_files()
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "prologue.trace"))
        .collect();
    assert!(
        out.len() >= 8,
        "expected the Thunder traces in testdata, found {out:?}"
    );
    out
}

#[test]
fn every_prologue_reads() {
    let prologues: Vec<PathBuf> = trace_files()
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "prologue.trace"))
        .collect();
    assert!(prologues.len() >= 6, "{prologues:?}");
    for p in prologues {
        let pro = parse_prologue(&std::fs::read_to_string(&p).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(
            !pro.tensors.is_empty() && !pro.returns.is_empty(),
            "{}",
            p.display()
        );
    }
}

#[test]
fn every_trace_parses_and_verifies() {
    for p in all_traces() {
        let text = std::fs::read_to_string(&p).unwrap();
        let t = parse_trace(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if let Err(e) = verify(&t) {
            panic!("{}: {e}", p.display());
        }
    }
}

#[test]
fn text_round_trip_and_deterministic_print() {
    for p in all_traces() {
        let t = parse_trace(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let printed = print_trace(&t);
        assert_eq!(
            printed,
            print_trace(&t),
            "{}: printing is not deterministic",
            p.display()
        );
        let back = parse_trace(&printed)
            .unwrap_or_else(|e| panic!("{}: reparse: {e}\n{printed}", p.display()));
        assert!(back == t, "{}: parse(print(t)) != t", p.display());
        assert_eq!(print_trace(&back), printed);
    }
}

#[test]
fn binary_and_json_round_trip() {
    for p in all_traces() {
        let t = parse_trace(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let m = Module::Trace(t.clone());
        let bytes = codec::encode(&m).unwrap();
        assert_eq!(codec::decode(&bytes).unwrap(), m, "{}", p.display());
        assert_eq!(
            codec::encode(&m).unwrap(),
            bytes,
            "binary encoding is not deterministic"
        );
        let json = serde_json::to_string(&m).unwrap();
        let back: Module = serde_json::from_str(&json).unwrap();
        assert_eq!(back, m, "{}", p.display());
    }
}
