//! Meta functions of the built-in ops: output shapes and dtypes from operand types.

use crate::arg::Arg;
use crate::registry::{ops, Effect, MetaCx, MetaOut, OpRegistry};
use crate::types::{broadcast_shapes, DType, Device, TensorType, Type};

type R<T> = Result<T, String>;

/// A scalar or tensor operand of an elementwise op.
enum Operand<'a> {
    Tensor(&'a TensorType),
    Number(Type),
}

impl<'a> MetaCx<'a> {
    pub fn arg(&self, i: usize) -> R<&'a Arg> {
        self.args
            .get(i)
            .ok_or_else(|| format!("{} expects an operand at position {i}", self.op))
    }
    pub fn kwarg(&self, key: &str) -> Option<&'a Arg> {
        self.kwargs.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    /// Positional `i`, else keyword `key`.
    pub fn arg_or_kwarg(&self, i: usize, key: &str) -> Option<&'a Arg> {
        self.args.get(i).or_else(|| self.kwarg(key))
    }
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
    fn operand(&self, i: usize) -> R<Operand<'a>> {
        let a = self.arg(i)?;
        if let Arg::Value(v) = a {
            return match self.trace.ty(*v) {
                Some(Type::Tensor(t)) => Ok(Operand::Tensor(t)),
                Some(t @ (Type::Int(_) | Type::Float(_) | Type::Bool(_))) => {
                    Ok(Operand::Number(t.clone()))
                }
                Some(other) => Err(format!(
                    "{} expects a tensor or number at position {i}, got {other}",
                    self.op
                )),
                None => Err(format!("operand {v} of {} is not defined", self.op)),
            };
        }
        match a {
            Arg::Int(_) | Arg::Float(_) | Arg::Bool(_) => Ok(Operand::Number(self.type_of(a)?)),
            other => Err(format!(
                "{} expects a tensor or number at position {i}, got {other:?}",
                self.op
            )),
        }
    }
}

fn promote(a: DType, b: DType) -> DType {
    if a.promotion_rank() >= b.promotion_rank() {
        a
    } else {
        b
    }
}

fn elementwise(cx: &MetaCx, arity: usize) -> R<MetaOut> {
    if cx.args.len() < arity {
        return Err(format!(
            "{} takes {arity} operands, got {}",
            cx.op,
            cx.args.len()
        ));
    }
    let mut result: Option<TensorType> = None;
    let mut number: Option<Type> = None;
    for i in 0..arity {
        match cx.operand(i)? {
            Operand::Tensor(t) => {
                result = Some(match result {
                    None => t.clone(),
                    Some(r) => {
                        if r.device != t.device {
                            return Err(format!(
                                "{} mixes devices {} and {}",
                                cx.op, r.device, t.device
                            ));
                        }
                        let shape = broadcast_shapes(&r.shape, &t.shape).ok_or_else(|| {
                            format!(
                                "{}: shapes {:?} and {:?} do not broadcast",
                                cx.op, r.shape, t.shape
                            )
                        })?;
                        TensorType::new(shape, promote(r.dtype, t.dtype), r.device)
                    }
                })
            }
            Operand::Number(n) => {
                number = Some(match (number, n) {
                    (Some(Type::Float(_)), _) | (_, Type::Float(_)) => Type::Float(None),
                    _ => Type::Int(None),
                })
            }
        }
    }
    Ok(MetaOut::Types(vec![match result {
        Some(t) => Type::Tensor(t),
        None => number.unwrap_or(Type::Any),
    }]))
}

fn unary(cx: &MetaCx) -> R<MetaOut> {
    elementwise(cx, 1)
}
fn binary(cx: &MetaCx) -> R<MetaOut> {
    elementwise(cx, 2)
}
fn identity(cx: &MetaCx) -> R<MetaOut> {
    Ok(MetaOut::Types(vec![Type::Tensor(cx.tensor(0)?)]))
}

