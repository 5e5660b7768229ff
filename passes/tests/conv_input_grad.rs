//! `conv-input-grad`: Thunder's input gradient of a convolution (the output gradient spread
//! by the stride, convolved by the channel-swapped, flipped weight, then cropped) becomes one
//! transposed convolution, on hand-made traces written as Thunder writes them (snapshots, and
//! the near misses it must leave alone) and on the corpus ResNet's backward.

use std::path::Path;
use tracepass_ir::*;
use tracepass_passes::*;

fn printed(t: &Trace) -> String {
    print_trace_with(
        t,
        PrintOptions {
            dels: false,
            ..PrintOptions::default()
        },
    )
}

/// Rewrites `t`, checks what every rewrite must keep (the verifier, the returned values and
/// their types, a lossless print), and returns how many gradients were rewritten.
fn rewrite(t: &mut Trace) -> usize {
    let before = t.clone();
    let n = conv_input_grad(t, OpRegistry::builtin()).unwrap();
    verify(t).unwrap_or_else(|e| panic!("{e}\n{}", printed(t)));
    let sig = |t: &Trace| {
        t.returned_values()
            .iter()
            .map(|v| (t.name(*v), t.ty(*v).cloned()))
            .collect::<Vec<_>>()
    };
    assert_eq!(sig(&before), sig(t));
    let back = parse_trace(&print_trace(t)).unwrap();
    assert_eq!(printed(&back), printed(t));
    n
}

/// Thunder's input gradient of a 2-d convolution of `[2, ci, n, n]` by a `[co, ci, k, k]`
/// weight with stride `s`, padding `p`, dilation `d` (`w_chain` replaced when given, `tail`
/// after the crop, which returns `y`).
struct Grad {
    ci: usize,
    co: usize,
    n: usize,
    k: usize,
    s: usize,
    p: usize,
    d: usize,
}

impl Grad {
    fn trace(&self, flip: &str, tail: &str) -> String {
        let Grad {
            ci,
            co,
            n,
            k,
            s,
            p,
            d,
        } = *self;
        let out = (n + 2 * p - d * (k - 1) - 1) / s + 1;
        let spread = (out - 1) * s + 1;
        let q = d * (k - 1);
        let full = spread + q;
        let hi = n as i64 - full as i64 + p as i64;
        format!(
            "def backward(g, w):\n  # g: \"cpu f32[2, {co}, {out}, {out}]\"\n  # w: \"cpu f32[{co}, {ci}, {k}, {k}]\"\n  \
             gs = torch_pad_prim_impl(g, 0.0, [(0, 0, 0), (0, 0, 0), (0, 0, {i}), (0, 0, {i})])  # gs: \"cpu f32[2, {co}, {spread}, {spread}]\"\n  \
             w1 = torch.permute(w, (1, 0, 2, 3))  # w1: \"cpu f32[{ci}, {co}, {k}, {k}]\"\n  \
             w2 = torch.reshape(w1, [{ci}, 1, {co}, {k}, {k}])  # w2: \"cpu f32[{ci}, 1, {co}, {k}, {k}]\"\n  \
             w3 = torch.permute(w2, (1, 0, 2, 3, 4))  # w3: \"cpu f32[1, {ci}, {co}, {k}, {k}]\"\n  \
             w4 = torch.reshape(w3, [{ci}, {co}, {k}, {k}])  # w4: \"cpu f32[{ci}, {co}, {k}, {k}]\"\n  \
             wf = torch.flip(w4, {flip})  # wf: \"cpu f32[{ci}, {co}, {k}, {k}]\"\n  \
             c = torch.convolution(gs, wf, None, (1,), [{q}, {q}], ({d}, {d}), False, (0, 0), 1)  # c: \"cpu f32[2, {ci}, {full}, {full}]\"\n  \
             y = torch_pad_prim_impl(c, 0.0, [(0, 0, 0), (0, 0, 0), (-{p}, {hi}, 0), (-{p}, {hi}, 0)])  # y: \"cpu f32[2, {ci}, {n}, {n}]\"\n{tail}",
            i = s - 1,
        )
    }
}

