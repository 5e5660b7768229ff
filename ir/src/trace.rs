//! The trace: an SSA program as a petgraph DAG plus the schedule that runs it.

use crate::arg::Arg;
use crate::name_text::{NameSpan, NameText, MAX_NAME_TEXT};
use crate::node::{Edge, Node};
use crate::rebuild::Rebuild;
use crate::type_table::TypeTable;
use crate::types::Type;
use crate::value::ValueIdBuildHasher;
use crate::value::{Def, Name, Value, ValueId, ValueRef};
use indexmap::IndexMap;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use petgraph::Direction;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// Which pass of a training step a trace computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TraceKind {
    /// The forward pass.
    Forward,
    /// The backward pass.
    Backward,
    /// Forward and backward in one trace.
    Joint,
    /// A trace before autodiff (`thunder.last_traces`' first entry), or one of unknown role.
    Computation,
}

/// One `# Constructed by <pass> (took N milliseconds)` record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// The pass (as a pipeline spells it).
    pub pass: String,
    /// How long it took, when recorded.
    pub millis: Option<u64>,
}

/// A straight-line SSA program. Nodes live in a `StableDiGraph` (indices survive removals) with
/// data and order edges; `schedule` is the execution order, always a topological order of the graph.
#[derive(Debug)]
pub struct Trace {
    /// The function's name.
    pub name: String,
    /// Which pass of a training step it computes.
    pub kind: TraceKind,
    pub(crate) args: Vec<ValueId>,
    /// Use lists of the arguments, by argument position: the nodes that read each one. A
    /// node's output has its readers as the graph's data edges out of its producer; an
    /// argument has no producer, so its readers are kept here (see [`Trace::users`]). Entries
    /// are added as nodes are added or rewired and removed with their node; an entry left by
    /// a node that no longer reads the argument is skipped when read.
    pub(crate) arg_users: Vec<Vec<NodeIndex>>,
    pub(crate) graph: StableDiGraph<Node, Edge>,
    pub(crate) schedule: Vec<NodeIndex>,
    pub(crate) values: IndexMap<ValueId, Value, ValueIdBuildHasher>,
    /// The values' names, back to back (a value holds the span of its name).
    pub(crate) names: NameText,
    /// The values' distinct types (a value holds a handle).
    pub(crate) types: TypeTable,
    pub(crate) next_value: u32,
    /// What a [`NameGen`] would find by scanning every value name, kept up to date as values
    /// are added so that a pass does not scan a million names to make a fresh one; `None` once
    /// names may have changed or gone (`value_mut`, purging), and the next `name_gen` scans.
    pub(crate) name_counters: Option<NameCounters>,
    /// The return structure (tuples, lists, dicts, `None`, values).
    pub ret: Arg,
    /// Decorators printed above `def` (without the `@`).
    pub decorators: Vec<String>,
    /// The passes that made it, oldest first (`# Constructed by ...`).
    pub provenance: Vec<Provenance>,
}

/// Room a trace leaves for growth when it is copied or read: a quarter more nodes, edges and
/// values than it holds. Passes add nodes (DDP adds one per gradient and four per bucket); a
/// table filled to capacity would be copied whole, at every size, by the first node a pass adds.
pub(crate) fn growth_room(len: usize) -> usize {
    len / 4 + 16
}

impl Clone for Trace {
    /// A copy with room for growth (a quarter more) in its node, edge, schedule and value tables.
    fn clone(&self) -> Trace {
        // bounds, not counts: a graph with removed nodes or edges keeps their slots
        let (nodes, edges) = (
            petgraph::visit::NodeIndexable::node_bound(&self.graph),
            petgraph::visit::EdgeIndexable::edge_bound(&self.graph),
        );
        let mut graph =
            StableDiGraph::with_capacity(nodes + growth_room(nodes), edges + growth_room(edges));
        graph.clone_from(&self.graph);
        let mut schedule = Vec::with_capacity(self.schedule.len() + growth_room(nodes));
        schedule.extend_from_slice(&self.schedule);
        let room = growth_room(self.values.len());
        let mut values = IndexMap::with_capacity_and_hasher(
            self.values.len() + room,
            ValueIdBuildHasher::default(),
        );
        // copies the entries into the room made above, and the hash index at its old size
        values.clone_from(&self.values);
        values.reserve(room);
        Trace {
            name: self.name.clone(),
            kind: self.kind,
            args: self.args.clone(),
            arg_users: self.arg_users.clone(),
            graph,
            schedule,
            values,
            names: self.names.clone(),
            types: self.types.clone(),
            next_value: self.next_value,
            name_counters: self.name_counters.clone(),
            ret: self.ret.clone(),
            decorators: self.decorators.clone(),
            provenance: self.provenance.clone(),
        }
    }
}

/// In [`Trace::schedule_positions`]: no scheduled node has this index.
pub const UNSCHEDULED: u32 = u32::MAX;
/// In [`Trace::last_uses`]: nothing reads the value.
pub const NOT_READ: u32 = u32::MAX;
/// In [`Trace::last_uses`]: the trace returns the value.
pub const RETURNED: u32 = u32::MAX - 1;

/// Decorators Thunder puts on every trace it prints.
pub fn default_decorators() -> Vec<String> {
    vec!["torch.no_grad()".into(), "no_autocast".into()]
}

impl Trace {
    /// An empty trace.
    pub fn new(name: impl Into<String>, kind: TraceKind) -> Trace {
        Trace {
            name: name.into(),
            kind,
            args: Vec::new(),
            arg_users: Vec::new(),
            graph: StableDiGraph::new(),
            schedule: Vec::new(),
            values: IndexMap::default(),
            names: NameText::default(),
            types: TypeTable::default(),
            next_value: 0,
            name_counters: Some(NameCounters::default()),
            ret: Arg::None,
            decorators: default_decorators(),
            provenance: Vec::new(),
        }
    }

