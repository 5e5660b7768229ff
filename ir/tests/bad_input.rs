//! One test per class of bad input: each gives a clear error that says what and where.

use tracepass_ir::*;

const GOOD: &str = r#"import torch

@torch.no_grad()
def computation(x, w):
  # x: "cpu f32[8, 32]"
  # w: "cpu f32[64, 32]"
  t0 = ltorch.linear(x, w, None)  # t0: "cpu f32[8, 64]"
  t1 = ltorch.tanh(t0)  # t1: "cpu f32[8, 64]"
  return (t1,)
"#;

fn parse_err(text: &str) -> ParseError {
    parse_trace(text).expect_err("should not parse")
}

#[test]
fn good_trace_parses() {
    let t = parse_trace(GOOD).unwrap();
    verify(&t).unwrap();
    assert_eq!(t.node_count(), 2);
}

#[test]
fn unknown_op_names_line_and_column() {
    let e = parse_err(&GOOD.replace("ltorch.tanh(t0)", "ltorch.frobnicate(t0)"));
    assert_eq!((e.line, e.col), (8, 8));
    assert_eq!(
        e.message,
        "1 unknown op: `ltorch.frobnicate` (line 8) (register them, or pass \
         --allow-unregistered to keep them as opaque nodes)"
    );
    assert!(e.to_string().contains("t1 = ltorch.frobnicate(t0)"));
}

#[test]
fn every_unknown_op_is_listed_at_once() {
    let text = GOOD
        .replace("ltorch.tanh(t0)", "ltorch.frobnicate(t0)")
        .replace("ltorch.linear(", "torch.wibble(");
    let e = parse_err(&text);
    assert!(
        e.message
            .starts_with("2 unknown ops: `torch.wibble` (line 7), `ltorch.frobnicate` (line 8)"),
        "{}",
        e.message
    );
    // kept as opaque nodes when allowed: declared types are trusted
    let reg = tracepass_ir::OpRegistry::builtin_allowing_unregistered();
    let t = tracepass_ir::parse_trace_with(&text, reg).unwrap();
    assert!(t.nodes().any(|(_, n)| n.op == "ltorch.frobnicate"));
    assert_eq!(
        reg.effect("ltorch.frobnicate"),
        tracepass_ir::Effect::SideEffect
    );
    tracepass_ir::verify_with(&t, reg).unwrap();
    assert!(tracepass_ir::verify(&t).is_err());
}

#[test]
fn undefined_name() {
    let e = parse_err(&GOOD.replace("ltorch.tanh(t0)", "ltorch.tanh(t9)"));
    assert_eq!((e.line, e.col), (8, 20));
    assert_eq!(e.message, "undefined name `t9`");
}

#[test]
fn redefinition() {
    let e = parse_err(&GOOD.replace("t1 = ltorch.tanh(t0)  # t1", "t0 = ltorch.tanh(t0)  # t0"));
    assert_eq!(e.line, 8);
    assert_eq!(e.message, "`t0` is defined twice (first on line 7)");
}

#[test]
fn unknown_type_string() {
    let e = parse_err(&GOOD.replace("cpu f32[8, 32]", "cpu q13[8, 32]"));
    assert_eq!(e.line, 5);
    assert_eq!(e.message, "unknown type `cpu q13[8, 32]`");
}

#[test]
fn syntax_errors() {
    let e = parse_err(&GOOD.replace("ltorch.tanh(t0)", "ltorch.tanh(t0"));
    assert_eq!(e.line, 8);
    assert_eq!(e.message, "expected `)`");
    let e = parse_err(&GOOD.replace("ltorch.tanh(t0)", "ltorch.tanh(t0) + 1"));
    assert_eq!(e.message, "unexpected character `+`");
    let e = parse_err(&GOOD.replace("ltorch.tanh(t0)", "ltorch.tanh('abc)"));
    assert_eq!(e.message, "unterminated string");
    let e = parse_err(&GOOD.replace("ltorch.tanh(t0)", "ltorch.tanh(foo(t0))"));
    assert_eq!(
        e.message,
        "call of `foo` inside an operand is not supported"
    );
}

