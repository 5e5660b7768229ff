//! The op table: it registers whole, every spelling resolves to its op, and the metas give
//! PyTorch's shapes and dtypes (each case below is what PyTorch 2.9 returns for that call).

use tracepass_ir::{parse_trace, verify, OpRegistry, Trace};

/// Parses a one-statement computation whose result has no type comment, so the op's meta
/// infers it; returns the types of the statement's outputs.
fn infer(args: &[(&str, &str)], stmt: &str) -> Result<Vec<String>, String> {
    let names: Vec<&str> = args.iter().map(|a| a.0).collect();
    let mut text = format!("def computation({}):\n", names.join(", "));
    for (n, ty) in args {
        text += &format!("  # {n}: \"{ty}\"\n");
    }
    text += &format!("  {stmt}\n  return None\n");
    let t: Trace = parse_trace(&text).map_err(|e| e.message)?;
    let (_, node) = t.nodes().last().unwrap();
    Ok(node
        .outputs()
        .iter()
        .map(|o| t.ty(*o).unwrap().to_string())
        .collect())
}

fn one(args: &[(&str, &str)], stmt: &str) -> String {
    let v = infer(args, stmt).unwrap_or_else(|e| panic!("{stmt}: {e}"));
    assert_eq!(v.len(), 1, "{stmt}");
    v.into_iter().next().unwrap()
}

fn fails(args: &[(&str, &str)], stmt: &str) -> String {
    infer(args, stmt).expect_err(stmt)
}

#[test]
fn the_table_registers_and_every_spelling_names_its_op() {
    let reg = OpRegistry::with_builtins();
    let defs = reg.defs();
    assert!(defs.len() > 150, "{} ops", defs.len());
    for d in defs {
        assert!(d.signature.is_some(), "{} has no signature", d.name);
        assert_eq!(reg.resolve(&d.name), Some(d.name.as_str()));
        for s in &d.spellings {
            assert_eq!(reg.resolve(s), Some(d.name.as_str()), "{s}");
        }
        let ns = d.name.split('.').next().unwrap();
        assert!(
            ["prims", "ltorch", "dist", "python", "tracepass"].contains(&ns),
            "{} is outside the canonical namespaces",
            d.name
        );
    }
}

#[test]
fn a_spelling_cannot_name_two_ops() {
    use tracepass_ir::{DTypeRule, Effect, OpSpec};
    let mut reg = OpRegistry::with_builtins();
    let spec = OpSpec {
        name: "user.my_mul",
        spellings: &["torch.mul"],
        effect: Effect::Pure,
        signature: "a, b",
        dtype: DTypeRule::Promote,
        meta: |_| Ok(tracepass_ir::MetaOut::Declared),
    };
    let e = reg.declare(&spec).unwrap_err().to_string();
    assert_eq!(
        e,
        "`torch.mul` already names `ltorch.mul`; it cannot also name `user.my_mul`"
    );
}

#[test]
fn comparisons_and_predicates_give_booleans() {
    let a = [("a", "cpu f32[2, 3]")];
    assert_eq!(one(&a, "t0 = torch.gt(a, 0.0)"), "cpu b8[2, 3]");
    assert_eq!(one(&a, "t0 = torch.eq(a, a)"), "cpu b8[2, 3]");
    assert_eq!(one(&a, "t0 = torch.isnan(a)"), "cpu b8[2, 3]");
    let ab = [("a", "cpu b8[2, 3]"), ("b", "cpu f32[3]")];
    assert_eq!(one(&ab, "t0 = torch.where(a, b, 0.0)"), "cpu f32[2, 3]");
}