    // ----- values -----

    /// Where `id` sits in the value table. Values are usually stored in id order (ids are
    /// handed out in sequence and decoding keeps the order), so the entry at position `id` is
    /// checked first: a direct array access, no hashing, and no random probe into the hash
    /// index, which is what makes lookups in a million-value trace miss the cache. Falls back
    /// to the hash index when values were removed or reordered.
    #[inline]
    fn position(&self, id: ValueId) -> Option<usize> {
        let i = id.0 as usize;
        match self.values.get_index(i) {
            Some((k, _)) if *k == id => Some(i),
            _ => self.values.get_index_of(&id),
        }
    }
    #[inline]
    fn entry(&self, id: ValueId) -> Option<&Value> {
        self.position(id)
            .and_then(|i| self.values.get_index(i))
            .map(|(_, v)| v)
    }
    #[inline]
    fn entry_mut(&mut self, id: ValueId) -> Option<&mut Value> {
        self.position(id)
            .and_then(|i| self.values.get_index_mut(i))
            .map(|(_, v)| v)
    }

    /// Creates a value that is not yet defined; give it to a node's outputs or `push_arg`.
    ///
    /// # Panics
    /// If the trace's names would pass 4 GiB (files and texts that large are refused when read).
    pub fn new_value(&mut self, name: impl AsRef<str>, ty: Type) -> ValueId {
        let id = ValueId(self.next_value);
        self.next_value += 1;
        let name = self.push_name(name.as_ref());
        let ty = self.types.intern(ty);
        self.values.insert(
            id,
            Value {
                name,
                ty,
                def: Def::Undefined,
            },
        );
        id
    }
    /// Appends a name to the name text (reclaiming unused names first if it is full).
    fn push_name(&mut self, name: &str) -> NameSpan {
        if let Some(c) = &mut self.name_counters {
            c.note(name);
        }
        if self.names.len() + name.len() > MAX_NAME_TEXT {
            self.compact_names();
        }
        self.names
            .push(name)
            .expect("value names of a trace within 4 GiB")
    }
    /// Reclaims the names no value uses once they outweigh the rest.
    fn reclaim_unused_names(&mut self) {
        if self.names.wasteful() {
            self.compact_names();
        }
    }
    /// Rewrites the name text with only the names values use.
    fn compact_names(&mut self) {
        let (names, moved) = self.names.compacted(self.values.values().map(|v| v.name));
        for (v, span) in self.values.values_mut().zip(moved) {
            v.name = span;
        }
        self.names = names;
    }
    /// Appends a trace argument.
    pub fn push_arg(&mut self, name: impl AsRef<str>, ty: Type) -> ValueId {
        let id = self.new_value(name, ty);
        self.push_existing_arg(id);
        id
    }
    pub(crate) fn push_existing_arg(&mut self, id: ValueId) {
        let pos = self.args.len() as u32;
        if let Some(v) = self.entry_mut(id) {
            v.def = Def::Arg(pos);
        }
        self.args.push(id);
        // a value read before it became an argument (rare: arguments come first)
        let readers = if self.graph.node_count() == 0 {
            Vec::new()
        } else {
            self.nodes()
                .filter(|(_, n)| reads(n, id))
                .map(|(i, _)| i)
                .collect()
        };
        self.arg_users.push(readers);
    }
    /// Adds `idx` to the use lists of the arguments it reads.
    pub(crate) fn note_arg_reads(&mut self, idx: NodeIndex) {
        let Some(node) = self.graph.node_weight(idx) else {
            return;
        };
        let mut positions: Vec<u32> = Vec::new();
        node.for_each_operand(&mut |v| {
            if let Some(Value {
                def: Def::Arg(p), ..
            }) = self.entry(v)
            {
                positions.push(*p);
            }
        });
        for p in positions {
            if let Some(list) = self.arg_users.get_mut(p as usize) {
                if list.last() != Some(&idx) {
                    list.push(idx);
                }
            }
        }
    }
    /// Removes `idx` from the use lists of the arguments `node` (its weight) reads.
    fn forget_arg_reads(&mut self, idx: NodeIndex, node: &Node) {
        let mut positions: Vec<u32> = Vec::new();
        node.for_each_operand(&mut |v| {
            if let Some(Value {
                def: Def::Arg(p), ..
            }) = self.entry(v)
            {
                positions.push(*p);
            }
        });
        for p in positions {
            if let Some(list) = self.arg_users.get_mut(p as usize) {
                list.retain(|n| *n != idx);
            }
        }
    }
    /// The trace's arguments, in order.
    pub fn args(&self) -> &[ValueId] {
        &self.args
    }
    /// Replaces the argument list (a pass that changes what a trace takes: `fsdp` trades
    /// parameters for their shards). Each value of `args` must be in the value table and be
    /// an argument already or not yet defined; an argument left out becomes undefined, so
    /// whatever still reads it is the verifier's error, and [`Trace::purge_undefined_values`]
    /// drops it once nothing does.
    pub fn set_args(&mut self, args: Vec<ValueId>) {
        for old in std::mem::take(&mut self.args) {
            if let Some(v) = self.entry_mut(old) {
                v.def = Def::Undefined;
            }
        }
        for id in args {
            self.push_existing_arg(id);
        }
    }
    /// Reads a stored value's name and type out of the trace's tables.
    fn view(&self, v: &Value) -> ValueRef<'_> {
        ValueRef {
            name: self.names.get(v.name),
            ty: self.types.get(v.ty),
            def: v.def,
        }
    }
    /// A value's name, type and definition.
    pub fn value(&self, id: ValueId) -> Option<ValueRef<'_>> {
        self.entry(id).map(|v| self.view(v))
    }
    /// Renames a value.
    pub fn set_name(&mut self, id: ValueId, name: &str) {
        let Some(old) = self.entry(id).map(|v| v.name) else {
            return;
        };
        self.names.forget(old);
        let span = self.push_name(name);
        // looked up again: pushing the name may have compacted the spans
        if let Some(v) = self.entry_mut(id) {
            v.name = span;
        }
        self.reclaim_unused_names();
    }
    /// Sets a value's type (its name stays).
    pub fn set_ty(&mut self, id: ValueId, ty: Type) {
        if let Some(i) = self.position(id) {
            let ty = self.types.intern(ty);
            if let Some((_, v)) = self.values.get_index_mut(i) {
                v.ty = ty;
            }
        }
    }
    /// The name of a value, or `<undefined %N>` for a dangling handle.
    pub fn name(&self, id: ValueId) -> String {
        match self.entry(id) {
            Some(v) => self.names.get(v.name).to_string(),
            None => format!("<undefined {id}>"),
        }
    }
    /// The name of a value.
    pub fn value_name(&self, id: ValueId) -> Option<&str> {
        self.entry(id).map(|v| self.names.get(v.name))
    }
    /// A value's type.
    pub fn ty(&self, id: ValueId) -> Option<&Type> {
        self.entry(id).map(|v| self.types.get(v.ty))
    }
    /// Every value, in table order.
    pub fn values(&self) -> impl Iterator<Item = (ValueId, ValueRef<'_>)> {
        self.values.iter().map(|(k, v)| (*k, self.view(v)))
    }
    /// One more than the largest value handle ever given out: size of a table indexed by `ValueId.0`.
    pub fn value_bound(&self) -> usize {
        self.next_value as usize
    }
    /// The number of values.
    pub fn value_count(&self) -> usize {
        self.values.len()
    }
    /// Looks a value up by its printed name (linear scan; build a map for repeated lookups).
    pub fn find_value(&self, name: &str) -> Option<ValueId> {
        self.values
            .iter()
            .find(|(_, v)| self.names.get(v.name) == name)
            .map(|(k, _)| *k)
    }
    /// The node that defines `id`, if any.
    pub fn producer(&self, id: ValueId) -> Option<NodeIndex> {
        match self.entry(id)?.def {
            Def::Node(n, _) => Some(n),
            _ => None,
        }
    }
    /// Removes values that nothing defines (left over after their producers were removed).
    pub fn purge_undefined_values(&mut self) {
        let names = &mut self.names;
        self.values.retain(|_, v| {
            let keep = v.def != Def::Undefined;
            if !keep {
                names.forget(v.name);
            }
            keep
        });
        self.name_counters = None;
        self.reclaim_unused_names();
    }

    /// Makes room for `nodes` more nodes (and twice as many edges) and `values` more values.
    pub fn reserve(&mut self, nodes: usize, values: usize) {
        self.graph.reserve_nodes(nodes);
        self.graph.reserve_edges(2 * nodes);
        self.schedule.reserve(nodes);
        self.values.reserve(values);
    }

    // ----- nodes -----

    /// Adds a node to the graph (not to the schedule), with data edges from the producers of
    /// its operands, and makes it the definition of its outputs.
    pub fn add_node(&mut self, node: Node) -> NodeIndex {
        let mut producers: Vec<(NodeIndex, ValueId)> = Vec::new();
        node.for_each_operand(&mut |v| {
            if let Some(Value {
                def: Def::Node(p, _),
                ..
            }) = self.entry(v)
            {
                producers.push((*p, v));
            }
        });
        let idx = self.graph.add_node(node);
        let n_out = self.graph[idx].outputs.len();
        for i in 0..n_out {
            let out = self.graph[idx].outputs[i];
            if let Some(v) = self.entry_mut(out) {
                v.def = Def::Node(idx, i as u32);
            }
        }
        for (p, v) in producers {
            self.graph.add_edge(p, idx, Edge::Data { value: v });
        }
        self.note_arg_reads(idx);
        idx
    }
    /// Adds a node and appends it to the schedule.
    pub fn append(&mut self, node: Node) -> NodeIndex {
        let idx = self.add_node(node);
        self.schedule.push(idx);
        idx
    }
    /// Adds an ordering constraint `before -> after`.
    pub fn add_order_edge(&mut self, before: NodeIndex, after: NodeIndex) {
        self.graph.add_edge(before, after, Edge::Order);
    }
    /// A node.
    pub fn node(&self, idx: NodeIndex) -> Option<&Node> {
        self.graph.node_weight(idx)
    }
    /// Mutable access to a node. Changing its operands or outputs needs `rewire_node` after;
    /// outside this crate, edits go through the [`crate::Rewriter`].
    pub(crate) fn node_mut(&mut self, idx: NodeIndex) -> Option<&mut Node> {
        self.graph.node_weight_mut(idx)
    }
    /// Rebuilds the incoming data edges and output definitions of a node after an edit.
    pub(crate) fn rewire_node(&mut self, idx: NodeIndex) {
        let Some(node) = self.graph.node_weight(idx) else {
            return;
        };
        let outputs = node.outputs.clone();
        let operands = node.operands();
        let incoming: Vec<_> = self
            .graph
            .edges_directed(idx, Direction::Incoming)
            .filter(|e| matches!(e.weight(), Edge::Data { .. }))
            .map(|e| e.id())
            .collect();
        for e in incoming {
            self.graph.remove_edge(e);
        }
        for (i, out) in outputs.iter().enumerate() {
            if let Some(v) = self.entry_mut(*out) {
                v.def = Def::Node(idx, i as u32);
            }
        }
        for v in operands {
            if let Some(p) = self.producer(v) {
                self.graph.add_edge(p, idx, Edge::Data { value: v });
            }
        }
        self.note_arg_reads(idx);
    }
    /// Removes a node from the graph and the schedule; its outputs become undefined.
    /// O(schedule) for the schedule update: batch removals with `retain_nodes` instead.
    pub fn remove_node(&mut self, idx: NodeIndex) -> Option<Node> {
        self.schedule.retain(|n| *n != idx);
        self.detach_node(idx)
    }
    /// Removes every scheduled node for which `keep` is false, in one sweep.
    pub fn retain_nodes(&mut self, mut keep: impl FnMut(&Trace, NodeIndex) -> bool) {
        let schedule = std::mem::take(&mut self.schedule);
        let mut kept = Vec::with_capacity(schedule.len());
        for idx in schedule {
            if keep(self, idx) {
                kept.push(idx);
            } else {
                self.detach_node(idx);
            }
        }
        self.schedule = kept;
    }
    /// Sets the definition of a value (no-op for an unknown handle).
    pub(crate) fn set_def(&mut self, id: ValueId, def: Def) {
        if let Some(v) = self.entry_mut(id) {
            v.def = def;
        }
    }
    pub(crate) fn detach_node(&mut self, idx: NodeIndex) -> Option<Node> {
        let node = self.graph.remove_node(idx)?;
        self.forget_arg_reads(idx, &node);
        for out in &node.outputs {
            if let Some(v) = self.entry_mut(*out) {
                if v.def != Def::Undefined {
                    v.def = Def::Undefined;
                }
            }
        }
        Some(node)
    }
    /// The number of nodes.
    pub fn node_count(&self) -> usize {
        self.graph.node_count()
    }
    /// The graph itself, for the crate's own views (petgraph stays an implementation detail).
    pub(crate) fn graph(&self) -> &StableDiGraph<Node, Edge> {
        &self.graph
    }
    /// One more than the largest node index in use: the size of a table indexed by
    /// `NodeIndex::index()`.
    pub fn node_bound(&self) -> usize {
        petgraph::visit::NodeIndexable::node_bound(&self.graph)
    }
    /// The number of edges (data and order).
    pub fn edge_count(&self) -> usize {
        self.graph.edge_count()
    }
    /// Every edge as (source, target, kind), in storage order.
    pub fn edges(&self) -> impl Iterator<Item = (NodeIndex, NodeIndex, Edge)> + '_ {
        self.graph
            .edge_references()
            .map(|e| (e.source(), e.target(), *e.weight()))
    }
    /// The edges into `idx`, as (source, kind): the producers of its operands (one edge per
    /// operand read) and the nodes ordered before it.
    pub fn predecessors(&self, idx: NodeIndex) -> impl Iterator<Item = (NodeIndex, Edge)> + '_ {
        self.graph
            .edges_directed(idx, Direction::Incoming)
            .map(|e| (e.source(), *e.weight()))
    }
    /// The edges out of `idx`, as (target, kind): its readers (one edge per operand read) and
    /// the nodes ordered after it.
    pub fn successors(&self, idx: NodeIndex) -> impl Iterator<Item = (NodeIndex, Edge)> + '_ {
        self.graph
            .edges_directed(idx, Direction::Outgoing)
            .map(|e| (e.target(), *e.weight()))
    }
    /// The execution order.
    pub fn schedule(&self) -> &[NodeIndex] {
        &self.schedule
    }
    /// Replaces the execution order; the verifier checks that it is a topological order.
    pub fn set_schedule(&mut self, schedule: Vec<NodeIndex>) {
        self.schedule = schedule;
    }
    /// Nodes in schedule order.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeIndex, &Node)> {
        self.schedule
            .iter()
            .filter_map(|i| self.graph.node_weight(*i).map(|n| (*i, n)))
    }
    /// Nodes reading `id`, deduplicated: a node output's readers are the data edges out of
    /// its producer, an argument's come from its use list (both in the order they were
    /// added), and only a value nothing defines is looked for in every node.
    pub fn users(&self, id: ValueId) -> Vec<NodeIndex> {
        let def = self.entry(id).map(|v| v.def);
        let Some(Def::Node(p, _)) = def else {
            if let Some(Def::Arg(pos)) = def {
                let mut seen = HashSet::new();
                return self
                    .arg_users
                    .get(pos as usize)
                    .map(|l| l.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .copied()
                    .filter(|n| self.graph.node_weight(*n).is_some_and(|n| reads(n, id)))
                    .filter(|n| seen.insert(*n))
                    .collect();
            }
            return self
                .nodes()
                .filter(|(_, n)| reads(n, id))
                .map(|(i, _)| i)
                .collect();
        };
        let mut seen = HashSet::new();
        self.graph
            .edges_directed(p, Direction::Outgoing)
            .filter(|e| matches!(e.weight(), Edge::Data { value } if *value == id))
            .map(|e| e.target())
            .filter(|t| seen.insert(*t))
            .collect()
    }
    /// Replaces every use of `old` by `new` in nodes and in the return structure.
    pub fn replace_all_uses(&mut self, old: ValueId, new: ValueId) {
        let users = self.users(old);
        for u in users {
            if let Some(n) = self.graph.node_weight_mut(u) {
                n.map_operands(&mut |v| if v == old { new } else { v });
            }
            self.rewire_node(u);
        }
        self.ret.map_values(&mut |v| if v == old { new } else { v });
    }
    /// Values in the return structure, in printed order.
    pub fn returned_values(&self) -> Vec<ValueId> {
        let mut out = Vec::new();
        self.ret.for_each_value(&mut |v| out.push(v));
        out
    }
    /// Each node's position in the schedule, by node index ([`UNSCHEDULED`] for a slot with
    /// no scheduled node): a dense table, as indices are bounded by the graph, and `u32`, as
    /// node indices are.
    pub fn schedule_positions(&self) -> Vec<u32> {
        let mut pos = vec![UNSCHEDULED; petgraph::visit::NodeIndexable::node_bound(&self.graph)];
        for (i, n) in self.schedule.iter().enumerate() {
            if let Some(p) = pos.get_mut(n.index()) {
                *p = i as u32;
            }
        }
        pos
    }
    /// Per value id, the schedule position of its last use: [`RETURNED`] when the trace
    /// returns it, [`NOT_READ`] when nothing reads it. A dense table of `u32` (a schedule
    /// position fits: node indices are `u32`): one sweep, no hashing, 4 bytes a value.
    pub fn last_uses(&self) -> Vec<u32> {
        let mut last = vec![NOT_READ; self.value_bound()];
        for (pos, (_, n)) in self.nodes().enumerate() {
            n.for_each_operand(&mut |v| {
                if let Some(l) = last.get_mut(v.0 as usize) {
                    *l = pos as u32;
                }
            });
        }
        for v in self.returned_values() {
            if let Some(l) = last.get_mut(v.0 as usize) {
                *l = RETURNED;
            }
        }
        last
    }
    /// A hash of everything a pass can change (nodes in schedule order with their operands,
    /// outputs and bindings, the value table's names, types and definitions, arguments,
    /// order edges, return and decorators; not the provenance): equal before and after a pass
    /// when the pass changed nothing. One sweep, no allocation: cheaper than verifying, so a
    /// pass manager can verify what a pass changed rather than what it says it changed.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        self.name.hash(&mut h);
        (self.kind as u8).hash(&mut h);
        self.args.hash(&mut h);
        self.schedule.len().hash(&mut h);
        for (idx, n) in self.nodes() {
            idx.index().hash(&mut h);
            n.op.as_str().hash(&mut h);
            n.callee().hash(&mut h);
            n.args.hash(&mut h);
            n.kwargs().hash(&mut h);
            n.outputs.hash(&mut h);
            (n.lhs as u8).hash(&mut h);
            n.subsymbols().len().hash(&mut h);
        }
        self.graph.edge_count().hash(&mut h);
        for e in self.graph.edge_references() {
            if matches!(e.weight(), Edge::Order) {
                (e.source().index(), e.target().index()).hash(&mut h);
            }
        }
        self.values.len().hash(&mut h);
        for (id, v) in &self.values {
            id.hash(&mut h);
            self.names.get(v.name).hash(&mut h);
            v.ty.0.hash(&mut h);
            match v.def {
                Def::Arg(i) => (0u8, i, 0u32).hash(&mut h),
                Def::Node(n, k) => (1u8, n.index() as u32, k).hash(&mut h),
                Def::Undefined => (2u8, 0u32, 0u32).hash(&mut h),
            }
        }
        self.ret.hash(&mut h);
        self.decorators.hash(&mut h);
        h.finish()
    }
    /// A generator of names not used in this trace.
    pub fn name_gen(&self) -> NameGen {
        NameGen::new(self)
    }
}

