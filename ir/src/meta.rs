//! The meta-function toolkit: reading operands (by position or by parameter name) and the
//! shape and dtype rules that many ops share. The ops themselves are declared in `op_table`.

use crate::arg::Arg;
use crate::registry::{DTypeRule, MetaCx, MetaOut};
use crate::types::{broadcast_shapes, DType, Device, TensorType, Type};

type R<T> = Result<T, String>;

/// A scalar or tensor operand of an elementwise op.
pub(crate) enum Operand<'a> {
    Tensor(&'a TensorType),
    Number(Type),
}

impl<'a> MetaCx<'a> {
    /// Positional operand `i` (an error naming it when missing).
    pub fn arg(&self, i: usize) -> R<&'a Arg> {
        self.args
            .get(i)
            .ok_or_else(|| format!("{} expects an operand at position {i}", self.op))
    }
    /// A keyword operand by name.
    pub fn kwarg(&self, key: &str) -> Option<&'a Arg> {
        self.kwargs.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    /// Positional `i`, else keyword `key`.
    pub fn arg_or_kwarg(&self, i: usize, key: &str) -> Option<&'a Arg> {
        self.args.get(i).or_else(|| self.kwarg(key))
    }
    /// The type of an operand: a value's type, or a literal's.
    pub fn type_of(&self, a: &Arg) -> R<Type> {
        Ok(match a {
            Arg::Value(v) => self
                .trace
                .ty(*v)
                .cloned()
                .ok_or_else(|| format!("operand {v} of {} is not defined", self.op))?,
            Arg::Int(v) => Type::Int(Some(*v)),
            Arg::Float(v) => Type::Float(Some(*v)),
            Arg::Bool(v) => Type::Bool(Some(*v)),
            Arg::Str(_) => Type::Str,
            Arg::None => Type::None,
            _ => Type::Any,
        })
    }
    /// Positional operand `i` as a tensor type (an error when it is not one).
    pub fn tensor(&self, i: usize) -> R<TensorType> {
        self.tensor_arg(self.arg(i)?, i)
    }
    fn tensor_arg(&self, a: &Arg, i: usize) -> R<TensorType> {
        match self.type_of(a)? {
            Type::Tensor(t) => Ok(t),
            other => Err(format!(
                "{} expects a tensor at position {i}, got {other}",
                self.op
            )),
        }
    }
    pub(crate) fn operand_of(&self, a: &Arg, what: &str) -> R<Operand<'a>> {
        let i = what;
        if let Arg::Value(v) = a {
            return match self.trace.ty(*v) {
                Some(Type::Tensor(t)) => Ok(Operand::Tensor(t)),
                Some(t @ (Type::Int(_) | Type::Float(_) | Type::Bool(_))) => {
                    Ok(Operand::Number(t.clone()))
                }
                Some(other) => Err(format!(
                    "{} expects a tensor or number at {i}, got {other}",
                    self.op
                )),
                None => Err(format!("operand {v} of {} is not defined", self.op)),
            };
        }
        match a {
            Arg::Int(_) | Arg::Float(_) | Arg::Bool(_) => Ok(Operand::Number(self.type_of(a)?)),
            other => Err(format!(
                "{} expects a tensor or number at {i}, got {other:?}",
                self.op
            )),
        }
    }

    // ----- operands by parameter name (ops declared with a signature) -----

    /// The operand bound to parameter `name` (or its default); an error when there is none.
    pub fn param(&self, name: &str) -> R<&Arg> {
        self.bound
            .as_ref()
            .and_then(|b| b.get(name))
            .ok_or_else(|| format!("{} needs operand `{name}`", self.op))
    }
    /// The operand bound to `name`, `None` when absent or Python `None`.
    pub fn opt(&self, name: &str) -> Option<&Arg> {
        self.bound
            .as_ref()
            .and_then(|b| b.get(name))
            .filter(|a| !matches!(a, Arg::None))
    }
    /// A tensor operand by name.
    pub fn tensor_param(&self, name: &str) -> R<TensorType> {
        match self.type_of(self.param(name)?)? {
            Type::Tensor(t) => Ok(t),
            other => Err(format!(
                "{} expects a tensor for `{name}`, got {other}",
                self.op
            )),
        }
    }
    /// An optional tensor operand by name.
    pub fn opt_tensor(&self, name: &str) -> R<Option<TensorType>> {
        match self.opt(name) {
            None => Ok(None),
            Some(_) => self.tensor_param(name).map(Some),
        }
    }
    /// An integer operand by name (a literal, or a value whose type knows it).
    pub fn int_param(&self, name: &str) -> R<i64> {
        let a = self.param(name)?;
        self.known_int(a)
            .ok_or_else(|| format!("{}: `{name}` must be an integer, got {a:?}", self.op))
    }
    fn known_int(&self, a: &Arg) -> Option<i64> {
        match a {
            Arg::Value(v) => match self.trace.ty(*v) {
                Some(Type::Int(Some(i))) => Some(*i),
                _ => None,
            },
            other => other.as_int(),
        }
    }
    /// A number operand by name, when it is known.
    pub fn f64_param(&self, name: &str) -> Option<f64> {
        match self.opt(name)? {
            Arg::Value(v) => match self.trace.ty(*v) {
                Some(Type::Int(Some(i))) => Some(*i as f64),
                Some(Type::Float(Some(x))) => Some(*x),
                _ => None,
            },
            other => other.as_f64(),
        }
    }
    /// Integers given as one int, a tuple/list of them, or `*args` collected into a tuple
    /// (`reshape(t, (2, 3))` and `reshape(t, 2, 3)` read alike).
    pub fn ints_param(&self, name: &str) -> R<Vec<i64>> {
        let a = self.param(name)?;
        flat_ints(a, |x| self.known_int(x))
            .ok_or_else(|| format!("{}: `{name}` must be integers, got {a:?}", self.op))
    }
    /// A dtype operand by name (`dtype=torch.float32`), if given.
    pub fn dtype_param(&self, name: &str) -> Option<DType> {
        match self.opt(name)? {
            Arg::DType(d, _) => Some(*d),
            _ => None,
        }
    }
    /// A device operand by name, if given.
    pub fn device_param(&self, name: &str) -> R<Option<Device>> {
        match self.opt(name) {
            None => Ok(None),
            Some(Arg::Device(d, _)) => Ok(Some(*d)),
            Some(Arg::Str(s)) => Device::parse(s)
                .map(Some)
                .ok_or_else(|| format!("{}: unknown device `{s}`", self.op)),
            Some(other) => Err(format!("{}: `{name}` is not a device: {other:?}", self.op)),
        }
    }
}