#[test]
fn elementwise_promotion_follows_pytorch() {
    let i = [("a", "cpu i64[4]")];
    assert_eq!(one(&i, "t0 = torch.true_divide(a, 2)"), "cpu f32[4]");
    assert_eq!(one(&i, "t0 = torch.add(a, 1)"), "cpu i64[4]");
    assert_eq!(one(&i, "t0 = torch.add(a, 1.5)"), "cpu f32[4]");
    assert_eq!(one(&i, "t0 = torch.exp(a)"), "cpu f32[4]");
    assert_eq!(
        one(&i, "t0 = torch.div(a, 2, rounding_mode='floor')"),
        "cpu i64[4]"
    );
    // a 0-d tensor does not widen a dimensioned one of its category
    let z = [("a", "cpu f32[4]"), ("s", "cpu f64[]")];
    assert_eq!(one(&z, "t0 = torch.mul(a, s)"), "cpu f32[4]");
    let h = [("a", "cpu f16[2]"), ("b", "cpu bf16[2]")];
    assert_eq!(one(&h, "t0 = torch.add(a, b)"), "cpu f32[2]");
    let bc = [("a", "cpu f32[4, 1]"), ("b", "cpu f32[3]")];
    assert_eq!(one(&bc, "t0 = torch.sub(a, b, alpha=1)"), "cpu f32[4, 3]");
    assert!(fails(
        &[("a", "cpu f32[4]"), ("b", "cpu f32[3]")],
        "t0 = torch.mul(a, b)"
    )
    .contains("do not broadcast"));
}

#[test]
fn creation_ops_take_dtype_and_infer_lengths() {
    assert_eq!(
        one(
            &[],
            "t0 = torch.arange(start=0, step=1, end=16, device=torch.device(\"cpu\"), dtype=torch.int64)"
        ),
        "cpu i64[16]"
    );
    assert_eq!(one(&[], "t0 = torch.arange(0.0, 1.0, 0.25)"), "cpu f32[4]");
    assert_eq!(one(&[], "t0 = torch.arange(5)"), "cpu i64[5]");
    assert_eq!(one(&[], "t0 = torch.full((2, 3), 1.0)"), "cpu f32[2, 3]");
    assert_eq!(one(&[], "t0 = torch.full((2,), True)"), "cpu b8[2]");
    assert_eq!(one(&[], "t0 = torch.full((2,), 7)"), "cpu i64[2]");
    assert_eq!(
        one(
            &[],
            "t0 = uniform((4, 64), 0.0, 1.0, device=torch.device(\"cpu\"), dtype=torch.float32)"
        ),
        "cpu f32[4, 64]"
    );
}

#[test]
fn thunder_prims_pad_and_slice() {
    let a = [("a", "cpu f32[4, 5]")];
    // lo/hi may crop; interior padding inserts between elements
    assert_eq!(
        one(
            &a,
            "t0 = torch_pad_prim_impl(a, 0.0, [(1, -1, 0), (0, 0, 2)])"
        ),
        "cpu f32[4, 13]"
    );
    assert_eq!(
        one(&a, "t0 = torch_slice_prim_impl(a, [0, 1], [4, 5], [2, 2])"),
        "cpu f32[2, 2]"
    );
    assert!(fails(&a, "t0 = torch_slice_prim_impl(a, [0, 1], [5, 5])").contains("bad slice"));
    assert_eq!(
        one(&a, "t0 = torch_prims_reshape_impl(a, (20,))"),
        "cpu f32[20]"
    );
}

#[test]
fn basic_indexing() {
    let a = [("a", "cpu f32[4, 5, 6]")];
    assert_eq!(
        one(
            &a,
            "t0 = Tensor.__getitem__(a, (slice(None, 2, None), None, ..., 1))"
        ),
        "cpu f32[2, 1, 5]"
    );
    assert_eq!(one(&a, "t0 = Tensor.__getitem__(a, 0)"), "cpu f32[5, 6]");
    assert_eq!(
        one(
            &a,
            "t0 = Tensor.__getitem__(a, (..., slice(-2, None, None)))"
        ),
        "cpu f32[4, 5, 2]"
    );
}