/// Whether `node` reads `id`.
fn reads(node: &Node, id: ValueId) -> bool {
    let mut found = false;
    node.for_each_operand(&mut |v| found |= v == id);
    found
}

/// Hands out fresh value names (`t17`, `ft3`) that do not collide with a trace's names: each
/// prefix continues after the largest number any existing name of that form uses.
pub struct NameGen {
    next: HashMap<&'static str, u64>,
}

pub(crate) const NAME_PREFIXES: [&str; 8] = ["t", "ft", "C", "i", "f", "b", "s", "o"];

/// Per prefix of [`NAME_PREFIXES`], one more than the largest number a name of the form
/// `<prefix><digits>` uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NameCounters([u64; NAME_PREFIXES.len()]);

impl NameCounters {
    pub(crate) fn note(&mut self, name: &str) {
        if let Some((k, digits)) = split_numbered(name) {
            if let Ok(n) = digits.parse::<u64>() {
                self.0[k] = self.0[k].max(n.saturating_add(1));
            }
        }
    }
}

/// For a name `<prefix><digits>` with a prefix of [`NAME_PREFIXES`]: the prefix's index and the
/// digits. The prefixes have no digits, so such a name splits at its first digit.
pub(crate) fn split_numbered(name: &str) -> Option<(usize, &str)> {
    let at = name.bytes().position(|c| c.is_ascii_digit())?;
    let (prefix, digits) = name.split_at(at);
    if !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((NAME_PREFIXES.iter().position(|p| *p == prefix)?, digits))
}

