//! sort-waits: every collective as early as its operands allow, every wait immediately before its
//! first consumer, all other nodes in their relative order. Linear in nodes + edges.

use crate::pass::{Changed, PassContext, PassError, TracePass};
use std::collections::VecDeque;
use tracepass_ir::{ops, Effect, RewriteError, Rewriter, Trace, UNSCHEDULED};

/// The `sort-waits` pass (trace-level).
pub struct SortWaits;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Early,
    Late,
    Regular,
}

/// Position in the old schedule. `u32` rather than `usize`: the tables below are read for every
/// node, and half the bytes is half the memory traffic once a trace outgrows the caches.
type Pos = u32;

/// Reorders a trace's schedule; returns whether it changed.
pub fn sort_waits(t: &mut Trace, reg: &tracepass_ir::OpRegistry) -> Result<bool, RewriteError> {
    let old = t.schedule().to_vec();
    // a schedule lists each node once and node indices are `u32` below petgraph's end marker,
    // so every position fits below `UNSCHEDULED`; so does every edge count (edge indices are
    // `u32` too)
    let n = old.len();
    let slot = t.schedule_positions();
    let mut effects = reg.effects();
    // One sweep over the nodes: each node's class and its predecessors by schedule position,
    // in one flat table (no vector per node).
    let mut class: Vec<Class> = Vec::with_capacity(n);
    let mut preds = Adjacency::with_capacity(n, t.edge_count());
    let mut row = Vec::new();
    for idx in &old {
        let node = t.node(*idx).expect("scheduled node exists");
        class.push(if node.op == ops::WAIT {
            Class::Late
        } else if effects.effect(&node.op) == Effect::Collective {
            Class::Early
        } else {
            Class::Regular
        });
        row.clear();
        row.extend(
            t.predecessors(*idx)
                .map(|(source, _)| slot[source.index()])
                .filter(|s| *s != UNSCHEDULED),
        );
        row.sort_unstable();
        row.dedup();
        preds.push_row(&row);
    }
    // an early node waits for its non-wait predecessors; waits are pulled on demand
    let mut pending: Vec<Pos> = vec![0; n];
    let mut edges: Vec<(Pos, Pos)> = Vec::new();
    for i in 0..n {
        if class[i] == Class::Early {
            for &p in preds.row(i) {
                if class[p as usize] != Class::Late {
                    edges.push((p, i as Pos));
                    pending[i] += 1;
                }
            }
        }
    }
    let early_succs = Adjacency::from_pairs(n, edges);
    let released: VecDeque<Pos> = (0..n)
        .filter(|&i| class[i] == Class::Early && pending[i] == 0)
        .map(|i| i as Pos)
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
            st.place(i as Pos);
            st.drain();
        }
    }
    for i in 0..n {
        st.place(i as Pos);
        st.drain();
    }
    let order = st.order;
    let changed = order.iter().enumerate().any(|(k, &i)| k != i as usize);
    if changed {
        let mut rw = Rewriter::new();
        rw.set_order(order.into_iter().map(|i| old[i as usize]).collect());
        rw.apply(t)?;
    }
    Ok(changed)
}

/// Builds the new order: regular nodes in turn, pulling the waits they need just before them,
/// and each collective as soon as its last non-wait predecessor is placed.
struct Placer<'a> {
    preds: &'a Adjacency,
    /// The collectives that wait for each node (most nodes have none).
    early_succs: &'a Adjacency,
    class: &'a [Class],
    placed: Vec<bool>,
    pending: Vec<Pos>,
    order: Vec<Pos>,
    released: VecDeque<Pos>,
    /// Scratch for `place`, kept between calls.
    stack: Vec<(Pos, bool)>,
}

/// Rows of node positions stored back to back: row `i` is `items[ends[i-1]..ends[i]]`.
struct Adjacency {
    items: Vec<Pos>,
    ends: Vec<Pos>,
}

impl Adjacency {
    fn with_capacity(rows: usize, items: usize) -> Adjacency {
        Adjacency {
            items: Vec::with_capacity(items),
            ends: Vec::with_capacity(rows),
        }
    }
    fn push_row(&mut self, row: &[Pos]) {
        self.items.extend_from_slice(row);
        self.ends.push(self.items.len() as Pos);
    }
    /// `rows` rows from (row, item) pairs, by counting sort; items keep their order in a row.
    fn from_pairs(rows: usize, pairs: Vec<(Pos, Pos)>) -> Adjacency {
        let mut ends: Vec<Pos> = vec![0; rows];
        for &(r, _) in &pairs {
            ends[r as usize] += 1;
        }
        let mut acc = 0;
        for e in ends.iter_mut() {
            acc += *e;
            *e = acc;
        }
        // fill back to front so each row's items stay in pair order
        let mut items = vec![0; pairs.len()];
        let mut next = ends.clone();
        for &(r, x) in pairs.iter().rev() {
            next[r as usize] -= 1;
            items[next[r as usize] as usize] = x;
        }
        Adjacency { items, ends }
    }
    fn row(&self, i: usize) -> &[Pos] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.items[start..self.ends[i] as usize]
    }
}

impl Placer<'_> {
    /// Places `i` after any unplaced predecessors (iteratively, no recursion).
    fn place(&mut self, i: Pos) {
        if self.placed[i as usize] {
            return;
        }
        let mut stack = std::mem::take(&mut self.stack);
        stack.push((i, false));
        while let Some((x, expanded)) = stack.pop() {
            let xu = x as usize;
            if self.placed[xu] {
                continue;
            }
            if !expanded {
                stack.push((x, true));
                for &p in self.preds.row(xu).iter().rev() {
                    if !self.placed[p as usize] {
                        stack.push((p, false));
                    }
                }
                continue;
            }
            self.placed[xu] = true;
            self.order.push(x);
            if self.class[xu] != Class::Late {
                for &s in self.early_succs.row(xu) {
                    let su = s as usize;
                    self.pending[su] -= 1;
                    if self.pending[su] == 0 {
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

impl TracePass for SortWaits {
    fn name(&self) -> &str {
        "sort-waits"
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        let changed =
            sort_waits(t, cx.registry).map_err(|e| PassError::rewrite("sort-waits", e))?;
        Ok(changed.into())
    }
}
