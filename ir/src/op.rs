//! Op handles: a pass matches ops by handle, not by string, so a misspelt op is a compile
//! error instead of a pattern that matches nothing.
//!
//! Generated from the op table (`ir/build.rs` reads `src/op_table/`), so every op of the table
//! has handles, and one added to it gets them with the next build:
//! - `op::prims::MUL`, `op::ltorch::MUL`, `op::dist::WAIT`: one handle per **canonical name**,
//!   the name a node stores (`Node::op`). Build nodes with these.
//! - `op::MUL`: the **family** of an op across namespaces (`ltorch.mul` and `prims.mul`).
//!   Match with these: an export prints `torch.mul(1.0, t)` (or `Tensor.__mul__`), which the
//!   parser stores as `ltorch.mul`; a pass that adds a multiplication writes `prims.mul`.
//!
//! Printed spellings (`torch.mul`, `Tensor.mul`, `torch_all_reduce_prim_impl`) are mapped to
//! canonical names when a trace is read ([`crate::OpRegistry::resolve`]), so a handle never
//! needs them; the printer writes a node's original spelling back ([`crate::Node::callee`]).
//!
//! ```
//! use tracepass_ir::{op, parse_trace};
//! let t = parse_trace(
//!     "def f(x):\n  # x: \"cpu f32[4]\"\n  a = torch.mul(1.0, x)  # a: \"cpu f32[4]\"\n  b = prims.mul(a, 2.0)  # b: \"cpu f32[4]\"\n  return b\n",
//! )
//! .unwrap();
//! let muls: Vec<&str> = t.nodes().filter(|(_, n)| op::MUL.matches(n)).map(|(_, n)| n.op.as_str()).collect();
//! assert_eq!(muls, ["ltorch.mul", "prims.mul"]);
//! assert!(op::prims::MUL.matches(t.nodes().nth(1).unwrap().1));
//! assert!(!op::ltorch::MUL.matches(t.nodes().nth(1).unwrap().1));
//! assert_eq!(op::prims::MUL.name(), "prims.mul");
//! ```

use crate::node::Node;

/// A handle on one canonical op, or on an op's family across namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    name: &'static str,
    names: &'static [&'static str],
}

impl Op {
    /// The handle of one canonical name.
    pub const fn exact(name: &'static str) -> Op {
        Op { name, names: &[] }
    }
    /// The handle of a family: `base` (`mul`) and the canonical names that carry it.
    pub const fn family(base: &'static str, names: &'static [&'static str]) -> Op {
        Op { name: base, names }
    }
    /// The canonical name (of a family: its base name, `mul`).
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The canonical names the handle matches (of an exact handle: its name).
    pub fn names(&self) -> &[&'static str] {
        if self.names.is_empty() {
            std::slice::from_ref(&self.name)
        } else {
            self.names
        }
    }
    /// Whether `op` (a canonical name, as [`Node::op`] holds) is one of the handle's.
    pub fn is(&self, op: &str) -> bool {
        self.names().contains(&op)
    }
    /// Whether `node` is a call of this op.
    pub fn matches(&self, node: &Node) -> bool {
        self.is(&node.op)
    }
}

include!(concat!(env!("OUT_DIR"), "/op_handles.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    /// Every op of the table has its handle, and every handle is an op of the table.
    #[test]
    fn handles_cover_the_op_table() {
        let mut table: Vec<&str> = crate::op_table::all().map(|s| s.name).collect();
        table.sort_unstable();
        table.dedup();
        let handles: Vec<&str> = ALL.iter().map(|o| o.name()).collect();
        assert_eq!(handles, table);
        // families gather a name across namespaces
        assert_eq!(MUL.names(), ["ltorch.mul", "prims.mul"]);
        assert_eq!(dist::WAIT.names(), [crate::registry::ops::WAIT]);
    }
}
