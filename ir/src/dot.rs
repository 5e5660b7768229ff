//! Graphviz export: data edges solid (labelled with the value), order edges dashed.

use crate::node::Edge;
use crate::print::print_node_line;
use crate::trace::Trace;
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use std::fmt::Write;

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The trace as a Graphviz digraph (data and order edges).
pub fn to_dot(t: &Trace) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", escape(&t.name));
    out.push_str("  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
    for (i, a) in t.args().iter().enumerate() {
        let _ = writeln!(
            out,
            "  arg{i} [shape=ellipse, label=\"{}\"];",
            escape(&t.name(*a))
        );
    }
    for (pos, idx) in t.schedule().iter().enumerate() {
        let _ = writeln!(
            out,
            "  n{} [label=\"{pos}: {}\"];",
            idx.index(),
            escape(&print_node_line(t, *idx))
        );
    }
    for (i, a) in t.args().iter().enumerate() {
        for u in t.users(*a) {
            let _ = writeln!(out, "  arg{i} -> n{};", u.index());
        }
    }
    for e in t.graph().edge_references() {
        match e.weight() {
            Edge::Data { value } => {
                let _ = writeln!(
                    out,
                    "  n{} -> n{} [label=\"{}\"];",
                    e.source().index(),
                    e.target().index(),
                    escape(&t.name(*value))
                );
            }
            Edge::Order => {
                let _ = writeln!(
                    out,
                    "  n{} -> n{} [style=dashed];",
                    e.source().index(),
                    e.target().index()
                );
            }
        }
    }
    out.push_str("}\n");
    out
}
