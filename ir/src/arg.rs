//! Operands: references to values and the Python literals Thunder prints inline.

use crate::types::{DType, Device};
use crate::value::ValueId;
use serde::{Deserialize, Serialize};

/// How a dtype literal was spelled (`dtypes.float32` or `torch.float32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DTypeSpelling {
    /// `dtypes.float32`, as Thunder prints it.
    Thunder,
    /// `torch.float32`, as PyTorch spells it.
    Torch,
}

/// How a device literal was spelled (`devices.Device("cuda:0")` or `torch.device("cuda:0")`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeviceSpelling {
    /// `devices.Device("cuda:0")`, as Thunder prints it.
    Thunder,
    /// `torch.device("cuda:0")`, as PyTorch spells it.
    Torch,
}

/// An object Thunder prints as `_<TypeName>[_<MEMBER>]_<counter>`, such as a process group
/// (`_torch_distributed_distributed_c10d_ProcessGroup_1`) or an enum member
/// (`_DistributedReduceOps_SUM_0`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Opaque {
    /// The Python type (`torch.dtype`, `DDPType`).
    pub type_name: String,
    /// The member after the dot (`float32`), if any.
    pub member: Option<String>,
    /// Which occurrence of an unprintable object this is (printed as `<type_N>`).
    pub counter: u32,
}

impl Opaque {
    /// Recovers type and member from a printed name; `None` if it is not of that shape.
    pub fn from_name(name: &str) -> Option<Opaque> {
        let body = name.strip_prefix('_')?;
        let (rest, counter) = body.rsplit_once('_')?;
        let counter = counter.parse::<u32>().ok()?;
        if rest.is_empty() {
            return None;
        }
        if let Some((type_name, member)) = rest.rsplit_once('_') {
            let is_member = !type_name.is_empty()
                && member.chars().any(|c| c.is_ascii_uppercase())
                && member
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if is_member {
                return Some(Opaque {
                    type_name: type_name.to_string(),
                    member: Some(member.to_string()),
                    counter,
                });
            }
        }
        Some(Opaque {
            type_name: rest.to_string(),
            member: None,
            counter,
        })
    }
    /// The name as printed.
    pub fn printed_name(&self) -> String {
        match &self.member {
            Some(m) => format!("_{}_{}_{}", self.type_name, m, self.counter),
            None => format!("_{}_{}", self.type_name, self.counter),
        }
    }
}

/// A positional or keyword operand of a node, or the return structure of a trace.
#[derive(Clone, Debug, Serialize)]
pub enum Arg {
    /// A value of the trace, by handle.
    Value(ValueId),
    /// Python's `None`.
    None,
    /// `True` or `False`.
    Bool(bool),
    /// An integer literal.
    Int(i64),
    /// A float literal; two are equal when their bits are.
    Float(#[serde(serialize_with = "float_text::serialize")] f64),
    /// A string literal.
    Str(String),
    /// A tuple, `(a, b)`.
    Tuple(Vec<Arg>),
    /// A list, `[a, b]`.
    List(Vec<Arg>),
    /// A dict, `{k: v}`: its key/value pairs in printed order.
    Dict(Vec<(Arg, Arg)>),
    /// A dtype literal, and how it was spelled (printed back the same way).
    DType(DType, DTypeSpelling),
    /// A device literal, and how it was spelled (printed back the same way).
    Device(Device, DeviceSpelling),
    /// Boxed: rare, and three times the size of every other operand.
    Opaque(Box<Opaque>),
    /// A Python slice, `slice(start, stop, step)` with `None` as `None` (indexing operands).
    Slice(Box<[Option<i64>; 3]>),
    /// Python's `...` (indexing operands).
    Ellipsis,
}

impl PartialEq for Arg {
    fn eq(&self, other: &Self) -> bool {
        use Arg::*;
        match (self, other) {
            (Value(a), Value(b)) => a == b,
            (None, None) => true,
            (Bool(a), Bool(b)) => a == b,
            (Int(a), Int(b)) => a == b,
            (Float(a), Float(b)) => a.to_bits() == b.to_bits(),
            (Str(a), Str(b)) => a == b,
            (Tuple(a), Tuple(b)) | (List(a), List(b)) => a == b,
            (Dict(a), Dict(b)) => a == b,
            (DType(a, x), DType(b, y)) => a == b && x == y,
            (Device(a, x), Device(b, y)) => a == b && x == y,
            (Opaque(a), Opaque(b)) => a == b,
            (Slice(a), Slice(b)) => a == b,
            (Ellipsis, Ellipsis) => true,
            _ => false,
        }
    }
}

/// Consistent with equality: floats hash by their bits.
impl std::hash::Hash for Arg {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        std::mem::discriminant(self).hash(h);
        match self {
            Arg::Value(v) => v.hash(h),
            Arg::None | Arg::Ellipsis => {}
            Arg::Bool(b) => b.hash(h),
            Arg::Int(i) => i.hash(h),
            Arg::Float(x) => x.to_bits().hash(h),
            Arg::Str(s) => s.hash(h),
            Arg::Tuple(xs) | Arg::List(xs) => xs.hash(h),
            Arg::Dict(kv) => kv.hash(h),
            Arg::DType(d, s) => (d, s).hash(h),
            Arg::Device(d, s) => (d, s).hash(h),
            Arg::Opaque(o) => o.hash(h),
            Arg::Slice(s) => s.hash(h),
        }
    }
}