#[test]
fn layout_ops() {
    let a = [("a", "cpu f32[2, 16, 192]")];
    assert_eq!(
        infer(&a, "[t0, t1, t2] = torch.split(a, 64, 2)").unwrap(),
        vec!["cpu f32[2, 16, 64]"; 3]
    );
    assert_eq!(
        one(&a, "t0 = torch.reshape(a, (-1, 192))"),
        "cpu f32[32, 192]"
    );
    assert_eq!(one(&a, "t0 = torch.reshape(a, 2, -1)"), "cpu f32[2, 3072]");
    assert_eq!(
        one(&a, "t0 = torch.permute(a, (0, 2, 1))"),
        "cpu f32[2, 192, 16]"
    );
    assert_eq!(
        one(&a, "t0 = torch.unsqueeze(a, -1)"),
        "cpu f32[2, 16, 192, 1]"
    );
    assert_eq!(one(&a, "t0 = torch.flip(a, (1, 2))"), "cpu f32[2, 16, 192]");
    let c = [("a", "cpu f32[2, 3]"), ("b", "cpu f32[2, 5]")];
    assert_eq!(one(&c, "t0 = torch.cat((a, b), 1)"), "cpu f32[2, 8]");
    assert!(fails(&c, "t0 = torch.cat((a, b), 0)").contains("does not fit"));
    let e = [("a", "cpu f32[1, 8, 1, 1]")];
    assert_eq!(
        one(&e, "t0 = Tensor.expand(a, (4, 8, 16, 16))"),
        "cpu f32[4, 8, 16, 16]"
    );
    assert!(fails(&e, "t0 = Tensor.expand(a, (4, 7, 1, 1))").contains("cannot expand"));
    let s = [("a", "cpu f32[1, 3, 1]")];
    assert_eq!(one(&s, "t0 = torch.squeeze(a)"), "cpu f32[3]");
    assert_eq!(one(&s, "t0 = torch.squeeze(a, 2)"), "cpu f32[1, 3]");
    let t = [("a", "cpu f32[4]")];
    assert_eq!(
        one(&t, "t0 = Tensor.to(a, torch.float16, copy=True)"),
        "cpu f16[4]"
    );
}

#[test]
fn triangles_pixel_shuffles_and_rolls() {
    let m = [("a", "cpu b8[3, 5, 7]")];
    assert_eq!(one(&m, "t0 = torch.triu(a, 1)"), "cpu b8[3, 5, 7]");
    assert_eq!(
        one(&m, "t0 = Tensor.tril(a, diagonal=-2)"),
        "cpu b8[3, 5, 7]"
    );
    assert!(fails(&[("a", "cpu f32[4]")], "t0 = torch.triu(a)").contains("at least 2"));
    let x = [("x", "cpu f32[2, 12, 3, 5]")];
    assert_eq!(
        one(&x, "t0 = torch.nn.functional.pixel_shuffle(x, 2)"),
        "cpu f32[2, 3, 6, 10]"
    );
    assert!(fails(&x, "t0 = torch.nn.functional.pixel_shuffle(x, 3)").contains("divisible by 9"));
    let y = [("x", "cpu f32[2, 3, 6, 10]")];
    assert_eq!(
        one(&y, "t0 = torch.nn.functional.pixel_unshuffle(x, 2)"),
        "cpu f32[2, 12, 3, 5]"
    );
    assert!(fails(&y, "t0 = torch.pixel_unshuffle(x, 4)").contains("divisible by 4"));
    assert_eq!(
        one(&x, "t0 = torch.roll(x, shifts=(1, -2), dims=(2, 3))"),
        "cpu f32[2, 12, 3, 5]"
    );
    assert_eq!(one(&x, "t0 = Tensor.roll(x, 3)"), "cpu f32[2, 12, 3, 5]");
    assert!(fails(&x, "t0 = torch.roll(x, (1, 2))").contains("without dims"));
    assert!(fails(&x, "t0 = torch.roll(x, (1, 2), (3,))").contains("2 shifts for 1 dims"));
    assert!(fails(&x, "t0 = torch.roll(x, 1, 4)").contains("4"));
}

