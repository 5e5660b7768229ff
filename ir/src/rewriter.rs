//! The rewriter: queue edits to a trace, then apply them at once.
//!
//! In the spirit of rustc's `MirPatch` and Cranelift's cursor: a pass reads the trace, queues
//! insertions ([`Rewriter::insert_before`], [`Rewriter::insert_after`],
//! [`Rewriter::insert_at_start`], [`Rewriter::insert_at_end`]), replacements
//! ([`Rewriter::replace_all_uses`], and by a literal: [`Rewriter::replace_all_uses_with_literal`]),
//! erasures ([`Rewriter::erase`]), ordering constraints and a
//! new return ([`Rewriter::set_return`]), and [`Rewriter::apply`] carries them out in one sweep.
//! Operands, graph edges, value definitions and the schedule stay consistent by construction:
//! a pass never splices the schedule or rebuilds edges by hand. Values are still made on the
//! trace itself ([`Trace::new_value`], [`Trace::push_arg`]): a value is not defined until a
//! node that outputs it is inserted.
//!
//! ```
//! use tracepass_ir::{parse_trace, print_trace, verify, Arg, Node, Rewriter, Type};
//! let mut t = parse_trace(
//!     "def f(x):\n  # x: \"cpu f32[4]\"\n  y = prims.neg(x)  # y: \"cpu f32[4]\"\n  return y\n",
//! )
//! .unwrap();
//! let x = t.find_value("x").unwrap();
//! let y = t.find_value("y").unwrap();
//! let neg = t.producer(y).unwrap();
//! // z = prims.mul(y, 2.0) after the negation, and return it instead of y
//! let z = t.new_value("z", t.ty(x).unwrap().clone());
//! let mut rw = Rewriter::new();
//! rw.insert_after(neg, Node::new("prims.mul", vec![Arg::Value(y), Arg::Float(2.0)], vec![z]));
//! rw.set_return(Arg::Value(z));
//! rw.apply(&mut t).unwrap();
//! verify(&t).unwrap();
//! assert!(print_trace(&t).contains("z = prims.mul(y, 2.0)"));
//! ```

use crate::arg::Arg;
use crate::node::{Edge, Node};
use crate::trace::{Trace, UNSCHEDULED};
use crate::value::{Def, ValueId, ValueIdMap, ValueIdSet};
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;

/// A node queued for insertion, named before it exists (for [`Rewriter::add_order_edge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NewNode(u32);

/// A node of the trace, or one queued for insertion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeRef {
    /// A node already in the trace.
    Old(NodeIndex),
    /// A node the rewriter inserts.
    New(NewNode),
}

impl From<NodeIndex> for NodeRef {
    fn from(i: NodeIndex) -> NodeRef {
        NodeRef::Old(i)
    }
}

impl From<NewNode> for NodeRef {
    fn from(n: NewNode) -> NodeRef {
        NodeRef::New(n)
    }
}

/// Where a queued node goes in the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Start,
    Before(NodeIndex),
    After(NodeIndex),
    End,
}

/// Why queued edits could not be applied. Nothing is changed when `apply` fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    /// An insertion is anchored at a node that is not scheduled in the trace.
    #[error("trace `{trace}`: cannot insert next to node {node}: it is not in the schedule")]
    BadAnchor {
        /// The trace's name.
        trace: String,
        /// The anchor's index.
        node: usize,
    },
    /// A node queued for erasure is not in the trace.
    #[error("trace `{trace}`: cannot erase node {node}: it is not in the trace")]
    BadErase {
        /// The trace's name.
        trace: String,
        /// The node's index.
        node: usize,
    },
    /// An erased node's output would still be read.
    #[error("trace `{trace}`: `{value}` would still be {reader} after its producer is erased")]
    StillUsed {
        /// The trace's name.
        trace: String,
        /// The value's name.
        value: String,
        /// Who reads it (`read by <statement>`, `returned`).
        reader: String,
    },
    /// An inserted node outputs a value that already has a definition.
    #[error("trace `{trace}`: an inserted `{op}` defines `{value}`, which is already defined")]
    Redefined {
        /// The trace's name.
        trace: String,
        /// The inserted node's op.
        op: String,
        /// The value's name.
        value: String,
    },
    /// An inserted node reads or defines a value that is not in the trace's value table.
    #[error(
        "trace `{trace}`: an inserted `{op}` refers to {value}, which is not in the value table"
    )]
    UnknownValue {
        /// The trace's name.
        trace: String,
        /// The inserted node's op.
        op: String,
        /// The value's handle.
        value: ValueId,
    },
    /// A node would read a value it defines itself.
    #[error("trace `{trace}`: `{op}` would read `{value}`, which it defines itself")]
    SelfUse {
        /// The trace's name.
        trace: String,
        /// The node's op.
        op: String,
        /// The value's name.
        value: String,
    },
    /// A value would be replaced by a literal that is not a number (or `None`) of its type.
    #[error("trace `{trace}`: cannot replace `{value}` (\"{ty}\") by the literal {literal}: it must be a literal of the value's type{why}")]
    LiteralType {
        /// The trace's name.
        trace: String,
        /// The value's name.
        value: String,
        /// Its type (`?` when it has none).
        ty: String,
        /// The literal, printed.
        literal: String,
        /// What else is wrong, if anything (`; it is also replaced by a value`).
        why: String,
    },
    /// A new order is not a permutation of the schedule, or comes with other edits.
    #[error("trace `{trace}`: bad reordering: {reason}")]
    BadOrder {
        /// The trace's name.
        trace: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An order edge names a node that is neither in the trace nor queued.
    #[error("trace `{trace}`: an order edge names a node that does not exist")]
    BadOrderEdge {
        /// The trace's name.
        trace: String,
    },
}

