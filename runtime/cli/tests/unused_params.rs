//! Parameters the loss never reaches (the `unused` export: the last block's projection branch
//! feeds nothing): `verify` names them, `train` leaves them as they are and the files it writes
//! say they had no gradient, instead of zeros.

mod common;

use common::{model, ok, run};
use tracepass_runtime::tensor::TensorFile;

const UNUSED: &str = "blocks.2.fc.bias,blocks.2.fc.weight,blocks.2.proj.bias,blocks.2.proj.weight";

#[test]
fn verify_names_the_unused_parameters() {
    let (out, _) = ok(&run(&["verify", model("unused").to_str().unwrap()]));
    assert!(
        out.contains(&format!("unused: {}", UNUSED.replace(',', ", "))),
        "{out}"
    );
}

#[test]
fn checkpoints_and_saved_gradients_say_which_had_no_gradient() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.safetensors");
    let grads = dir.path().join("grads.safetensors");
    let model = model("unused");
    ok(&run(&[
        "train",
        "--model",
        model.to_str().unwrap(),
        "--world-size",
        "2",
        "--steps",
        "3",
        "--save",
        ck.to_str().unwrap(),
        "--save-grads",
        grads.to_str().unwrap(),
    ]));
    let g = TensorFile::load(&grads).unwrap();
    assert_eq!(
        g.metadata.get("no_gradient").map(String::as_str),
        Some(UNUSED)
    );
    assert!(g.tensors.keys().all(|k| !UNUSED.split(',').any(|u| u == k)));
    assert!(g.tensors.contains_key("blocks.2.skip.weight"));
    let c = TensorFile::load(&ck).unwrap();
    assert_eq!(
        c.metadata.get("no_gradient").map(String::as_str),
        Some(UNUSED)
    );
    let initial = TensorFile::load(&model.join("params.safetensors")).unwrap();
    for u in UNUSED.split(',') {
        // the value as exported, and no optimizer state for it
        assert!(c.tensors[&format!("param.{u}")].bitwise_eq(&initial.tensors[u]));
        assert!(!c.tensors.contains_key(&format!("exp_avg.{u}")));
    }
    assert!(c.tensors.contains_key("exp_avg.blocks.2.skip.weight"));
    // it resumes, and the unused parameters stay as they are
    let ck2 = dir.path().join("ck2.safetensors");
    ok(&run(&[
        "train",
        "--model",
        model.to_str().unwrap(),
        "--world-size",
        "2",
        "--steps",
        "5",
        "--resume",
        ck.to_str().unwrap(),
        "--save",
        ck2.to_str().unwrap(),
    ]));
    let c2 = TensorFile::load(&ck2).unwrap();
    for u in UNUSED.split(',') {
        assert!(c2.tensors[&format!("param.{u}")].bitwise_eq(&initial.tensors[u]));
    }
}
