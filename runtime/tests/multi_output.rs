//! A forward with two model outputs (`testdata/models/encdec`: an encoder-decoder returning its
//! encoder state and its logits, the loss on the logits): the backward takes a cotangent for
//! each, the trainer feeds zeros to the state's, and step 0 gives eager PyTorch's loss and
//! gradients.

mod common;
use common::json;
use std::path::{Path, PathBuf};
use tracepass_ir::DType;
use tracepass_runtime::exec::RValue;
use tracepass_runtime::tensor::{Tensor, TensorFile};
use tracepass_runtime::train::{train, Cotangent, Model, ModelSource, TrainConfig};

fn encdec() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models/encdec")
}

#[test]
fn the_output_the_loss_does_not_read_gets_a_zero_cotangent() {
    let model = Model::load(&ModelSource::Export(encdec())).expect("encdec loads");
    assert_eq!(json(&encdec().join("export.json"))["output"], 1);
    let [Cotangent::Zeros(state), Cotangent::Loss] = model.cotangents.as_slice() else {
        panic!("cotangents {:?}", model.cotangents)
    };
    assert_eq!(state.shape.as_slice(), &[4, 8, 16]);
    assert_eq!(state.dtype, DType::F32);
    // the loss reads the logits: the model output is output 1 of the forward's dict
    let logits = model.output_type().expect("a tensor output");
    assert_eq!(logits.shape.as_slice(), &[4, 8, 32]);
    let grad = Tensor::from_f32(vec![1], vec![7.0]);
    let seq = model
        .cotangent_values(grad, |t| {
            Tensor::zeros(&t.shape, t.dtype).ok_or_else(|| "zeros".to_string())
        })
        .expect("cotangents");
    let RValue::Seq(items) = seq else {
        panic!("a sequence of cotangents")
    };
    match items.as_slice() {
        [RValue::Tensor(z), RValue::Tensor(g)] => {
            assert_eq!(z.shape(), &[4, 8, 16]);
            assert!(z.to_f64_vec().iter().all(|&x| x == 0.0));
            assert_eq!(g.to_f64_vec(), vec![7.0]);
        }
        other => panic!("cotangents {other:?}"),
    }
}

#[test]
fn an_encoder_decoder_trains_with_eager_pytorchs_step0_loss_and_gradients() {
    let cfg = TrainConfig {
        model: ModelSource::Export(encdec()),
        world_size: 1,
        steps: 1,
        keep_all_ranks: true,
        pin_ranks: false,
        ..TrainConfig::default()
    };
    let r = train(&cfg, &|_, _| {}).expect("encdec trains");
    let want = json(&encdec().join("reference/loss.json"))["losses"][0]
        .as_f64()
        .expect("a loss");
    assert!(
        ((r.losses[0] - want) / want).abs() < 1e-5,
        "loss {} vs PyTorch {want}",
        r.losses[0]
    );
    let reference = TensorFile::load(&encdec().join("reference/grads.safetensors")).expect("grads");
    assert_eq!(reference.tensors.len(), 7, "every parameter has a gradient");
    for (fqn, want) in &reference.tensors {
        let i = r
            .param_names
            .iter()
            .position(|n| n == fqn)
            .unwrap_or_else(|| panic!("no parameter `{fqn}`"));
        let got = r.grads_step0[0][i]
            .as_ref()
            .unwrap_or_else(|| panic!("no gradient for `{fqn}`"))
            .to_f64_vec();
        let want = want.to_f64_vec();
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            err <= 1e-4 * scale,
            "`{fqn}`: off by {err:e} (scale {scale:e})"
        );
    }
}
