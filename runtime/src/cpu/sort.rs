//! Sorting along one dimension: `sort`, `argsort` and `topk`.
//!
//! Every order is stable: equal values keep their index order. That is PyTorch's
//! `stable=True`; for `stable=False` and for `topk`'s ties PyTorch promises no order, and a
//! stable one makes every run, rank and backend agree. NaN sorts above every number (as in
//! PyTorch: last ascending, first descending, and `topk(largest=True)` takes it first); -0.0
//! and 0.0 are equal. Floats compare exactly (as f64), integers and bools as i64.

use super::cumsum::lines;
use crate::tensor::{Elem, Tensor};
use crate::with_elem;
use std::cmp::Ordering;
use tracepass_ir::DType;

/// PyTorch's sort order of floats: NaN above everything, NaNs equal to each other.
fn cmp_f64(a: &f64, b: &f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(b).unwrap_or(Ordering::Equal),
    }
}

/// The first `take` positions of each line along `dim` in sorted order (stable; `descending`
/// reverses the comparison, not the ties), laid out as the input with `dim` resized to `take`.
fn order<K>(
    keys: &[K],
    shape: &[usize],
    dim: usize,
    descending: bool,
    take: usize,
    cmp: impl Fn(&K, &K) -> Ordering,
) -> Result<Vec<i64>, String> {
    let (outer, len, inner) = lines(shape, dim)?;
    if take > len {
        return Err(format!(
            "{take} elements asked of dimension {dim} of {shape:?}"
        ));
    }
    let mut out = vec![0i64; outer * take * inner];
    let mut line: Vec<usize> = Vec::with_capacity(len);
    for o in 0..outer {
        for i in 0..inner {
            let key = |j: usize| &keys[(o * len + j) * inner + i];
            line.clear();
            line.extend(0..len);
            // `sort_by` is stable: equal keys keep their index order in both directions
            if descending {
                line.sort_by(|&p, &q| cmp(key(q), key(p)));
            } else {
                line.sort_by(|&p, &q| cmp(key(p), key(q)));
            }
            for (r, &j) in line[..take].iter().enumerate() {
                out[(o * take + r) * inner + i] = j as i64;
            }
        }
    }
    Ok(out)
}

/// The sorted positions of `x` (see [`order`]) over any dtype the CPU backend sorts.
fn sorted_positions(
    what: &str,
    x: &Tensor,
    dim: usize,
    descending: bool,
    take: usize,
) -> Result<Vec<i64>, String> {
    let shape = x.shape();
    let r = match x.dtype() {
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 => {
            order(&x.to_f64_vec(), shape, dim, descending, take, cmp_f64)
        }
        DType::I64 | DType::I32 | DType::Bool => {
            order(&x.to_i64_vec(), shape, dim, descending, take, i64::cmp)
        }
        other => return Err(format!("{what}: dtype {other} is not supported")),
    };
    r.map_err(|e| format!("{what}: {e}"))
}

/// The output shape: `shape` with `dim` resized to `take` (a 0-d input stays 0-d).
fn resized(shape: &[usize], dim: usize, take: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    if let Some(n) = s.get_mut(dim) {
        *n = take;
    }
    s
}

/// The values of `x` at `positions` along `dim` (laid out as [`order`] gives them).
fn values_at(
    what: &str,
    x: &Tensor,
    dim: usize,
    positions: &[i64],
    take: usize,
) -> Result<Tensor, String> {
    let (outer, len, inner) = lines(x.shape(), dim)?;
    let shape = resized(x.shape(), dim, take);
    with_elem!(x.dtype(), T => {
        let v = x.elems::<T>().ok_or_else(|| format!("{what}: input storage"))?;
        let mut out = Vec::with_capacity(positions.len());
        for o in 0..outer {
            for r in 0..take {
                for i in 0..inner {
                    let j = positions[(o * take + r) * inner + i] as usize;
                    out.push(v[(o * len + j) * inner + i]);
                }
            }
        }
        Ok(Tensor::new(shape, T::wrap(out)))
    }, other => Err(format!("{what}: dtype {other} is not supported by the cpu backend")))
}