impl Arg {
    /// Calls `f` on every value referenced, depth first, in printed order.
    pub fn for_each_value(&self, f: &mut impl FnMut(ValueId)) {
        match self {
            Arg::Value(v) => f(*v),
            Arg::Tuple(items) | Arg::List(items) => items.iter().for_each(|a| a.for_each_value(f)),
            Arg::Dict(items) => items.iter().for_each(|(k, v)| {
                k.for_each_value(f);
                v.for_each_value(f);
            }),
            _ => {}
        }
    }
    /// Rewrites every value reference in place.
    pub fn map_values(&mut self, f: &mut impl FnMut(ValueId) -> ValueId) {
        match self {
            Arg::Value(v) => *v = f(*v),
            Arg::Tuple(items) | Arg::List(items) => items.iter_mut().for_each(|a| a.map_values(f)),
            Arg::Dict(items) => items.iter_mut().for_each(|(k, v)| {
                k.map_values(f);
                v.map_values(f);
            }),
            _ => {}
        }
    }
    /// Replaces every value reference `f` gives a literal for by that literal (the rewriter's
    /// [`crate::Rewriter::replace_all_uses_with_literal`]).
    pub(crate) fn substitute_values(&mut self, f: &mut impl FnMut(ValueId) -> Option<Arg>) {
        match self {
            Arg::Value(v) => {
                if let Some(lit) = f(*v) {
                    *self = lit;
                }
            }
            Arg::Tuple(items) | Arg::List(items) => {
                items.iter_mut().for_each(|a| a.substitute_values(f))
            }
            Arg::Dict(items) => items.iter_mut().for_each(|(k, v)| {
                k.substitute_values(f);
                v.substitute_values(f);
            }),
            _ => {}
        }
    }
    /// The value this operand reads, if it is one.
    pub fn as_value(&self) -> Option<ValueId> {
        match self {
            Arg::Value(v) => Some(*v),
            _ => Option::None,
        }
    }
    /// The integer literal, if it is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Arg::Int(v) => Some(*v),
            Arg::Bool(b) => Some(*b as i64),
            _ => Option::None,
        }
    }
    /// The number literal (integers too), if it is one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Arg::Float(v) => Some(*v),
            Arg::Int(v) => Some(*v as f64),
            Arg::Bool(b) => Some(*b as i64 as f64),
            _ => Option::None,
        }
    }
    /// The string literal, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Arg::Str(s) => Some(s),
            _ => Option::None,
        }
    }
    /// Items of a tuple or list.
    pub fn as_seq(&self) -> Option<&[Arg]> {
        match self {
            Arg::Tuple(a) | Arg::List(a) => Some(a),
            _ => Option::None,
        }
    }
    /// A tuple/list of ints, or a single int, as a list.
    pub fn as_int_list(&self) -> Option<Vec<i64>> {
        match self {
            Arg::Int(v) => Some(vec![*v]),
            Arg::Tuple(a) | Arg::List(a) => a.iter().map(Arg::as_int).collect(),
            _ => Option::None,
        }
    }
    /// A tuple of ints, the form shapes and dims take.
    pub fn int_tuple(v: impl IntoIterator<Item = i64>) -> Arg {
        Arg::Tuple(v.into_iter().map(Arg::Int).collect())
    }
    /// One value operand per value.
    pub fn values(values: impl IntoIterator<Item = ValueId>) -> Vec<Arg> {
        values.into_iter().map(Arg::Value).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_names() {
        let o = Opaque::from_name("_DistributedReduceOps_SUM_0").unwrap();
        assert_eq!(o.type_name, "DistributedReduceOps");
        assert_eq!(o.member.as_deref(), Some("SUM"));
        let g = Opaque::from_name("_torch_distributed_distributed_c10d_ProcessGroup_1").unwrap();
        assert_eq!(
            g.type_name,
            "torch_distributed_distributed_c10d_ProcessGroup"
        );
        assert_eq!(g.member, None);
        assert_eq!(g.counter, 1);
        assert_eq!(
            g.printed_name(),
            "_torch_distributed_distributed_c10d_ProcessGroup_1"
        );
        assert!(Opaque::from_name("_x").is_none());
        assert!(Opaque::from_name("t_l1_weight").is_none());
    }
}