/// Shape arguments given as one tuple or as trailing ints (`reshape(t, -1, 4)`).
fn shape_args(cx: &MetaCx, from: usize, key: &str) -> R<Vec<i64>> {
    if cx.args.len() == from + 1 {
        if let Some(v) = cx.args[from].as_int_list() {
            return Ok(v);
        }
    } else if cx.args.len() > from + 1 {
        return cx.args[from..]
            .iter()
            .map(|a| {
                a.as_int()
                    .ok_or_else(|| format!("{}: bad dimension {a:?}", cx.op))
            })
            .collect();
    } else if let Some(v) = cx.kwarg(key).and_then(Arg::as_int_list) {
        return Ok(v);
    }
    Err(format!("{} needs a shape", cx.op))
}

fn reshape(cx: &MetaCx) -> R<MetaOut> {
    let t = cx.tensor(0)?;
    let spec = shape_args(cx, 1, "shape")?;
    let numel = t.numel();
    let mut known: usize = 1;
    let mut infer = None;
    for (i, d) in spec.iter().enumerate() {
        match *d {
            -1 if infer.is_none() => infer = Some(i),
            d if d >= 0 => {
                known = known
                    .checked_mul(d as usize)
                    .ok_or_else(|| format!("{}: shape {spec:?} is too large", cx.op))?
            }
            _ => return Err(format!("{}: invalid shape {spec:?}", cx.op)),
        }
    }
    let mut shape: Vec<usize> = spec.iter().map(|d| (*d).max(0) as usize).collect();
    if let Some(i) = infer {
        if known == 0 || numel % known != 0 {
            return Err(format!(
                "{}: cannot reshape {:?} to {spec:?}",
                cx.op, t.shape
            ));
        }
        shape[i] = numel / known;
    } else if known != numel {
        return Err(format!(
            "{}: cannot reshape {:?} ({numel} elements) to {spec:?}",
            cx.op, t.shape
        ));
    }
    Ok(MetaOut::Types(vec![Type::Tensor(t.with_shape(shape))]))
}

fn norm_dim(d: i64, rank: usize, op: &str) -> R<usize> {
    let r = rank as i64;
    let n = if d < 0 { d + r } else { d };
    if n < 0 || n >= r.max(1) {
        return Err(format!("{op}: dimension {d} out of range for rank {rank}"));
    }
    Ok(n as usize)
}

fn permute(cx: &MetaCx) -> R<MetaOut> {
    let t = cx.tensor(0)?;
    let perm = shape_args(cx, 1, "dims")?;
    if perm.len() != t.shape.len() {
        return Err(format!(
            "{}: permutation {perm:?} does not match rank {}",
            cx.op,
            t.shape.len()
        ));
    }
    let mut seen = vec![false; perm.len()];
    let mut shape = Vec::with_capacity(perm.len());
    for d in &perm {
        let d = norm_dim(*d, t.shape.len(), cx.op)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(format!("{}: {perm:?} is not a permutation", cx.op));
        }
        shape.push(t.shape[d]);
    }
    Ok(MetaOut::Types(vec![Type::Tensor(t.with_shape(shape))]))
}

fn transpose2(cx: &MetaCx) -> R<MetaOut> {
    let t = cx.tensor(0)?;
    let rank = t.shape.len();
    let a = norm_dim(
        cx.arg(1)?.as_int().ok_or("transpose: bad dim")?,
        rank,
        cx.op,
    )?;
    let b = norm_dim(
        cx.arg(2)?.as_int().ok_or("transpose: bad dim")?,
        rank,
        cx.op,
    )?;
    let mut shape = t.shape.clone();
    shape.swap(a, b);
    Ok(MetaOut::Types(vec![Type::Tensor(t.with_shape(shape))]))
}

