//! The binary form of a trace (format versions 2 and 3): columns instead of rows.
//!
//! A row form (one serde struct per node and per value) costs a visitor call per field and a
//! varint per number, which made decoding only about 3x faster than parsing the text. Here the
//! million-entry parts are three flat blobs that bincode copies as bytes, read back with plain
//! loops:
//! - `values`: per value, three little-endian `u32` words: id, type, name length;
//! - `names`: every value name, back to back;
//! - `nodes`: per node in schedule order, words: op, `lhs | kwargs << 8`, operand count,
//!   output count, the operands (a tag word, then its payload), the keyword operands (a key,
//!   then an operand), the output ids.
//!
//! Everything with few distinct instances stays serde: the type, op and keyword tables the
//! words index, operands the words do not inline (strings, dicts, dtypes, devices, opaque
//! objects), the rare per-node parts (callee, decomposition, source), the return structure. Every index,
//! count and length read from a blob is checked; a bad one is an error naming what and where.

use crate::arg::{Arg, MAX_NESTING};
use crate::name_text::{NameText, MAX_NAME_TEXT};
use crate::node::{Lhs, LhsSlot, Node, SubSymbol};
use crate::op_name::OpName;
use crate::rebuild::Rebuild;
use crate::trace::{Provenance, Trace, TraceKind};
use crate::type_table::TypeId;
use crate::types::Type;
use crate::value::ValueId;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// Argument tags of the `nodes` blob.
mod tag {
    pub const VALUE: u32 = 0;
    pub const NONE: u32 = 1;
    pub const BOOL: u32 = 2;
    pub const INT: u32 = 3;
    pub const FLOAT: u32 = 4;
    pub const TUPLE: u32 = 5;
    pub const LIST: u32 = 6;
    /// An operand kept whole in the `operands` table, by index.
    pub const TABLE: u32 = 7;
}

/// Bindings by their code in the `nodes` blob (the code is the index). `Nested` (format
/// version 4) is followed, after the outputs, by its places ([`put_pattern`]).
const BINDINGS: [Lhs; 6] = [
    Lhs::None,
    Lhs::Single,
    Lhs::List,
    Lhs::Unpack,
    Lhs::Tuple,
    Lhs::Nested,
];

/// How deep a nested left-hand side may be in a file (Thunder's are two levels).
const MAX_PATTERN_DEPTH: usize = 64;

/// A nested left-hand side's places: a count word, then one word per place in preorder
/// (`0` a name, `1` a discard, `2 | len << 2` a group whose `len` places follow).
fn put_pattern(out: &mut Vec<u8>, slots: &[LhsSlot]) -> Result<(), String> {
    let n = u32::try_from(slots.len())
        .map_err(|_| format!("a left-hand side of {} places", slots.len()))?;
    put(out, n);
    put_places(out, slots)
}

/// Places without a count word (a group's length is in the group's own word).
fn put_places(out: &mut Vec<u8>, slots: &[LhsSlot]) -> Result<(), String> {
    for s in slots {
        match s {
            LhsSlot::Out => put(out, 0),
            LhsSlot::Discard => put(out, 1),
            LhsSlot::Group(inner) => {
                if inner.len() >= 1 << 30 {
                    return Err(format!("a left-hand side group of {} places", inner.len()));
                }
                put(out, 2 | (inner.len() as u32) << 2);
                put_places(out, inner)?;
            }
        }
    }
    Ok(())
}

/// Reads what [`put_pattern`] wrote.
fn read_pattern(w: &mut Words) -> Result<Vec<LhsSlot>, String> {
    let n = w.count("places")?;
    read_places(w, n, 1)
}

