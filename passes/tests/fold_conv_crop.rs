//! `fold-conv-crop`: a convolution whose only reader crops it becomes a convolution with less
//! padding, on hand-made traces (snapshots, and the cases it must leave alone) and on the
//! corpus ResNet's backward, where every input-gradient convolution is cropped.

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

/// Folds `t`, checks what every fold must keep (the verifier, the returned values and their
/// types, a lossless print), and returns how many crops were folded.
fn fold(t: &mut Trace) -> usize {
    let before = t.clone();
    let n = fold_conv_crop(t, OpRegistry::builtin()).unwrap();
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

/// A trace of one convolution (`x: [2, 3, *spatial]`, weight `[4, 3, *kernel]`) whose result
/// `c` is cropped by `crop` (a pad config) into `y` of shape `kept`, then `tail` (further
/// statements and the return).
fn conv_then_crop(
    spatial: &[usize],
    kernel: &[usize],
    params: &str,
    out: &[usize],
    crop: &str,
    kept: &[usize],
    tail: &str,
) -> String {
    let shape = |head: &[usize], tail: &[usize]| {
        let all: Vec<String> = head.iter().chain(tail).map(|d| d.to_string()).collect();
        all.join(", ")
    };
    format!(
        "def backward(x, w):\n  # x: \"cpu f32[{x}]\"\n  # w: \"cpu f32[{w}]\"\n  \
         c = torch.convolution(x, w, None, {params}, False, (0,), 1)  # c: \"cpu f32[{c}]\"\n  \
         y = torch_pad_prim_impl(c, 0.0, {crop})  # y: \"cpu f32[{y}]\"\n{tail}",
        x = shape(&[2, 3], spatial),
        w = shape(&[4, 3], kernel),
        c = shape(&[2, 4], out),
        y = shape(&[], kept),
    )
}

#[test]
fn thunders_input_gradient_crop_becomes_the_forward_padding() {
    // a 3x3 convolution with padding 1 on 5x5: Thunder's input gradient pads by 2 and crops 1
    let src = conv_then_crop(
        &[5, 5],
        &[3, 3],
        "(1,), [2, 2], (1, 1)",
        &[7, 7],
        "[(0, 0, 0), (0, 0, 0), (-1, -1, 0), (-1, -1, 0)]",
        &[2, 4, 5, 5],
        "  return y\n",
    );
    let mut t = parse_trace(&src).unwrap();
    assert_eq!(fold(&mut t), 1);
    assert!(t.nodes().all(|(_, n)| !op::PAD.matches(n)));
    let convs: Vec<_> = t
        .nodes()
        .filter(|(_, n)| op::CONVOLUTION.matches(n))
        .collect();
    assert_eq!(convs.len(), 1);
    assert_eq!(
        convs[0].1.args()[4],
        Arg::List(vec![Arg::Int(1), Arg::Int(1)])
    );
    insta::assert_snapshot!("fold_conv_crop_2d", printed(&t));
}

#[test]
fn strided_dilated_and_one_and_three_dim_crops_fold() {
    // stride 2, padding 2 on 8: 5 outputs; dropping one at each end is padding 0 (3 outputs)
    let mut t = parse_trace(&conv_then_crop(
        &[8],
        &[3],
        "(2,), (2,), (1,)",
        &[5],
        "[(0, 0, 0), (0, 0, 0), (-1, -1, 0)]",
        &[2, 4, 3],
        "  return y\n",
    ))
    .unwrap();
    assert_eq!(fold(&mut t), 1);
    insta::assert_snapshot!("fold_conv_crop_strided_1d", printed(&t));

    // dilation 2, padding 4 on 6x6x6: 10 outputs a dim; crops of 2 give padding 2 (6 outputs),
    // and a dim left alone keeps its padding
    let mut t = parse_trace(&conv_then_crop(
        &[6, 6, 6],
        &[3, 3, 3],
        "(1,), (4, 4, 4), (2,)",
        &[10, 10, 10],
        "[(0, 0, 0), (0, 0, 0), (-2, -2, 0), (0, 0, 0), (-2, -2, 0)]",
        &[2, 4, 6, 10, 6],
        "  return y\n",
    ))
    .unwrap();
    assert_eq!(fold(&mut t), 1);
    let conv = t
        .nodes()
        .find(|(_, n)| op::CONVOLUTION.matches(n))
        .unwrap()
        .1;
    assert_eq!(
        conv.args()[4],
        Arg::Tuple(vec![Arg::Int(2), Arg::Int(4), Arg::Int(2)])
    );
}

#[test]
fn crops_that_are_not_a_smaller_padding_are_left_alone() {
    let cases = [
        // one side only: torch's padding is the same on both sides
        (
            "(1,), (2,), (1,)",
            [7, 7],
            "[(0, 0, 0), (0, 0, 0), (-1, 0, 0), (0, 0, 0)]",
            [2, 4, 6, 7],
        ),
        // more than the padding: the convolution would need a negative one
        (
            "(1,), (1,), (1,)",
            [5, 5],
            "[(0, 0, 0), (0, 0, 0), (-2, -2, 0), (0, 0, 0)]",
            [2, 4, 1, 5],
        ),
        // the batch dim is cropped
        (
            "(1,), (1,), (1,)",
            [5, 5],
            "[(-1, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0)]",
            [1, 4, 5, 5],
        ),
        // interior padding inserts zeros
        (
            "(1,), (1,), (1,)",
            [5, 5],
            "[(0, 0, 0), (0, 0, 0), (-1, -1, 1), (0, 0, 0)]",
            [2, 4, 7, 5],
        ),
        // a positive pad grows the result
        (
            "(1,), (1,), (1,)",
            [5, 5],
            "[(0, 0, 0), (0, 0, 0), (1, 1, 0), (0, 0, 0)]",
            [2, 4, 7, 5],
        ),
        // stride 2: dropping the last output only is not a symmetric padding
        (
            "(2,), (2,), (1,)",
            [4, 4],
            "[(0, 0, 0), (0, 0, 0), (0, -1, 0), (0, 0, 0)]",
            [2, 4, 3, 4],
        ),
    ];
    for (params, out, crop, kept) in cases {
        let src = conv_then_crop(&[5, 5], &[3, 3], params, &out, crop, &kept, "  return y\n");
        let mut t = parse_trace(&src).unwrap();
        let before = printed(&t);
        assert_eq!(fold(&mut t), 0, "{crop}");
        assert_eq!(printed(&t), before);
    }

    // the uncropped result is also read, or returned
    let read = "  z = torch.neg(c)  # z: \"cpu f32[2, 4, 7, 7]\"\n";
    let crop = "[(0, 0, 0), (0, 0, 0), (-1, -1, 0), (-1, -1, 0)]";
    for tail in [
        format!("{read}  return y, z\n"),
        "  return y, c\n".to_string(),
    ] {
        let src = conv_then_crop(
            &[5, 5],
            &[3, 3],
            "(1,), [2, 2], (1, 1)",
            &[7, 7],
            crop,
            &[2, 4, 5, 5],
            &tail,
        );
        let mut t = parse_trace(&src).unwrap();
        assert_eq!(fold(&mut t), 0, "{tail}");
    }
}

#[test]
fn every_input_gradient_of_the_corpus_resnet_is_folded() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models/resnet");
    let export = load_export(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut t = export.program.backward.clone();
    // the crops Thunder wrote: pads of a convolution's result
    let crops = t
        .nodes()
        .filter(|(_, n)| {
            op::PAD.matches(n)
                && matches!(n.args().first(), Some(Arg::Value(v))
                    if t.producer(*v).and_then(|p| t.node(p)).is_some_and(|p| op::CONVOLUTION.matches(p)))
        })
        .count();
    assert!(crops > 0);
    let convs = |t: &Trace| {
        t.nodes()
            .filter(|(_, n)| op::CONVOLUTION.matches(n))
            .count()
    };
    let before = convs(&t);
    assert_eq!(fold(&mut t), crops);
    assert_eq!(convs(&t), before);
    // the folded convolutions, as printed
    let lines: String = printed(&t)
        .lines()
        .filter(|l| l.trim_start().starts_with('t') && l.contains("torch.convolution"))
        .map(|l| format!("{}\n", l.trim()))
        .collect();
    insta::assert_snapshot!("fold_conv_crop_resnet", lines);
}
