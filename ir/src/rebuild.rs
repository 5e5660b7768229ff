//! Rebuilding a trace from its serialized parts (both binary forms and JSON), checking every
//! reference as it goes.
//!
//! The parts come in this order: the value ids, the arguments, the nodes one at a time, then
//! each value's name and type. Ids come first so that a node can be checked and linked the
//! moment it is read; names and types come last so that each value is written once, with its
//! definition. Written first, every value would be visited again when the node defining it
//! arrives, by then long evicted from the cache: that second visit cost about 14 ms of a
//! 1M-node decode.

use crate::arg::Arg;
use crate::name_text::{NameSpan, NameText};
use crate::node::{Edge, Node};
use crate::trace::{decode_budget, growth_room, Provenance, Trace, TraceKind};
use crate::type_table::TypeId;
use crate::types::Type;
use crate::value::{Def, Value, ValueId};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};

/// What defines an operand of a node being rebuilt.
#[derive(Clone, Copy)]
enum Source {
    /// The node at this index.
    Node(u32),
    /// The argument at this position.
    Arg(u32),
    /// Nothing (yet).
    None,
}

pub(crate) struct Rebuild {
    t: Trace,
    slots: Slots,
    /// Per slot (position in the value table), where the value is defined so far.
    defs: Vec<Def>,
    /// Scratch: the operands of the node being pushed, with their producers.
    operands: Vec<(ValueId, Source)>,
    /// Per type handle, whether the type is too large to exist: checked once per type, and
    /// an error for the first value that has it.
    oversized: Vec<bool>,
}

/// Value id -> slot.
enum Slots {
    /// The ids are `0..n` in order, each its own slot: every trace this crate writes.
    Identity(u32),
    /// A vector when ids are dense.
    Dense(Vec<u32>),
    /// A hash map when a file claims ids far beyond its number of values, so that a hostile
    /// id cannot make the decoder allocate gigabytes.
    Sparse(rustc_hash::FxHashMap<u32, u32>),
}

impl Slots {
    /// The slots of `ids`, listed in slot order, with how many there are and one more than
    /// the largest id (in one pass when the ids are `0..n`); an id listed twice is an error.
    fn of(ids: impl Iterator<Item = ValueId> + Clone) -> Result<(Slots, usize, u32), String> {
        let mut count = 0usize;
        let mut in_order = true;
        let mut bound = 0usize;
        for (i, id) in ids.clone().enumerate() {
            in_order &= id.0 as usize == i;
            bound = bound.max(id.0 as usize + 1);
            count += 1;
        }
        let next_value = u32::try_from(bound).unwrap_or(u32::MAX);
        if in_order {
            return Ok((Slots::Identity(count as u32), count, next_value));
        }
        let twice = |id: ValueId| format!("value {id} is listed twice");
        let slots = if bound <= 16 * count + 4096 {
            let mut v = vec![u32::MAX; bound];
            for (i, id) in ids.enumerate() {
                if std::mem::replace(&mut v[id.0 as usize], i as u32) != u32::MAX {
                    return Err(twice(id));
                }
            }
            Slots::Dense(v)
        } else {
            let mut m = rustc_hash::FxHashMap::default();
            for (i, id) in ids.enumerate() {
                if m.insert(id.0, i as u32).is_some() {
                    return Err(twice(id));
                }
            }
            Slots::Sparse(m)
        };
        Ok((slots, count, next_value))
    }
    #[inline]
    fn get(&self, id: ValueId) -> Option<u32> {
        match self {
            Slots::Identity(n) => (id.0 < *n).then_some(id.0),
            Slots::Dense(v) => v.get(id.0 as usize).copied().filter(|s| *s != u32::MAX),
            Slots::Sparse(m) => m.get(&id.0).copied(),
        }
    }
}

impl Rebuild {
    /// A rebuild of a trace whose value table lists `ids`, in this order.
    pub(crate) fn start(
        name: String,
        kind: TraceKind,
        ids: impl Iterator<Item = ValueId> + Clone,
    ) -> Result<Rebuild, String> {
        let (slots, count, next_value) = Slots::of(ids)?;
        let mut t = Trace::new(name, kind);
        // names are scanned only if a pass asks for fresh ones (decoding stays lean)
        t.name_counters = None;
        t.next_value = next_value;
        t.values.reserve(count + growth_room(count));
        Ok(Rebuild {
            t,
            slots,
            defs: vec![Def::Undefined; count],
            operands: Vec::with_capacity(8),
            oversized: Vec::new(),
        })
    }

    /// Sets the trace's arguments.
    pub(crate) fn set_args(&mut self, args: Vec<ValueId>) -> Result<(), String> {
        for a in args {
            let Some(s) = self.slots.get(a) else {
                return Err(format!("argument {a} is not in the value table"));
            };
            self.defs[s as usize] = Def::Arg(self.t.args.len() as u32);
            self.t.args.push(a);
            self.t.arg_users.push(Vec::new());
        }
        Ok(())
    }

    /// Makes room for `nodes` nodes a file claims (bounded, so a false claim cannot make the
    /// decoder allocate more than the payload could fill), plus [`growth_room`].
    pub(crate) fn reserve_nodes(&mut self, nodes: usize) {
        let n = nodes.min(1 << 21).min(decode_budget());
        let n = n + growth_room(n);
        self.t.graph = StableDiGraph::with_capacity(n, 2 * n);
        self.t.schedule.reserve(n);
    }