impl NameGen {
    /// Names numbered from 0 for every prefix, whatever a trace holds.
    pub(crate) fn from_zero() -> NameGen {
        NameGen {
            next: HashMap::new(),
        }
    }
    /// A generator of names not used in `trace`.
    pub fn new(trace: &Trace) -> NameGen {
        let scanned;
        let counters = match &trace.name_counters {
            Some(c) => c,
            None => {
                let mut c = NameCounters::default();
                for v in trace.values.values() {
                    c.note(trace.names.get(v.name));
                }
                scanned = c;
                &scanned
            }
        };
        let next = NAME_PREFIXES
            .iter()
            .zip(counters.0)
            .filter(|(_, n)| *n > 0)
            .map(|(p, n)| (*p, n))
            .collect();
        NameGen { next }
    }
    /// A fresh name with the given prefix.
    pub fn fresh(&mut self, prefix: &'static str) -> Name {
        use compact_str::ToCompactString;
        let n = self.next.entry(prefix).or_insert(0);
        // built in place (a prefix and the digits fit a name's inline buffer), and the digits
        // without the formatting machinery
        let mut name = Name::from(prefix);
        name.push_str(&n.to_compact_string());
        *n += 1;
        name
    }
    /// A fresh name for a value of type `ty`.
    pub fn fresh_for(&mut self, ty: &Type) -> Name {
        self.fresh(ty.name_prefix())
    }
}