fn read_places(w: &mut Words, n: usize, depth: usize) -> Result<Vec<LhsSlot>, String> {
    if depth > MAX_PATTERN_DEPTH {
        return Err(format!(
            "a left-hand side nested deeper than {MAX_PATTERN_DEPTH} levels"
        ));
    }
    let mut slots = Vec::with_capacity(n);
    for _ in 0..n {
        let at = w.at;
        let word = w.next()?;
        slots.push(match word & 3 {
            0 if word == 0 => LhsSlot::Out,
            1 if word == 1 => LhsSlot::Discard,
            2 => {
                let len = w.claim((word >> 2) as usize, "places", at)?;
                LhsSlot::Group(read_places(w, len, depth + 1)?)
            }
            _ => return Err(format!("`nodes` blob: unknown place {word} at byte {at}")),
        });
    }
    Ok(slots)
}

/// A byte blob, written as one bincode byte string (not a sequence of numbers).
struct Blob<'a>(&'a [u8]);

impl Serialize for Blob<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// The rare parts of one node, by its position in the schedule.
#[derive(Serialize)]
#[serde(rename = "Extra")]
struct ExtraRef<'a> {
    position: u32,
    callee: Option<&'a str>,
    subsymbols: &'a [SubSymbol],
    source: Option<&'a str>,
}

#[derive(Deserialize)]
#[serde(rename = "Extra")]
struct Extra {
    position: u32,
    callee: Option<String>,
    subsymbols: Vec<SubSymbol>,
    source: Option<String>,
}

/// What [`Columns`] reads, written from a trace without copying its names, types or ops.
#[derive(Serialize)]
#[serde(rename = "Columns")]
struct ColumnsRef<'a> {
    name: &'a str,
    kind: TraceKind,
    args: &'a [ValueId],
    types: &'a [&'a Type],
    ops: &'a [&'a str],
    keys: &'a [&'a str],
    values: Blob<'a>,
    names: &'a str,
    node_count: u32,
    nodes: Blob<'a>,
    operands: &'a [&'a Arg],
    extras: &'a [ExtraRef<'a>],
    order_edges: Vec<(u32, u32)>,
    ret: &'a Arg,
    decorators: &'a [String],
    provenance: &'a [Provenance],
}

/// The columns as read, the blobs borrowed from the payload.
#[derive(Deserialize)]
#[serde(rename = "Columns")]
struct Columns<'a> {
    name: String,
    kind: TraceKind,
    args: Vec<ValueId>,
    types: Vec<Type>,
    ops: Vec<OpName>,
    keys: Vec<String>,
    #[serde(borrow)]
    values: &'a [u8],
    #[serde(borrow)]
    names: &'a str,
    node_count: u32,
    #[serde(borrow)]
    nodes: &'a [u8],
    operands: Vec<Arg>,
    extras: Vec<Extra>,
    order_edges: Vec<(u32, u32)>,
    ret: Arg,
    decorators: Vec<String>,
    provenance: Vec<Provenance>,
}

/// The blobs of one trace, built before they are serialized.
struct Blobs<'a> {
    node_count: u32,
    types: Vec<&'a Type>,
    ops: Vec<&'a str>,
    keys: Vec<&'a str>,
    values: Vec<u8>,
    names: String,
    nodes: Vec<u8>,
    operands: Vec<&'a Arg>,
    extras: Vec<ExtraRef<'a>>,
}

fn put(out: &mut Vec<u8>, w: u32) {
    out.extend_from_slice(&w.to_le_bytes());
}

fn put_arg<'a>(out: &mut Vec<u8>, operands: &mut Vec<&'a Arg>, a: &'a Arg) {
    match a {
        Arg::Value(v) => {
            put(out, tag::VALUE);
            put(out, v.0);
        }
        Arg::None => put(out, tag::NONE),
        Arg::Bool(b) => {
            put(out, tag::BOOL);
            put(out, u32::from(*b));
        }
        Arg::Int(i) => {
            put(out, tag::INT);
            out.extend_from_slice(&i.to_le_bytes());
        }
        Arg::Float(x) => {
            put(out, tag::FLOAT);
            out.extend_from_slice(&x.to_bits().to_le_bytes());
        }
        Arg::Tuple(items) | Arg::List(items) => {
            put(
                out,
                if matches!(a, Arg::Tuple(_)) {
                    tag::TUPLE
                } else {
                    tag::LIST
                },
            );
            put(out, items.len() as u32);
            items.iter().for_each(|x| put_arg(out, operands, x));
        }
        Arg::Str(_)
        | Arg::Dict(_)
        | Arg::DType(..)
        | Arg::Device(..)
        | Arg::Opaque(_)
        | Arg::Slice(_)
        | Arg::Ellipsis => {
            put(out, tag::TABLE);
            put(out, operands.len() as u32);
            operands.push(a);
        }
    }
}