#[test]
fn missing_return_and_trailing_statements() {
    let e = parse_err(&GOOD.replace("  return (t1,)\n", ""));
    assert_eq!(e.message, "trace has no `return`");
    let e = parse_err(&format!("{GOOD}  t2 = ltorch.tanh(t1)\n"));
    assert_eq!(
        (e.line, e.message.as_str()),
        (10, "statement after `return`")
    );
    let e = parse_err("x = 1\n");
    assert_eq!(e.line, 1);
    assert!(e.message.starts_with("expected a header line"));
    let e = parse_err("import torch\n");
    assert_eq!(e.message, "no `def` line: not a trace");
}

#[test]
fn type_comment_for_another_name() {
    let e = parse_err(&GOOD.replace("# t1: \"cpu", "# t7: \"cpu"));
    assert_eq!(e.line, 8);
    assert_eq!(
        e.message,
        "type comment names `t7`, which this statement does not define"
    );
}

#[test]
fn decomposition_without_statement() {
    let e = parse_err(&GOOD.replace(
        "  # w: \"cpu f32[64, 32]\"\n",
        "  # w: \"cpu f32[64, 32]\"\n    # t0 = prims.x(x)\n",
    ));
    assert_eq!(e.message, "decomposition comment before any statement");
}

#[test]
fn verifier_reports_every_error_with_its_line() {
    // a wrong declared type and a bad reshape, both reported at once
    let text = GOOD
        .replace("# t0: \"cpu f32[8, 64]\"", "# t0: \"cpu f32[8, 65]\"")
        .replace(
            "t1 = ltorch.tanh(t0)  # t1: \"cpu f32[8, 64]\"",
            "t1 = ltorch.reshape(x, (7, 7))  # t1: \"cpu f32[7, 7]\"",
        );
    let t = parse_trace(&text).unwrap();
    let e = verify(&t).unwrap_err();
    assert_eq!(e.diagnostics.len(), 2, "{e}");
    assert_eq!(
        e.diagnostics[0].to_string(),
        "`t0 = ltorch.linear(x, w, None)  # t0: \"cpu f32[8, 65]\"`: `t0` is declared \"cpu f32[8, 65]\" but ltorch.linear gives \"cpu f32[8, 64]\""
    );
    assert_eq!(
        e.diagnostics[1].message,
        "ltorch.reshape: cannot reshape [8, 32] (256 elements) to [7, 7]"
    );
    assert!(e
        .to_string()
        .starts_with("trace `computation` failed verification (2 errors):"));
}

#[test]
fn verifier_checks_schedule_and_futures() {
    let mut b = TraceBuilder::new("backward_fn", TraceKind::Backward);
    let x = b.arg("x", Type::tensor([4], DType::F32, Device::CPU));
    let y = b.op(ops::DIV, vec![x.into(), 2.0.into()]).unwrap();
    let f = b
        .op(
            ops::ALL_REDUCE,
            vec![y.into(), "sum".into(), "world".into()],
        )
        .unwrap();
    let z = b.op("ltorch.tanh", vec![y.into()]).unwrap(); // uses the buffer after the collective
    b.ret(Arg::Tuple(vec![z.into()]));
    let mut t = b.finish();
    let e = verify(&t).unwrap_err();
    let msgs: Vec<_> = e.diagnostics.iter().map(|d| d.message.clone()).collect();
    assert!(
        msgs.contains(&"uses `t0` after it was handed to dist.all_reduce_async".to_string()),
        "{msgs:?}"
    );
    assert!(
        msgs.contains(&"future `ft1` is waited 0 times (must be exactly once)".to_string()),
        "{msgs:?}"
    );
    let _ = f;
    // reversing the schedule breaks topological order
    let mut s = t.schedule().to_vec();
    s.reverse();
    t.set_schedule(s);
    let e = verify(&t).unwrap_err();
    assert!(
        e.diagnostics
            .iter()
            .any(|d| d.message.contains("before it is defined")),
        "{e}"
    );
    assert!(
        e.diagnostics
            .iter()
            .any(|d| d.message.starts_with("schedule is not topological")),
        "{e}"
    );
}

fn sample_bytes() -> Vec<u8> {
    codec::encode(&Module::Trace(parse_trace(GOOD).unwrap())).unwrap()
}

#[test]
fn binary_bad_magic() {
    let mut b = sample_bytes();
    b[0] = b'X';
    assert!(matches!(
        codec::decode(&b),
        Err(CodecError::BadMagic { .. })
    ));
    assert!(matches!(
        codec::decode(GOOD.as_bytes()),
        Err(CodecError::BadMagic { .. })
    ));
}