fn convs(t: &Trace) -> Vec<Node> {
    t.nodes()
        .filter(|(_, n)| op::CONVOLUTION.matches(n))
        .map(|(_, n)| n.clone())
        .collect()
}

#[test]
fn a_stride_two_input_gradient_becomes_one_transposed_convolution() {
    // ResNet's downsampling 3x3: stride 2, padding 1, 8x8 -> 4x4
    let g = Grad {
        ci: 3,
        co: 4,
        n: 8,
        k: 3,
        s: 2,
        p: 1,
        d: 1,
    };
    let mut t = parse_trace(&g.trace("(2, 3)", "  return y\n")).unwrap();
    assert_eq!(rewrite(&mut t), 1);
    // nothing else is left: the spread, the views, the flip and the crop went with it
    assert_eq!(t.nodes().count(), 1);
    let c = &convs(&t)[0];
    assert_eq!(c.args()[6], Arg::Bool(true));
    assert_eq!(c.args()[3], Arg::int_tuple([2, 2]));
    assert_eq!(c.args()[4], Arg::int_tuple([1, 1]));
    assert_eq!(c.args()[7], Arg::int_tuple([1, 1]));
    insta::assert_snapshot!("conv_input_grad_stride_2", printed(&t));
}

#[test]
fn strides_paddings_dilations_and_pointwise_kernels_are_rewritten() {
    for (g, stride, padding, output_padding) in [
        // stride 1, padding 1: what fold-conv-crop would only shrink
        (
            Grad {
                ci: 3,
                co: 5,
                n: 6,
                k: 3,
                s: 1,
                p: 1,
                d: 1,
            },
            1,
            1,
            0,
        ),
        // the 1x1 downsample: the crop is a pad that adds a zero row
        (
            Grad {
                ci: 4,
                co: 6,
                n: 4,
                k: 1,
                s: 2,
                p: 0,
                d: 1,
            },
            2,
            0,
            1,
        ),
        // stride 3 over 11: one input row the forward never read
        (
            Grad {
                ci: 2,
                co: 3,
                n: 11,
                k: 3,
                s: 3,
                p: 1,
                d: 1,
            },
            3,
            1,
            1,
        ),
        (
            Grad {
                ci: 2,
                co: 3,
                n: 9,
                k: 3,
                s: 1,
                p: 2,
                d: 2,
            },
            1,
            2,
            0,
        ),
        (
            Grad {
                ci: 3,
                co: 3,
                n: 7,
                k: 7,
                s: 2,
                p: 3,
                d: 1,
            },
            2,
            3,
            0,
        ),
    ] {
        let src = g.trace("(2, 3)", "  return y\n");
        let mut t = parse_trace(&src).unwrap();
        assert_eq!(rewrite(&mut t), 1, "{src}");
        let c = &convs(&t)[0];
        assert_eq!(c.args()[3], Arg::int_tuple([stride; 2]), "{src}");
        assert_eq!(c.args()[4], Arg::int_tuple([padding; 2]), "{src}");
        assert_eq!(c.args()[7], Arg::int_tuple([output_padding; 2]), "{src}");
        assert_eq!(t.nodes().count(), 1, "{src}");
    }
}