// ----- serialized form: nodes in schedule order; edges except order edges are derived -----

#[derive(Deserialize)]
struct ValueRepr {
    id: ValueId,
    name: Name,
    ty: Type,
}

/// What the binary payload being decoded on this thread is like (serde gives a `Deserialize`
/// impl no way to ask its caller).
#[derive(Clone, Copy)]
struct Decoding {
    /// Upper bound on the elements any one sequence can hold: the payload's bytes (each
    /// element takes at least one). Unbounded outside a decode.
    budget: usize,
    /// Whether traces are stored as rows (format version 1) rather than columns.
    rows: bool,
    /// Whether parameters carry no buffer flag (format versions 1 and 2).
    legacy_params: bool,
    /// Whether parameters carry no shard placement (format versions 1 to 4).
    unsharded_params: bool,
}

thread_local! {
    static DECODING: std::cell::Cell<Decoding> = const {
        std::cell::Cell::new(Decoding {
            budget: usize::MAX,
            rows: false,
            legacy_params: false,
            unsharded_params: false,
        })
    };
}

/// Runs `f` decoding a binary payload of `bytes` bytes, whose traces are rows when `rows`.
pub(crate) fn decoding<R>(bytes: usize, version: u32, f: impl FnOnce() -> R) -> R {
    let old = DECODING.with(|d| {
        d.replace(Decoding {
            budget: bytes,
            rows: version == 1,
            legacy_params: version <= 2,
            unsharded_params: version <= 4,
        })
    });
    let r = f();
    DECODING.with(|d| d.set(old));
    r
}

