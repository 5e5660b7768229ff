//! What Thunder 0.2.6 prints for Python-level writes into tensors (`y[key] = value`:
//! `copy_with_setitem_impl`) and for `nn.MultiheadAttention` through its torch fallback
//! (`multi_head_attention_forward` and `multi_head_attention_forward_vjp`): parsed, typed by
//! their metas, and refused with the statement named when the operands do not fit.

use tracepass_ir::*;

fn ty(t: &Trace, name: &str) -> String {
    let v = t
        .values()
        .find(|(_, v)| v.name == name)
        .unwrap_or_else(|| panic!("no value {name}"))
        .0;
    t.ty(v).unwrap().to_string()
}

/// Thunder's slice-assignment statements (from a forward and a backward, names shortened).
const SETITEM: &str = r#"def f(y, z, cols, mask, g):
  # y: "cpu f32[4, 24]"
  # z: "cpu f32[4, 2]"
  # cols: "cpu i64[2]"
  # mask: "cpu b8[4, 24]"
  # g: "cpu f32[4, 24]"
  t1 = copy_with_setitem_impl(y, (slice(None,None,None), slice(None,8,None)), t0)  # t1: "cpu f32[4, 24]"
  t2 = copy_with_setitem_impl(t1, (..., 0), 0.0)  # t2: "cpu f32[4, 24]"
  t3 = copy_with_setitem_impl(t2, (slice(None,None,None), cols), z)  # t3: "cpu f32[4, 24]"
  t4 = copy_with_setitem_impl(t3, mask, 1.0)  # t4: "cpu f32[4, 24]"
  t5 = copy_with_setitem_impl(t4, 0, t6)  # t5: "cpu f32[4, 24]"
  t7 = copy_with_setitem_impl(g, (slice(None,None,None), cols), 0)  # t7: "cpu f32[4, 24]"
  t8 = Tensor.__getitem__(g, (slice(None,None,None), cols))  # t8: "cpu f32[4, 2]"
  t9 = copy_(t5, y, grad_enabled=True)  # t9: "cpu f32[4, 24]"
  return (t9, t7, t8)
"#;

fn setitem_trace() -> String {
    // the values written, made by ops so that their types are inferred
    SETITEM
        .replace(
            "  t1 = copy",
            "  t0 = torch.full((4, 8), 2.0, device=torch.device(\"cpu\"), dtype=torch.float32)  # t0: \"cpu f32[4, 8]\"\n  t1 = copy",
        )
        .replace(
            "  t5 = copy",
            "  t6 = torch.full((24,), 3.0, device=torch.device(\"cpu\"), dtype=torch.float32)  # t6: \"cpu f32[24]\"\n  t5 = copy",
        )
}

#[test]
fn slice_assignments_parse_and_keep_the_written_tensors_type() {
    let t = parse_trace(&setitem_trace()).unwrap();
    verify(&t).unwrap();
    let writes = t
        .nodes()
        .filter(|(_, n)| n.op == "prims.copy_with_setitem")
        .count();
    assert_eq!(writes, 6);
    for name in ["t1", "t2", "t3", "t4", "t5", "t7"] {
        assert_eq!(ty(&t, name), "cpu f32[4, 24]", "{name}");
    }
    let printed = print_trace(&t);
    assert!(
        printed.contains("copy_with_setitem_impl(t2, (slice(None, None, None), cols), z)")
            || printed.contains("copy_with_setitem_impl(t2, (slice(None,None,None), cols), z)"),
        "{printed}"
    );
    assert_eq!(parse_trace(&printed).unwrap(), t);
}

/// A trace with one `copy_with_setitem_impl(y, KEY, VALUE)` into a `[4, 6]` tensor.
fn one_write(key: &str, value: &str) -> Result<Trace, String> {
    let text = format!(
        "def f(y, v, idx, m):\n  # y: \"cpu f32[4, 6]\"\n  # v: \"cpu f32[4, 3]\"\n  # idx: \"cpu i64[3]\"\n  # m: \"cpu b8[4]\"\n  t1 = copy_with_setitem_impl(y, {key}, {value})\n  return t1\n"
    );
    let t = parse_trace(&text).map_err(|e| e.to_string())?;
    verify(&t).map_err(|e| e.to_string())?;
    Ok(t)
}

#[test]
fn a_written_value_must_broadcast_to_what_the_key_selects() {
    // fits: [4, 3] into y[:, 1:4], y[:, idx], y[:, ::2]; a number anywhere
    for key in [
        "(slice(None,None,None), slice(1,4,None))",
        "(slice(None,None,None), idx)",
        "(..., slice(None,None,2))",
    ] {
        let t = one_write(key, "v").unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(ty(&t, "t1"), "cpu f32[4, 6]");
    }
    one_write("(m,)", "0.5").unwrap();
    // does not fit: 4 columns selected, or one row
    for key in ["(slice(None,None,None), slice(0,4,None))", "1"] {
        let e = one_write(key, "v").unwrap_err();
        assert!(
            e.contains("copy_with_setitem") && e.contains("does not broadcast"),
            "{key}: {e}"
        );
    }
}

#[test]
fn a_key_that_does_not_index_the_tensor_is_refused() {
    let e = one_write("(0, 6)", "1.0").unwrap_err();
    assert!(e.contains("out of range for dimension 1"), "{e}");
    let e = one_write("(0, 0, 0)", "1.0").unwrap_err();
    assert!(e.contains("3 indices for a tensor of rank 2"), "{e}");
    let e = one_write("(slice(None,None,None), m)", "1.0").unwrap_err();
    assert!(e.contains("boolean mask"), "{e}");
}