/// How deeply serialized operands and decompositions may nest. Decoding recurses once per level,
/// so a hostile file nesting tuples thousands deep would otherwise overflow the stack.
pub const MAX_NESTING: u32 = 128;

thread_local! {
    static NESTING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// One level of nesting while decoding; an error past [`MAX_NESTING`].
pub(crate) struct NestingGuard;

impl NestingGuard {
    pub(crate) fn enter<E: serde::de::Error>() -> Result<NestingGuard, E> {
        let depth = NESTING.with(|n| {
            let d = n.get() + 1;
            n.set(d);
            d
        });
        if depth > MAX_NESTING {
            NESTING.with(|n| n.set(n.get() - 1));
            return Err(E::custom(format!(
                "values nest deeper than {MAX_NESTING} levels"
            )));
        }
        Ok(NestingGuard)
    }
}

impl Drop for NestingGuard {
    fn drop(&mut self) {
        NESTING.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// The derived decoding of [`Arg`], called under a nesting guard.
#[derive(Deserialize)]
#[serde(remote = "Arg")]
enum ArgDef {
    Value(ValueId),
    None,
    Bool(bool),
    Int(i64),
    Float(#[serde(deserialize_with = "float_text::deserialize")] f64),
    Str(String),
    Tuple(Vec<Arg>),
    List(Vec<Arg>),
    Dict(Vec<(Arg, Arg)>),
    DType(DType, DTypeSpelling),
    Device(Device, DeviceSpelling),
    Opaque(Box<Opaque>),
    Slice(Box<[Option<i64>; 3]>),
    Ellipsis,
}

impl<'de> Deserialize<'de> for Arg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Arg, D::Error> {
        let _level = NestingGuard::enter::<D::Error>()?;
        ArgDef::deserialize(d)
    }
}

/// Floats in human-readable formats: JSON has no infinities or NaN (serde_json writes `null`),
/// so those travel as Python's spelling (`"inf"`, `"-inf"`, `"nan"`); binary formats keep bits.
mod float_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() && !v.is_finite() {
            s.serialize_str(&crate::pyfloat::repr(*v))
        } else {
            s.serialize_f64(*v)
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Number(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        if !d.is_human_readable() {
            return f64::deserialize(d);
        }
        match Either::deserialize(d)? {
            Either::Number(v) => Ok(v),
            Either::Text(t) => crate::pyfloat::parse(&t)
                .ok_or_else(|| serde::de::Error::custom(format!("bad float `{t}`"))),
        }
    }
}