#[test]
fn reductions() {
    let x = [("a", "cpu f32[4, 8, 16, 16]")];
    assert_eq!(
        infer(&x, "(t0, t1) = torch.var_mean(a, (0, 2, 3), correction=0)").unwrap(),
        vec!["cpu f32[8]", "cpu f32[8]"]
    );
    assert_eq!(
        one(&x, "t0 = torch.sum(a, (0,), False, dtype=None)"),
        "cpu f32[8, 16, 16]"
    );
    assert_eq!(
        one(&x, "t0 = torch.amax(a, -1, True)"),
        "cpu f32[4, 8, 16, 1]"
    );
    let i = [("a", "cpu i64[4]")];
    assert_eq!(one(&i, "t0 = torch.sum(a)"), "cpu i64[]");
    assert!(fails(&i, "t0 = torch.mean(a)").contains("floating"));
    let b = [("a", "cpu b8[4]")];
    assert_eq!(one(&b, "t0 = torch.sum(a)"), "cpu i64[]");
    let s = [("a", "cpu f32[2, 5]")];
    assert_eq!(one(&s, "t0 = torch.softmax(a, -1)"), "cpu f32[2, 5]");
    assert_eq!(one(&s, "t0 = torch.argmax(a, 1)"), "cpu i64[2]");
    // as torch 2.9.0 prints them
    assert_eq!(one(&s, "t0 = torch.argmin(a, -1, True)"), "cpu i64[2, 1]");
    assert_eq!(one(&s, "t0 = torch.argmax(a, None, False)"), "cpu i64[]");
    // torch 2.9.0: argmax(x, keepdim=True) of a 2-d x has shape (1, 1)
    assert_eq!(one(&s, "t0 = torch.argmax(a, None, True)"), "cpu i64[1, 1]");
    assert_eq!(one(&s, "t0 = torch.cumsum(a, 1)"), "cpu f32[2, 5]");
    assert_eq!(
        one(&i, "t0 = torch.cumsum(a, 0, dtype=torch.float32)"),
        "cpu f32[4]"
    );
    assert_eq!(one(&b, "t0 = torch.cumsum(a, 0)"), "cpu i64[4]");
    assert_eq!(
        infer(&s, "(t0, t1) = torch.topk(a, 3)").unwrap(),
        vec!["cpu f32[2, 3]", "cpu i64[2, 3]"]
    );
}

#[test]
fn convolution_pooling_embedding() {
    let c = [
        ("x", "cpu f32[4, 3, 16, 16]"),
        ("w", "cpu f32[8, 3, 3, 3]"),
        ("b", "cpu f32[8]"),
    ];
    assert_eq!(
        one(
            &c,
            "t0 = torch.convolution(x, w, b, (1, 1), (1, 1), (1, 1), False, (0, 0), 1)"
        ),
        "cpu f32[4, 8, 16, 16]"
    );
    assert_eq!(
        one(
            &c,
            "t0 = torch.convolution(x, w, None, (2, 2), (0, 0), (1, 1), False, (0, 0), 1)"
        ),
        "cpu f32[4, 8, 7, 7]"
    );
    assert_eq!(
        one(
            &c,
            "t0 = torch.nn.functional.conv2d(x, w, b, padding='same')"
        ),
        "cpu f32[4, 8, 16, 16]"
    );
    // transposed: the weight is [in, out / groups, k, k]
    let t = [("x", "cpu f32[1, 8, 7, 7]"), ("w", "cpu f32[8, 3, 3, 3]")];
    assert_eq!(
        one(
            &t,
            "t0 = torch.convolution(x, w, None, (2, 2), (0, 0), (1, 1), True, (1, 1), 1)"
        ),
        "cpu f32[1, 3, 16, 16]"
    );
    assert!(fails(
        &[("x", "cpu f32[4, 4, 16, 16]"), ("w", "cpu f32[8, 3, 3, 3]")],
        "t0 = torch.convolution(x, w, None, (1, 1), (1, 1), (1, 1), False, (0, 0), 1)"
    )
    .contains("channels"));
    let p = [("x", "cpu f32[4, 8, 16, 16]")];
    assert_eq!(
        infer(
            &p,
            "(t0, t1) = max_pool2d_with_indices(x, 2, 2, 0, 1, False)"
        )
        .unwrap(),
        vec!["cpu f32[4, 8, 8, 8]", "cpu i64[4, 8, 8, 8]"]
    );
    assert_eq!(
        infer(
            &p,
            "(t0, t1) = max_pool2d_with_indices(x, 3, 2, 1, 1, True)"
        )
        .unwrap()[0],
        // ceil mode: ceil((16 + 2 - 2 - 1) / 2) + 1 = 9; the last window starts inside
        "cpu f32[4, 8, 9, 9]"
    );
    let e = [
        ("idx", "cpu i64[2, 16]"),
        ("w", "cpu f32[128, 64]"),
        ("g", "cpu f32[2, 16, 64]"),
    ];
    assert_eq!(
        one(
            &e,
            "t0 = torch.nn.functional.embedding(idx, w, None, None, 2.0, False, False)"
        ),
        "cpu f32[2, 16, 64]"
    );
    assert_eq!(
        one(
            &e,
            "t0 = torch.torch.ops.aten.embedding_backward(g, idx, 128, -1, False, False)"
        ),
        "cpu f32[128, 64]"
    );
}