#[test]
fn values_read_elsewhere_stay_and_the_crop_is_optional() {
    let g = Grad {
        ci: 3,
        co: 4,
        n: 6,
        k: 3,
        s: 1,
        p: 1,
        d: 1,
    };
    // the flipped weight is also returned: the flip and its views stay
    let mut t = parse_trace(&g.trace("(2, 3)", "  return y, wf\n")).unwrap();
    assert_eq!(rewrite(&mut t), 1);
    assert_eq!(t.nodes().filter(|(_, n)| op::FLIP.matches(n)).count(), 1);
    assert_eq!(t.nodes().filter(|(_, n)| op::PERMUTE.matches(n)).count(), 2);
    // the full result is returned too: the convolution itself becomes the transposed one
    // (padding 0: every output), and the crop stays
    let mut t = parse_trace(&g.trace("(2, 3)", "  return y, c\n")).unwrap();
    assert_eq!(rewrite(&mut t), 1);
    let c = &convs(&t)[0];
    assert_eq!(
        (&c.args()[4], &c.args()[6]),
        (&Arg::int_tuple([0, 0]), &Arg::Bool(true))
    );
    assert_eq!(t.nodes().filter(|(_, n)| op::PAD.matches(n)).count(), 1);
    // fold-conv-crop first: a stride-1 gradient is a convolution with the forward's padding
    let mut t = parse_trace(&g.trace("(2, 3)", "  return y\n")).unwrap();
    assert_eq!(fold_conv_crop(&mut t, OpRegistry::builtin()).unwrap(), 1);
    assert_eq!(rewrite(&mut t), 1);
    assert_eq!(convs(&t)[0].args()[4], Arg::int_tuple([1, 1]));
}

#[test]
fn near_misses_are_left_alone() {
    let g = Grad {
        ci: 3,
        co: 4,
        n: 6,
        k: 3,
        s: 2,
        p: 1,
        d: 1,
    };
    let check = |src: String, why: &str| {
        let mut t = parse_trace(&src).unwrap_or_else(|e| panic!("{why}: {e}\n{src}"));
        let before = printed(&t);
        assert_eq!(rewrite(&mut t), 0, "{why}");
        assert_eq!(printed(&t), before, "{why}");
    };
    check(g.trace("(2,)", "  return y\n"), "one tap dim flipped");
    check(
        g.trace("(1, 2, 3)", "  return y\n"),
        "a channel dim flipped too",
    );
    // the weight regrouped instead of swapped
    let base = g.trace("(2, 3)", "  return y\n");
    check(
        base.replace(
            "torch.permute(w, (1, 0, 2, 3))",
            "torch.reshape(w, [3, 4, 3, 3])",
        ),
        "a reshape is no swap",
    );
    // the convolution reads 3 zeros before the spread gradient, more than a 3x3 kernel's
    // reach: a transposed convolution would need padding -1
    check(
        base.replace("[2, 2], (1, 1), False", "[3, 3], (1, 1), False")
            .replace("f32[2, 3, 7, 7]", "f32[2, 3, 9, 9]")
            .replace("(-1, 0, 0), (-1, 0, 0)", "(0, -3, 0), (0, -3, 0)"),
        "more padding than a transposed convolution has",
    );
    // a pad by ones spreads nothing; read as the gradient itself, the result would need
    // an output_padding of 1 at stride 1
    check(
        base.replace("torch_pad_prim_impl(g, 0.0", "torch_pad_prim_impl(g, 1.0"),
        "a pad by ones",
    );
}

#[test]
fn every_input_gradient_of_the_corpus_convolutions_is_rewritten() {
    // plain, grouped (ShuffleNet), depthwise 2-d and 1-d
    for model in ["resnet", "shuffle-unit", "convzoo", "conv1d"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/models")
            .join(model);
        let export = load_export(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut t = export.program.backward.clone();
        let flips = t.nodes().filter(|(_, n)| op::FLIP.matches(n)).count();
        assert!(flips > 0, "{model}");
        assert_eq!(rewrite(&mut t), flips, "{model}");
        assert_eq!(
            t.nodes().filter(|(_, n)| op::FLIP.matches(n)).count(),
            0,
            "{model}"
        );
        if model == "resnet" {
            let lines: String = printed(&t)
                .lines()
                .filter(|l| l.trim_start().starts_with('t') && l.contains("True"))
                .map(|l| format!("{}\n", l.trim()))
                .collect();
            insta::assert_snapshot!("conv_input_grad_resnet", lines);
        }
    }
}