pub(crate) fn decode_budget() -> usize {
    DECODING.with(|d| d.get().budget)
}

/// Whether the payload being decoded predates the parameters' buffer flag.
pub(crate) fn reading_legacy_params() -> bool {
    DECODING.with(|d| d.get().legacy_params)
}

/// Whether the payload being decoded predates the parameters' shard placement.
pub(crate) fn reading_unsharded_params() -> bool {
    DECODING.with(|d| d.get().unsharded_params)
}

fn reading_rows() -> bool {
    DECODING.with(|d| d.get().rows)
}

/// Deserializes a `Vec` with its whole length reserved up front (serde's default grows large
/// vectors by doubling, copying a 1M-node trace several times), capped so a corrupt length
/// prefix cannot request an absurd allocation.
fn exact_vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a sequence")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            const CAP: usize = 1 << 21;
            let cap = seq.size_hint().unwrap_or(0).min(CAP).min(decode_budget());
            let mut out = Vec::with_capacity(cap);
            while let Some(x) = seq.next_element()? {
                out.push(x);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(V(std::marker::PhantomData))
}

#[derive(Deserialize)]
pub(crate) struct TraceRepr {
    name: String,
    kind: TraceKind,
    args: Vec<ValueId>,
    #[serde(deserialize_with = "exact_vec")]
    values: Vec<ValueRepr>,
    #[serde(deserialize_with = "exact_vec")]
    nodes: Vec<Node>,
    /// Order edges as (from, to) positions in `nodes`.
    order_edges: Vec<(u32, u32)>,
    ret: Arg,
    decorators: Vec<String>,
    provenance: Vec<Provenance>,
}

/// The serialized form written straight from a trace, in the field order of [`TraceRepr`]
/// (which reads it back): encoding copies no node, name or type.
#[derive(Serialize)]
#[serde(rename = "TraceRepr")]
struct TraceReprRef<'a> {
    name: &'a str,
    kind: TraceKind,
    args: &'a [ValueId],
    values: ValuesRef<'a>,
    nodes: Vec<&'a Node>,
    order_edges: Vec<(u32, u32)>,
    ret: &'a Arg,
    decorators: &'a [String],
    provenance: &'a [Provenance],
}

/// The value table as a sequence of [`ValueRepr`]s.
struct ValuesRef<'a>(&'a Trace);

#[derive(Serialize)]
#[serde(rename = "ValueRepr")]
struct ValueReprRef<'a> {
    id: ValueId,
    name: &'a str,
    ty: &'a Type,
}

impl Serialize for ValuesRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.values().map(|(id, v)| ValueReprRef {
            id,
            name: v.name,
            ty: v.ty,
        }))
    }
}

impl Trace {
    /// Order edges as (from, to) schedule positions, the form both serialized forms store.
    pub(crate) fn order_edge_positions(&self) -> Vec<(u32, u32)> {
        let pos = self.schedule_positions();
        let at = |n: NodeIndex| pos.get(n.index()).copied().filter(|p| *p != UNSCHEDULED);
        self.graph
            .edge_references()
            .filter(|e| matches!(e.weight(), Edge::Order))
            .filter_map(|e| Some((at(e.source())?, at(e.target())?)))
            .collect()
    }
}

impl<'a> From<&'a Trace> for TraceReprRef<'a> {
    fn from(t: &'a Trace) -> TraceReprRef<'a> {
        let order_edges = t.order_edge_positions();
        TraceReprRef {
            name: &t.name,
            kind: t.kind,
            args: &t.args,
            values: ValuesRef(t),
            nodes: t.nodes().map(|(_, n)| n).collect(),
            order_edges,
            ret: &t.ret,
            decorators: &t.decorators,
            provenance: &t.provenance,
        }
    }
}

/// A rebuild of a trace stored as rows: the value table first, which [`finish_rows`] adds
/// after the nodes.
fn start_rows(
    name: String,
    kind: TraceKind,
    args: Vec<ValueId>,
    values: &[ValueRepr],
    nodes_hint: usize,
) -> Result<Rebuild, String> {
    let mut r = Rebuild::start(name, kind, values.iter().map(|v| v.id))?;
    r.set_args(args)?;
    r.reserve_nodes(nodes_hint);
    Ok(r)
}

fn finish_rows(
    mut r: Rebuild,
    values: Vec<ValueRepr>,
    order_edges: Vec<(u32, u32)>,
    ret: Arg,
    decorators: Vec<String>,
    provenance: Vec<Provenance>,
) -> Result<Trace, String> {
    for v in values {
        r.push_value(v.id, &v.name, v.ty)?;
    }
    r.finish(order_edges, ret, decorators, provenance)
}

