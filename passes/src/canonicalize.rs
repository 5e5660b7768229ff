//! `canonicalize`: algebraic identities and dead casts, written as [rewrite
//! patterns](crate::patterns) and applied to a fixed point. Every rule is exact: the result is
//! bit for bit what the trace computed before, for every input (NaN, infinities and signed
//! zeros included), so a trained model's numbers do not move. Each rule:
//!
//! | rule | rewrites | why it is exact |
//! |---|---|---|
//! | `mul-one` | `x * 1`, `1 * x` -> `x` | IEEE multiplication by one is the identity (NaN stays NaN, `-0.0` stays `-0.0`) |
//! | `div-one` | `x / 1` -> `x` (`div`, `true_divide`, no `rounding_mode`) | division by one is the identity; a rounding mode would floor |
//! | `sub-zero` | `x - 0` -> `x` (no `alpha`) | `-0.0 - 0.0` is `-0.0`; not `x - (-0.0)`, which is `+0.0` for `x = -0.0` |
//! | `add-neg-zero` | `x + (-0.0)`, `(-0.0) + x` -> `x` (no `alpha`) | `-0.0` is the additive identity; `x + 0.0` is **not** rewritten: `-0.0 + 0.0` is `+0.0` |
//! | `neg-neg` | `-(-x)` -> `x` | negation flips the sign bit only |
//! | `dead-cast` | `to(x, ...)`, `convert_element_type(x, ...)` of `x`'s own dtype and device -> `x` | no conversion happens; torch returns `x` itself |
//! | `dead-reshape` | `reshape(x, ...)`, `expand(x, ...)` to `x`'s own shape -> `x` | the same elements in the same order |
//! | `mul-const-const` | `(x * c1) * c2` -> `x * c` for a tensor `x` (either operand order) | floats: `c1`, `c2` powers of two of magnitude >= 1 and `c` finite in the dtype, so no multiplication rounds; integers: wrapping products are associative and `c` fits the dtype ([`crate::fold::tensor_scale_product`]) |
//! | `fold-scalar` | `a + b`, `a - b`, `a * b` of two number literals -> the literal | Python's own arithmetic: integers exactly, floats in double, no fold past `i64`, to a non-finite float, or of an integer not exact as a float ([`crate::fold::python_arith`]); the readers of the result read the literal |
//!
//! Every rule requires the result to have exactly `x`'s type (dtype, shape, device): an
//! integer times `1.0` is a float, and a broadcast makes a larger tensor, so neither is `x`.
//! Casts, reshapes and expands are kept where an impure reader (an in-place `copy_`) could
//! tell a copy from its input. Not done, on purpose: float reassociation where it rounds
//! (`x*3.0*5.0` is not `x*15.0` for every `x`), scalings below one (they round where the
//! results are subnormal; not proven exact, so not folded), and `x + 0.0`. Scalar folds repeat to a fixed point: `(2*3)*4` becomes `24`
//! over two sweeps, and `x*s` with `s` folded reads the literal.

use crate::fold::{python_arith, tensor_scale_product, Arith};
use crate::pass::{Changed, PassContext, PassError, TracePass};
use crate::patterns::{apply_patterns_greedily, Bindings, Guard, Operand, Pattern, Rewrite};
use tracepass_ir::{op, Arg, Node, Trace};

const SAME: &[Guard] = &[Guard::NoKwargs, Guard::SameType("x")];
const DEAD: &[Guard] = &[Guard::SameType("x"), Guard::PureReaders("x")];

/// `x * 1` -> `x`.
pub static MUL_ONE: Pattern = Pattern {
    name: "mul-one",
    root: op::MUL,
    operands: &[Operand::Bind("x"), Operand::Number(1.0)],
    commutative: true,
    guards: SAME,
    rewrite: Rewrite::Value("x"),
};
/// `x / 1` -> `x` (`div`).
pub static DIV_ONE: Pattern = Pattern {
    name: "div-one",
    root: op::DIV,
    operands: &[Operand::Bind("x"), Operand::Number(1.0)],
    commutative: false,
    guards: SAME,
    rewrite: Rewrite::Value("x"),
};
/// `x / 1` -> `x` (`true_divide`).
pub static TRUE_DIVIDE_ONE: Pattern = Pattern {
    name: "div-one",
    root: op::TRUE_DIVIDE,
    ..DIV_ONE
};
/// `x - 0` -> `x`.
pub static SUB_ZERO: Pattern = Pattern {
    name: "sub-zero",
    root: op::SUB,
    operands: &[Operand::Bind("x"), Operand::Number(0.0)],
    commutative: false,
    guards: SAME,
    rewrite: Rewrite::Value("x"),
};
/// `x + (-0.0)` -> `x`.
pub static ADD_NEG_ZERO: Pattern = Pattern {
    name: "add-neg-zero",
    root: op::ADD,
    operands: &[Operand::Bind("x"), Operand::Number(-0.0)],
    commutative: true,
    guards: SAME,
    rewrite: Rewrite::Value("x"),
};
/// `-(-x)` -> `x`.
pub static NEG_NEG: Pattern = Pattern {
    name: "neg-neg",
    root: op::NEG,
    operands: &[Operand::Node(op::NEG, &[Operand::Bind("x")])],
    commutative: false,
    guards: &[Guard::SameType("x")],
    rewrite: Rewrite::Value("x"),
};
/// `to(x, ...)` of x's own type -> `x`.
pub static DEAD_TO: Pattern = Pattern {
    name: "dead-cast",
    root: op::TO,
    operands: &[Operand::Bind("x"), Operand::Rest],
    commutative: false,
    guards: DEAD,
    rewrite: Rewrite::Value("x"),
};
/// `convert_element_type(x, dtype)` of x's own dtype -> `x`.
pub static DEAD_CONVERT: Pattern = Pattern {
    name: "dead-cast",
    root: op::CONVERT_ELEMENT_TYPE,
    ..DEAD_TO
};
/// `reshape(x, ...)` to x's own shape -> `x`.
pub static DEAD_RESHAPE: Pattern = Pattern {
    name: "dead-reshape",
    root: op::RESHAPE,
    ..DEAD_TO
};
/// `expand(x, ...)` to x's own shape -> `x`.
pub static DEAD_EXPAND: Pattern = Pattern {
    name: "dead-reshape",
    root: op::EXPAND,
    ..DEAD_TO
};