/// Integers given as one int, a tuple/list of them, or `*args` collected into a tuple holding
/// one tuple, each read by `int`; `None` when one is not an integer.
pub(crate) fn flat_ints(a: &Arg, int: impl Fn(&Arg) -> Option<i64>) -> Option<Vec<i64>> {
    let flat = match a {
        Arg::Tuple(items) | Arg::List(items) if items.len() == 1 => match &items[0] {
            inner @ (Arg::Tuple(_) | Arg::List(_)) => inner,
            _ => a,
        },
        _ => a,
    };
    match flat {
        Arg::Tuple(items) | Arg::List(items) => items.iter().map(int).collect(),
        other => int(other).map(|i| vec![i]),
    }
}

/// One tensor of `t`'s type.
pub(crate) fn one(t: TensorType) -> R<MetaOut> {
    Ok(MetaOut::Types(vec![Type::Tensor(t)]))
}

/// Several tensors.
pub(crate) fn many(ts: Vec<TensorType>) -> R<MetaOut> {
    Ok(MetaOut::Types(ts.into_iter().map(Type::Tensor).collect()))
}

/// A dimension index for a tensor of rank `rank`, negative counting from the end.
pub(crate) fn dim_of(cx: &MetaCx, d: i64, rank: usize) -> R<usize> {
    norm_dim(d, rank, cx.op)
}