/// `torch.sort(x, dim, descending, stable=True)`: (values, i64 indices).
pub fn sort(x: &Tensor, dim: usize, descending: bool) -> Result<(Tensor, Tensor), String> {
    let len = lines(x.shape(), dim)?.1;
    let pos = sorted_positions("sort", x, dim, descending, len)?;
    let values = values_at("sort", x, dim, &pos, len)?;
    Tensor::try_new(x.shape(), crate::tensor::Storage::I64(pos)).map(|indices| (values, indices))
}

/// `torch.argsort(x, dim, descending, stable=True)`: the i64 indices of [`sort`].
pub fn argsort(x: &Tensor, dim: usize, descending: bool) -> Result<Tensor, String> {
    let len = lines(x.shape(), dim)?.1;
    let pos = sorted_positions("argsort", x, dim, descending, len)?;
    Tensor::try_new(x.shape(), crate::tensor::Storage::I64(pos))
}

/// `torch.topk(x, k, dim, largest, sorted=True)`: the `k` largest (or smallest) values along
/// `dim` and their i64 indices, largest first (smallest first), ties by lower index. A 0-d `x`
/// gives itself and index 0 for `k` 0 or 1, as PyTorch does.
pub fn topk(x: &Tensor, k: usize, dim: usize, largest: bool) -> Result<(Tensor, Tensor), String> {
    let k = if x.shape().is_empty() && k == 0 { 1 } else { k };
    let pos = sorted_positions("topk", x, dim, largest, k)?;
    let values = values_at("topk", x, dim, &pos, k)?;
    Tensor::try_new(resized(x.shape(), dim, k), crate::tensor::Storage::I64(pos))
        .map(|indices| (values, indices))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_orders_with_nan_last_as_pytorch() {
        // torch 2.9.0: sort([3, 1, 1, 2, nan, 3, -0., 0.], stable=True)
        let x = Tensor::from_f32(vec![1, 8], vec![3., 1., 1., 2., f32::NAN, 3., -0., 0.]);
        let (v, i) = sort(&x, 1, false).unwrap();
        assert_eq!(i.to_i64_vec(), vec![6, 7, 1, 2, 3, 0, 5, 4]);
        assert!(v.to_f32_vec()[7].is_nan());
        let (_, i) = sort(&x, 1, true).unwrap();
        assert_eq!(i.to_i64_vec(), vec![4, 0, 5, 3, 1, 2, 6, 7]);
        assert_eq!(
            argsort(&x, 1, true).unwrap().to_i64_vec(),
            vec![4, 0, 5, 3, 1, 2, 6, 7]
        );
        // topk([3, 1, 1, 2, nan, 3], 3) -> [nan, 3, 3] at [4, 0, 5]; smallest: [1, 1, 2]
        let y = Tensor::from_f32(vec![6], vec![3., 1., 1., 2., f32::NAN, 3.]);
        let (v, i) = topk(&y, 3, 0, true).unwrap();
        assert_eq!(i.to_i64_vec(), vec![4, 0, 5]);
        assert_eq!(v.to_f32_vec()[1..], [3., 3.]);
        let (v, i) = topk(&y, 3, 0, false).unwrap();
        assert_eq!(
            (v.to_f32_vec(), i.to_i64_vec()),
            (vec![1., 1., 2.], vec![1, 2, 3])
        );
        assert!(topk(&y, 7, 0, true).unwrap_err().contains("7 elements"));
        let ints = Tensor::from_i64(vec![4], vec![3, 1, 1, 2]);
        assert_eq!(
            argsort(&ints, 0, false).unwrap().to_i64_vec(),
            vec![1, 2, 3, 0]
        );
    }
}