impl TryFrom<TraceRepr> for Trace {
    type Error = String;
    fn try_from(r: TraceRepr) -> Result<Trace, String> {
        let mut b = start_rows(r.name, r.kind, r.args, &r.values, r.nodes.len())?;
        for n in r.nodes {
            b.push(n)?;
        }
        finish_rows(
            b,
            r.values,
            r.order_edges,
            r.ret,
            r.decorators,
            r.provenance,
        )
    }
}

/// Binary formats get columns (the `columns` module), text formats (JSON) rows.
impl Serialize for Trace {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            TraceReprRef::from(self).serialize(s)
        } else {
            crate::columns::serialize(self, s)
        }
    }
}

/// `Vec<T>` read with its length reserved (see [`exact_vec`]).
struct ExactVec<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ExactVec<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        exact_vec(d).map(ExactVec)
    }
}

/// Decodes the node sequence straight into the graph being rebuilt (no intermediate vector
/// of a million nodes).
struct NodesInto<'a>(&'a mut Rebuild);

impl<'de> serde::de::DeserializeSeed<'de> for NodesInto<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        struct V<'a>(&'a mut Rebuild);
        impl<'de> serde::de::Visitor<'de> for V<'_> {
            type Value = ();
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sequence of nodes")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
                while let Some(n) = seq.next_element::<Node>()? {
                    self.0.push(n).map_err(serde::de::Error::custom)?;
                }
                Ok(())
            }
        }
        d.deserialize_seq(V(self.0))
    }
}

const TRACE_FIELDS: &[&str] = &[
    "name",
    "kind",
    "args",
    "values",
    "nodes",
    "order_edges",
    "ret",
    "decorators",
    "provenance",
];

impl<'de> Deserialize<'de> for Trace {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if !d.is_human_readable() && !reading_rows() {
            return crate::columns::deserialize(d);
        }
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Trace;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a trace")
            }
            // binary formats: fields in order, nodes streamed into the graph
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Trace, A::Error> {
                use serde::de::Error;
                let missing = |f: &str| A::Error::custom(format!("trace: missing field `{f}`"));
                let name: String = seq.next_element()?.ok_or_else(|| missing("name"))?;
                let kind: TraceKind = seq.next_element()?.ok_or_else(|| missing("kind"))?;
                let args: Vec<ValueId> = seq.next_element()?.ok_or_else(|| missing("args"))?;
                let values: ExactVec<ValueRepr> =
                    seq.next_element()?.ok_or_else(|| missing("values"))?;
                let hint = values.0.len();
                let mut b =
                    start_rows(name, kind, args, &values.0, hint).map_err(A::Error::custom)?;
                seq.next_element_seed(NodesInto(&mut b))?
                    .ok_or_else(|| missing("nodes"))?;
                let order_edges: Vec<(u32, u32)> =
                    seq.next_element()?.ok_or_else(|| missing("order_edges"))?;
                let ret: Arg = seq.next_element()?.ok_or_else(|| missing("ret"))?;
                let decorators: Vec<String> =
                    seq.next_element()?.ok_or_else(|| missing("decorators"))?;
                let provenance: Vec<Provenance> =
                    seq.next_element()?.ok_or_else(|| missing("provenance"))?;
                finish_rows(b, values.0, order_edges, ret, decorators, provenance)
                    .map_err(A::Error::custom)
            }
            // self-describing formats (JSON): any field order
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Trace, A::Error> {
                use serde::de::Error;
                let (mut name, mut kind, mut args, mut values, mut nodes) =
                    (None, None, None, None, None);
                let (mut order_edges, mut ret, mut decorators, mut provenance) =
                    (None, None, None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "name" => name = Some(map.next_value()?),
                        "kind" => kind = Some(map.next_value()?),
                        "args" => args = Some(map.next_value()?),
                        "values" => values = Some(map.next_value::<Vec<ValueRepr>>()?),
                        "nodes" => nodes = Some(map.next_value::<Vec<Node>>()?),
                        "order_edges" => order_edges = Some(map.next_value()?),
                        "ret" => ret = Some(map.next_value()?),
                        "decorators" => decorators = Some(map.next_value()?),
                        "provenance" => provenance = Some(map.next_value()?),
                        other => return Err(A::Error::unknown_field(other, TRACE_FIELDS)),
                    }
                }
                let repr = TraceRepr {
                    name: name.ok_or_else(|| A::Error::missing_field("name"))?,
                    kind: kind.ok_or_else(|| A::Error::missing_field("kind"))?,
                    args: args.ok_or_else(|| A::Error::missing_field("args"))?,
                    values: values.ok_or_else(|| A::Error::missing_field("values"))?,
                    nodes: nodes.ok_or_else(|| A::Error::missing_field("nodes"))?,
                    order_edges: order_edges
                        .ok_or_else(|| A::Error::missing_field("order_edges"))?,
                    ret: ret.ok_or_else(|| A::Error::missing_field("ret"))?,
                    decorators: decorators.ok_or_else(|| A::Error::missing_field("decorators"))?,
                    provenance: provenance.ok_or_else(|| A::Error::missing_field("provenance"))?,
                };
                Trace::try_from(repr).map_err(A::Error::custom)
            }
        }
        d.deserialize_struct("TraceRepr", TRACE_FIELDS, V)
    }
}

// ----- equality: structural, by names (value handles and graph indices are not compared) -----

