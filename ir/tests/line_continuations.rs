//! Python's explicit line continuations (`\` at a line's end) in Thunder's printed traces: a
//! continued op is one op, and a backslash that Thunder copied into a source comment is not a
//! continuation (it would swallow the op on the next line).

use tracepass_ir::*;

/// A trace whose first op's source comment ends in `\`, as Thunder prints an op whose Python
/// line was continued (`return F.kl_div(a, b) + \`).
const SOURCE_COMMENT_WITH_BACKSLASH: &str = r#"import torch

@torch.no_grad()
def computation(x, w):
  # x: "cpu f32[8, 32]"
  # w: "cpu f32[64, 32]"

  # /tmp/model.py:12: 	        return F.linear(x, w) + \
  t0 = ltorch.linear(x, w, None)  # t0: "cpu f32[8, 64]"
  t1 = ltorch.tanh(t0)  # t1: "cpu f32[8, 64]"
  return (t1,)
"#;

fn ops(t: &Trace) -> Vec<String> {
    t.schedule()
        .iter()
        .map(|&n| t.node(n).expect("scheduled").op.as_str().to_string())
        .collect()
}

#[test]
fn a_backslash_in_a_comment_does_not_swallow_the_next_op() {
    let t = parse_trace(SOURCE_COMMENT_WITH_BACKSLASH).unwrap();
    verify(&t).unwrap();
    assert_eq!(ops(&t), ["ltorch.linear", "ltorch.tanh"]);
}

#[test]
fn a_continued_op_is_one_op() {
    let text = SOURCE_COMMENT_WITH_BACKSLASH.replace(
        "t0 = ltorch.linear(x, w, None)",
        "t0 = ltorch.linear(x, \\\n      w, None)",
    );
    let t = parse_trace(&text).unwrap();
    assert_eq!(ops(&t), ["ltorch.linear", "ltorch.tanh"]);
    // an error after the joined line names the physical line it is on
    let bad = text.replace("ltorch.tanh(t0)", "ltorch.frobnicate(t0)");
    let e = parse_trace(&bad).expect_err("unknown op");
    assert_eq!(e.line, 11, "{e}");
}
