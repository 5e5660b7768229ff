//! Statements whose results nest in tuples, with discarded places: Thunder's backward of an
//! op it registered automatically (`conv_transpose2d_vjp`), which returns one gradient per leaf
//! of the forward's operands.

use tracepass_ir::*;

/// The statement as Thunder 0.2.6 prints it in a U-Net's backward (names shortened).
const VJP: &str = r#"def backward_fn(x, w, b, g):
  # x: "cpu f32[2, 8, 4, 4]"
  # w: "cpu f32[8, 4, 2, 2]"
  # b: "cpu f32[4]"
  # g: "cpu f32[2, 4, 8, 8]"
  (t1, t2, t3, (_, _), (_, _), (_, _), _, (_, _)) = conv_transpose2d_vjp(((x, w, b, (2, 2), (0, 0), (0, 0), 1, (1, 1)), {}), g)
  return (t1, t2, t3)
"#;

fn vjp_node(t: &Trace) -> &Node {
    t.nodes()
        .map(|(_, n)| n)
        .find(|n| n.op == "ltorch.conv_transpose2d_vjp")
        .expect("the vjp statement")
}

#[test]
fn a_fallback_vjp_binds_one_gradient_per_tensor_operand() {
    let t = parse_trace(VJP).unwrap();
    verify(&t).unwrap();
    let n = vjp_node(&t);
    assert_eq!(n.lhs, Lhs::Nested);
    let names: Vec<String> = n.outputs().iter().map(|o| t.name(*o).to_string()).collect();
    assert_eq!(names, ["t1", "t2", "t3"]);
    // each gradient has its operand's type, inferred (Thunder prints no type comments here)
    let ty = |name: &str| {
        let v = t.values().find(|(_, v)| v.name == name).unwrap().0;
        t.ty(v).unwrap().to_string()
    };
    assert_eq!(ty("t1"), ty("x"));
    assert_eq!(ty("t2"), ty("w"));
    assert_eq!(ty("t3"), ty("b"));
    let pattern = n.lhs_pattern().unwrap();
    assert_eq!(pattern.len(), 8);
    assert_eq!(LhsSlot::count_outputs(pattern), 3);
    assert_eq!(
        pattern[3],
        LhsSlot::Group(vec![LhsSlot::Discard, LhsSlot::Discard])
    );
}

#[test]
fn a_nested_left_hand_side_prints_and_stores_as_read() {
    let t = parse_trace(VJP).unwrap();
    let printed = print_trace(&t);
    assert!(
        printed.contains("  (t1, t2, t3, (_, _), (_, _), (_, _), _, (_, _)) = conv_transpose2d_vjp(((x, w, b, (2, 2), (0, 0), (0, 0), 1, (1, 1)), {}), g)\n"),
        "{printed}"
    );
    assert_eq!(parse_trace(&printed).unwrap(), t);
    let m = Module::Trace(t);
    let bytes = codec::encode(&m).unwrap();
    assert_eq!(codec::decode(&bytes).unwrap(), m);
    let json = serde_json::to_string(&m).unwrap();
    assert!(json.contains("lhs_pattern"), "{json}");
    assert_eq!(serde_json::from_str::<Module>(&json).unwrap(), m);
}

#[test]
fn one_element_groups_keep_their_comma() {
    let text = "def f(a, g):\n  # a: \"cpu f32[3]\"\n  # g: \"cpu f32[3]\"\n  ((t1,), _) = conv_transpose1d_vjp((([a], 2), {}), g)\n  return t1\n";
    // the forward's operands are made up: the meta only mirrors their structure
    let t = parse_trace(text).unwrap();
    let printed = print_trace(&t);
    assert!(
        printed.contains("  ((t1,), _) = conv_transpose1d_vjp"),
        "{printed}"
    );
    assert_eq!(parse_trace(&printed).unwrap(), t);
}

/// The builder names every gradient and discards every `None`.
#[test]
fn the_builder_binds_nested_results() {
    let ty = |s: &str| Type::parse(s).unwrap();
    let mut b = TraceBuilder::new("backward_fn", TraceKind::Backward);
    let x = b.arg("x", ty("cpu f32[1, 2, 3]"));
    let w = b.arg("w", ty("cpu f32[2, 2, 3]"));
    let g = b.arg("g", ty("cpu f32[1, 2, 5]"));
    let saved = Arg::Tuple(vec![
        Arg::Tuple(vec![Arg::Value(x), Arg::Value(w), Arg::None, Arg::Int(1)]),
        Arg::Dict(vec![]),
    ]);
    let outs = b
        .op_multi(
            "ltorch.conv_transpose1d_vjp",
            vec![saved, Arg::Value(g)],
            vec![],
        )
        .unwrap();
    assert_eq!(outs.len(), 2);
    b.ret(Arg::Tuple(outs.iter().map(|o| Arg::Value(*o)).collect()));
    let t = b.finish();
    verify(&t).unwrap();
    let printed = print_trace(&t);
    assert!(
        printed.contains(", _, _) = ltorch.conv_transpose1d_vjp(((x, w, None, 1), {}), g)"),
        "{printed}"
    );
    assert_eq!(parse_trace(&printed).unwrap(), t);
}

