//! A `tracepass-opt`-style driver with a pass of its own, `drop-mul-one`, which removes
//! `y = prims.mul(x, 1.0)` (every reader of `y` reads `x`). Registered once, it works in
//! pipeline strings next to the built-in passes.
//!
//! ```sh
//! cargo run -p tracepass-passes --example opt -- FILE.trace 'drop-mul-one,backward(dce)'
//! cargo run -p tracepass-passes --example opt              # a built-in example trace
//! cargo run -p tracepass-passes --example opt -- --help     # every pass and option
//! ```

use tracepass_ir::{fsio, parse_trace, print_trace, Arg, Module, OpRegistry, Program, Rewriter};
use tracepass_passes::{
    Changed, PassContext, PassDecl, PassError, PassLevel, PassManager, PassRegistry, TracePass,
};

/// The pass: a trace-level pass, so it can be anchored (`forward(drop-mul-one)`).
struct DropMulOne;

static DROP_MUL_ONE: PassDecl = PassDecl {
    name: "drop-mul-one",
    help: "replaces `prims.mul(x, 1.0)` by `x`",
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
            if let (true, [Arg::Value(x), one], [y]) =
                (node.op == "prims.mul", node.args(), node.outputs())
            {
                if one.as_f64() == Some(1.0) {
                    rw.replace_all_uses(*y, *x);
                    rw.erase(idx);
                    n += 1;
                }
            }
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
        [file, pipeline] => match fsio::load(std::path::Path::new(file))? {
            Module::Trace(t) => (Program::lone(t), pipeline.clone()),
            Module::Program(p) => (p, pipeline.clone()),
        },
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
