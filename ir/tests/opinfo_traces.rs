//! Statements of Thunder's OpInfo traces (`testdata/opinfo/`) the corpus never showed.

use tracepass_ir::{parse_trace, print_trace, verify, Type};

/// topk's backward: the cotangent of the integer indices is bound to `_`, with no type comment.
const TOPK_BACKWARD: &str = r#"import torch
from thunder.executors.torchex import no_autocast

@torch.no_grad()
@no_autocast
def backward_fn(saved_for_backward, cotangents):
  # saved_for_backward: "Collection"
  # cotangents: "Collection"
  C0, C1, = saved_for_backward
  # C0: "Collection"
  # C1: "Collection"
  clear_mutable_collection(saved_for_backward)
  clear_mutable_collection(C1)
  del C1, saved_for_backward
  t7, _, = cotangents
  # t7: "cpu f32[1]"
  clear_mutable_collection(cotangents)
  del cotangents
  t_0, t15, = C0
  # t_0: "cpu f32[]"
  # t15: "cpu i64[1]"
  clear_mutable_collection(C0)
  del C0
  return (t7,)
"#;

#[test]
fn a_discarded_member_without_a_type_comment_parses_as_any() {
    let t = parse_trace(TOPK_BACKWARD).expect("parses");
    verify(&t).expect("verifies");
    let discarded = t
        .nodes()
        .flat_map(|(_, n)| n.outputs().to_vec())
        .find(|&o| t.name(o) == "_")
        .expect("`_` is bound");
    assert_eq!(t.ty(discarded), Some(&Type::Any));
    let again = parse_trace(&print_trace(&t)).expect("the printed trace parses");
    verify(&again).expect("and verifies");
}

#[test]
fn a_named_member_without_a_type_comment_is_still_an_error() {
    let text = TOPK_BACKWARD.replace("t7, _, = cotangents", "t7, t8, = cotangents");
    let e = parse_trace(&text).expect_err("t8 has no type");
    assert!(e.to_string().contains("no type comment for `t8`"), "{e}");
}
