//! A `tracepass-opt`-style driver with a pass of its own, `drop-mul-one`, which removes
//! `y = x * 1.0` (`prims.mul(x, 1.0)`, or `torch.mul(1.0, x)` as exports print it, stored as
//! `ltorch.mul`): every reader of `y` reads `x`, but only where `y` has exactly `x`'s type
//! (an integer `x` times `1.0` is a float; a broadcast makes a larger tensor). Registered
//! once, it works in pipeline strings next to the built-in passes.
//!
//! ```sh
//! cargo run -p tracepass-passes --example opt -- testdata/models/mlp 'drop-mul-one,backward(dce)'
//! cargo run -p tracepass-passes --example opt              # a built-in example trace
//! cargo run -p tracepass-passes --example opt -- --help     # every pass and option
//! ```

use tracepass_ir::{fsio, op, parse_trace, print_trace, Arg, OpRegistry, Program, Rewriter};
use tracepass_passes::{
    Changed, PassContext, PassDecl, PassError, PassLevel, PassManager, PassRegistry, TracePass,
};

/// The pass: a trace-level pass, so it can be anchored (`forward(drop-mul-one)`).
struct DropMulOne;

static DROP_MUL_ONE: PassDecl = PassDecl {
    name: "drop-mul-one",
    help: "replaces `x * 1.0` by `x` where the product has x's type",
    level: PassLevel::Trace,
    options: &[],
};

impl TracePass for DropMulOne {
    fn name(&self) -> &str {
        DROP_MUL_ONE.name
    }
    fn run_on_trace(
        &self,
        t: &mut tracepass_ir::Trace,
        cx: &mut PassContext,
    ) -> Result<Changed, PassError> {
        let mut rw = Rewriter::new();
        let mut n = 0;
        for (idx, node) in t.nodes() {
            // `op::MUL`: `prims.mul` and `ltorch.mul` (`torch.mul`, `Tensor.__mul__`)
            let (true, [a, b], [y]) = (op::MUL.matches(node), node.args(), node.outputs()) else {
                continue;
            };
            // the constant on either side: `torch.mul(1.0, t)` is as common as `t * 1.0`
            let x = match (a, b) {
                (Arg::Value(x), one) | (one, Arg::Value(x)) if one.as_f64() == Some(1.0) => *x,
                _ => continue,
            };
            // y must be x itself: same dtype, shape and device (no promotion, no broadcast)
            if t.ty(x).is_none() || t.ty(x) != t.ty(*y) {
                continue;
            }
            rw.replace_all_uses(*y, x);
            rw.erase(idx);
            n += 1;
        }
        rw.apply(t)
            .map_err(|e| PassError::rewrite(self.name(), e))?;
        cx.stat("drop-mul-one.removed", n);
        Ok((n > 0).into())
    }
}

const EXAMPLE: &str = "def f(x):
  # x: \"cpu f32[4]\"
  a = prims.mul(x, 1.0)  # a: \"cpu f32[4]\"
  b = prims.neg(a)  # b: \"cpu f32[4]\"
  c = prims.neg(a)  # c: \"cpu f32[4]\"
  return b
";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut registry = PassRegistry::with_builtins();
    registry.register_trace_pass(&DROP_MUL_ONE, |_| Ok(DropMulOne))?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--help") {
        print!("{}", registry.help());
        return Ok(());
    }
    let (mut program, pipeline) = match args.as_slice() {
        // a trace or program file, or an export directory
        [file, pipeline] => (
            fsio::load(std::path::Path::new(file))?.into_program().0,
            pipeline.clone(),
        ),
        [] => (
            Program::lone(parse_trace(EXAMPLE)?),
            "drop-mul-one,dce".to_string(),
        ),
        _ => return Err("usage: opt [FILE PIPELINE | --help]".into()),
    };
    let report =
        PassManager::parse_with(&registry, &pipeline)?.run(&mut program, OpRegistry::builtin())?;
    for (k, v) in &report.stats {
        eprintln!("{k}: {v}");
    }
    if !program.is_lone() {
        print!("{}", print_trace(&program.forward));
    }
    print!("{}", print_trace(&program.backward));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(src: &str) -> String {
        let mut registry = PassRegistry::with_builtins();
        registry
            .register_trace_pass(&DROP_MUL_ONE, |_| Ok(DropMulOne))
            .unwrap();
        let mut p = Program::lone(parse_trace(src).unwrap());
        PassManager::parse_with(&registry, "drop-mul-one,dce")
            .unwrap()
            .run(&mut p, OpRegistry::builtin())
            .unwrap();
        print_trace(&p.backward)
    }

    /// Issue #27, bug 4: the example kept `x * 1.0` only when its type is x's, and matched
    /// only `prims.mul`; exports print `torch.mul(1.0, t)`.
    #[test]
    fn drops_mul_one_in_every_spelling_and_only_where_the_type_is_kept() {
        let out = run(EXAMPLE);
        assert!(
            !out.contains("mul(") && out.contains("b = prims.neg(x)"),
            "{out}"
        );
        // as exports print it: the constant first, under torch's name
        let torch = "def f(x):\n  # x: \"cpu f32[4]\"\n  a = torch.mul(1.0, x)  # a: \"cpu f32[4]\"\n  b = prims.neg(a)  # b: \"cpu f32[4]\"\n  return b\n";
        let out = run(torch);
        assert!(
            !out.contains("mul(") && out.contains("b = prims.neg(x)"),
            "{out}"
        );
        // an integer times 1.0 is a float: kept
        let int = "def f(x):\n  # x: \"cpu i64[4]\"\n  a = prims.mul(x, 1.0)  # a: \"cpu f32[4]\"\n  return a\n";
        assert!(run(int).contains("a = prims.mul(x, 1.0)"));
    }
}
