//! Writing into and reading from a tensor by a Python key, on any backend from its own kernels:
//! Thunder's `copy_with_setitem(a, key, value)` (`y[key] = value`) and `a[key]` with index
//! tensors (the value's gradient of such a write).
//!
//! - A basic key (ints, slices, `None`, `...`): the value, broadcast to `a[key]`, is padded
//!   into `a`'s shape (each slice's start before it, its step as interior padding) and taken
//!   where a padded mask of ones says.
//! - A boolean mask (the whole key): `where(mask, value, a)`, the value broadcast over the
//!   dimensions the mask leaves.
//! - Integer index tensors among whole slices (`:` and `...`): the indexed dimensions are
//!   moved to the front and `index_put` (which refuses a place written twice, as PyTorch leaves
//!   the winner unspecified) writes there; a read is an `index_select` of the flat position.
//!
//! Anything else (an index tensor next to a partial slice, an int or `None`) is refused,
//! naming the key.

use crate::exec::backend::{Backend, Input};
use crate::exec::kernel::{BinaryOp, CompareOp, Kernel, KeyItem, Side};
use tracepass_ir::DType;

use crate::exec::composer::{err, Cx, R};

/// Runs `kernel` if it is one of this module's ops.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<B::Tensor>> {
    let c = Cx { b: backend };
    Some(match kernel {
        Kernel::SetItem { key, value } => c.set_item(key, *value, inputs),
        Kernel::GetItemTensor { key } => c.get_item(key, inputs),
        _ => return None,
    })
}

fn tensor_at<'t, T>(op: &str, inputs: &[Input<'t, T>], i: usize) -> R<&'t T> {
    match inputs.get(i) {
        Some(Input::Tensor(t)) => Ok(*t),
        _ => Err(err(op, format!("input {i} must be a tensor"))),
    }
}

/// How one dimension of `a` is indexed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dim {
    /// `start`, `len` elements every `step` (an int is one element, its dimension dropped).
    Range {
        start: usize,
        len: usize,
        step: usize,
        dropped: bool,
    },
    /// By the key's `j`-th tensor.
    Tensor(usize),
}

/// A key resolved against `a`'s shape: what each dimension takes, and where `None` adds a
/// dimension (its place among the selected dimensions).
struct Resolved {
    dims: Vec<Dim>,
    new_axes: Vec<usize>,
}

fn resolve(op: &str, shape: &[usize], key: &[KeyItem]) -> R<Resolved> {
    let consumed = key
        .iter()
        .filter(|k| !matches!(k, KeyItem::NewAxis | KeyItem::Ellipsis))
        .count();
    if consumed > shape.len() {
        return Err(err(
            op,
            format!("{consumed} indices for a tensor of shape {shape:?}"),
        ));
    }
    let whole = |n: usize| Dim::Range {
        start: 0,
        len: n,
        step: 1,
        dropped: false,
    };
    let (mut dims, mut new_axes, mut tensors, mut placed) = (Vec::new(), Vec::new(), 0, 0);
    for item in key {
        match item {
            KeyItem::NewAxis => new_axes.push(placed),
            KeyItem::Ellipsis => {
                for _ in 0..shape.len() - consumed {
                    dims.push(whole(shape[dims.len()]));
                    placed += 1;
                }
            }
            KeyItem::Int(i) => {
                let n = shape[dims.len()] as i64;
                let at = if *i < 0 { i + n } else { *i };
                if at < 0 || at >= n {
                    return Err(err(
                        op,
                        format!("index {i} is out of range for a dimension of {n}"),
                    ));
                }
                dims.push(Dim::Range {
                    start: at as usize,
                    len: 1,
                    step: 1,
                    dropped: true,
                });
            }
            KeyItem::Slice([lo, hi, k]) => {
                let n = shape[dims.len()] as i64;
                let k = k.unwrap_or(1);
                if k <= 0 {
                    return Err(err(op, format!("slice step {k} must be positive")));
                }
                let clamp = |x: i64| if x < 0 { (x + n).max(0) } else { x.min(n) };
                let lo = lo.map_or(0, clamp);
                let hi = hi.map_or(n, clamp).max(lo);
                dims.push(Dim::Range {
                    start: lo as usize,
                    len: ((hi - lo + k - 1) / k) as usize,
                    step: k as usize,
                    dropped: false,
                });
                placed += 1;
            }
            KeyItem::Tensor => {
                dims.push(Dim::Tensor(tensors));
                tensors += 1;
                placed += 1;
            }
        }
    }
    while dims.len() < shape.len() {
        dims.push(whole(shape[dims.len()]));
    }
    Ok(Resolved { dims, new_axes })
}