/// The promoted dtype of two tensors of equal priority. f16 and bf16 together give f32, as in
/// PyTorch; otherwise the higher rank wins.
pub(crate) fn promote(a: DType, b: DType) -> DType {
    if (a == DType::F16 && b == DType::BF16) || (a == DType::BF16 && b == DType::F16) {
        return DType::F32;
    }
    if a.promotion_rank() >= b.promotion_rank() {
        a
    } else {
        b
    }
}

/// Elementwise over the operands bound to the named parameters (`None` operands skipped);
/// `shape_only` operands broadcast but take no part in dtype promotion (`where`'s predicate).
pub(crate) fn ew(cx: &MetaCx, names: &[&str], shape_only: &[&str]) -> R<MetaOut> {
    let mut operands = Vec::new();
    let mut extra = Vec::new();
    for n in names.iter().chain(shape_only) {
        let Some(a) = cx.opt(n) else { continue };
        let o = cx.operand_of(a, n)?;
        if shape_only.contains(n) {
            extra.push(o);
        } else {
            operands.push(o);
        }
    }
    elementwise_of(cx, &operands, &extra)
}

fn elementwise_of(cx: &MetaCx, operands: &[Operand], shape_only: &[Operand]) -> R<MetaOut> {
    let mut shape: Option<Vec<usize>> = None;
    // the device, and whether it came from a 0-d CPU tensor only
    let mut device: Option<(Device, bool)> = None;
    for o in operands.iter().chain(shape_only) {
        if let Operand::Tensor(t) = o {
            shape = Some(match shape {
                None => t.shape.to_vec(),
                Some(s) => broadcast_shapes(&s, &t.shape).ok_or_else(|| {
                    format!(
                        "{}: shapes {:?} and {:?} do not broadcast",
                        cx.op, s, t.shape
                    )
                })?,
            });
            // a 0-d CPU tensor may join tensors of any device, as in PyTorch
            let scalar_cpu = t.shape.is_empty() && t.device == Device::CPU;
            match device {
                None => device = Some((t.device, scalar_cpu)),
                Some((d, _)) if d == t.device => {}
                Some(_) if scalar_cpu => {}
                Some((_, true)) => device = Some((t.device, false)),
                Some((d, false)) => {
                    return Err(format!("{} mixes devices {} and {}", cx.op, d, t.device))
                }
            }
        }
    }
    let device = device.map(|(d, _)| d);
    let dtype = result_dtype(operands);
    let out_dtype = |d: DType| match cx.dtype_rule {
        DTypeRule::Bool => DType::Bool,
        DTypeRule::PromoteToFloat if !d.is_float() => DType::F32,
        _ => d,
    };
    Ok(MetaOut::Types(vec![match (shape, device, dtype) {
        (Some(shape), Some(device), Promoted::Tensor(d)) => {
            Type::tensor(shape, out_dtype(d), device)
        }
        // numbers placed by a shape-only tensor (`where(pred, 49, 0)`): a tensor of their
        // category's default dtype, as PyTorch gives
        (Some(shape), Some(device), Promoted::Number(cat)) => {
            let d = match cat {
                Category::Bool => DType::Bool,
                Category::Int => DType::I64,
                Category::Float => DType::F32,
            };
            Type::tensor(shape, out_dtype(d), device)
        }
        (_, _, Promoted::Number(cat)) => match (cx.dtype_rule, cat) {
            (DTypeRule::Bool, _) => Type::Bool(None),
            (DTypeRule::PromoteToFloat, _) | (_, Category::Float) => Type::Float(None),
            (_, Category::Int) => Type::Int(None),
            (_, Category::Bool) => Type::Bool(None),
        },
        _ => Type::Any,
    }]))
}

/// Kinds of numbers, in promotion order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Category {
    Bool,
    Int,
    Float,
}

pub(crate) fn category(d: DType) -> Category {
    if d == DType::Bool {
        Category::Bool
    } else if d.is_float() {
        Category::Float
    } else {
        Category::Int
    }
}

fn number_category(t: &Type) -> Category {
    match t {
        Type::Float(_) => Category::Float,
        Type::Bool(_) => Category::Bool,
        _ => Category::Int,
    }
}

enum Promoted {
    Tensor(DType),
    Number(Category),
}