#[test]
fn signatures_check_keywords_and_arity() {
    let a = [("a", "cpu f32[4]")];
    let e = fails(&a, "t0 = torch.sum(a, frob=1)");
    assert!(e.contains("has no keyword `frob`"), "{e}");
    let e = fails(&a, "t0 = torch.add(a)");
    assert!(e.contains("needs operand `b`"), "{e}");
    // a declared type that contradicts the meta is a verifier error naming both
    let text = "def computation(a):\n  # a: \"cpu f32[4]\"\n  t0 = torch.gt(a, 0.0)  # t0: \"cpu f32[4]\"\n  return (t0,)\n";
    let t = parse_trace(text).unwrap();
    let err = verify(&t).unwrap_err().to_string();
    assert!(
        err.contains("declared \"cpu f32[4]\" but ltorch.gt gives \"cpu b8[4]\""),
        "{err}"
    );
}

#[test]
fn gather_and_scatter_add_as_thunder_prints_them() {
    // Thunder 0.2.6 prints torch.gather(t65, 1, t67) and, in the backward,
    // torch.scatter_add(t80, 1, t67, t72)
    let g = [("a", "cpu f32[4, 16]"), ("i", "cpu i64[4, 8]")];
    assert_eq!(one(&g, "t0 = torch.gather(a, 1, i)"), "cpu f32[4, 8]");
    assert_eq!(one(&g, "t0 = torch.gather(a, -1, i)"), "cpu f32[4, 8]");
    assert_eq!(
        one(&g, "t0 = torch.gather(input=a, dim=1, index=i)"),
        "cpu f32[4, 8]"
    );
    // index may be larger than the input along dim, not elsewhere
    let long = [("a", "cpu bf16[3, 4]"), ("i", "cpu i32[2, 9]")];
    assert_eq!(one(&long, "t0 = torch.gather(a, 1, i)"), "cpu bf16[2, 9]");
    let e = fails(&long, "t0 = torch.gather(a, 0, i)");
    assert!(e.contains("larger than input [3, 4] in dimension 1"), "{e}");
    let e = fails(
        &[("a", "cpu f32[3, 4]"), ("i", "cpu i64[4]")],
        "t0 = torch.gather(a, 0, i)",
    );
    assert!(e.contains("must have the rank of input"), "{e}");
    let e = fails(
        &[("a", "cpu f32[3, 4]"), ("i", "cpu f32[3, 4]")],
        "t0 = torch.gather(a, 0, i)",
    );
    assert!(
        e.contains("`index` must be an i64 or i32 tensor, got f32"),
        "{e}"
    );
    let e = fails(&g, "t0 = torch.gather(a, 2, i)");
    assert!(e.contains("dimension 2 out of range for rank 2"), "{e}");

    let s = [
        ("z", "cpu f32[4, 16]"),
        ("i", "cpu i64[4, 8]"),
        ("g", "cpu f32[4, 8]"),
    ];
    assert_eq!(
        one(&s, "t0 = torch.scatter_add(z, 1, i, g)"),
        "cpu f32[4, 16]"
    );
    assert_eq!(
        one(&s, "t0 = torch.scatter_add(z, -1, i, src=g)"),
        "cpu f32[4, 16]"
    );
    // src may be larger than index; index no larger than src anywhere
    let big = [
        ("z", "cpu f32[4, 16]"),
        ("i", "cpu i64[4, 8]"),
        ("g", "cpu f32[5, 9]"),
    ];
    assert_eq!(
        one(&big, "t0 = torch.scatter_add(z, 1, i, g)"),
        "cpu f32[4, 16]"
    );
    let small = [
        ("z", "cpu f32[4, 16]"),
        ("i", "cpu i64[4, 8]"),
        ("g", "cpu f32[4, 7]"),
    ];
    let e = fails(&small, "t0 = torch.scatter_add(z, 1, i, g)");
    assert!(e.contains("no larger than src [4, 7]"), "{e}");
    let mixed = [
        ("z", "cpu f32[4, 16]"),
        ("i", "cpu i64[4, 8]"),
        ("g", "cpu f64[4, 8]"),
    ];
    let e = fails(&mixed, "t0 = torch.scatter_add(z, 1, i, g)");
    assert!(e.contains("`src` is cpu f64, the input cpu f32"), "{e}");
    let wide = [
        ("z", "cpu f32[4, 16]"),
        ("i", "cpu i64[5, 8]"),
        ("g", "cpu f32[5, 8]"),
    ];
    let e = fails(&wide, "t0 = torch.scatter_add(z, 1, i, g)");
    assert!(e.contains("larger than a [4, 16] in dimension 0"), "{e}");
}