/// The layout of an advanced-indexing key: the indexed dimensions `t` moved in front of the
/// others `o`, and whether the index's dimensions stay in place (the indexed dimensions are
/// adjacent) in `a[key]`, after `before` of the others.
struct Advanced {
    t: Vec<usize>,
    o: Vec<usize>,
    before: Option<usize>,
}

fn advanced(op: &str, r: &Resolved, shape: &[usize], key: &[KeyItem]) -> R<Advanced> {
    if !r.new_axes.is_empty() {
        return Err(err(
            op,
            format!("`None` next to index tensors is not supported, key {key:?}"),
        ));
    }
    let (mut t, mut o) = (Vec::new(), Vec::new());
    for (d, dim) in r.dims.iter().enumerate() {
        match dim {
            Dim::Tensor(_) => t.push(d),
            Dim::Range {
                start: 0,
                len,
                step: 1,
                dropped: false,
            } if *len == shape[d] => o.push(d),
            _ => {
                return Err(err(
                    op,
                    format!("index tensors go with whole slices (`:`, `...`) only, key {key:?}"),
                ))
            }
        }
    }
    let adjacent = t.windows(2).all(|w| w[1] == w[0] + 1);
    let before = adjacent.then(|| o.iter().filter(|&&d| d < t[0]).count());
    Ok(Advanced { t, o, before })
}

/// The inverse of a permutation.
fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