    /// Adds the next node in schedule order, with a data edge from each operand's producer.
    pub(crate) fn push(&mut self, n: Node) -> Result<(), String> {
        // one lookup per operand: whether it exists, and who produces it (`u32::MAX`: none),
        // gathered before the node moves into the graph
        let mut unknown = None;
        let (slots, defs, edges) = (&self.slots, &self.defs, &mut self.operands);
        edges.clear();
        n.for_each_operand(&mut |v| match slots.get(v) {
            None => unknown = Some(v),
            Some(s) => edges.push((
                v,
                match defs[s as usize] {
                    Def::Node(p, _) => Source::Node(p.index() as u32),
                    Def::Arg(a) => Source::Arg(a),
                    _ => Source::None,
                },
            )),
        });
        if let Some(v) = unknown {
            return Err(format!("node `{}` refers to unknown value {v}", n.op));
        }
        // the outputs' definitions, set while the node is at hand: nothing is ever removed
        // from the graph being rebuilt, so the node's index is the node count
        let idx = NodeIndex::new(self.t.graph.node_count());
        for (k, out) in n.outputs.iter().enumerate() {
            let Some(s) = self.slots.get(*out) else {
                return Err(format!("node `{}` refers to unknown value {out}", n.op));
            };
            self.defs[s as usize] = Def::Node(idx, k as u32);
        }
        let added = self.t.graph.add_node(n);
        debug_assert_eq!(added, idx);
        for &(v, p) in &self.operands {
            match p {
                Source::Node(p) => {
                    self.t
                        .graph
                        .add_edge(NodeIndex::new(p as usize), idx, Edge::Data { value: v });
                }
                // an argument: the node goes on its use list
                Source::Arg(a) => {
                    if let Some(list) = self.t.arg_users.get_mut(a as usize) {
                        if list.last() != Some(&idx) {
                            list.push(idx);
                        }
                    }
                }
                Source::None => {}
            }
        }
        self.t.schedule.push(idx);
        Ok(())
    }

    /// Adds the next entry of the value table, after the nodes: `id` must be the next of the
    /// ids given to [`Rebuild::start`].
    pub(crate) fn push_value(&mut self, id: ValueId, name: &str, ty: Type) -> Result<(), String> {
        let Some(name) = self.t.names.push(name) else {
            return Err(format!("value {id}: the names pass 4 GiB"));
        };
        let ty = self.intern_type(ty);
        self.push_entry(id, name, ty)
    }

    /// Takes the names of all values at once, laid out back to back in value order: each
    /// value then names its span with [`Rebuild::push_entry`].
    pub(crate) fn set_names(&mut self, names: NameText) {
        self.t.names = names;
    }
    /// The span of `len` bytes at `at` of the names given to [`Rebuild::set_names`].
    pub(crate) fn name_span(&self, at: usize, len: usize) -> Option<NameSpan> {
        self.t.names.span(at, len)
    }
    /// The handle of `ty` in the trace's type table.
    pub(crate) fn intern_type(&mut self, ty: Type) -> TypeId {
        let id = self.t.types.intern(ty);
        // handles are given out in sequence: a new one is the next index
        if id.0 as usize == self.oversized.len() {
            self.oversized.push(self.t.types.get(id).is_oversized());
        }
        id
    }

    /// Adds the next entry of the value table from a name span and a type handle.
    pub(crate) fn push_entry(
        &mut self,
        id: ValueId,
        name: NameSpan,
        ty: TypeId,
    ) -> Result<(), String> {
        let slot = self.t.values.len();
        if self.slots.get(id) != Some(slot as u32) {
            return Err(format!("value {id} is not listed as value {slot}"));
        }
        if self.oversized.get(ty.0 as usize) == Some(&true) {
            return Err(format!(
                "value {id} (`{}`) has type {}, over {} bytes",
                self.t.names.get(name),
                self.t.types.get(ty),
                crate::types::MAX_TENSOR_BYTES
            ));
        }
        let def = self.defs[slot];
        self.t.values.insert(id, Value { name, ty, def });
        Ok(())
    }

    pub(crate) fn finish(
        mut self,
        order_edges: Vec<(u32, u32)>,
        ret: Arg,
        decorators: Vec<String>,
        provenance: Vec<Provenance>,
    ) -> Result<Trace, String> {
        if self.t.values.len() != self.defs.len() {
            return Err(format!(
                "{} values listed, {} named",
                self.defs.len(),
                self.t.values.len()
            ));
        }
        for (a, b) in order_edges {
            let (Some(&x), Some(&y)) = (
                self.t.schedule.get(a as usize),
                self.t.schedule.get(b as usize),
            ) else {
                return Err(format!("order edge ({a}, {b}) points past the node list"));
            };
            self.t.add_order_edge(x, y);
        }
        let mut missing = None;
        ret.for_each_value(&mut |v| {
            if self.slots.get(v).is_none() {
                missing = Some(v);
            }
        });
        if let Some(v) = missing {
            return Err(format!("return refers to unknown value {v}"));
        }
        self.t.ret = ret;
        self.t.decorators = decorators;
        self.t.provenance = provenance;
        Ok(self.t)
    }
}