#[test]
fn index_select_and_index_add_as_thunder_prints_them() {
    // torch.index_select(t_w, 0, t73) and its backward torch.index_add(t98, 0, t73, t97)
    let s = [("w", "cpu f32[32, 16]"), ("i", "cpu i64[16]")];
    assert_eq!(
        one(&s, "t0 = torch.index_select(w, 0, i)"),
        "cpu f32[16, 16]"
    );
    assert_eq!(
        one(&s, "t0 = torch.index_select(w, -1, i)"),
        "cpu f32[32, 16]"
    );
    // a 0-d index selects one slice and keeps the dimension
    let z = [("w", "cpu f32[32, 16]"), ("i", "cpu i32[]")];
    assert_eq!(
        one(&z, "t0 = torch.index_select(w, 1, i)"),
        "cpu f32[32, 1]"
    );
    let e = fails(
        &[("w", "cpu f32[32, 16]"), ("i", "cpu i64[2, 8]")],
        "t0 = torch.index_select(w, 0, i)",
    );
    assert!(e.contains("index must be a vector"), "{e}");
    let e = fails(
        &[("w", "cpu f32[32, 16]"), ("i", "cpu b8[2]")],
        "t0 = torch.index_select(w, 0, i)",
    );
    assert!(e.contains("must be an i64 or i32 tensor, got b8"), "{e}");

    let a = [
        ("z", "cpu f32[32, 16]"),
        ("i", "cpu i64[16]"),
        ("g", "cpu f32[16, 16]"),
    ];
    assert_eq!(
        one(&a, "t0 = torch.index_add(z, 0, i, g)"),
        "cpu f32[32, 16]"
    );
    let e = fails(&a, "t0 = torch.index_add(z, 1, i, g)");
    assert!(e.contains("source [16, 16] must be a [32, 16]"), "{e}");
    let bad = [
        ("z", "cpu f32[32, 16]"),
        ("i", "cpu i64[16]"),
        ("g", "cpu bf16[16, 16]"),
    ];
    let e = fails(&bad, "t0 = torch.index_add(z, 0, i, g)");
    assert!(e.contains("`source` is cpu bf16, the input cpu f32"), "{e}");
}