#[test]
fn binary_wrong_version() {
    let mut b = sample_bytes();
    b[8] = 99;
    assert_eq!(
        codec::decode(&b).unwrap_err().to_string(),
        "unsupported format version 99 (this build reads versions 1 to 5)"
    );
}

#[test]
fn binary_truncated() {
    let b = sample_bytes();
    let cut = &b[..b.len() - 10];
    assert!(matches!(
        codec::decode(cut),
        Err(CodecError::Truncated { .. })
    ));
    assert!(matches!(
        codec::decode(&b[..12]),
        Err(CodecError::ShortHeader { found: 12 })
    ));
    let mut longer = b.clone();
    longer.push(0);
    assert!(matches!(
        codec::decode(&longer),
        Err(CodecError::TrailingBytes { extra: 1 })
    ));
}

#[test]
fn binary_flipped_byte_anywhere_is_an_error_never_a_panic() {
    let b = sample_bytes();
    for i in 0..b.len() {
        let mut c = b.clone();
        c[i] ^= 0x40;
        assert!(
            codec::decode(&c).is_err(),
            "flipping byte {i} went unnoticed"
        );
    }
    let mut c = b.clone();
    let last = c.len() - 1;
    c[last] ^= 1;
    assert!(matches!(
        codec::decode(&c),
        Err(CodecError::ChecksumMismatch { .. })
    ));
}

#[test]
fn files_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.xyz");
    let e = fsio::load(&p).unwrap_err();
    assert!(e
        .to_string()
        .ends_with("unknown file extension; use .trace (text), .tpb (binary) or .json"));
    let p = dir.path().join("missing.trace");
    assert!(fsio::load(&p)
        .unwrap_err()
        .to_string()
        .contains("missing.trace"));
    let p = dir.path().join("bad.trace");
    std::fs::write(&p, GOOD.replace("ltorch.tanh", "ltorch.nope")).unwrap();
    let e = fsio::load(&p).unwrap_err().to_string();
    assert!(
        e.contains("bad.trace: line 8, column 8: 1 unknown op: `ltorch.nope` (line 8)"),
        "{e}"
    );
    let p = dir.path().join("bad.json");
    std::fs::write(&p, "{\"Trace\": 3}").unwrap();
    assert!(fsio::load(&p)
        .unwrap_err()
        .to_string()
        .contains("bad.json: invalid JSON trace"));
}

#[test]
fn atomic_save_replaces_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.tpb");
    let m = Module::Trace(parse_trace(GOOD).unwrap());
    fsio::save(&p, &m).unwrap();
    assert_eq!(fsio::load(&p).unwrap(), m);
    // no temporary files left behind
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    // a program cannot be written as text
    let prog = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    let e = fsio::save(&dir.path().join("p.trace"), &Module::Program(prog)).unwrap_err();
    assert!(matches!(e, FileError::ProgramAsText { .. }));
    assert!(!dir.path().join("p.trace").exists());
}

/// Found by `cargo xtask fuzz decode` (an out-of-memory): a 22-byte payload claiming a value id
/// near 2^32 made the decoder size its id tables by that id (gigabytes). It must be a plain error.
#[test]
fn fuzz_decode_huge_value_id_is_an_error_not_an_allocation() {
    let input = include_bytes!("fuzz_regressions/decode_huge_value_id.bin");
    // the fuzz target's convention: an odd first byte means "payload; add a valid header"
    let payload = &input[1..];
    let mut bytes = b"TRACEPB\0".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(payload);
    let start = std::time::Instant::now();
    let r = tracepass_ir::codec::decode(&bytes);
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
    assert!(r.is_err(), "{r:?}");
}

