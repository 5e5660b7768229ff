//! `fold-conv-crop` on the CPU: a folded convolution gives exactly the bits of the cropped one
//! (every kept output is the same sum), on random operands over strides, dilations, groups
//! and 1 to 3 spatial dims, and training the corpus ResNet with the fold gives the unfolded
//! gradients bit for bit.

mod common;
use common::{corpus, dims, run_trace as run, values};
use tracepass_ir::parse_trace;
use tracepass_passes::{fold_conv_crop, parse_pipeline};
use tracepass_runtime::tensor::Tensor;
use tracepass_runtime::train::{train, ModelSource, OptimizerKind, TrainConfig};

fn random(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let v = values(n, seed).into_iter().map(|x| x as f32).collect();
    Tensor::from_f32(shape, v)
}

/// One convolution geometry: `x` and `w` shapes, stride, padding, dilation, groups, and the
/// crop of each spatial dim.
struct Case {
    x: Vec<usize>,
    w: Vec<usize>,
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
    crop: usize,
}

impl Case {
    fn trace(&self) -> String {
        let sp = self.x.len() - 2;
        let out: Vec<usize> = (0..sp)
            .map(|d| {
                let span =
                    self.x[d + 2] + 2 * self.padding - self.dilation * (self.w[d + 2] - 1) - 1;
                span / self.stride + 1
            })
            .collect();
        let mut c = vec![self.x[0], self.w[0]];
        c.extend(&out);
        let mut y = vec![self.x[0], self.w[0]];
        y.extend(out.iter().map(|o| o - 2 * self.crop));
        let mut config = vec!["(0, 0, 0)".to_string(); 2];
        config.extend((0..sp).map(|_| format!("(-{0}, -{0}, 0)", self.crop)));
        format!(
            "def backward(x, w):\n  # x: \"cpu f32[{}]\"\n  # w: \"cpu f32[{}]\"\n  \
             c = torch.convolution(x, w, None, ({},), ({},), ({},), False, (0,), {})  # c: \"cpu f32[{}]\"\n  \
             y = torch_pad_prim_impl(c, 0.0, [{}])  # y: \"cpu f32[{}]\"\n  return y\n",
            dims(&self.x),
            dims(&self.w),
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            dims(&c),
            config.join(", "),
            dims(&y),
        )
    }
}

#[test]
fn a_folded_convolution_gives_the_cropped_bits() {
    let case = |x: &[usize], w: &[usize], stride, padding, dilation, groups, crop| Case {
        x: x.to_vec(),
        w: w.to_vec(),
        stride,
        padding,
        dilation,
        groups,
        crop,
    };
    let cases = [
        // Thunder's input gradient of a 3x3, padding 1 convolution
        case(&[2, 8, 6, 6], &[5, 8, 3, 3], 1, 2, 1, 1, 1),
        // a late layer: 2x2 images, many channels (several samples per product)
        case(&[4, 64, 2, 2], &[32, 64, 3, 3], 1, 2, 1, 1, 1),
        case(&[3, 4, 9], &[6, 4, 3], 2, 2, 1, 1, 1),
        case(&[2, 4, 7, 7], &[4, 2, 3, 3], 1, 4, 2, 2, 2),
        case(&[1, 2, 5, 5, 5], &[3, 2, 3, 3, 3], 1, 2, 1, 1, 1),
        case(&[2, 3, 16, 16], &[8, 3, 7, 7], 1, 6, 1, 1, 3),
    ];
    for (seed, c) in cases.into_iter().enumerate() {
        let src = c.trace();
        let cropped = parse_trace(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let mut folded = cropped.clone();
        let reg = tracepass_ir::OpRegistry::builtin();
        assert_eq!(fold_conv_crop(&mut folded, reg).unwrap(), 1, "{src}");
        let seed = 2 * seed as u64;
        let inputs = [random(&c.x, seed + 1), random(&c.w, seed + 2)];
        let (want, got) = (run(&cropped, &inputs), run(&folded, &inputs));
        assert_eq!(want[0].shape(), got[0].shape(), "{src}");
        assert!(want[0].bitwise_eq(&got[0]), "{src}");
    }
}

#[test]
fn training_the_corpus_resnet_with_the_fold_gives_the_unfolded_gradients() {
    let dir = corpus()
        .into_iter()
        .find(|d| d.ends_with("resnet"))
        .expect("the corpus has a resnet export");
    let step = |pipeline: &str| {
        let c = TrainConfig {
            model: ModelSource::Export(dir.clone()),
            world_size: 1,
            steps: 2,
            keep_all_ranks: true,
            pin_ranks: false,
            optimizer: OptimizerKind::Sgd { lr: 0.01 },
            passes: Some(parse_pipeline(pipeline).unwrap()),
            ..TrainConfig::default()
        };
        train(&c, &|_, _| {}).unwrap_or_else(|e| panic!("`{pipeline}`: {e}"))
    };
    let (plain, folded) = (step("dce"), step("fold-conv-crop"));
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&plain.losses), bits(&folded.losses));
    let (a, b) = (&plain.grads_step0[0], &folded.grads_step0[0]);
    assert!(!a.is_empty() && a.len() == b.len());
    for (g, h) in a.iter().zip(b) {
        match (g, h) {
            (Some(g), Some(h)) => assert!(g.bitwise_eq(h)),
            (None, None) => {}
            _ => panic!("a gradient is missing on one side"),
        }
    }
    // and the parameters after two steps
    for (p, q) in plain.params[0].iter().zip(&folded.params[0]) {
        assert!(p.bitwise_eq(q));
    }
}