impl<'a> Blobs<'a> {
    fn of(t: &'a Trace) -> Result<Blobs<'a>, String> {
        let count = |n: usize, what: &str| {
            u32::try_from(n)
                .map_err(|_| format!("{n} {what} do not fit the format's 32-bit counts"))
        };
        // trace type handle -> index in the file's table, which lists the types values use
        // in the order of first use (a trace's table may hold types no value uses any more)
        let mut type_index = vec![u32::MAX; t.types.len()];
        let mut b = Blobs {
            node_count: count(t.node_count(), "nodes")?,
            types: Vec::new(),
            ops: Vec::new(),
            keys: Vec::new(),
            values: Vec::with_capacity(12 * t.values.len()),
            names: String::with_capacity(t.names.len()),
            nodes: Vec::with_capacity(64 * t.node_count()),
            operands: Vec::new(),
            extras: Vec::new(),
        };
        for (id, v) in &t.values {
            let slot = &mut type_index[v.ty.0 as usize];
            if *slot == u32::MAX {
                *slot = b.types.len() as u32;
                b.types.push(t.types.get(v.ty));
            }
            let name = t.names.get(v.name);
            put(&mut b.values, id.0);
            put(&mut b.values, *slot);
            put(&mut b.values, count(name.len(), "name bytes")?);
            b.names.push_str(name);
        }
        // keyed by where the text lives: one entry per built-in op without hashing its name
        // (a user op spelled twice from two places gets two entries, which decode the same)
        let mut op_index: FxHashMap<(usize, usize), u32> = FxHashMap::default();
        let mut key_index: FxHashMap<&str, u32> = FxHashMap::default();
        for (position, (_, n)) in t.nodes().enumerate() {
            let op = *op_index
                .entry((n.op.addr(), n.op.len()))
                .or_insert_with(|| {
                    b.ops.push(&n.op);
                    b.ops.len() as u32 - 1
                });
            put(&mut b.nodes, op);
            let lhs = BINDINGS
                .iter()
                .position(|b| *b == n.lhs)
                .expect("every binding has a code") as u32;
            let kwargs = n.kwargs();
            if kwargs.len() >= 1 << 24 {
                return Err(format!(
                    "node `{}` has {} keyword operands",
                    n.op,
                    kwargs.len()
                ));
            }
            put(&mut b.nodes, lhs | (kwargs.len() as u32) << 8);
            put(&mut b.nodes, count(n.args.len(), "operands")?);
            put(&mut b.nodes, count(n.outputs.len(), "outputs")?);
            for a in &n.args {
                put_arg(&mut b.nodes, &mut b.operands, a);
            }
            for (k, a) in kwargs {
                let key = *key_index.entry(k).or_insert_with(|| {
                    b.keys.push(k);
                    b.keys.len() as u32 - 1
                });
                put(&mut b.nodes, key);
                put_arg(&mut b.nodes, &mut b.operands, a);
            }
            for o in &n.outputs {
                put(&mut b.nodes, o.0);
            }
            if n.lhs == Lhs::Nested {
                let pattern = n.lhs_pattern().ok_or_else(|| {
                    format!(
                        "node `{}` binds a nested left-hand side without its places",
                        n.op
                    )
                })?;
                put_pattern(&mut b.nodes, pattern)?;
            }
            if n.callee().is_some() || !n.subsymbols().is_empty() || n.source().is_some() {
                b.extras.push(ExtraRef {
                    position: position as u32,
                    callee: n.callee(),
                    subsymbols: n.subsymbols(),
                    source: n.source(),
                });
            }
        }
        Ok(b)
    }

    /// The serialized form: the blobs with what the trace holds as is.
    fn columns<'b>(&'b self, t: &'a Trace) -> ColumnsRef<'b>
    where
        'a: 'b,
    {
        ColumnsRef {
            name: &t.name,
            kind: t.kind,
            args: &t.args,
            types: &self.types,
            ops: &self.ops,
            keys: &self.keys,
            values: Blob(&self.values),
            names: &self.names,
            node_count: self.node_count,
            nodes: Blob(&self.nodes),
            operands: &self.operands,
            extras: &self.extras,
            order_edges: t.order_edge_positions(),
            ret: &t.ret,
            decorators: &t.decorators,
            provenance: &t.provenance,
        }
    }
}

/// Writes `t` in columns.
pub(crate) fn serialize<S: serde::Serializer>(t: &Trace, s: S) -> Result<S::Ok, S::Error> {
    let b = Blobs::of(t).map_err(serde::ser::Error::custom)?;
    b.columns(t).serialize(s)
}

/// Reads a trace written by [`serialize`].
pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Trace, D::Error> {
    let c = Columns::deserialize(d)?;
    from_columns(c).map_err(serde::de::Error::custom)
}

/// Little-endian words of a blob, each read checked against its end.
struct Words<'a> {
    bytes: &'a [u8],
    at: usize,
    blob: &'static str,
}