#[test]
fn sorting_ops_as_thunder_prints_them() {
    // torch.argsort(t65, dim=1, descending=False, stable=False) and
    // (t64, t65) = torch.topk(t63, 4, 1, True, True), as Thunder 0.2.6 prints them
    let a = [("a", "cpu f32[4, 16]")];
    assert_eq!(
        one(
            &a,
            "t0 = torch.argsort(a, dim=1, descending=False, stable=False)"
        ),
        "cpu i64[4, 16]"
    );
    assert_eq!(one(&a, "t0 = torch.argsort(a, dim=None)"), "cpu i64[4, 16]");
    assert!(fails(&a, "t0 = torch.argsort(a, dim=2)").contains("out of range"));
    assert_eq!(
        infer(&a, "(t0, t1) = torch.topk(a, 4, 1, True, True)").unwrap(),
        vec!["cpu f32[4, 4]", "cpu i64[4, 4]"]
    );
    assert_eq!(
        infer(&a, "(t0, t1) = torch.topk(a, 2, 0, False, False)").unwrap(),
        vec!["cpu f32[2, 16]", "cpu i64[2, 16]"]
    );
    let e = infer(&a, "(t0, t1) = torch.topk(a, 17, 1, True, True)").unwrap_err();
    assert!(e.contains("k = 17 is out of range"), "{e}");
    let s = [("a", "cpu f32[]")];
    assert_eq!(
        infer(&s, "(t0, t1) = torch.topk(a, 1)").unwrap(),
        vec!["cpu f32[]", "cpu i64[]"]
    );
    assert!(infer(&s, "(t0, t1) = torch.topk(a, 2)").is_err());
    assert_eq!(
        infer(
            &a,
            "(t0, t1) = torch.sort(a, dim=0, descending=True, stable=False)"
        )
        .unwrap(),
        vec!["cpu f32[4, 16]", "cpu i64[4, 16]"]
    );
    assert_eq!(
        infer(&a, "(t0, t1) = torch.sort(a)").unwrap(),
        vec!["cpu f32[4, 16]", "cpu i64[4, 16]"]
    );
}

/// `torch.min` is registered automatically by Thunder and printed as called, with each of its
/// overloads; `where` of two numbers placed by a tensor predicate is a tensor.
#[test]
fn torch_min_overloads_and_where_of_numbers() {
    let a = [("a", "cpu i64[16, 16]"), ("b", "cpu i64[16, 16]")];
    assert_eq!(one(&a, "t0 = torch.min(a, b)"), "cpu i64[16, 16]");
    let f = [("a", "cpu f32[4, 3]"), ("b", "cpu f64[3]")];
    assert_eq!(one(&f, "t0 = torch.min(a, b)"), "cpu f64[4, 3]");
    assert_eq!(one(&f, "t0 = torch.min(a)"), "cpu f32[]");
    assert_eq!(
        infer(&f, "(t0, t1) = torch.min(a, 1)").unwrap(),
        vec!["cpu f32[4]", "cpu i64[4]"]
    );
    assert_eq!(
        infer(&f, "(t0, t1) = torch.min(a, -1, True)").unwrap(),
        vec!["cpu f32[4, 1]", "cpu i64[4, 1]"]
    );
    let p = [("p", "cpu b8[256]")];
    assert_eq!(one(&p, "t0 = torch.where(p, 49, 0)"), "cpu i64[256]");
    assert_eq!(one(&p, "t0 = torch.where(p, 1.5, 0)"), "cpu f32[256]");
    let x = [("x", "cpu f32[2, 32, 49]")];
    assert_eq!(
        one(&x, "t0 = torch.nn.functional.adaptive_avg_pool1d(x, 1)"),
        "cpu f32[2, 32, 1]"
    );
    assert!(fails(
        &[("x", "cpu f32[49]")],
        "t0 = torch.adaptive_avg_pool1d(x, 1)"
    )
    .contains("2 or 3"));
}