/// PyTorch's `result_type`: tensors with dimensions outrank 0-d tensors, which outrank Python
/// numbers; a lower-priority operand changes the result only when its category (bool < int <
/// float) is higher, and then numbers give the default dtype of their category (f32, i64).
fn result_dtype(operands: &[Operand]) -> Promoted {
    let fold = |it: &mut dyn Iterator<Item = DType>| it.reduce(promote);
    let dims = fold(&mut operands.iter().filter_map(|o| match o {
        Operand::Tensor(t) if !t.shape.is_empty() => Some(t.dtype),
        _ => None,
    }));
    let zero_dim = fold(&mut operands.iter().filter_map(|o| match o {
        Operand::Tensor(t) if t.shape.is_empty() => Some(t.dtype),
        _ => None,
    }));
    let numbers = operands
        .iter()
        .filter_map(|o| match o {
            Operand::Number(n) => Some(number_category(n)),
            _ => None,
        })
        .max();
    let mut result = match (dims, zero_dim) {
        (Some(d), Some(z)) if category(z) > category(d) => z,
        (Some(d), _) => d,
        (None, Some(z)) => z,
        (None, None) => return Promoted::Number(numbers.unwrap_or(Category::Int)),
    };
    if let Some(n) = numbers {
        if n > category(result) {
            result = match n {
                Category::Float => DType::F32,
                Category::Int => DType::I64,
                Category::Bool => DType::Bool,
            };
        }
    }
    Promoted::Tensor(result)
}

pub(crate) fn identity(cx: &MetaCx) -> R<MetaOut> {
    Ok(MetaOut::Types(vec![Type::Tensor(cx.tensor(0)?)]))
}

pub(crate) fn norm_dim(d: i64, rank: usize, op: &str) -> R<usize> {
    // a 0-d tensor takes dimension 0 or -1, as PyTorch's `maybe_wrap_dim`
    let r = rank.max(1) as i64;
    let n = if d < 0 { d + r } else { d };
    if n < 0 || n >= r.max(1) {
        return Err(format!("{op}: dimension {d} out of range for rank {rank}"));
    }
    Ok(n as usize)
}

/// `shape` permuted by `perm`, which must name every dimension once.
pub(crate) fn permute_dims(op: &str, shape: &[usize], perm: &[i64]) -> R<Vec<usize>> {
    if perm.len() != shape.len() {
        return Err(format!(
            "{op}: permutation {perm:?} does not match rank {}",
            shape.len()
        ));
    }
    let mut seen = vec![false; perm.len()];
    let mut out = Vec::with_capacity(perm.len());
    for d in perm {
        let d = norm_dim(*d, shape.len(), op)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(format!("{op}: {perm:?} is not a permutation"));
        }
        out.push(shape[d]);
    }
    Ok(out)
}

pub(crate) fn matmul_shapes(op: &str, a: &[usize], b: &[usize]) -> R<Vec<usize>> {
    let err = || format!("{op}: shapes {a:?} and {b:?} do not multiply");
    match (a.len(), b.len()) {
        (0, _) | (_, 0) => Err(err()),
        (1, 1) => (a[0] == b[0]).then(Vec::new).ok_or_else(err),
        (1, _) => {
            let k = b[b.len() - 2];
            if a[0] != k {
                return Err(err());
            }
            let mut s = b[..b.len() - 2].to_vec();
            s.push(b[b.len() - 1]);
            Ok(s)
        }
        (_, 1) => {
            if a[a.len() - 1] != b[0] {
                return Err(err());
            }
            Ok(a[..a.len() - 1].to_vec())
        }
        _ => {
            let (n, k) = (a[a.len() - 2], a[a.len() - 1]);
            let (k2, m) = (b[b.len() - 2], b[b.len() - 1]);
            if k != k2 {
                return Err(err());
            }
            let mut s = broadcast_shapes(&a[..a.len() - 2], &b[..b.len() - 2]).ok_or_else(err)?;
            s.push(n);
            s.push(m);
            Ok(s)
        }
    }
}

