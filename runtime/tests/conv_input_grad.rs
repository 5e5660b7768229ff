//! `conv-input-grad` on the CPU: the transposed convolution gives what Thunder's spread,
//! flipped and cropped convolution gives (in f64, to rounding: the same terms summed in
//! another order) over strides, paddings, dilations, kernel sizes and 1 to 3 spatial dims;
//! training the corpus's convolutional models with it matches eager PyTorch within the corpus
//! bars, and with DDP the gradients stay bit for bit the same across bucket sizes.

mod common;
use common::{corpus, dims, json, name, run_trace as run, step0, values};
use tracepass_ir::{op, parse_trace};
use tracepass_passes::conv_input_grad;
use tracepass_runtime::tensor::{Tensor, TensorFile};
use tracepass_runtime::train::TrainReport;

/// The forward convolution of `[2, ci, *n]` by `[co, ci / groups, *k]` (every spatial dim
/// alike) whose input gradient Thunder writes.
struct Case {
    groups: usize,
    ci: usize,
    co: usize,
    n: Vec<usize>,
    k: usize,
    s: usize,
    p: usize,
    d: usize,
}

impl Case {
    /// Thunder's input gradient, in f64: spread, channel swap, flip, full convolution, crop.
    fn trace(&self) -> String {
        let Case {
            groups,
            ci,
            co,
            k,
            s,
            p,
            d,
            ..
        } = *self;
        let (cig, cog) = (ci / groups, co / groups);
        let sp = self.n.len();
        let out: Vec<usize> = self
            .n
            .iter()
            .map(|&n| (n + 2 * p - d * (k - 1) - 1) / s + 1)
            .collect();
        let spread: Vec<usize> = out.iter().map(|o| (o - 1) * s + 1).collect();
        let q = d * (k - 1);
        let full: Vec<usize> = spread.iter().map(|x| x + q).collect();
        let shape = |head: &[usize], tail: &[usize]| dims(&[head, tail].concat());
        let ks = vec![k; sp];
        let zero = "(0, 0, 0)";
        let spread_cfg: Vec<String> = (0..sp).map(|_| format!("(0, 0, {})", s - 1)).collect();
        let crop_cfg: Vec<String> = (0..sp)
            .map(|j| {
                format!(
                    "(-{p}, {}, 0)",
                    self.n[j] as i64 - full[j] as i64 + p as i64
                )
            })
            .collect();
        let rest: Vec<String> = (2..2 + sp).map(|j| j.to_string()).collect();
        format!(
            "def backward(g, w):\n  # g: \"cpu f64[{g}]\"\n  # w: \"cpu f64[{w}]\"\n  \
             gs = torch_pad_prim_impl(g, 0.0, [{zero}, {zero}, {sc}])  # gs: \"cpu f64[{gs}]\"\n  \
             w1 = torch.permute(w, (1, 0, {rest}))  # w1: \"cpu f64[{w1}]\"\n  \
             w2 = torch.reshape(w1, [{cig}, {groups}, {cog}, {ks}])  # w2: \"cpu f64[{cig}, {groups}, {cog}, {ks}]\"\n  \
             w3 = torch.permute(w2, (1, 0, 2, {rest1}))  # w3: \"cpu f64[{groups}, {cig}, {cog}, {ks}]\"\n  \
             w4 = torch.reshape(w3, [{w4}])  # w4: \"cpu f64[{w4}]\"\n  \
             wf = torch.flip(w4, ({rest},))  # wf: \"cpu f64[{w4}]\"\n  \
             c = torch.convolution(gs, wf, None, (1,), ({q},), ({d},), False, (0,), {groups})  # c: \"cpu f64[{c}]\"\n  \
             y = torch_pad_prim_impl(c, 0.0, [{zero}, {zero}, {cc}])  # y: \"cpu f64[{y}]\"\n  return y\n",
            g = shape(&[2, co], &out),
            w = shape(&[co, cig], &ks),
            sc = spread_cfg.join(", "),
            gs = shape(&[2, co], &spread),
            rest = rest.join(", "),
            rest1 = (3..3 + sp).map(|j| j.to_string()).collect::<Vec<_>>().join(", "),
            w1 = shape(&[cig, co], &ks),
            w4 = shape(&[ci, cog], &ks),
            ks = dims(&ks),
            c = shape(&[2, ci], &full),
            cc = crop_cfg.join(", "),
            y = shape(&[2, ci], &self.n),
        )
    }
    fn g_shape(&self) -> Vec<usize> {
        let mut v = vec![2, self.co];
        v.extend(
            self.n
                .iter()
                .map(|&n| (n + 2 * self.p - self.d * (self.k - 1) - 1) / self.s + 1),
        );
        v
    }
}