impl<B: Backend> Cx<'_, B> {
    fn expand(&self, x: &B::Tensor, shape: &[usize]) -> R<B::Tensor> {
        self.k(
            Kernel::Expand(shape.iter().map(|&d| d as i64).collect()),
            &[x],
        )
    }
    fn where_(&self, cond: &B::Tensor, a: &B::Tensor, b: &B::Tensor) -> R<B::Tensor> {
        let dtype = self.b.dtype(b);
        self.k(
            Kernel::Where {
                a: Side::Input(1),
                b: Side::Input(2),
                dtype,
            },
            &[cond, a, b],
        )
    }
    /// The value in `a`'s dtype (PyTorch casts what it writes).
    fn cast(&self, v: &B::Tensor, dtype: DType) -> R<B::Tensor> {
        if self.b.dtype(v) == dtype {
            self.k(Kernel::Identity, &[v])
        } else {
            self.k(Kernel::Convert(dtype), &[v])
        }
    }
    /// A value broadcast to `shape`, as PyTorch broadcasts what it writes.
    fn broadcast(&self, op: &str, v: &B::Tensor, shape: &[usize]) -> R<B::Tensor> {
        let vs = self.b.shape(v).to_vec();
        match tracepass_ir::broadcast_shapes(&vs, shape) {
            Some(b) if b == shape => self.expand(v, shape),
            _ => Err(err(
                op,
                format!("a value of shape {vs:?} does not broadcast to {shape:?}"),
            )),
        }
    }
    /// Integer indices with negative ones counted from the end of a dimension of `n`, as i64.
    fn wrapped(&self, idx: &B::Tensor, n: usize) -> R<B::Tensor> {
        let idx = self.k(Kernel::Convert(DType::I64), &[idx])?;
        let negative = self.k(
            Kernel::Compare {
                op: CompareOp::Lt,
                a: Side::Input(0),
                b: Side::Scalar(0.0),
            },
            &[&idx],
        )?;
        let shifted = self.k(
            Kernel::Binary {
                op: BinaryOp::Add,
                a: Side::Input(0),
                b: Side::Scalar(n as f64),
                alpha: 1.0,
            },
            &[&idx],
        )?;
        self.where_(&negative, &shifted, &idx)
    }

    fn set_item(
        &self,
        key: &[KeyItem],
        value: Option<f64>,
        inputs: &[Input<'_, B::Tensor>],
    ) -> R<B::Tensor> {
        const OP: &str = "copy_with_setitem";
        let a = tensor_at(OP, inputs, 0)?;
        let shape = self.b.shape(a).to_vec();
        let dtype = self.b.dtype(a);
        let first_index = if value.is_some() { 1 } else { 2 };
        let indices = (first_index..inputs.len())
            .map(|i| tensor_at(OP, inputs, i))
            .collect::<R<Vec<_>>>()?;
        let value_tensor = match value {
            Some(_) => None,
            None => Some(self.cast(tensor_at(OP, inputs, 1)?, dtype)?),
        };
        let r = resolve(OP, &shape, key)?;
        if indices.len()
            != r.dims
                .iter()
                .filter(|d| matches!(d, Dim::Tensor(_)))
                .count()
        {
            return Err(err(
                OP,
                format!("{} index tensors for key {key:?}", indices.len()),
            ));
        }
        let mask = indices.iter().position(|t| self.b.dtype(t) == DType::Bool);
        if let Some(j) = mask {
            if key.len() != 1 {
                return Err(err(
                    OP,
                    format!("a boolean mask is supported as the whole key only, key {key:?}"),
                ));
            }
            return self.set_masked(indices[j], value, value_tensor.as_ref(), a);
        }
        if indices.is_empty() {
            return self.set_basic(&r, value, value_tensor.as_ref(), a);
        }
        // integer index tensors: the indexed dimensions in front, index_put there
        let adv = advanced(OP, &r, &shape, key)?;
        let perm: Vec<usize> = adv.t.iter().chain(&adv.o).copied().collect();
        let moved = self.k(Kernel::Permute(perm.clone()), &[a])?;
        let mut common: Vec<usize> = Vec::new();
        for idx in &indices {
            common = tracepass_ir::broadcast_shapes(&common, self.b.shape(idx))
                .ok_or_else(|| err(OP, "the index tensors' shapes do not broadcast".to_string()))?;
        }
        let others: Vec<usize> = adv.o.iter().map(|&d| shape[d]).collect();
        let front: Vec<usize> = common.iter().chain(&others).copied().collect();
        let values = match (&value_tensor, value) {
            (_, Some(v)) => self.full(&front, v, dtype)?,
            (Some(v), None) => match adv.before {
                // `a[key]` keeps the index's dimensions after `b` of the others: move them
                // in front
                Some(b) if b > 0 => {
                    let m = common.len();
                    let selected: Vec<usize> = others[..b]
                        .iter()
                        .chain(&common)
                        .chain(&others[b..])
                        .copied()
                        .collect();
                    let v = self.broadcast(OP, v, &selected)?;
                    let order: Vec<usize> = (b..b + m)
                        .chain(0..b)
                        .chain(b + m..selected.len())
                        .collect();
                    self.k(Kernel::Permute(order), &[&v])?
                }
                _ => self.broadcast(OP, v, &front)?,
            },
            (None, None) => return Err(err(OP, "no value to write")),
        };
        let mut args: Vec<Input<'_, B::Tensor>> =
            vec![Input::Tensor(&moved), Input::Tensor(&values)];
        args.extend(indices.iter().map(|t| Input::Tensor(*t)));
        let written = self
            .b
            .run(&Kernel::IndexPut { accumulate: false }, &args)
            .map_err(|e| err(OP, e))?;
        self.k(Kernel::Permute(inverse(&perm)), &[&written])
    }

    /// A basic key: the value padded into `a`'s shape, taken where a padded mask of ones is.
    fn set_basic(
        &self,
        r: &Resolved,
        value: Option<f64>,
        value_tensor: Option<&B::Tensor>,
        a: &B::Tensor,
    ) -> R<B::Tensor> {
        const OP: &str = "copy_with_setitem";
        let shape = self.b.shape(a).to_vec();
        let dtype = self.b.dtype(a);
        let (mut region, mut selected, mut config) = (Vec::new(), Vec::new(), Vec::new());
        for (d, dim) in r.dims.iter().enumerate() {
            let Dim::Range {
                start,
                len,
                step,
                dropped,
            } = *dim
            else {
                return Err(err(OP, "an index tensor in a basic key"));
            };
            region.push(len);
            if !dropped {
                selected.push(len);
            }
            let end = if len == 0 {
                start
            } else {
                start + (len - 1) * step + 1
            };
            config.push((start as i64, shape[d] as i64 - end as i64, step as i64 - 1));
        }
        for &p in r.new_axes.iter().rev() {
            selected.insert(p.min(selected.len()), 1);
        }
        if region.contains(&0) {
            return self.k(Kernel::Identity, &[a]);
        }
        let block = match (value_tensor, value) {
            (_, Some(v)) => self.full(&region, v, dtype)?,
            (Some(v), None) => {
                let v = self.broadcast(OP, v, &selected)?;
                self.k(Kernel::Reshape(region.clone()), &[&v])?
            }
            (None, None) => return Err(err(OP, "no value to write")),
        };
        let pad = |value: f64, x: &B::Tensor| {
            self.k(
                Kernel::Pad {
                    value,
                    config: config.clone(),
                },
                &[x],
            )
        };
        let placed = pad(0.0, &block)?;
        let ones = self.full(&region, 1.0, DType::F32)?;
        let written = self.k(
            Kernel::Compare {
                op: CompareOp::Ne,
                a: Side::Input(0),
                b: Side::Scalar(0.0),
            },
            &[&pad(0.0, &ones)?],
        )?;
        self.where_(&written, &placed, a)
    }

    /// A boolean mask over `a`'s leading dimensions: every masked element takes the value,
    /// broadcast over the dimensions the mask leaves.
    fn set_masked(
        &self,
        mask: &B::Tensor,
        value: Option<f64>,
        value_tensor: Option<&B::Tensor>,
        a: &B::Tensor,
    ) -> R<B::Tensor> {
        const OP: &str = "copy_with_setitem";
        let shape = self.b.shape(a).to_vec();
        let ms = self.b.shape(mask).to_vec();
        if ms.len() > shape.len() || ms[..] != shape[..ms.len()] {
            return Err(err(
                OP,
                format!("mask {ms:?} does not match the leading dimensions of {shape:?}"),
            ));
        }
        let rest = &shape[ms.len()..];
        let lifted: Vec<usize> = ms.iter().copied().chain(rest.iter().map(|_| 1)).collect();
        let m = self.k(Kernel::Reshape(lifted), &[mask])?;
        let m = self.expand(&m, &shape)?;
        let values = match (value_tensor, value) {
            (_, Some(v)) => self.full(&shape, v, self.b.dtype(a))?,
            (Some(v), None) => {
                // a value for every masked element alike: leading dimensions of 1 dropped
                let vs = self.b.shape(v).to_vec();
                let cut = vs.len().saturating_sub(rest.len());
                if vs[..cut].iter().any(|&n| n != 1) {
                    return Err(err(
                        OP,
                        format!(
                            "a value of shape {vs:?} gives the masked elements different \
                             values; their number is known at run time only"
                        ),
                    ));
                }
                let v = self.k(Kernel::Reshape(vs[cut..].to_vec()), &[v])?;
                let v = self.broadcast(OP, &v, rest)?;
                self.expand(&v, &shape)?
            }
            (None, None) => return Err(err(OP, "no value to write")),
        };
        self.where_(&m, &values, a)
    }

    /// `a[key]` with integer index tensors among whole slices: the flat position of the
    /// indexed dimensions, `index_select`ed, back in `a[key]`'s layout.
    fn get_item(&self, key: &[KeyItem], inputs: &[Input<'_, B::Tensor>]) -> R<B::Tensor> {
        const OP: &str = "getitem";
        let a = tensor_at(OP, inputs, 0)?;
        let shape = self.b.shape(a).to_vec();
        let indices = (1..inputs.len())
            .map(|i| tensor_at(OP, inputs, i))
            .collect::<R<Vec<_>>>()?;
        if indices.iter().any(|t| self.b.dtype(t) == DType::Bool) {
            return Err(err(
                OP,
                "a boolean mask selects a number of elements known at run time only",
            ));
        }
        let r = resolve(OP, &shape, key)?;
        let adv = advanced(OP, &r, &shape, key)?;
        if adv.t.len() != indices.len() {
            return Err(err(
                OP,
                format!("{} index tensors for key {key:?}", indices.len()),
            ));
        }
        let mut common: Vec<usize> = Vec::new();
        for idx in &indices {
            common = tracepass_ir::broadcast_shapes(&common, self.b.shape(idx))
                .ok_or_else(|| err(OP, "the index tensors' shapes do not broadcast"))?;
        }
        let perm: Vec<usize> = adv.t.iter().chain(&adv.o).copied().collect();
        let moved = self.k(Kernel::Permute(perm), &[a])?;
        let mut position: Option<B::Tensor> = None;
        let mut stride = 1usize;
        for (idx, &d) in indices.iter().zip(&adv.t).rev() {
            let e = self.expand(idx, &common)?;
            let e = self.wrapped(&e, shape[d])?;
            let term = self.k(
                Kernel::Binary {
                    op: BinaryOp::Mul,
                    a: Side::Input(0),
                    b: Side::Scalar(stride as f64),
                    alpha: 1.0,
                },
                &[&e],
            )?;
            position = Some(match position {
                None => term,
                Some(p) => self.k(
                    Kernel::Binary {
                        op: BinaryOp::Add,
                        a: Side::Input(0),
                        b: Side::Input(1),
                        alpha: 1.0,
                    },
                    &[&p, &term],
                )?,
            });
            stride *= shape[d];
        }
        let position = position.ok_or_else(|| err(OP, "no index tensors"))?;
        let n: usize = common.iter().product();
        let position = self.k(Kernel::Reshape(vec![n]), &[&position])?;
        let others: Vec<usize> = adv.o.iter().map(|&d| shape[d]).collect();
        let flat: Vec<usize> = std::iter::once(stride)
            .chain(others.iter().copied())
            .collect();
        let flat = self.k(Kernel::Reshape(flat), &[&moved])?;
        let rows = self.k(Kernel::IndexSelect { dim: 0 }, &[&flat, &position])?;
        let front: Vec<usize> = common.iter().chain(&others).copied().collect();
        let out = self.k(Kernel::Reshape(front.clone()), &[&rows])?;
        match adv.before {
            Some(b) if b > 0 => {
                // the index's dimensions back after `b` of the others
                let m = common.len();
                let order: Vec<usize> = (m..m + b).chain(0..m).chain(m + b..front.len()).collect();
                self.k(Kernel::Permute(order), &[&out])
            }
            _ => Ok(out),
        }
    }
}
