//! SSA values: a name and a type, defined once (a trace argument or one node output).

use crate::types::Type;
use petgraph::stable_graph::NodeIndex;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Handle of a value in a trace's value table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Where a value is defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Def {
    /// Not defined yet (just created, or its producer was removed).
    Undefined,
    /// The i-th argument of the trace.
    Arg(usize),
    /// Output `.1` of node `.0`.
    Node(NodeIndex, u32),
}

/// A value: its printed name and its type.
#[derive(Clone, Debug)]
pub struct Value {
    pub name: String,
    pub ty: Type,
    pub(crate) def: Def,
}

impl Value {
    pub fn def(&self) -> Def {
        self.def
    }
}