/// Edits queued against one trace, applied together by [`Rewriter::apply`].
#[derive(Debug, Default)]
pub struct Rewriter {
    inserts: Vec<(Place, Node)>,
    replacements: ValueIdMap<ValueId>,
    /// Per replaced value, the readers that keep reading it ([`Rewriter::replace_all_uses_except`]).
    kept_readers: ValueIdMap<Vec<NodeRef>>,
    /// Values whose readers read a literal instead ([`Rewriter::replace_all_uses_with_literal`]).
    literals: ValueIdMap<Arg>,
    /// Nodes replaced in place ([`Rewriter::replace`]): their order edges move to the new node.
    replaced: Vec<(NodeIndex, NewNode)>,
    erased: Vec<NodeIndex>,
    order_edges: Vec<(NodeRef, NodeRef)>,
    ret: Option<Arg>,
    order: Option<Vec<NodeIndex>>,
}

/// What [`Rewriter::apply`] did.
#[derive(Debug, Default)]
pub struct Applied {
    /// The index each queued node got, by [`NewNode`] order.
    pub new_nodes: Vec<NodeIndex>,
    /// Whether anything changed.
    pub changed: bool,
}

impl Applied {
    /// The index a queued node got.
    pub fn index(&self, n: NewNode) -> Option<NodeIndex> {
        self.new_nodes.get(n.0 as usize).copied()
    }
}

