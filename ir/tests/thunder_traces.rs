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
            // Thunder's OpInfo samples are held by `runtime/tests/opinfo.rs`, which records
            // how many parse (some ops there are not in the table yet)
            if p.is_dir() && p != testdata().join("opinfo") {
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

/// Thunder 0.2.6's grad rule for `amax` (here behind `max_pool1d`) declares the `unsqueeze`
/// and `expand` of an i64 tie count as `b8`; torch keeps the input's dtype, so the values are
/// i64 when Thunder runs the trace. The lines are from a real backward.
const AMAX_GRAD: &str = r#"def backward_fn(t637, t633):
  # t637: "cpu b8[2, 32, 2, 8]"
  # t633: "cpu f32[2, 32, 2, 8]"
  t640 = torch.sum(t637, (2,))  # t640: "cpu i64[2, 32, 8]"
  t641 = torch.unsqueeze(t640, 2)  # t641: "cpu b8[2, 32, 1, 8]"
  t642 = Tensor.expand(t641, [2, 32, 1, 8])  # t642: "cpu b8[2, 32, 1, 8]"
  t647 = torch.true_divide(t633, t642)  # t647: "cpu f32[2, 32, 2, 8]"
  return t647
"#;

#[test]
fn a_view_declared_in_another_dtype_takes_its_inputs_dtype_and_says_so() {
    let t = parse_trace(AMAX_GRAD).unwrap();
    verify(&t).unwrap();
    for name in ["t641", "t642"] {
        let v = t.find_value(name).unwrap();
        match t.ty(v) {
            Some(Type::Tensor(tt)) => assert_eq!(tt.dtype, DType::I64, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    let note = &t.provenance.last().unwrap().pass;
    assert!(
        note.contains("t641 (ltorch.unsqueeze declared b8, gives i64)")
            && note.contains("t642 (ltorch.expand declared b8, gives i64)"),
        "{note}"
    );
    // the note survives printing, and the printed trace reads back unchanged
    let again = parse_trace(&print_trace(&t)).unwrap();
    assert_eq!(print_trace(&again), print_trace(&t));
}

#[test]
fn other_disagreements_with_the_declared_type_are_still_errors() {
    // a wrong shape on a view, and a wrong dtype on an op whose dtype is not its input's
    for (from, to) in [
        (
            r#"t641 = torch.unsqueeze(t640, 2)  # t641: "cpu b8[2, 32, 1, 8]""#,
            r#"t641 = torch.unsqueeze(t640, 2)  # t641: "cpu b8[2, 32, 8, 1]""#,
        ),
        (
            r#"t647 = torch.true_divide(t633, t642)  # t647: "cpu f32[2, 32, 2, 8]""#,
            r#"t647 = torch.true_divide(t633, t642)  # t647: "cpu i64[2, 32, 2, 8]""#,
        ),
    ] {
        let text = AMAX_GRAD.replace(from, to);
        assert_ne!(text, AMAX_GRAD);
        let failed = match parse_trace(&text) {
            Err(_) => true,
            Ok(t) => verify(&t).is_err(),
        };
        assert!(failed, "accepted:\n{text}");
    }
    // a trace whose types agree gets no note
    let t = parse_trace(&AMAX_GRAD.replace("cpu b8[2, 32, 1, 8]", "cpu i64[2, 32, 1, 8]")).unwrap();
    assert!(t.provenance.is_empty(), "{:?}", t.provenance);
}