pub(crate) fn same_dtype_device(op: &str, a: &TensorType, b: &TensorType) -> R<()> {
    if a.dtype != b.dtype || a.device != b.device {
        return Err(format!(
            "{op}: operands differ in dtype or device ({} {} vs {} {})",
            a.device, a.dtype, b.device, b.dtype
        ));
    }
    Ok(())
}

pub(crate) fn matmul(cx: &MetaCx) -> R<MetaOut> {
    let a = cx.tensor(0)?;
    let b = cx.tensor(1)?;
    same_dtype_device(cx.op, &a, &b)?;
    let shape = matmul_shapes(cx.op, &a.shape, &b.shape)?;
    Ok(MetaOut::Types(vec![Type::Tensor(a.with_shape(shape))]))
}

pub(crate) fn linear(cx: &MetaCx) -> R<MetaOut> {
    let x = cx.tensor(0)?;
    let w = cx.tensor(1)?;
    same_dtype_device(cx.op, &x, &w)?;
    let err = || {
        format!(
            "{}: input {:?} and weight {:?} do not fit",
            cx.op, x.shape, w.shape
        )
    };
    let (inner, out) = match w.shape.len() {
        1 => (w.shape[0], None),
        2 => (w.shape[1], Some(w.shape[0])),
        _ => return Err(err()),
    };
    if x.shape.last() != Some(&inner) {
        return Err(err());
    }
    let mut shape = x.shape[..x.shape.len() - 1].to_vec();
    shape.extend(out);
    if let Some(bias) = cx.arg_or_kwarg(2, "bias") {
        if !matches!(bias, Arg::None) {
            let b = cx.tensor_arg(bias, 2)?;
            same_dtype_device(cx.op, &x, &b)?;
            if broadcast_shapes(&shape, &b.shape).as_deref() != Some(&shape[..]) {
                return Err(format!(
                    "{}: bias {:?} does not fit output {shape:?}",
                    cx.op, b.shape
                ));
            }
        }
    }
    Ok(MetaOut::Types(vec![Type::Tensor(x.with_shape(shape))]))
}

/// `ltorch.to(t, dtype?, device?, ...)` / `prims.convert_element_type(t, dtype)`.
pub(crate) fn convert(cx: &MetaCx) -> R<MetaOut> {
    let mut t = cx.tensor(0)?;
    for a in cx.args[1..].iter().chain(cx.kwargs.iter().map(|(_, a)| a)) {
        match a {
            Arg::DType(d, _) => t.dtype = *d,
            Arg::Device(d, _) => t.device = *d,
            _ => {}
        }
    }
    Ok(MetaOut::Types(vec![Type::Tensor(t)]))
}

pub(crate) fn declared(_: &MetaCx) -> R<MetaOut> {
    Ok(MetaOut::Declared)
}
pub(crate) fn no_outputs(_: &MetaCx) -> R<MetaOut> {
    Ok(MetaOut::Types(Vec::new()))
}

pub(crate) fn all_reduce(cx: &MetaCx) -> R<MetaOut> {
    let t = cx.tensor(0)?;
    Ok(MetaOut::Types(vec![Type::Future(t)]))
}

/// The `world_size=` of a sharded collective: a positive integer.
fn world_size(cx: &MetaCx) -> R<usize> {
    let w = cx.int_param("world_size")?;
    usize::try_from(w)
        .ok()
        .filter(|w| *w > 0)
        .ok_or_else(|| format!("{}: world_size must be positive, got {w}", cx.op))
}

/// A flat (1-d) tensor operand of a sharded collective.
fn flat(cx: &MetaCx) -> R<TensorType> {
    let t = cx.tensor_param("a")?;
    if t.shape.len() != 1 {
        return Err(format!("{} takes a flat (1-d) buffer, got {}", cx.op, t));
    }
    Ok(t)
}

/// `all_gather_async(shard, ..., world_size=W)`: a future of the `W` shards end to end.
pub(crate) fn all_gather(cx: &MetaCx) -> R<MetaOut> {
    let t = flat(cx)?;
    let w = world_size(cx)?;
    let n = t.shape[0].checked_mul(w).ok_or_else(|| {
        format!(
            "{}: {w} shards of {} elements are too many",
            cx.op, t.shape[0]
        )
    })?;
    Ok(MetaOut::Types(vec![Type::Future(t.with_shape([n]))]))
}