/// Reduction dims: None means all.
fn reduction(cx: &MetaCx) -> R<MetaOut> {
    let t = cx.tensor(0)?;
    let rank = t.shape.len();
    let dims = match cx.arg_or_kwarg(1, "dim") {
        None | Some(Arg::None) => (0..rank).collect::<Vec<_>>(),
        Some(a) => a
            .as_int_list()
            .ok_or_else(|| format!("{}: bad dims {a:?}", cx.op))?
            .into_iter()
            .map(|d| norm_dim(d, rank, cx.op))
            .collect::<R<Vec<_>>>()?,
    };
    let keepdim = match cx.arg_or_kwarg(2, "keepdim") {
        Some(Arg::Bool(b)) => *b,
        _ => false,
    };
    let mut dtype = t.dtype;
    if let Some(Arg::DType(d, _)) = cx.arg_or_kwarg(3, "dtype") {
        dtype = *d;
    }
    let shape: Vec<usize> = t
        .shape
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            if dims.contains(&i) {
                keepdim.then_some(1)
            } else {
                Some(*s)
            }
        })
        .collect();
    Ok(MetaOut::Types(vec![Type::tensor(shape, dtype, t.device)]))
}

fn matmul_shapes(op: &str, a: &[usize], b: &[usize]) -> R<Vec<usize>> {
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

fn same_dtype_device(op: &str, a: &TensorType, b: &TensorType) -> R<()> {
    if a.dtype != b.dtype || a.device != b.device {
        return Err(format!(
            "{op}: operands differ in dtype or device ({} {} vs {} {})",
            a.device, a.dtype, b.device, b.dtype
        ));
    }
    Ok(())
}

fn matmul(cx: &MetaCx) -> R<MetaOut> {
    let a = cx.tensor(0)?;
    let b = cx.tensor(1)?;
    same_dtype_device(cx.op, &a, &b)?;
    let shape = matmul_shapes(cx.op, &a.shape, &b.shape)?;
    Ok(MetaOut::Types(vec![Type::Tensor(a.with_shape(shape))]))
}

fn linear(cx: &MetaCx) -> R<MetaOut> {
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
fn convert(cx: &MetaCx) -> R<MetaOut> {
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

fn softmax_like(cx: &MetaCx) -> R<MetaOut> {
    let t = cx.tensor(0)?;
    let dim = cx
        .arg_or_kwarg(1, "dim")
        .and_then(Arg::as_int)
        .ok_or_else(|| format!("{} needs a dim", cx.op))?;
    norm_dim(dim, t.shape.len(), cx.op)?;
    Ok(MetaOut::Types(vec![Type::Tensor(t)]))
}

fn declared(_: &MetaCx) -> R<MetaOut> {
    Ok(MetaOut::Declared)
}
fn no_outputs(_: &MetaCx) -> R<MetaOut> {
    Ok(MetaOut::Types(Vec::new()))
}

fn all_reduce(cx: &MetaCx) -> R<MetaOut> {
    let t = cx.tensor(0)?;
    Ok(MetaOut::Types(vec![Type::Future(t)]))
}

fn wait(cx: &MetaCx) -> R<MetaOut> {
    match cx.type_of(cx.arg(0)?)? {
        Type::Future(t) => Ok(MetaOut::Types(vec![Type::Tensor(t)])),
        other => Err(format!("{} expects a future, got {other}", cx.op)),
    }
}

/// Members of a bucket given as a list/tuple of tensors.
fn tensor_list(cx: &MetaCx, i: usize) -> R<Vec<TensorType>> {
    let items = cx
        .arg(i)?
        .as_seq()
        .ok_or_else(|| format!("{} expects a list of tensors at position {i}", cx.op))?;
    items.iter().map(|a| cx.tensor_arg(a, i)).collect()
}

fn common_kind(op: &str, ts: &[TensorType]) -> R<(DType, Device)> {
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

fn bucket_pack(cx: &MetaCx) -> R<MetaOut> {
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
fn unpack(cx: &MetaCx) -> R<MetaOut> {
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

/// Registers the built-in ops and Thunder's spellings of them.
pub(crate) fn register_builtins(r: &mut OpRegistry) {
    use Effect::*;
    let binaries = [
        "add",
        "sub",
        "mul",
        "div",
        "true_divide",
        "pow",
        "maximum",
        "minimum",
        "atan2",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
    ];
    let unaries = [
        "tanh",
        "exp",
        "log",
        "neg",
        "abs",
        "sqrt",
        "rsqrt",
        "sigmoid",
        "relu",
        "erf",
        "sin",
        "cos",
        "reciprocal",
        "sign",
        "log1p",
        "expm1",
        "gelu",
    ];
    for ns in ["prims", "ltorch"] {
        for b in binaries {
            r.register(format!("{ns}.{b}"), Pure, binary);
        }
        for u in unaries {
            r.register(format!("{ns}.{u}"), Pure, unary);
        }
        r.register(format!("{ns}.reshape"), Pure, reshape);
        r.register(format!("{ns}.linear"), Pure, linear);
        r.register(format!("{ns}.matmul"), Pure, matmul);
        r.register(format!("{ns}.sum"), Pure, reduction);
        r.register(format!("{ns}.mean"), Pure, reduction);
        r.register(format!("{ns}.amax"), Pure, reduction);
    }
    r.register("prims.where", Pure, |cx| elementwise(cx, 3));
    r.register("ltorch.where", Pure, |cx| elementwise(cx, 3));
    r.register("prims.transpose", Pure, permute);
    r.register("ltorch.permute", Pure, permute);
    r.register("ltorch.view", Pure, reshape);
    r.register("ltorch.transpose", Pure, transpose2);
    r.register("prims.shallow_copy", Pure, identity);
    r.register("ltorch.contiguous", Pure, identity);
    r.register("prims.get_grad", Pure, identity);
    r.register("ltorch.to", Pure, convert);
    r.register("prims.convert_element_type", Pure, convert);
    r.register("ltorch.softmax", Pure, softmax_like);
    r.register("ltorch.log_softmax", Pure, softmax_like);
    r.register(ops::UNPACK_SEQUENCE, Pure, declared);
    r.register(ops::CLEAR_COLLECTION, SideEffect, no_outputs);
    r.register(ops::ALL_REDUCE, Collective, all_reduce);
    r.register(ops::WAIT, Collective, wait);
    r.register(ops::BUCKET_PACK, Pure, bucket_pack);
    r.register(ops::UNPACK, Pure, unpack);
    r.register(ops::UPDATE_BUCKET_VIEW, Pure, identity);

    for b in binaries.iter().chain(unaries.iter()).chain(
        [
            "reshape",
            "linear",
            "matmul",
            "sum",
            "mean",
            "amax",
            "where",
            "permute",
            "view",
            "transpose",
            "contiguous",
            "to",
            "softmax",
            "log_softmax",
        ]
        .iter(),
    ) {
        r.alias(format!("torch.{b}"), format!("ltorch.{b}"));
    }
    for f in ["linear", "softmax", "log_softmax", "gelu", "relu"] {
        r.alias(format!("torch.nn.functional.{f}"), format!("ltorch.{f}"));
    }
    r.alias("torch.Tensor.to", "ltorch.to");
    r.alias("shallow_copy", "prims.shallow_copy");
    r.alias("unpack_sequence", ops::UNPACK_SEQUENCE);
    r.alias("clear_mutable_collection", ops::CLEAR_COLLECTION);
    for (thunder, ours) in [
        ("all_reduce", ops::ALL_REDUCE),
        ("wait", ops::WAIT),
        ("pack", ops::BUCKET_PACK),
        ("unpack", ops::UNPACK),
        ("update_bucket_view", ops::UPDATE_BUCKET_VIEW),
    ] {
        r.alias(format!("torch_{thunder}_prim_impl"), ours);
        r.alias(format!("thunder.distributed.prims.{thunder}"), ours);
    }
}
