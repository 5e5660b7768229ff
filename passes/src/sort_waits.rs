//! sort-waits: every collective as early as its operands allow, every wait immediately before its
//! first consumer, all other nodes in their relative order. Linear in nodes + edges.

use crate::pass::{Changed, Pass, PassContext, PassError};
use petgraph::visit::EdgeRef;
use petgraph::visit::NodeIndexable;
use petgraph::Direction;
use std::collections::VecDeque;
use tracepass_ir::{ops, Effect, Program, Trace};

pub struct SortWaits;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Early,
    Late,
    Regular,
}

/// Reorders a trace's schedule; returns whether it changed.
pub fn sort_waits(t: &mut Trace, reg: &tracepass_ir::OpRegistry) -> bool {
    let old = t.schedule().to_vec();
    let n = old.len();
    let mut slot = vec![usize::MAX; t.graph().node_bound()];
    for (i, x) in old.iter().enumerate() {
        slot[x.index()] = i;
    }
    let mut effects = reg.effects();
    let class: Vec<Class> = old
        .iter()
        .map(|idx| {
            let node = t.node(*idx).expect("scheduled node exists");
            let effect = effects.effect(&node.op);
            if node.op == ops::WAIT {
                Class::Late
            } else if effect == Effect::Collective {
                Class::Early
            } else {
                Class::Regular
            }
        })
        .collect();
    let g = t.graph();
    // predecessors by schedule position, in one flat table (no vector per node)
    let mut preds = Adjacency::with_capacity(n, g.edge_count());
    let mut row = Vec::new();
    for idx in &old {
        row.clear();
        row.extend(
            g.edges_directed(*idx, Direction::Incoming)
                .map(|e| slot[e.source().index()])
                .filter(|s| *s != usize::MAX),
        );
        row.sort_unstable();
        row.dedup();
        preds.items.extend_from_slice(&row);
        preds.ends.push(preds.items.len());
    }
    let mut early_succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    // an early node waits for its non-wait predecessors; waits are pulled on demand
    let mut pending: Vec<usize> = vec![0; n];
    for i in 0..n {
        if class[i] == Class::Early {
            for &p in preds.row(i) {
                if class[p] != Class::Late {
                    early_succs[p].push(i);
                    pending[i] += 1;
                }
            }
        }
    }
    let released: VecDeque<usize> = (0..n)
        .filter(|&i| class[i] == Class::Early && pending[i] == 0)
        .collect();
    let mut st = Placer {
        preds: &preds,
        early_succs: &early_succs,
        class: &class,
        placed: vec![false; n],
        pending,
        order: Vec::with_capacity(n),
        released,
        stack: Vec::new(),
    };
    st.drain();
    for (i, c) in class.iter().enumerate() {
        if *c == Class::Regular {
            st.place(i);
            st.drain();
        }
    }
    for i in 0..n {
        st.place(i);
        st.drain();
    }
    let order = st.order;
    let changed = order.iter().enumerate().any(|(k, &i)| k != i);
    if changed {
        t.set_schedule(order.into_iter().map(|i| old[i]).collect());
    }
    changed
}

/// Builds the new order: regular nodes in turn, pulling the waits they need just before them,
/// and each collective as soon as its last non-wait predecessor is placed.
struct Placer<'a> {
    preds: &'a Adjacency,
    early_succs: &'a [Vec<usize>],
    class: &'a [Class],
    placed: Vec<bool>,
    pending: Vec<usize>,
    order: Vec<usize>,
    released: VecDeque<usize>,
    /// Scratch for `place`, kept between calls.
    stack: Vec<(usize, bool)>,
}

/// Rows of node positions stored back to back: row `i` is `items[ends[i-1]..ends[i]]`.
struct Adjacency {
    items: Vec<usize>,
    ends: Vec<usize>,
}

impl Adjacency {
    fn with_capacity(rows: usize, items: usize) -> Adjacency {
        Adjacency {
            items: Vec::with_capacity(items),
            ends: Vec::with_capacity(rows),
        }
    }
    fn row(&self, i: usize) -> &[usize] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.items[start..self.ends[i]]
    }
}

impl Placer<'_> {
    /// Places `i` after any unplaced predecessors (iteratively, no recursion).
    fn place(&mut self, i: usize) {
        if self.placed[i] {
            return;
        }
        let mut stack = std::mem::take(&mut self.stack);
        stack.push((i, false));
        while let Some((x, expanded)) = stack.pop() {
            if self.placed[x] {
                continue;
            }
            if !expanded {
                stack.push((x, true));
                for &p in self.preds.row(x).iter().rev() {
                    if !self.placed[p] {
                        stack.push((p, false));
                    }
                }
                continue;
            }
            self.placed[x] = true;
            self.order.push(x);
            if self.class[x] != Class::Late {
                for &s in &self.early_succs[x] {
                    self.pending[s] -= 1;
                    if self.pending[s] == 0 {
                        self.released.push_back(s);
                    }
                }
            }
        }
        self.stack = stack;
    }
    /// Places every collective whose operands are ready.
    fn drain(&mut self) {
        while let Some(e) = self.released.pop_front() {
            self.place(e);
        }
    }
}

impl Pass for SortWaits {
    fn name(&self) -> &str {
        "sort-waits"
    }
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        Ok(sort_waits(&mut p.backward, cx.registry).into())
    }
}