/// The word readers are inlined (called several times per node) and their messages made out
/// of line, where the hot loop does not carry them.
impl Words<'_> {
    #[inline(always)]
    fn next(&mut self) -> Result<u32, String> {
        match self.bytes.get(self.at..self.at + 4) {
            Some(w) => {
                self.at += 4;
                Ok(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            }
            None => Err(self.cut()),
        }
    }
    #[cold]
    fn cut(&self) -> String {
        format!(
            "`{}` blob ends inside a word (byte {} of {})",
            self.blob,
            self.at,
            self.bytes.len()
        )
    }
    #[inline(always)]
    fn next_u64(&mut self) -> Result<u64, String> {
        let lo = self.next()?;
        let hi = self.next()?;
        Ok(u64::from(lo) | u64::from(hi) << 32)
    }
    /// Words left: a bound on how many items a count read from the blob can honestly claim.
    #[inline(always)]
    fn left(&self) -> usize {
        (self.bytes.len() - self.at.min(self.bytes.len())) / 4
    }
    /// A count read from the blob: one word, checked by [`Words::claim`].
    #[inline(always)]
    fn count(&mut self, what: &str) -> Result<usize, String> {
        let at = self.at;
        let n = self.next()? as usize;
        self.claim(n, what, at)
    }
    /// `n`, if that many items (one word each at least) can follow; `at` is where the
    /// count was read.
    #[inline(always)]
    fn claim(&self, n: usize, what: &str, at: usize) -> Result<usize, String> {
        if n > self.left() {
            return Err(self.overclaim(n, what, at));
        }
        Ok(n)
    }
    #[cold]
    fn overclaim(&self, n: usize, what: &str, at: usize) -> String {
        format!(
            "`{}` blob: {n} {what} claimed at byte {at}, {} words left",
            self.blob,
            self.left()
        )
    }
}

/// Entry `i` of a table the blobs index (`what`: its name; `whose`: the record that read `i`).
/// Always inlined: called per node and value, and a call cost about 3 ms of a 1M-node decode.
#[inline(always)]
fn lookup<'t, T>(
    table: &'t [T],
    i: usize,
    what: &str,
    whose: impl FnOnce() -> String,
) -> Result<&'t T, String> {
    table.get(i).ok_or_else(|| {
        format!(
            "{}: {what} {i} is past the {what} table ({} {what}s)",
            whose(),
            table.len()
        )
    })
}