fn parse_err(text: &str) -> ParseError {
    parse_trace(text).unwrap_err()
}

const HEAD: &str = "def f(x, w, g):\n  # x: \"cpu f32[1, 2, 3]\"\n  # w: \"cpu f32[2, 2, 3]\"\n  # g: \"cpu f32[1, 2, 5]\"\n";

#[test]
fn a_name_on_a_place_without_a_gradient_is_an_error() {
    // the stride (an int) has no gradient: naming it would bind None
    let e = parse_err(&format!(
        "{HEAD}  (t1, t2, _, t3) = conv_transpose1d_vjp(((x, w, None, 1), {{}}), g)\n  return t1\n"
    ));
    assert_eq!(e.line, 5, "{e}");
    assert!(e.message.contains("result[3] is None"), "{e}");
}

#[test]
fn a_left_hand_side_of_another_shape_is_an_error() {
    let e = parse_err(&format!(
        "{HEAD}  (t1, t2, _) = conv_transpose1d_vjp(((x, w, None, 1), {{}}), g)\n  return t1\n"
    ));
    assert!(
        e.message
            .contains("a tuple of 4 places, the left-hand side unpacks 3"),
        "{e}"
    );
    let e = parse_err(&format!(
        "{HEAD}  (t1, t2, _, (_, _)) = conv_transpose1d_vjp(((x, w, None, 1), {{}}), g)\n  return t1\n"
    ));
    assert!(e.message.contains("result[3] is not a tuple"), "{e}");
    let e = parse_err(&format!(
        "{HEAD}  t1 = conv_transpose1d_vjp(((x, w, None, 1), {{}}), g)\n  return t1\n"
    ));
    assert!(e.message.contains("bind them with a tuple"), "{e}");
}

#[test]
fn a_malformed_nested_left_hand_side_is_an_error_with_its_column() {
    let e = parse_err(&format!(
        "{HEAD}  (t1, (t2 _), _) = conv_transpose1d_vjp(((x, w, None, 1), {{}}), g)\n  return t1\n"
    ));
    assert_eq!((e.line, e.col), (5, 12), "{e}");
    assert!(e.message.contains("expected `,` or `)`"), "{e}");
    let e = parse_err(&format!(
        "{HEAD}  [t1, _, _] = conv_transpose1d_vjp(((x, w, 1), {{}}), g)\n  return t1\n"
    ));
    assert!(e.message.contains("`_` is bound more than once"), "{e}");
}

/// Only fallbacks whose gradient tracepass computes are in the table: any other is an
/// unknown op, not run on a guess from its name.
#[test]
fn a_fallback_of_another_op_is_an_unknown_op() {
    let e = parse_err(&format!(
        "{HEAD}  (t1, _) = adaptive_max_pool3d_vjp(((x, 2), {{}}), g)\n  return t1\n"
    ));
    assert!(e.message.contains("adaptive_max_pool3d_vjp"), "{e}");
}

/// A file whose places do not fit the outputs is refused when read; a node built in memory
/// with such places is reported by the verifier.
#[test]
fn places_that_do_not_fit_the_outputs_are_errors() {
    let m = Module::Trace(parse_trace(VJP).unwrap());
    let json = serde_json::to_string(&m).unwrap();
    let edited = json.replacen(
        "\"lhs_pattern\":[\"Out\",\"Out\",\"Out\",",
        "\"lhs_pattern\":[\"Out\",\"Out\",\"Discard\",",
        1,
    );
    assert_ne!(edited, json, "{json}");
    let e = serde_json::from_str::<Module>(&edited)
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 places for 3 outputs"), "{e}");
    let Module::Trace(mut t) = m else {
        unreachable!()
    };
    let n = vjp_node(&t).clone();
    let outs = vec![t.new_value("t7", Type::Any), t.new_value("t8", Type::Any)];
    let mut wrong = n.with_operands(n.args().to_vec(), outs);
    wrong.set_nested_lhs(vec![LhsSlot::Out; 3]);
    t.append(wrong);
    let e = verify(&t).unwrap_err().to_string();
    assert!(e.contains("names 3 places for 2 outputs"), "{e}");
}
