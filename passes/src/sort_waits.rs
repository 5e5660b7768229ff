//! sort-waits: every collective as early as its operands allow, every wait immediately before its
//! first consumer, all other nodes in their relative order. Linear in nodes + edges.

use crate::pass::{Changed, Pass, PassContext, PassError};
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use std::collections::{HashMap, VecDeque};
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
    let slot: HashMap<NodeIndex, usize> = old.iter().enumerate().map(|(i, x)| (*x, i)).collect();
    let class: Vec<Class> = old
        .iter()
        .map(|idx| {
            let node = t.node(*idx).expect("scheduled node exists");
            if node.op == ops::WAIT {
                Class::Late
            } else if reg.effect(&node.op) == Effect::Collective {
                Class::Early
            } else {
                Class::Regular
            }
        })
        .collect();
    let g = t.graph();
    let preds: Vec<Vec<usize>> = old
        .iter()
        .map(|idx| {
            let mut p: Vec<usize> = g
                .edges_directed(*idx, Direction::Incoming)
                .filter_map(|e| slot.get(&e.source()).copied())
                .collect();
            p.sort_unstable();
            p.dedup();
            p
        })
        .collect();
    let mut early_succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    // an early node waits for its non-wait predecessors; waits are pulled on demand
    let mut pending: Vec<usize> = vec![0; n];
    for (i, ps) in preds.iter().enumerate() {
        if class[i] == Class::Early {
            for &p in ps {
                if class[p] != Class::Late {
                    early_succs[p].push(i);
                    pending[i] += 1;
                }
            }
        }
    }
    let mut placed = vec![false; n];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    let mut released: VecDeque<usize> = (0..n)
        .filter(|&i| class[i] == Class::Early && pending[i] == 0)
        .collect();

    // place(i): pull unplaced predecessors (waits, or early nodes whose waits were pending), then i
    fn place(
        i: usize,
        preds: &[Vec<usize>],
        placed: &mut [bool],
        order: &mut Vec<usize>,
        early_succs: &[Vec<usize>],
        pending: &mut [usize],
        released: &mut VecDeque<usize>,
        class: &[Class],
    ) {
        let mut stack = vec![(i, false)];
        while let Some((x, expanded)) = stack.pop() {
            if placed[x] {
                continue;
            }
            if !expanded {
                stack.push((x, true));
                for &p in preds[x].iter().rev() {
                    if !placed[p] {
                        stack.push((p, false));
                    }
                }
                continue;
            }
            placed[x] = true;
            order.push(x);
            if class[x] != Class::Late {
                for &s in &early_succs[x] {
                    pending[s] -= 1;
                    if pending[s] == 0 {
                        released.push_back(s);
                    }
                }
            }
        }
    }
    let drain = |placed: &mut Vec<bool>, order: &mut Vec<usize>, pending: &mut Vec<usize>, released: &mut VecDeque<usize>| {
        while let Some(e) = released.pop_front() {
            place(e, &preds, placed, order, &early_succs, pending, released, &class);
        }
    };
    drain(&mut placed, &mut order, &mut pending, &mut released);
    for i in 0..n {
        if class[i] == Class::Regular && !placed[i] {
            place(i, &preds, &mut placed, &mut order, &early_succs, &mut pending, &mut released, &class);
            drain(&mut placed, &mut order, &mut pending, &mut released);
        }
    }
    for i in 0..n {
        if !placed[i] {
            place(i, &preds, &mut placed, &mut order, &early_succs, &mut pending, &mut released, &class);
            drain(&mut placed, &mut order, &mut pending, &mut released);
        }
    }
    let changed = order.iter().enumerate().any(|(k, &i)| k != i);
    if changed {
        t.set_schedule(order.into_iter().map(|i| old[i]).collect());
    }
    changed
}

impl Pass for SortWaits {
    fn name(&self) -> &str {
        "sort-waits"
    }
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        Ok(sort_waits(&mut p.backward, cx.registry).into())
    }
}