/// Reads one operand: a tag word, then its payload. Values, numbers and `None` (nearly every
/// operand) are read inline; anything else by [`read_rare`]. Through a call, each operand came
/// back in a `Result` through memory, which cost about 12 ms of a 1M-node decode.
#[inline(always)]
fn read_arg(w: &mut Words, operands: &[Arg], depth: u32) -> Result<Arg, String> {
    let at = w.at;
    Ok(match w.next()? {
        tag::VALUE => Arg::Value(ValueId(w.next()?)),
        tag::INT => Arg::Int(w.next_u64()? as i64),
        tag::FLOAT => Arg::Float(f64::from_bits(w.next_u64()?)),
        tag::NONE => Arg::None,
        _ => {
            w.at = at;
            read_rare(w, operands, depth)?
        }
    })
}

/// Reads one operand other than a value, a number or `None`.
#[inline(never)]
fn read_rare(w: &mut Words, operands: &[Arg], depth: u32) -> Result<Arg, String> {
    let at = w.at;
    Ok(match w.next()? {
        tag::VALUE => Arg::Value(ValueId(w.next()?)),
        tag::NONE => Arg::None,
        tag::BOOL => Arg::Bool(match w.next()? {
            0 => false,
            1 => true,
            x => return Err(format!("`nodes` blob: bool {x} at byte {}", w.at - 4)),
        }),
        tag::INT => Arg::Int(w.next_u64()? as i64),
        tag::FLOAT => Arg::Float(f64::from_bits(w.next_u64()?)),
        t @ (tag::TUPLE | tag::LIST) => {
            if depth >= MAX_NESTING {
                return Err(format!("values nest deeper than {MAX_NESTING} levels"));
            }
            let n = w.count("items")?;
            // reserved up to a small bound: every nesting level may claim up to the words
            // left, and reserving each claim in full would multiply a small file's claims
            // by the nesting depth
            let mut items = Vec::with_capacity(n.min(64));
            for _ in 0..n {
                items.push(read_arg(w, operands, depth + 1)?);
            }
            if t == tag::TUPLE {
                Arg::Tuple(items)
            } else {
                Arg::List(items)
            }
        }
        tag::TABLE => {
            let i = w.next()? as usize;
            operands.get(i).cloned().ok_or_else(|| {
                format!(
                    "`nodes` blob: operand {i} at byte {at}, the table has {}",
                    operands.len()
                )
            })?
        }
        x => {
            return Err(format!(
                "`nodes` blob: unknown operand tag {x} at byte {at}"
            ))
        }
    })
}