/// `x * c` in place of `(x * c1) * c2`, where [`tensor_scale_product`] says it is exact.
fn scale_once(t: &Trace, b: &Bindings) -> Option<Node> {
    let x = b.get("x")?;
    let dtype = t.ty(x)?.as_tensor()?.dtype;
    let c = tensor_scale_product(dtype, b.literal("c1")?, b.literal("c2")?)?;
    let root = t.node(b.root)?;
    Some(root.with_operands(vec![Arg::Value(x), c], root.outputs().to_vec()))
}
/// `(x * c1) * c2` -> `x * (c1*c2)`.
pub static MUL_CONST_CONST: Pattern = Pattern {
    name: "mul-const-const",
    root: op::MUL,
    operands: &[
        Operand::Node(op::MUL, &[Operand::Bind("x"), Operand::Literal("c1")]),
        Operand::Literal("c2"),
    ],
    commutative: true,
    guards: SAME,
    rewrite: Rewrite::Node(scale_once),
};
/// `(c1 * x) * c2` -> `x * (c1*c2)`.
pub static CONST_MUL_CONST: Pattern = Pattern {
    operands: &[
        Operand::Node(op::MUL, &[Operand::Literal("c1"), Operand::Bind("x")]),
        Operand::Literal("c2"),
    ],
    ..MUL_CONST_CONST
};

fn fold_literals(b: &Bindings, op: Arith) -> Option<Arg> {
    python_arith(op, b.literal("a")?, b.literal("b")?)
}
const LITERALS: &[Operand] = &[Operand::Literal("a"), Operand::Literal("b")];
/// `a * b` of two number literals -> the literal.
pub static MUL_LITERALS: Pattern = Pattern {
    name: "fold-scalar",
    root: op::MUL,
    operands: LITERALS,
    commutative: false,
    guards: &[Guard::NoKwargs],
    rewrite: Rewrite::Literal(|_, b| fold_literals(b, Arith::Mul)),
};
/// `a + b` of two number literals -> the literal.
pub static ADD_LITERALS: Pattern = Pattern {
    root: op::ADD,
    rewrite: Rewrite::Literal(|_, b| fold_literals(b, Arith::Add)),
    ..MUL_LITERALS
};
/// `a - b` of two number literals -> the literal.
pub static SUB_LITERALS: Pattern = Pattern {
    root: op::SUB,
    rewrite: Rewrite::Literal(|_, b| fold_literals(b, Arith::Sub)),
    ..MUL_LITERALS
};

/// Every rule of `canonicalize`, in the order they are tried.
pub static PATTERNS: &[&Pattern] = &[
    &MUL_ONE,
    &DIV_ONE,
    &TRUE_DIVIDE_ONE,
    &SUB_ZERO,
    &ADD_NEG_ZERO,
    &NEG_NEG,
    &DEAD_TO,
    &DEAD_CONVERT,
    &DEAD_RESHAPE,
    &DEAD_EXPAND,
    &MUL_CONST_CONST,
    &CONST_MUL_CONST,
    &MUL_LITERALS,
    &ADD_LITERALS,
    &SUB_LITERALS,
];

/// The `canonicalize` pass (trace-level): applies [`PATTERNS`] to a fixed point and counts each
/// rule (`canonicalize.mul-one`); nodes left unread go with `dce`.
pub struct Canonicalize;

impl TracePass for Canonicalize {
    fn name(&self) -> &str {
        "canonicalize"
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        let applied = apply_patterns_greedily(t, PATTERNS, cx.registry)
            .map_err(|e| PassError::rewrite("canonicalize", e))?;
        for (rule, n) in &applied.0 {
            cx.stat(format!("canonicalize.{rule}"), *n);
        }
        cx.stat("canonicalize.rewrites", applied.total());
        Ok((applied.total() > 0).into())
    }
}