impl Rewriter {
    /// An empty set of edits.
    pub fn new() -> Rewriter {
        Rewriter::default()
    }
    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.inserts.is_empty()
            && self.replacements.is_empty()
            && self.literals.is_empty()
            && self.erased.is_empty()
            && self.order_edges.is_empty()
            && self.ret.is_none()
            && self.order.is_none()
    }
    /// Makes room for `n` more insertions.
    pub fn reserve(&mut self, n: usize) {
        self.inserts.reserve(n);
    }
    fn push(&mut self, place: Place, node: Node) -> NewNode {
        let id = NewNode(self.inserts.len() as u32);
        self.inserts.push((place, node));
        id
    }
    /// Inserts `node` right before `anchor`. Nodes queued before the same anchor keep their
    /// queue order.
    pub fn insert_before(&mut self, anchor: NodeIndex, node: Node) -> NewNode {
        self.push(Place::Before(anchor), node)
    }
    /// Inserts `node` right after `anchor` (after nodes queued after it earlier).
    pub fn insert_after(&mut self, anchor: NodeIndex, node: Node) -> NewNode {
        self.push(Place::After(anchor), node)
    }
    /// Inserts `node` before every existing node (after nodes queued there earlier).
    pub fn insert_at_start(&mut self, node: Node) -> NewNode {
        self.push(Place::Start, node)
    }
    /// Inserts `node` after every existing node (after nodes queued there earlier).
    pub fn insert_at_end(&mut self, node: Node) -> NewNode {
        self.push(Place::End, node)
    }
    /// Makes every reader of `old` (existing and inserted nodes, and the return) read `new`.
    /// Replacements chain: `a -> b` and `b -> c` make readers of `a` read `c`. To wrap a value
    /// (`v = a * 2.0`, and `a`'s readers read `v`), keep the wrapper reading `a` with
    /// [`Rewriter::replace_all_uses_except`]: a node that would read its own output is refused.
    pub fn replace_all_uses(&mut self, old: ValueId, new: ValueId) {
        if old != new {
            self.replacements.insert(old, new);
        }
    }
    /// As [`Rewriter::replace_all_uses`], but the nodes in `keep` (existing or queued) go on
    /// reading `old`.
    pub fn replace_all_uses_except(
        &mut self,
        old: ValueId,
        new: ValueId,
        keep: impl IntoIterator<Item = NodeRef>,
    ) {
        if old != new {
            self.replacements.insert(old, new);
            self.kept_readers.entry(old).or_default().extend(keep);
        }
    }
    /// Makes every reader of `old` (existing and inserted nodes, and the return) read the
    /// literal `lit` instead: a fold that computed a number puts it where the number was read.
    /// `lit` must be a literal of `old`'s type, checked by [`Rewriter::apply`]: an `Int` for
    /// an `int`, a `Float` for a `float` (bit for bit the known value, if the type states one),
    /// a `Bool` for a `bool`, `None` for `None`; never a tensor. Readers of a value replaced by
    /// `old` ([`Rewriter::replace_all_uses`]) read the literal too; `old` itself must not also
    /// be replaced by a value.
    pub fn replace_all_uses_with_literal(&mut self, old: ValueId, lit: Arg) {
        self.literals.insert(old, lit);
    }
    /// Replaces `node` by `new` in place: `new` takes its place in the schedule and its order
    /// edges, and may define the same values (their names stay, and their readers read them
    /// from `new`), so a fold does not mint names. `new`'s outputs must cover every output of
    /// `node` that stays read, as for [`Rewriter::erase`].
    pub fn replace(&mut self, node: NodeIndex, new: Node) -> NewNode {
        self.erase(node);
        let id = self.insert_before(node, new);
        self.replaced.push((node, id));
        id
    }
    /// Removes a node. Its outputs must be unread once the other edits are applied.
    pub fn erase(&mut self, node: NodeIndex) {
        self.erased.push(node);
    }
    /// Orders `before` ahead of `after` with no data between them (collectives, side effects).
    pub fn add_order_edge(&mut self, before: impl Into<NodeRef>, after: impl Into<NodeRef>) {
        self.order_edges.push((before.into(), after.into()));
    }
    /// Reorders the schedule: `order` must list every scheduled node once, and is the only
    /// edit of its rewriter (insertions and erasures place nodes themselves). The verifier
    /// checks that it is a topological order.
    pub fn set_order(&mut self, order: Vec<NodeIndex>) {
        self.order = Some(order);
    }
    /// Sets the trace's return structure.
    pub fn set_return(&mut self, ret: Arg) {
        self.ret = Some(ret);
    }

    /// What `reader` (`None`: the return) reads in place of `v`: the final replacement,
    /// following chains, stopping at a replacement `reader` is kept out of (and where a cycle
    /// closes).
    fn resolve(&self, mut v: ValueId, reader: Option<NodeRef>) -> ValueId {
        let mut steps = 0;
        while let Some(&n) = self.replacements.get(&v) {
            if let (Some(r), Some(kept)) = (reader, self.kept_readers.get(&v)) {
                if kept.contains(&r) {
                    break;
                }
            }
            v = n;
            steps += 1;
            if steps > self.replacements.len() {
                break;
            }
        }
        v
    }

    /// The literal `reader` reads in place of `v`, if `v` (after its replacements) is replaced
    /// by one.
    fn literal_for(&self, v: ValueId, reader: Option<NodeRef>) -> Option<Arg> {
        if self.literals.is_empty() {
            return None;
        }
        self.literals.get(&self.resolve(v, reader)).cloned()
    }

    /// Refuses a literal that is not one of its value's type, or a value replaced both by a
    /// literal and by a value.
    fn check_literals(&self, t: &Trace) -> Result<(), RewriteError> {
        for (v, lit) in &self.literals {
            let ty = t.ty(*v);
            let why = if self.replacements.contains_key(v) {
                "; it is also replaced by a value"
            } else if t.value(*v).is_none() {
                "; it is not in the value table"
            } else {
                ""
            };
            if why.is_empty() && literal_fits(ty, lit) {
                continue;
            }
            let mut literal = String::new();
            crate::print::write_arg(&mut literal, t, lit);
            return Err(RewriteError::LiteralType {
                trace: t.name.clone(),
                value: t.name(*v),
                ty: ty.map_or("?".to_string(), |ty| ty.to_string()),
                literal,
                why: why.to_string(),
            });
        }
        Ok(())
    }

    /// Applies every queued edit. Checks come first: when it fails, the trace is unchanged.
    pub fn apply(mut self, t: &mut Trace) -> Result<Applied, RewriteError> {
        if self.is_empty() {
            return Ok(Applied::default());
        }
        let trace = || t.name.clone();
        if let Some(order) = self.order.take() {
            let bad = |reason: String| RewriteError::BadOrder {
                trace: trace(),
                reason,
            };
            if !self.is_empty() {
                return Err(bad("a reordering is the only edit of its rewriter".into()));
            }
            if order.len() != t.schedule.len() {
                return Err(bad(format!(
                    "{} nodes for a schedule of {}",
                    order.len(),
                    t.schedule.len()
                )));
            }
            let mut seen = vec![false; t.node_bound()];
            for n in &order {
                match seen.get_mut(n.index()) {
                    Some(s) if !*s && t.graph.node_weight(*n).is_some() => *s = true,
                    _ => return Err(bad(format!("node {} is not scheduled once", n.index()))),
                }
            }
            // same length, all distinct, all in the graph: a permutation of the schedule when the
            // schedule holds every node once (the verifier checks that)
            let changed = order != t.schedule;
            t.schedule = order;
            return Ok(Applied {
                new_nodes: Vec::new(),
                changed,
            });
        }
        let bound = petgraph::visit::NodeIndexable::node_bound(&t.graph);
        let pos = t.schedule_positions();
        let scheduled = |i: NodeIndex| pos.get(i.index()).is_some_and(|p| *p != UNSCHEDULED);
        // --- checks ---
        let mut dead = vec![false; bound];
        for e in &self.erased {
            if t.graph.node_weight(*e).is_none() {
                return Err(RewriteError::BadErase {
                    trace: trace(),
                    node: e.index(),
                });
            }
            dead[e.index()] = true;
        }
        // values an erased node defines and an inserted one defines again (in-place replace)
        let mut redefined = ValueIdSet::default();
        for (place, node) in &self.inserts {
            if let Place::Before(a) | Place::After(a) = place {
                if !scheduled(*a) {
                    return Err(RewriteError::BadAnchor {
                        trace: trace(),
                        node: a.index(),
                    });
                }
            }
            let mut unknown = None;
            node.for_each_operand(&mut |v| {
                if unknown.is_none() && t.value(v).is_none() {
                    unknown = Some(v);
                }
            });
            for o in &node.outputs {
                let redefinition = |op: &str, value: &str| RewriteError::Redefined {
                    trace: trace(),
                    op: op.to_string(),
                    value: value.to_string(),
                };
                match t.value(*o) {
                    None => unknown = unknown.or(Some(*o)),
                    Some(v) => match v.def {
                        Def::Undefined => {}
                        Def::Node(p, _) if dead.get(p.index()).copied().unwrap_or(false) => {}
                        _ => return Err(redefinition(&node.op, v.name)),
                    },
                }
                if t.value(*o).is_some_and(|v| v.def != Def::Undefined) && !redefined.insert(*o) {
                    return Err(redefinition(&node.op, &t.name(*o)));
                }
            }
            if let Some(value) = unknown {
                return Err(RewriteError::UnknownValue {
                    trace: trace(),
                    op: node.op.to_string(),
                    value,
                });
            }
        }
        for (a, b) in &self.order_edges {
            let ok = |r: &NodeRef| match r {
                NodeRef::Old(i) => t.graph.node_weight(*i).is_some() && !dead[i.index()],
                NodeRef::New(n) => (n.0 as usize) < self.inserts.len(),
            };
            if !ok(a) || !ok(b) {
                return Err(RewriteError::BadOrderEdge { trace: trace() });
            }
        }
        // the existing nodes whose operands change: readers of replaced values, and readers
        // of values an inserted node defines again (their edges come from the erased node)
        let mut readers: Vec<NodeIndex> = Vec::new();
        for old in self.replacements.keys().chain(self.literals.keys()) {
            readers.extend(t.users(*old));
        }
        for v in &redefined {
            readers.extend(t.users(*v));
        }
        readers.retain(|r| !dead[r.index()]);
        readers.sort_unstable();
        readers.dedup();
        self.check_literals(t)?;
        self.check_self_use(t, &readers)?;
        if !self.erased.is_empty() {
            self.check_erasable(t, &dead, &redefined)?;
        }
        // order edges of nodes replaced in place, which move to their replacements
        let mut moved_order: Vec<(NodeRef, NodeRef)> = Vec::new();
        for (old, new) in &self.replaced {
            for e in t.graph.edges_directed(*old, Direction::Incoming) {
                if matches!(e.weight(), Edge::Order) && !dead[e.source().index()] {
                    moved_order.push((NodeRef::Old(e.source()), NodeRef::New(*new)));
                }
            }
            for e in t.graph.edges_directed(*old, Direction::Outgoing) {
                if matches!(e.weight(), Edge::Order) && !dead[e.target().index()] {
                    moved_order.push((NodeRef::New(*new), NodeRef::Old(e.target())));
                }
            }
        }
        // --- edits ---
        // 1. erasures (their outputs become undefined, until an inserted node defines them)
        let erased_any = !self.erased.is_empty();
        for e in &self.erased {
            t.detach_node(*e);
        }
        // 2. insertions: every new node first, so that each defines its outputs before any
        // reader is rewired to them
        let inserts = std::mem::take(&mut self.inserts);
        let mut places = Vec::with_capacity(inserts.len());
        let mut new_nodes = Vec::with_capacity(inserts.len());
        let has_replacements = !self.replacements.is_empty();
        let has_literals = !self.literals.is_empty();
        for (k, (place, mut node)) in inserts.into_iter().enumerate() {
            let me = Some(NodeRef::New(NewNode(k as u32)));
            if has_literals {
                node.substitute_operands(&mut |v| self.literal_for(v, me));
            }
            if has_replacements {
                node.map_operands(&mut |v| self.resolve(v, me));
            }
            let n_out = node.outputs.len();
            let idx = t.graph.add_node(node);
            for k in 0..n_out {
                let out = t.graph[idx].outputs[k];
                t.set_def(out, Def::Node(idx, k as u32));
            }
            places.push(place);
            new_nodes.push(idx);
        }
        // 3. existing readers read the replacements, with edges from their (possibly new)
        // producers
        let mut ret = self.ret.take().unwrap_or_else(|| t.ret.clone());
        for r in readers {
            if let Some(n) = t.graph.node_weight_mut(r) {
                let me = Some(NodeRef::Old(r));
                if has_literals {
                    n.substitute_operands(&mut |v| self.literal_for(v, me));
                }
                n.map_operands(&mut |v| self.resolve(v, me));
            }
            t.rewire_node(r);
        }
        if has_literals {
            ret.substitute_values(&mut |v| self.literal_for(v, None));
        }
        if has_replacements {
            ret.map_values(&mut |v| self.resolve(v, None));
        }
        // 4. the new nodes' data edges, then order edges
        let mut producers = Vec::new();
        for &idx in &new_nodes {
            producers.clear();
            t.graph[idx].for_each_operand(&mut |v| producers.push(v));
            for &v in &producers {
                if let Some(p) = t.producer(v) {
                    t.graph.add_edge(p, idx, Edge::Data { value: v });
                }
            }
            t.note_arg_reads(idx);
        }
        for (a, b) in self.order_edges.iter().chain(&moved_order) {
            let at = |r: &NodeRef| match r {
                NodeRef::Old(i) => *i,
                NodeRef::New(n) => new_nodes[n.0 as usize],
            };
            t.graph.add_edge(at(a), at(b), Edge::Order);
        }
        // 5. the schedule: one merge of the old order with the insertions
        if !new_nodes.is_empty() || erased_any {
            // (old position, 0 before / 1 after, queue order) per insertion
            let mut anchored: Vec<(u32, u8, u32)> = Vec::new();
            let mut start = Vec::new();
            let mut end = Vec::new();
            for (k, place) in places.iter().enumerate() {
                match place {
                    Place::Start => start.push(new_nodes[k]),
                    Place::End => end.push(new_nodes[k]),
                    Place::Before(a) => anchored.push((pos[a.index()], 0, k as u32)),
                    Place::After(a) => anchored.push((pos[a.index()], 1, k as u32)),
                }
            }
            anchored.sort_unstable();
            let old = std::mem::take(&mut t.schedule);
            let mut sched = Vec::with_capacity(old.len() + new_nodes.len());
            sched.extend_from_slice(&start);
            let mut next = anchored.into_iter().peekable();
            for (i, n) in old.into_iter().enumerate() {
                let i = i as u32;
                while let Some(&(p, 0, k)) = next.peek() {
                    if p != i {
                        break;
                    }
                    sched.push(new_nodes[k as usize]);
                    next.next();
                }
                if !dead.get(n.index()).copied().unwrap_or(false) {
                    sched.push(n);
                }
                while let Some(&(p, 1, k)) = next.peek() {
                    if p != i {
                        break;
                    }
                    sched.push(new_nodes[k as usize]);
                    next.next();
                }
            }
            sched.extend(end);
            t.schedule = sched;
        }
        t.ret = ret;
        if erased_any {
            t.purge_undefined_values();
        }
        Ok(Applied {
            new_nodes,
            changed: true,
        })
    }

    /// Refuses a node (existing reader or inserted) that would read its own output once the
    /// replacements are made: a cycle the schedule cannot hold.
    fn check_self_use(&self, t: &Trace, readers: &[NodeIndex]) -> Result<(), RewriteError> {
        let self_use = |node: &Node, me: NodeRef| {
            let mut bad = None;
            node.for_each_operand(&mut |v| {
                let r = self.resolve(v, Some(me));
                if bad.is_none() && node.outputs.contains(&r) && !self.literals.contains_key(&r) {
                    bad = Some(r);
                }
            });
            bad.map(|v| RewriteError::SelfUse {
                trace: t.name.clone(),
                op: node.op.to_string(),
                value: t.name(v),
            })
        };
        for (k, (_, node)) in self.inserts.iter().enumerate() {
            if let Some(e) = self_use(node, NodeRef::New(NewNode(k as u32))) {
                return Err(e);
            }
        }
        for r in readers {
            if let Some(e) = t.node(*r).and_then(|n| self_use(n, NodeRef::Old(*r))) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Refuses erasures whose outputs would still be read after the replacements (and are not
    /// defined again by an inserted node).
    fn check_erasable(
        &self,
        t: &Trace,
        dead: &[bool],
        redefined: &ValueIdSet,
    ) -> Result<(), RewriteError> {
        let still = |value: ValueId, reader: String| RewriteError::StillUsed {
            trace: t.name.clone(),
            value: t.name(value),
            reader,
        };
        let is_dead_output = |v: ValueId| match t.value(v).map(|x| x.def) {
            _ if self.literals.contains_key(&v) => false,
            Some(Def::Node(p, _)) => {
                dead.get(p.index()).copied().unwrap_or(false) && !redefined.contains(&v)
            }
            _ => false,
        };
        for e in &self.erased {
            for edge in t.graph.edges_directed(*e, Direction::Outgoing) {
                let Edge::Data { value } = edge.weight() else {
                    continue;
                };
                let target = edge.target();
                if dead[target.index()] {
                    continue;
                }
                if is_dead_output(self.resolve(*value, Some(NodeRef::Old(target)))) {
                    return Err(still(
                        *value,
                        format!("read by `{}`", crate::print::print_node_line(t, target)),
                    ));
                }
            }
        }
        let mut bad = None;
        let ret = self.ret.as_ref().unwrap_or(&t.ret);
        ret.for_each_value(&mut |v| {
            if bad.is_none() && is_dead_output(self.resolve(v, None)) {
                bad = Some(v);
            }
        });
        if let Some(v) = bad {
            return Err(still(v, "returned".into()));
        }
        for (k, (_, node)) in self.inserts.iter().enumerate() {
            let me = Some(NodeRef::New(NewNode(k as u32)));
            let mut bad = None;
            node.for_each_operand(&mut |v| {
                if bad.is_none() && is_dead_output(self.resolve(v, me)) {
                    bad = Some(v);
                }
            });
            if let Some(v) = bad {
                return Err(still(v, format!("read by an inserted `{}`", node.op)));
            }
        }
        Ok(())
    }
}

/// Whether `lit` may stand where a value of type `ty` was read: a number of the same kind
/// (an `int` is not a `float`: Python computes with them differently), equal to the value
/// the type states, if it states one.
pub fn literal_fits(ty: Option<&crate::Type>, lit: &Arg) -> bool {
    use crate::Type;
    match (ty, lit) {
        (Some(Type::Int(k)), Arg::Int(i)) => k.is_none_or(|k| k == *i),
        (Some(Type::Float(k)), Arg::Float(f)) => k.is_none_or(|k| k.to_bits() == f.to_bits()),
        (Some(Type::Bool(k)), Arg::Bool(b)) => k.is_none_or(|k| k == *b),
        (Some(Type::None), Arg::None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_trace, print_trace, verify, Arg, Node};

    const SRC: &str = "def f(x):\n  # x: \"cpu f32[4]\"\n  a = prims.neg(x)  # a: \"cpu f32[4]\"\n  b = prims.neg(x)  # b: \"cpu f32[4]\"\n  c = prims.add(a, b)  # c: \"cpu f32[4]\"\n  return c\n";

    fn body(t: &Trace) -> Vec<String> {
        print_trace(t)
            .lines()
            .filter(|l| l.contains(" = ") || l.contains("return"))
            .map(|l| l.split("  #").next().unwrap_or(l).trim().to_string())
            .collect()
    }

    #[test]
    fn inserts_replaces_and_erases_in_one_apply() {
        let mut t = parse_trace(SRC).unwrap();
        let [x, a, b, c] = ["x", "a", "b", "c"].map(|n| t.find_value(n).unwrap());
        let (pa, pb, pc) = (
            t.producer(a).unwrap(),
            t.producer(b).unwrap(),
            t.producer(c).unwrap(),
        );
        let ty = t.ty(x).unwrap().clone();
        let d = t.new_value("d", ty.clone());
        let e = t.new_value("e", ty.clone());
        let s = t.new_value("s", ty);
        let mut rw = Rewriter::new();
        // b is a duplicate of a: its readers read a, and it goes
        rw.replace_all_uses(b, a);
        rw.erase(pb);
        rw.insert_before(pa, Node::new("prims.abs", vec![Arg::Value(x)], vec![d]));
        rw.insert_after(
            pc,
            Node::new("prims.mul", vec![Arg::Value(c), Arg::Value(d)], vec![e]),
        );
        rw.insert_at_start(Node::new("prims.neg", vec![Arg::Value(x)], vec![s]));
        rw.set_return(Arg::Value(e));
        let applied = rw.apply(&mut t).unwrap();
        assert_eq!(applied.new_nodes.len(), 3);
        verify(&t).unwrap();
        assert_eq!(
            body(&t),
            [
                "s = prims.neg(x)",
                "d = prims.abs(x)",
                "a = prims.neg(x)",
                "c = prims.add(a, a)",
                "e = prims.mul(c, d)",
                "return e"
            ]
        );
        assert!(t.value(b).is_none(), "the erased node's output is purged");
        assert_eq!(t.users(d), vec![applied.new_nodes[1]]);
    }

    #[test]
    fn refuses_to_erase_a_node_whose_output_is_still_read_and_changes_nothing() {
        let mut t = parse_trace(SRC).unwrap();
        let before = t.clone();
        let b = t.find_value("b").unwrap();
        let mut rw = Rewriter::new();
        rw.erase(t.producer(b).unwrap());
        let e = rw.apply(&mut t).unwrap_err();
        assert!(
            matches!(&e, RewriteError::StillUsed { value, reader, .. } if value == "b" && reader.contains("prims.add")),
            "{e}"
        );
        assert!(t == before);
        // returned values too
        let c = t.find_value("c").unwrap();
        let mut rw = Rewriter::new();
        rw.erase(t.producer(c).unwrap());
        assert!(matches!(
            rw.apply(&mut t),
            Err(RewriteError::StillUsed { reader, .. }) if reader == "returned"
        ));
    }

    #[test]
    fn refuses_redefinitions_and_unknown_anchors() {
        let mut t = parse_trace(SRC).unwrap();
        let [x, a] = ["x", "a"].map(|n| t.find_value(n).unwrap());
        let mut rw = Rewriter::new();
        rw.insert_at_end(Node::new("prims.neg", vec![Arg::Value(x)], vec![a]));
        assert!(matches!(
            rw.apply(&mut t),
            Err(RewriteError::Redefined { .. })
        ));
        let pa = t.producer(a).unwrap();
        let mut u = t.clone();
        u.retain_nodes(|_, i| i != pa);
        let y = u.new_value("y", u.ty(x).unwrap().clone());
        let mut rw = Rewriter::new();
        rw.insert_after(pa, Node::new("prims.neg", vec![Arg::Value(x)], vec![y]));
        assert!(matches!(
            rw.apply(&mut u),
            Err(RewriteError::BadAnchor { .. })
        ));
    }

    #[test]
    fn order_edges_between_new_nodes_and_chained_replacements() {
        let mut t = parse_trace(SRC).unwrap();
        let [x, a, b, c] = ["x", "a", "b", "c"].map(|n| t.find_value(n).unwrap());
        let ty = t.ty(x).unwrap().clone();
        let (p, q) = (t.new_value("p", ty.clone()), t.new_value("q", ty));
        let mut rw = Rewriter::new();
        let n1 = rw.insert_at_end(Node::new("prims.neg", vec![Arg::Value(c)], vec![p]));
        let n2 = rw.insert_at_end(Node::new("prims.neg", vec![Arg::Value(c)], vec![q]));
        rw.add_order_edge(n1, n2);
        // a -> b -> x: readers of a read x
        rw.replace_all_uses(a, b);
        rw.replace_all_uses(b, x);
        let applied = rw.apply(&mut t).unwrap();
        verify(&t).unwrap();
        let (i1, i2) = (applied.index(n1).unwrap(), applied.index(n2).unwrap());
        assert!(t.successors(i1).any(|(s, e)| s == i2 && e == Edge::Order));
        assert!(body(&t).contains(&"c = prims.add(x, x)".to_string()));
    }

    /// Issue #27, bug 1: readers rewired to a value an inserted node defines get their edge
    /// from it (they were rewired before the node existed, and kept no edge).
    #[test]
    fn readers_rewired_to_an_inserted_value_get_its_edge() {
        let mut t = parse_trace(SRC).unwrap();
        let [x, b, c] = ["x", "b", "c"].map(|n| t.find_value(n).unwrap());
        let (pb, pc) = (t.producer(b).unwrap(), t.producer(c).unwrap());
        let v = t.new_value("v", t.ty(x).unwrap().clone());
        let mut rw = Rewriter::new();
        rw.insert_before(
            pb,
            Node::new("prims.mul", vec![Arg::Value(x), Arg::Float(2.0)], vec![v]),
        );
        rw.replace_all_uses(b, v);
        rw.erase(pb);
        rw.apply(&mut t).unwrap();
        verify(&t).unwrap();
        let pv = t.producer(v).unwrap();
        assert_eq!(t.users(v), vec![pc]);
        assert!(t
            .successors(pv)
            .any(|(s, e)| s == pc && e == Edge::Data { value: v }));
        assert!(body(&t).contains(&"c = prims.add(a, v)".to_string()));
    }

    /// Issue #27, bug 2: wrapping a value refuses the cycle unless the wrapper is kept out.
    #[test]
    fn wrapping_a_value_refuses_a_self_use_and_keeps_the_wrapper_out() {
        let mut t = parse_trace(SRC).unwrap();
        let [x, a] = ["x", "a"].map(|n| t.find_value(n).unwrap());
        let pa = t.producer(a).unwrap();
        let v = t.new_value("v", t.ty(x).unwrap().clone());
        let wrap = Node::new("prims.mul", vec![Arg::Value(a), Arg::Float(2.0)], vec![v]);
        let before = t.clone();
        let mut rw = Rewriter::new();
        rw.insert_after(pa, wrap.clone());
        rw.replace_all_uses(a, v);
        let e = rw.apply(&mut t).unwrap_err();
        assert!(
            matches!(&e, RewriteError::SelfUse { value, .. } if value == "v"),
            "{e}"
        );
        assert!(t == before, "a refused rewrite changes nothing");
        let mut rw = Rewriter::new();
        let n = rw.insert_after(pa, wrap);
        rw.replace_all_uses_except(a, v, [NodeRef::New(n)]);
        rw.apply(&mut t).unwrap();
        verify(&t).unwrap();
        let b = body(&t);
        assert!(b.contains(&"v = prims.mul(a, 2.0)".to_string()), "{b:?}");
        assert!(b.contains(&"c = prims.add(v, b)".to_string()), "{b:?}");
    }

    /// Issue #27, bug 3: a node replaced in place keeps its result's name, its readers and
    /// its order edges.
    #[test]
    fn replace_in_place_keeps_the_name_readers_and_order_edges() {
        let mut t = parse_trace(SRC).unwrap();
        let [x, a, b, c] = ["x", "a", "b", "c"].map(|n| t.find_value(n).unwrap());
        let (pa, pb, pc) = (
            t.producer(a).unwrap(),
            t.producer(b).unwrap(),
            t.producer(c).unwrap(),
        );
        t.add_order_edge(pa, pb);
        let mut rw = Rewriter::new();
        let n = rw.replace(pa, Node::new("prims.abs", vec![Arg::Value(x)], vec![a]));
        let applied = rw.apply(&mut t).unwrap();
        verify(&t).unwrap();
        let new = applied.index(n).unwrap();
        assert_eq!(t.producer(a), Some(new));
        assert_eq!(t.users(a), vec![pc]);
        assert!(t.successors(new).any(|(s, e)| s == pb && e == Edge::Order));
        assert_eq!(
            body(&t),
            [
                "a = prims.abs(x)",
                "b = prims.neg(x)",
                "c = prims.add(a, b)",
                "return c"
            ]
        );
        // defining a value whose producer stays is still a redefinition
        let mut rw = Rewriter::new();
        rw.insert_at_end(Node::new("prims.neg", vec![Arg::Value(x)], vec![b]));
        assert!(matches!(
            rw.apply(&mut t),
            Err(RewriteError::Redefined { .. })
        ));
    }

    /// Issue #27, bug 10: an argument's readers come from its use list, kept through edits.
    #[test]
    fn argument_use_lists_follow_edits() {
        let mut t = parse_trace(SRC).unwrap();
        let [x, a, b] = ["x", "a", "b"].map(|n| t.find_value(n).unwrap());
        let (pa, pb) = (t.producer(a).unwrap(), t.producer(b).unwrap());
        assert_eq!(t.users(x), vec![pa, pb]);
        let y = t.new_value("y", t.ty(x).unwrap().clone());
        let mut rw = Rewriter::new();
        // b = neg(x) becomes b = neg(a): x loses a reader; y = abs(x) gains one
        let nb = rw.replace(pb, Node::new("prims.neg", vec![Arg::Value(a)], vec![b]));
        let ny = rw.insert_at_end(Node::new("prims.abs", vec![Arg::Value(x)], vec![y]));
        let applied = rw.apply(&mut t).unwrap();
        let (nb, ny) = (applied.index(nb).unwrap(), applied.index(ny).unwrap());
        assert_eq!(t.users(x), vec![pa, ny]);
        let mut ua = t.users(a);
        ua.sort_unstable();
        let mut expected = vec![t.producer(c_of(&t)).unwrap(), nb];
        expected.sort_unstable();
        assert_eq!(ua, expected);
        // a copy keeps the lists
        assert_eq!(t.clone().users(x), vec![pa, ny]);
        // and a decoded trace builds them
        let bytes = crate::codec::encode(&crate::Module::Trace(t.clone())).unwrap();
        let crate::Module::Trace(d) = crate::codec::decode(&bytes).unwrap() else {
            panic!("a trace was written")
        };
        let dx = d.find_value("x").unwrap();
        assert_eq!(d.users(dx).len(), 2);
    }

    /// Issue #27: a fold that computed a number puts the literal where the number was read,
    /// in nodes, inserted nodes and the return; a literal of another type is refused.
    #[test]
    fn a_value_replaced_by_a_literal_is_read_as_that_literal() {
        const SCALARS: &str = "def f(x):\n  # x: \"cpu f32[4]\"\n  s = prims.mul(2.0, 3.0)  # s: \"float 6.0\"\n  a = prims.mul(x, s)  # a: \"cpu f32[4]\"\n  return (a, s)\n";
        let mut t = parse_trace(SCALARS).unwrap();
        let [x, s, a] = ["x", "s", "a"].map(|n| t.find_value(n).unwrap());
        let (ps, pa) = (t.producer(s).unwrap(), t.producer(a).unwrap());
        let before = t.clone();
        // the wrong kind of number, another number than the type states, a tensor
        for (v, lit) in [(s, Arg::Int(6)), (s, Arg::Float(6.5)), (x, Arg::Float(1.0))] {
            let mut rw = Rewriter::new();
            rw.replace_all_uses_with_literal(v, lit);
            let e = rw.apply(&mut t).unwrap_err();
            assert!(matches!(e, RewriteError::LiteralType { .. }), "{e}");
            assert!(t == before, "a refused rewrite changes nothing");
        }
        // replaced by a value and by a literal at once
        let mut rw = Rewriter::new();
        rw.replace_all_uses(s, x);
        rw.replace_all_uses_with_literal(s, Arg::Float(6.0));
        let e = rw.apply(&mut t).unwrap_err();
        assert!(e.to_string().contains("also replaced by a value"), "{e}");
        // the literal goes where s was read, and s's producer can go
        let y = t.new_value("y", t.ty(x).unwrap().clone());
        let mut rw = Rewriter::new();
        rw.replace_all_uses_with_literal(s, Arg::Float(6.0));
        rw.erase(ps);
        let ny = rw.insert_after(
            pa,
            Node::new("prims.add", vec![Arg::Value(a), Arg::Value(s)], vec![y]),
        );
        let applied = rw.apply(&mut t).unwrap();
        verify(&t).unwrap();
        assert_eq!(
            body(&t),
            [
                "a = prims.mul(x, 6.0)",
                "y = prims.add(a, 6.0)",
                "return (a, 6.0)"
            ]
        );
        assert!(t.find_value("s").is_none(), "the folded value is purged");
        assert_eq!(t.users(x), vec![pa]);
        let ny = applied.index(ny).unwrap();
        assert!(t.predecessors(ny).all(|(p, _)| p == pa));
    }

    fn c_of(t: &Trace) -> ValueId {
        t.find_value("c").unwrap()
    }
}