fn from_columns(c: Columns) -> Result<Trace, String> {
    if !c.values.len().is_multiple_of(12) {
        return Err(format!(
            "`values` blob has {} bytes, not a multiple of 12",
            c.values.len()
        ));
    }
    let entries = || c.values.chunks_exact(12);
    let word = |e: &[u8], k: usize| u32::from_le_bytes([e[k], e[k + 1], e[k + 2], e[k + 3]]);
    let mut r = Rebuild::start(c.name, c.kind, entries().map(|e| ValueId(word(e, 0))))?;
    let node_count = c.node_count as usize;
    let mut w = Words {
        bytes: c.nodes,
        at: 0,
        blob: "nodes",
    };
    // each node takes at least four words
    if node_count > w.left() / 4 {
        return Err(format!(
            "{node_count} nodes claimed, the `nodes` blob holds at most {}",
            w.left() / 4
        ));
    }
    r.set_args(c.args)?;
    r.reserve_nodes(node_count);
    let mut extras = c.extras.into_iter().peekable();
    for position in 0..node_count {
        let at = w.at;
        let op = w.next()? as usize;
        let node = || format!("node {position} (byte {at})");
        let op = lookup(&c.ops, op, "op", node)?;
        let head = w.next()?;
        let lhs = head & 0xff;
        let Some(&lhs) = BINDINGS.get(lhs as usize) else {
            return Err(format!("{}: binding {lhs} is unknown", node()));
        };
        let n_kwargs = (head >> 8) as usize;
        let n_args = w.count("operands")?;
        let n_out = w.count("outputs")?;
        let mut args = Vec::with_capacity(n_args);
        for _ in 0..n_args {
            args.push(read_arg(&mut w, &c.operands, 1)?);
        }
        let mut kwargs = Vec::new();
        if n_kwargs > 0 {
            kwargs.reserve_exact(w.claim(n_kwargs, "keyword operands", at + 4)?);
        }
        for _ in 0..n_kwargs {
            let key = w.next()? as usize;
            let key = lookup(&c.keys, key, "keyword", node)?;
            kwargs.push((key.clone(), read_arg(&mut w, &c.operands, 1)?));
        }
        let mut outputs = Vec::with_capacity(n_out);
        for _ in 0..n_out {
            outputs.push(ValueId(w.next()?));
        }
        let mut node = Node::new(op.clone(), args, outputs);
        node.lhs = lhs;
        if lhs == Lhs::Nested {
            let pattern =
                read_pattern(&mut w).map_err(|m| format!("node {position} (byte {at}): {m}"))?;
            if LhsSlot::count_outputs(&pattern) != n_out {
                return Err(format!(
                    "node {position} (byte {at}): its left-hand side names {} places for {n_out} outputs",
                    LhsSlot::count_outputs(&pattern)
                ));
            }
            node.set_nested_lhs(pattern);
        }
        node.set_kwargs(kwargs);
        // one listed out of order is never taken, and is reported after the last node
        if let Some(e) = extras.next_if(|e| e.position as usize == position) {
            node.set_callee(e.callee);
            node.set_subsymbols(e.subsymbols);
            node.set_source(e.source);
        }
        r.push(node)?;
    }
    if let Some(e) = extras.next() {
        return Err(if (e.position as usize) < node_count {
            format!(
                "the rare parts of node {} are listed out of order",
                e.position
            )
        } else {
            format!(
                "rare parts for node {}, past the {node_count} nodes",
                e.position
            )
        });
    }
    if w.at != c.nodes.len() {
        return Err(format!(
            "`nodes` blob has {} bytes after its {node_count} nodes",
            c.nodes.len() - w.at
        ));
    }
    // names and types last (see `Rebuild`); each of the file's types as a handle in the trace
    let types: Vec<TypeId> = c.types.into_iter().map(|ty| r.intern_type(ty)).collect();
    if c.names.len() > MAX_NAME_TEXT {
        return Err(format!(
            "`names` text has {} bytes, over the {MAX_NAME_TEXT} a trace holds",
            c.names.len()
        ));
    }
    r.set_names(NameText::from_text(c.names.to_owned()));
    let mut name_at = 0usize;
    for (i, e) in entries().enumerate() {
        let (id, ty, len) = (word(e, 0), word(e, 4) as usize, word(e, 8) as usize);
        let ty = *lookup(&types, ty, "type", || format!("value {i}"))?;
        let name = r.name_span(name_at, len).ok_or_else(|| {
            format!(
                "value {i}: name bytes {name_at}..+{len} are not whole characters of the {}-byte `names` text",
                c.names.len()
            )
        })?;
        name_at += len;
        r.push_entry(ValueId(id), name, ty)?;
    }
    if name_at != c.names.len() {
        return Err(format!(
            "`names` text has {} bytes the values do not use",
            c.names.len() - name_at
        ));
    }
    r.finish(c.order_edges, c.ret, c.decorators, c.provenance)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two nodes: `t0 = mul(x, 2.0)` (words 0..10) and `t1 = add(t0, x, alpha=1)` (words
    /// 10..23); values x, t0, t1.
    const SMALL: &str = "def f(x):\n  # x: \"cpu f32[2]\"\n  t0 = ltorch.mul(x, 2.0)\n  # t0: \"cpu f32[2]\"\n  t1 = ltorch.add(t0, x, alpha=1)\n  # t1: \"cpu f32[2]\"\n  return t1\n";

    fn small() -> Trace {
        crate::parse_trace(SMALL).expect("parses")
    }

    /// The columns of `t`, edited, through bincode and back.
    fn decode_edited(t: &Trace, edit: impl FnOnce(&mut Blobs)) -> Result<Trace, String> {
        let mut b = Blobs::of(t).expect("columns");
        edit(&mut b);
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(b.columns(t), config).expect("encodes");
        bincode::serde::decode_from_slice::<Trace, _>(&bytes, config)
            .map(|(t, _)| t)
            .map_err(|e| e.to_string())
    }

    fn set_word(blob: &mut [u8], index: usize, w: u32) {
        blob[4 * index..4 * index + 4].copy_from_slice(&w.to_le_bytes());
    }

    fn word(blob: &[u8], index: usize) -> u32 {
        u32::from_le_bytes(blob[4 * index..4 * index + 4].try_into().expect("4 bytes"))
    }

    fn fails_with(t: &Trace, edit: impl FnOnce(&mut Blobs), expected: &str) {
        match decode_edited(t, edit) {
            Ok(_) => panic!("decoded, expected an error containing `{expected}`"),
            Err(e) => assert!(e.contains(expected), "`{e}` lacks `{expected}`"),
        }
    }

    #[test]
    fn the_layout_is_as_documented_and_round_trips() {
        let t = small();
        let b = Blobs::of(&t).expect("columns");
        assert_eq!(b.values.len(), 3 * 12);
        assert_eq!(b.names, "xt0t1");
        assert_eq!((b.ops.len(), b.keys, b.types.len()), (2, vec!["alpha"], 1));
        let words: Vec<u32> = (0..b.nodes.len() / 4).map(|i| word(&b.nodes, i)).collect();
        let [lo, hi] = [2.0f64.to_bits() as u32, (2.0f64.to_bits() >> 32) as u32];
        assert_eq!(
            words,
            vec![
                0,
                1,
                2,
                1,
                tag::VALUE,
                0,
                tag::FLOAT,
                lo,
                hi,
                1, // t0 = mul(x, 2.0)
                1,
                1 | 1 << 8,
                2,
                1,
                tag::VALUE,
                1,
                tag::VALUE,
                0,
                0,
                tag::INT,
                1,
                0,
                2, // t1
            ]
        );
        assert!(b.extras.is_empty() && b.operands.is_empty());
        assert!(decode_edited(&t, |_| {}).expect("decodes") == t);
    }

    #[test]
    fn a_bad_index_count_or_length_is_an_error_naming_it() {
        let t = small();
        // words set in the `nodes` blob (`Nodes`) or the `values` blob (`Values`)
        enum In {
            Nodes,
            Values,
        }
        /// (word index, new word)
        type Words = &'static [(usize, u32)];
        let word_edits: [(&str, In, Words); 12] = [
            ("op 99 is past the op table", In::Nodes, &[(0, 99)]),
            ("binding 7 is unknown", In::Nodes, &[(1, 7)]),
            ("unknown operand tag 42 at byte 16", In::Nodes, &[(4, 42)]),
            ("1073741824 operands claimed", In::Nodes, &[(2, 1 << 30)]),
            (
                "4000000000 outputs claimed",
                In::Nodes,
                &[(3, 4_000_000_000)],
            ),
            (
                "operand 5 at byte 24, the table has 0",
                In::Nodes,
                &[(6, tag::TABLE), (7, 5)],
            ),
            ("keyword 9 is past the keyword table", In::Nodes, &[(18, 9)]),
            ("bool 7 at byte", In::Nodes, &[(6, tag::BOOL), (7, 7)]),
            ("refers to unknown value %77", In::Nodes, &[(5, 77)]),
            (
                "value 1: type 9 is past the type table",
                In::Values,
                &[(4, 9)],
            ),
            (
                "value 2: name bytes 3..+1000 are not whole characters",
                In::Values,
                &[(8, 1000)],
            ),
            ("value %0 is listed twice", In::Values, &[(3, 0)]),
        ];
        for (expected, blob, words) in word_edits {
            let edit = |b: &mut Blobs| {
                let blob = match blob {
                    In::Nodes => &mut b.nodes,
                    In::Values => &mut b.values,
                };
                words.iter().for_each(|&(i, w)| set_word(blob, i, w));
            };
            fails_with(&t, edit, expected);
        }
        let extra = |position| ExtraRef {
            position,
            callee: Some("f"),
            subsymbols: &[],
            source: None,
        };
        type Edit<'a> = Box<dyn FnOnce(&mut Blobs) + 'a>;
        let other_edits: Vec<(&str, Edit)> = vec![
            ("1000 nodes claimed", Box::new(|b| b.node_count = 1000)),
            (
                "has 4 bytes after its 2 nodes",
                Box::new(|b| b.nodes.extend_from_slice(&[0; 4])),
            ),
            (
                "ends inside a word",
                Box::new(|b| {
                    let n = b.nodes.len();
                    b.nodes.truncate(n - 2)
                }),
            ),
            (
                "`names` text has 1 bytes the values do not use",
                Box::new(|b| b.names.push('z')),
            ),
            ("not a multiple of 12", Box::new(|b| b.values.push(0))),
            (
                "rare parts for node 5, past the 2 nodes",
                Box::new(|b| b.extras.push(extra(5))),
            ),
            (
                "the rare parts of node 0 are listed out of order",
                Box::new(|b| b.extras.extend([extra(1), extra(0)])),
            ),
        ];
        for (expected, edit) in other_edits {
            fails_with(&t, edit, expected);
        }
    }

    /// A name split inside a character (`é` is two bytes) is an error, not a panic.
    #[test]
    fn a_name_split_inside_a_character_is_an_error() {
        let mut t = small();
        let t0 = t.values().nth(1).map(|(id, _)| id).expect("t0");
        t.set_name(t0, "té");
        fails_with(
            &t,
            |b| {
                set_word(&mut b.values, 5, 2); // `té` is 3 bytes
                set_word(&mut b.values, 8, 3); // the next name takes the rest
            },
            "value 1: name bytes 1..+2 are not whole characters",
        );
    }

    /// Tuples nested in the node words are bounded like those serde reads.
    #[test]
    fn deep_nesting_in_the_words_is_an_error_not_a_stack_overflow() {
        let mut t = small();
        let mut a = Arg::Int(1);
        for _ in 0..MAX_NESTING + 5 {
            a = Arg::Tuple(vec![a]);
        }
        let n = t.schedule()[0];
        t.node_mut(n).expect("node").args[1] = a;
        fails_with(&t, |_| {}, "values nest deeper than 128 levels");
    }

    #[test]
    fn rare_parts_and_table_operands_round_trip() {
        let mut t = small();
        let n = t.schedule()[1];
        let node = t.node_mut(n).expect("node");
        node.set_callee(Some("torch.add".into()));
        node.set_source(Some("# model.py:3".into()));
        node.subsymbols_mut().push(SubSymbol {
            text: "t1 = prims.add(t0, x)".into(),
            children: vec![],
        });
        node.args.push(Arg::Str("s".into()));
        node.args.push(Arg::List(vec![Arg::None, Arg::Bool(true)]));
        let b = Blobs::of(&t).expect("columns");
        assert_eq!((b.extras.len(), b.operands.len()), (1, 1));
        let back = decode_edited(&t, |_| {}).expect("decodes");
        let node = back.node(back.schedule()[1]).expect("node");
        assert_eq!(node.callee(), Some("torch.add"));
        assert_eq!(node.source(), Some("# model.py:3"));
        assert_eq!(node.subsymbols().len(), 1);
        assert_eq!(node.kwarg("alpha"), Some(&Arg::Int(1)));
        assert_eq!(node.args.len(), 4);
        assert!(back == t);
    }
}