/// Found by `cargo xtask fuzz decode` (the process died of a stack overflow): a payload nesting
/// tuples thousands deep made decoding recurse once per level. Nesting is now bounded.
#[test]
fn fuzz_decode_deep_nesting_is_an_error_not_a_stack_overflow() {
    let mut t = Trace::new("deep", TraceKind::Forward);
    let mut ret = Arg::Int(1);
    for _ in 0..(tracepass_ir::arg::MAX_NESTING + 10) {
        ret = Arg::Tuple(vec![ret]);
    }
    t.ret = ret;
    let bytes = codec::encode(&Module::Trace(t)).unwrap();
    let e = codec::decode(&bytes).unwrap_err().to_string();
    assert!(e.contains("nest deeper than 128 levels"), "{e}");
    // and the text parser bounds its expressions the same way (it overflowed on 100,000 parens)
    let text = format!(
        "def f(x):\n  # x: \"cpu f32[2]\"\n  t0 = ltorch.reshape(x, {}2,{})\n  return t0\n",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    let e = parse_trace(&text).unwrap_err();
    assert!(
        e.message
            .contains("expression nests deeper than 128 levels"),
        "{}",
        e.message
    );
    assert_eq!(e.line, 3);
}

/// Found by the `opt` fuzzer: a shape whose element count overflows 64 bits made shape
/// inference multiply out of range.
#[test]
fn fuzz_shape_too_large_to_exist_is_an_error_everywhere() {
    // text: the type comment is refused where it stands
    let huge = "cpu f32[8, 3233333333333333333]";
    let e = parse_err(&GOOD.replace("# t0: \"cpu f32[8, 64]\"", &format!("# t0: \"{huge}\"")));
    assert_eq!((e.line, e.col), (7, 42), "at the type, after `# t0: \"`");
    assert!(e.message.contains("is too large"), "{}", e.message);
    // the limit is 2^63 - 1 bytes: 2^61 - 1 f32 elements fit, 2^61 do not
    assert!(
        parse_trace(&GOOD.replace("cpu f32[8, 32]", "cpu f32[1, 2305843009213693951]")).is_ok()
    );
    let e = parse_err(&GOOD.replace("cpu f32[8, 32]", "cpu f32[1, 2305843009213693952]"));
    assert_eq!((e.line, e.col), (5, 9));
    assert!(e.message.contains("is too large"), "{}", e.message);

    // a trace made in Rust: the verifier names the value, the decoder refuses the file
    let mut t = parse_trace(GOOD).unwrap();
    let x = t.find_value("x").unwrap();
    t.set_ty(
        x,
        Type::tensor(vec![1 << 40, 1 << 40], DType::F32, Device::CPU),
    );
    let err = verify(&t).unwrap_err().to_string();
    assert!(
        err.contains("`x` has type cpu f32[1099511627776, 1099511627776], over"),
        "{err}"
    );
    let bytes = codec::encode(&Module::Trace(t)).unwrap();
    let err = codec::decode(&bytes).unwrap_err().to_string();
    assert!(
        err.contains("(`x`) has type") && err.contains("bytes"),
        "{err}"
    );

    // shape inference: a reshape whose target shape overflows is an error, not a panic
    let e = parse_trace(&GOOD.replace(
        "t1 = ltorch.tanh(t0)  # t1: \"cpu f32[8, 64]\"",
        "t1 = ltorch.reshape(t0, (4294967296, 4294967296, 2))  # t1: \"cpu f32[8, 64]\"",
    ))
    .map(|t| verify(&t));
    let msg = format!("{e:?}");
    assert!(
        msg.contains("ltorch.reshape: shape [4294967296, 4294967296, 2] is too large"),
        "{msg}"
    );
}

/// Each member is a possible tensor; together they hold more elements than 64 bits count.
#[test]
fn a_pack_of_members_too_large_together_is_an_error() {
    let big = "cpu b8[9223372036854775807]";
    let text = format!(
        r#"import torch

@torch.no_grad()
def computation(a, b, c):
  # a: "{big}"
  # b: "{big}"
  # c: "{big}"
  t0 = dist.bucket_pack([a, b, c], bucket='b0', offsets=(0, 0, 0), nbytes=0)  # t0: "cpu b8[1]"
  return (t0,)
"#
    );
    let t = parse_trace(&text).unwrap();
    let err = verify(&t).unwrap_err().to_string();
    assert!(err.contains("the members hold too many elements"), "{err}");
}

/// Found by `cargo xtask fuzz decode`: a version-1 file (rows) whose node has the binding code
/// of a nested left-hand side decoded, without the places no version-1 file can hold, and
/// then could not be encoded again. It must be a plain error.
#[test]
fn fuzz_decode_v1_nested_binding_without_places_is_an_error() {
    let input = include_bytes!("fuzz_regressions/decode_v1_nested_without_places.bin");
    // the fuzz target's convention: first byte `& 3 == 3` means "payload of a version-1 file"
    assert_eq!(input[0] & 3, 3);
    let payload = &input[1..];
    let mut bytes = b"TRACEPB\0".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(payload);
    let e = tracepass_ir::codec::decode(&bytes).unwrap_err().to_string();
    assert!(
        e.contains("nested left-hand side without its places"),
        "{e}"
    );
}
