//! Shared by the `opt` and `plan` targets: passes such as ddp need parameters, which a lone
//! backward lacks.

use tracepass_ir::{parse_trace, Program, Trace};

/// `t` paired with the seed model's forward when it fits it (when `pair`), else alone.
pub fn program_for(t: Trace, pair: bool) -> Program {
    if pair {
        if let Ok(f) = parse_trace(include_str!("../../../testdata/thunder/mlp/forward.trace")) {
            if let Ok(p) = Program::from_thunder(f, t.clone()) {
                return p;
            }
        }
    }
    Program::lone(t)
}