/// `reduce_scatter_async(buf, ..., world_size=W)`: a future of this rank's `1/W` of `buf`,
/// whose size must be a multiple of `W` (passes pad it).
pub(crate) fn reduce_scatter(cx: &MetaCx) -> R<MetaOut> {
    let t = flat(cx)?;
    let w = world_size(cx)?;
    let n = t.shape[0];
    if n % w != 0 {
        return Err(format!(
            "{}: {n} elements do not split into {w} equal shards (pad the buffer to a multiple of {w})",
            cx.op
        ));
    }
    Ok(MetaOut::Types(vec![Type::Future(t.with_shape([n / w]))]))
}

pub(crate) fn wait(cx: &MetaCx) -> R<MetaOut> {
    match cx.type_of(cx.arg(0)?)? {
        Type::Future(t) => Ok(MetaOut::Types(vec![Type::Tensor(t)])),
        other => Err(format!("{} expects a future, got {other}", cx.op)),
    }
}

/// Members of a bucket given as a list/tuple of tensors.
pub(crate) fn tensor_list(cx: &MetaCx, i: usize) -> R<Vec<TensorType>> {
    let items = cx
        .arg(i)?
        .as_seq()
        .ok_or_else(|| format!("{} expects a list of tensors at position {i}", cx.op))?;
    items.iter().map(|a| cx.tensor_arg(a, i)).collect()
}

pub(crate) fn common_kind(op: &str, ts: &[TensorType]) -> R<(DType, Device)> {
    let first = ts.first().ok_or_else(|| format!("{op}: empty bucket"))?;
    for t in ts {
        if t.dtype != first.dtype || t.device != first.device {
            return Err(format!(
                "{op}: bucket mixes {} {} and {} {}",
                first.device, first.dtype, t.device, t.dtype
            ));
        }
    }
    Ok((first.dtype, first.device))
}

pub(crate) fn bucket_pack(cx: &MetaCx) -> R<MetaOut> {
    let members = tensor_list(cx, 0)?;
    let (dtype, device) = common_kind(cx.op, &members)?;
    let numel = members
        .iter()
        .try_fold(0usize, |n, t| n.checked_add(t.numel()))
        .ok_or_else(|| format!("{}: the members hold too many elements", cx.op))?;
    Ok(MetaOut::Types(vec![Type::tensor(
        vec![numel],
        dtype,
        device,
    )]))
}

/// `dist.unpack(buf, shapes=((..), ..), ...)` (ours) or `(buf, [templates], key)` (Thunder's).
pub(crate) fn unpack(cx: &MetaCx) -> R<MetaOut> {
    let buf = cx.tensor(0)?;
    let outs: Vec<TensorType> = if let Some(shapes) = cx.kwarg("shapes") {
        shapes
            .as_seq()
            .ok_or_else(|| format!("{}: shapes must be a tuple of shapes", cx.op))?
            .iter()
            .map(|s| {
                let dims = s
                    .as_int_list()
                    .filter(|d| d.iter().all(|x| *x >= 0))
                    .ok_or_else(|| format!("{}: bad shape {s:?}", cx.op))?;
                Ok(buf.with_shape(
                    dims.into_iter()
                        .map(|d| d as usize)
                        .collect::<crate::types::Shape>(),
                ))
            })
            .collect::<R<_>>()?
    } else {
        let ts = tensor_list(cx, 1)?;
        common_kind(cx.op, &ts)?;
        ts
    };
    let total = outs
        .iter()
        .try_fold(0usize, |n, t| n.checked_add(t.numel()))
        .ok_or_else(|| format!("{}: the members' shapes are too large", cx.op))?;
    if total != buf.numel() {
        return Err(format!(
            "{}: members hold {total} elements but the buffer has {}",
            cx.op,
            buf.numel()
        ));
    }
    Ok(MetaOut::Types(outs.into_iter().map(Type::Tensor).collect()))
}