#[test]
fn the_transposed_convolution_gives_thunders_input_gradient() {
    let case = |ci, co, n: &[usize], k, s, p, d| Case {
        groups: 1,
        ci,
        co,
        n: n.to_vec(),
        k,
        s,
        p,
        d,
    };
    let grouped = |groups, ci, co, n: &[usize], k, s, p| Case {
        groups,
        ci,
        co,
        n: n.to_vec(),
        k,
        s,
        p,
        d: 1,
    };
    let cases = [
        // ResNet: 3x3 stride 1 and 2, the 1x1 downsample, the 7x7 stem
        case(8, 6, &[6, 6], 3, 1, 1, 1),
        case(8, 16, &[8, 8], 3, 2, 1, 1),
        case(8, 16, &[4, 4], 1, 2, 0, 1),
        case(3, 4, &[16, 16], 7, 2, 3, 1),
        // late layers: many channels on 2x2 (several samples per product)
        case(64, 64, &[2, 2], 3, 1, 1, 1),
        case(4, 6, &[11], 3, 3, 1, 1),
        case(4, 6, &[9, 9], 3, 1, 2, 2),
        case(2, 3, &[5, 6, 5], 3, 2, 1, 1),
        // ShuffleNet's grouped 1x1, MobileNet's depthwise 3x3 at stride 2, a 1-d depthwise
        grouped(3, 12, 12, &[8, 8], 1, 1, 0),
        grouped(8, 8, 8, &[9, 9], 3, 2, 1),
        grouped(4, 4, 8, &[16], 3, 1, 1),
    ];
    for (seed, c) in cases.into_iter().enumerate() {
        let src = c.trace();
        let thunders = parse_trace(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let mut rewritten = thunders.clone();
        let reg = tracepass_ir::OpRegistry::builtin();
        assert_eq!(conv_input_grad(&mut rewritten, reg).unwrap(), 1, "{src}");
        assert!(rewritten.nodes().all(|(_, n)| !op::FLIP.matches(n)));
        let seed = 2 * seed as u64;
        let w_shape: Vec<usize> = [vec![c.co, c.ci / c.groups], vec![c.k; c.n.len()]].concat();
        let g_shape = c.g_shape();
        let t =
            |shape: &[usize], seed| Tensor::from_f64(shape, values(shape.iter().product(), seed));
        let inputs = [t(&g_shape, seed + 1), t(&w_shape, seed + 2)];
        let (want, got) = (run(&thunders, &inputs), run(&rewritten, &inputs));
        assert_eq!(want[0].shape(), got[0].shape(), "{src}");
        for (i, (a, b)) in got[0]
            .to_f64_vec()
            .iter()
            .zip(want[0].to_f64_vec())
            .enumerate()
        {
            assert!(
                (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                "{src}\nelement {i}: {a} vs {b}"
            );
        }
    }
}

/// The corpus models whose backward has an input gradient the pass rewrites.
fn rewritten_models() -> Vec<std::path::PathBuf> {
    corpus()
        .into_iter()
        .filter(|d| json(&d.join("export.json"))["world_size"].is_null())
        .filter(|d| {
            let Ok(export) = tracepass_ir::load_export(d) else {
                return false;
            };
            let mut t = export.program.backward.clone();
            conv_input_grad(&mut t, tracepass_ir::OpRegistry::builtin()).is_ok_and(|n| n > 0)
        })
        .collect()
}

#[test]
fn training_with_it_matches_eager_pytorch_and_keeps_bits_across_buckets() {
    let models = rewritten_models();
    // plain, grouped and depthwise convolutions, 1-d and 2-d
    for m in ["resnet", "unet", "shuffle-unit", "convzoo", "conv1d"] {
        assert!(
            models.iter().any(|d| d.ends_with(m)),
            "{m} not in {models:?}"
        );
    }
    for dir in &models {
        let r = step0(dir, 1, "conv-input-grad", 25.0);
        let want = json(&dir.join("reference/loss.json"))["losses"][0]
            .as_f64()
            .unwrap();
        assert!(((r.losses[0] - want) / want).abs() < 1e-5, "{}", name(dir));
        let reference = TensorFile::load(&dir.join("reference/grads.safetensors")).unwrap();
        let largest = reference
            .tensors
            .values()
            .map(|t| t.to_f64_vec().iter().map(|x| x.abs()).fold(0.0, f64::max))
            .fold(0.0, f64::max);
        for (fqn, want) in &reference.tensors {
            let i = r.param_names.iter().position(|n| n == fqn).unwrap();
            let g = r.grads_step0[0][i].as_ref().unwrap().to_f64_vec();
            let want = want.to_f64_vec();
            let err = g
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(
                err / largest < 1e-4,
                "{}: `{fqn}` off by {:e}",
                name(dir),
                err / largest
            );
        }
        // DDP: every bucket size gives the same bits on every rank
        let runs: Vec<TrainReport> = [0.0, 0.001, 25.0]
            .into_iter()
            .map(|mb| {
                let p = format!("ddp(world_size=2,bucket_mb={mb}),conv-input-grad,fold-conv-crop,fuse-elementwise,sort-waits");
                step0(dir, 2, &p, mb)
            })
            .collect();
        for r in &runs {
            for rank in 0..2 {
                for (a, b) in r.grads_step0[rank].iter().zip(&runs[0].grads_step0[0]) {
                    match (a, b) {
                        (Some(a), Some(b)) => assert!(a.bitwise_eq(b), "{}", name(dir)),
                        (None, None) => {}
                        _ => panic!("{}: a gradient is missing on one side", name(dir)),
                    }
                }
            }
        }
    }
}