/// `nn.MultiheadAttention(8, 2)` as Thunder 0.2.6 prints it (batch_first: permuted first).
const MHA: &str = r#"def f(x, w, b, wo, bo, g):
  # x: "cpu f32[4, 2, 8]"
  # w: "cpu f32[24, 8]"
  # b: "cpu f32[24]"
  # wo: "cpu f32[8, 8]"
  # bo: "cpu f32[8]"
  # g: "cpu f32[4, 2, 8]"
  (t35, t36) = torch.nn.functional.multi_head_attention_forward(x, x, x, 8, 2, w, b, None, None, False, 0.0, wo, bo, training=True, key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=AVG, is_causal=False)
  t68 = torch.zeros(2, 4, 4, device=torch.device("cpu"), dtype=torch.float32)  # t68: "cpu f32[2, 4, 4]"
  (t79, t80, t81, _, _, t82, t83, _, _, _, _, t84, t85) = multi_head_attention_forward_vjp(((x, x, x, 8, 2, w, b, None, None, False, 0.0, wo, bo), {'training': True, 'key_padding_mask': None, 'need_weights': True, 'attn_mask': None, 'average_attn_weights': True, 'is_causal': False}), g, t68)
  return (t35, t36, t79, t80, t81, t82, t83, t84, t85)
"#;

#[test]
fn multi_head_attention_and_its_fallback_backward_are_typed() {
    let t = parse_trace(&MHA.replace("AVG", "True")).unwrap();
    verify(&t).unwrap();
    assert_eq!(ty(&t, "t35"), "cpu f32[4, 2, 8]");
    assert_eq!(ty(&t, "t36"), "cpu f32[2, 4, 4]");
    for (g, of) in [
        ("t79", "x"),
        ("t80", "x"),
        ("t81", "x"),
        ("t82", "w"),
        ("t83", "b"),
        ("t84", "wo"),
        ("t85", "bo"),
    ] {
        assert_eq!(ty(&t, g), ty(&t, of), "{g}");
    }
    let n = t
        .nodes()
        .map(|(_, n)| n)
        .find(|n| n.op == "ltorch.multi_head_attention_forward_vjp")
        .unwrap();
    assert_eq!(LhsSlot::count_outputs(n.lhs_pattern().unwrap()), 7);
    assert_eq!(parse_trace(&print_trace(&t)).unwrap(), t);
    // per-head weights
    let t = parse_trace(&MHA.replace("AVG", "False")).unwrap();
    assert_eq!(ty(&t, "t36"), "cpu f32[2, 2, 4, 4]");
}

#[test]
fn multi_head_attention_refuses_operands_that_do_not_fit() {
    let bad = |from: &str, to: &str| {
        let text = MHA.replace("AVG", "True").replacen(from, to, 1);
        let e = parse_trace(&text)
            .map_err(|e| e.to_string())
            .and_then(|t| verify(&t).map_err(|e| e.to_string()))
            .unwrap_err();
        assert!(e.contains("multi_head_attention_forward"), "{e}");
        e
    };
    let e = bad("(x, x, x, 8, 2,", "(x, x, x, 8, 3,");
    assert!(e.contains("not divisible into 3 heads"), "{e}");
    let e = bad("(x, x, x, 8, 2,", "(x, x, x, 16, 2,");
    assert!(e.contains("embed_dim_to_check 16"), "{e}");
    let e = bad("# w: \"cpu f32[24, 8]\"", "# w: \"cpu f32[16, 8]\"");
    assert!(e.contains("in_proj_weight") && e.contains("[24, 8]"), "{e}");
    // the fallback gives no gradient to a keyword tensor (Thunder refuses it too)
    let e = bad("'attn_mask': None", "'attn_mask': g");
    assert!(e.contains("keyword operand"), "{e}");
}

#[test]
fn reading_by_index_tensors_is_typed_by_advanced_indexing() {
    let read = |key: &str, declared: &str| -> Result<String, String> {
        let text = format!(
            "def f(y, idx, j):\n  # y: \"cpu f32[3, 5, 2]\"\n  # idx: \"cpu i64[4]\"\n  # j: \"cpu i64[2, 1]\"\n  t1 = Tensor.__getitem__(y, {key})  # t1: \"cpu f32{declared}\"\n  return t1\n"
        );
        let t = parse_trace(&text).map_err(|e| e.to_string())?;
        verify(&t).map_err(|e| e.to_string())?;
        Ok(ty(&t, "t1"))
    };
    // adjacent index tensors stay in place; apart, their broadcast shape goes in front
    assert_eq!(
        read("(slice(None,None,None), idx)", "[3, 4, 2]").unwrap(),
        "cpu f32[3, 4, 2]"
    );
    assert_eq!(
        read("(idx, slice(None,None,None), j)", "[2, 4, 5]").unwrap(),
        "cpu f32[2, 4, 5]"
    );
    assert_eq!(
        read("(..., j)", "[3, 5, 2, 1]").unwrap(),
        "cpu f32[3, 5, 2, 1]"
    );
    // a declared type the indexing does not give is refused
    let e = read("(slice(None,None,None), idx)", "[3, 2]").unwrap_err();
    assert!(
        e.contains("declared \"cpu f32[3, 2]\" but ltorch.getitem gives \"cpu f32[3, 4, 2]\""),
        "{e}"
    );
}