impl PartialEq for Trace {
    fn eq(&self, other: &Self) -> bool {
        if self.name != other.name
            || self.kind != other.kind
            || self.decorators != other.decorators
            || self.provenance != other.provenance
            || self.args.len() != other.args.len()
            || self.schedule.len() != other.schedule.len()
        {
            return false;
        }
        let vname = |t: &Trace, v: ValueId| t.value_name(v).map(Name::from);
        let same_value = |a: ValueId, b: ValueId| match (self.value(a), other.value(b)) {
            (Some(x), Some(y)) => x.name == y.name && x.ty == y.ty,
            _ => false,
        };
        if !self
            .args
            .iter()
            .zip(&other.args)
            .all(|(a, b)| same_value(*a, *b))
        {
            return false;
        }
        let norm = |t: &Trace, a: &Arg| {
            let mut a = a.clone();
            let mut names = Vec::new();
            a.for_each_value(&mut |v| names.push(vname(t, v)));
            a.map_values(&mut |_| ValueId(0));
            (a, names)
        };
        for ((_, n), (_, m)) in self.nodes().zip(other.nodes()) {
            if n.op != m.op
                || n.callee() != m.callee()
                || n.lhs != m.lhs
                || n.subsymbols() != m.subsymbols()
                || n.source() != m.source()
                || n.outputs.len() != m.outputs.len()
                || n.args.len() != m.args.len()
                || n.kwargs().len() != m.kwargs().len()
            {
                return false;
            }
            if !n
                .outputs
                .iter()
                .zip(&m.outputs)
                .all(|(a, b)| same_value(*a, *b))
            {
                return false;
            }
            if !n
                .args
                .iter()
                .zip(&m.args)
                .all(|(a, b)| norm(self, a) == norm(other, b))
            {
                return false;
            }
            if !n
                .kwargs()
                .iter()
                .zip(m.kwargs())
                .all(|((k1, a), (k2, b))| k1 == k2 && norm(self, a) == norm(other, b))
            {
                return false;
            }
        }
        norm(self, &self.ret) == norm(other, &other.ret)
            && self.order_pairs() == other.order_pairs()
    }
}

impl Trace {
    /// Order edges as sorted schedule-position pairs (for comparison).
    fn order_pairs(&self) -> Vec<(usize, usize)> {
        let pos: HashMap<NodeIndex, usize> = self
            .schedule
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, i))
            .collect();
        let mut v: Vec<_> = self
            .graph
            .edge_references()
            .filter(|e| matches!(e.weight(), Edge::Order))
            .filter_map(|e| Some((*pos.get(&e.source())?, *pos.get(&e.target())?)))
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod name_gen_tests {
    use super::*;

    fn f32_scalar() -> Type {
        Type::tensor(vec![1], crate::DType::F32, crate::Device::CPU)
    }

    #[test]
    fn fresh_names_continue_after_the_largest_whatever_changed_the_names() {
        let mut t = Trace::new("t", TraceKind::Backward);
        for name in ["t5", "ft2", "x", "t12", "t07b"] {
            t.new_value(name, f32_scalar());
        }
        // kept up to date as values were added
        assert!(t.name_counters.is_some());
        let mut g = t.name_gen();
        assert_eq!(g.fresh("t"), "t13");
        assert_eq!(g.fresh("ft"), "ft3");
        assert_eq!(g.fresh("C"), "C0");
        // a rename is seen too
        let x = t.find_value("x").expect("x exists");
        t.set_name(x, "t99");
        assert_eq!(t.name_gen().fresh("t"), "t100");
        // and purging makes the next generator scan
        t.purge_undefined_values();
        assert!(t.name_counters.is_none());
        assert_eq!(t.name_gen().fresh("t"), "t0");
        // new values after that are seen too
        t.new_value("t150", f32_scalar());
        assert_eq!(t.name_gen().fresh("t"), "t151");
    }
}

#[cfg(test)]
mod growth_tests {
    use super::*;
    use crate::synth::{mlp_program, MlpSpec};
    use petgraph::visit::{EdgeIndexable, NodeIndexable};

    /// Slots left before the node, edge and value tables must grow.
    fn spare(t: &Trace) -> (usize, usize, usize) {
        let (nodes, edges) = t.graph.capacity();
        (
            nodes - NodeIndexable::node_bound(&t.graph),
            edges - EdgeIndexable::edge_bound(&t.graph),
            t.values.capacity() - t.values.len(),
        )
    }

    #[test]
    fn copies_and_decoded_traces_leave_room_for_the_nodes_a_pass_adds() {
        let p = mlp_program(&MlpSpec::deep(8, 16, 2)).expect("synthetic program");
        let t = &p.backward;
        let (n, e, v) = (
            NodeIndexable::node_bound(&t.graph),
            t.graph.edge_count(),
            t.value_count(),
        );
        let copy = t.clone();
        assert!(copy == *t);
        let (sn, se, sv) = spare(&copy);
        assert!(sn >= growth_room(n), "{sn} spare nodes of {n}");
        assert!(se >= growth_room(e), "{se} spare edges of {e}");
        assert!(sv >= growth_room(v), "{sv} spare values of {v}");
        let bytes = crate::codec::encode(&crate::Module::Trace(t.clone())).expect("encodes");
        let crate::Module::Trace(decoded) = crate::codec::decode(&bytes).expect("decodes") else {
            panic!("a trace was written");
        };
        let (sn, _, sv) = spare(&decoded);
        assert!(
            sn >= growth_room(n) && sv >= growth_room(v),
            "{sn} nodes, {sv} values spare"
        );
        // removed nodes keep their slots (and their edges' slots): room is counted past them
        // (the first node, as the graph drops trailing vacant slots)
        let mut holey = t.clone();
        let first = *holey.schedule().first().expect("nodes");
        holey.retain_nodes(|_, idx| idx != first);
        let (sn, se, _) = spare(&holey.clone());
        assert!(
            sn >= growth_room(n) && se >= growth_room(e),
            "{sn} nodes, {se} edges spare"
        );
    }

    #[test]
    fn reserve_grows_a_graph_that_already_has_nodes() {
        let p = mlp_program(&MlpSpec::deep(2, 4, 2)).expect("synthetic program");
        let mut t = p.backward;
        let before = t.graph.capacity().0;
        t.reserve(before * 3, 10);
        let (sn, se, sv) = spare(&t);
        assert!(sn >= before * 3 && se >= before * 6 && sv >= 10);
    }
}
