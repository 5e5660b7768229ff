//! Indexing along one dimension: `gather` and its backward `scatter_add`, `index_select` and
//! its backward `index_add`, with PyTorch 2.9's operand checks and messages.
//!
//! Gathers copy elements, exact in every dtype. The adds accumulate in f32 for f32, bf16 and
//! f16 (f64 for f64, wrapping i64 for integers), each element's contributions in index order
//! (PyTorch's CPU order), and round once to the dtype; the CUDA kernels add in the same order,
//! so both backends give the same bits.

use super::cumsum::lines;
use crate::tensor::{Elem, Tensor};
use crate::with_elem;
use tracepass_ir::DType;

/// The values of an index tensor (i64 or i32, the dtypes PyTorch takes).
fn index_values(what: &str, index: &Tensor) -> Result<Vec<i64>, String> {
    match index.dtype() {
        DType::I64 | DType::I32 => Ok(index.to_i64_vec()),
        other => Err(format!(
            "{what}: the index must be an i64 or i32 tensor, got {other}"
        )),
    }
}

/// Every index in `0..size`: PyTorch refuses negative indices in these ops. The error names
/// the first bad one, as PyTorch's does.
pub(crate) fn check_indices(
    what: &str,
    idx: &[i64],
    dim: usize,
    size: usize,
) -> Result<(), String> {
    match idx
        .iter()
        .find(|&&i| usize::try_from(i).map_or(true, |j| j >= size))
    {
        Some(bad) => Err(format!(
            "{what}: index {bad} is out of bounds for dimension {dim} with size {size}"
        )),
        None => Ok(()),
    }
}

/// The size of dimension `dim` of `shape` (1 for a 0-d tensor, which has one slice).
fn dim_size(shape: &[usize], dim: usize) -> usize {
    shape.get(dim).copied().unwrap_or(1)
}

/// `index` has the rank of `a` and is no larger than it in every dimension but `dim`
/// (`gather`'s and `scatter_add`'s rule).
pub(crate) fn check_gather(
    what: &str,
    a: &[usize],
    index: &[usize],
    dim: usize,
) -> Result<(), String> {
    if index.len() != a.len() {
        return Err(format!(
            "{what}: index {index:?} must have the rank of the input {a:?}"
        ));
    }
    if dim >= a.len().max(1) {
        return Err(format!("{what}: dimension {dim} is out of range for {a:?}"));
    }
    if let Some(d) = (0..a.len()).find(|&d| d != dim && index[d] > a[d]) {
        return Err(format!(
            "{what}: index {index:?} is larger than the input {a:?} in dimension {d}"
        ));
    }
    Ok(())
}

/// `scatter_add`'s operands: `src` of `a`'s dtype, `index` as in [`check_gather`] and no larger
/// than `src` in any dimension.
pub(crate) fn check_scatter(
    a: (&[usize], DType),
    index: &[usize],
    src: (&[usize], DType),
    dim: usize,
) -> Result<(), String> {
    if src.1 != a.1 {
        return Err(format!(
            "scatter_add: src is {}, the input {}; they must agree",
            src.1, a.1
        ));
    }
    check_gather("scatter_add", a.0, index, dim)?;
    if src.0.len() != index.len() || index.iter().zip(src.0).any(|(i, s)| i > s) {
        return Err(format!(
            "scatter_add: index {index:?} must have the rank of src {:?} and be no larger",
            src.0
        ));
    }
    Ok(())
}

/// The number of indices of an index vector (1-d, or 0-d for one index).
pub(crate) fn index_vector(what: &str, index: &[usize]) -> Result<usize, String> {
    match index {
        [] => Ok(1),
        [n] => Ok(*n),
        other => Err(format!(
            "{what}: the index must be a vector (0-d or 1-d), got shape {other:?}"
        )),
    }
}

/// `index_select`'s output shape: `a`'s with `dim` resized to `n` indices (a 0-d `a` takes one
/// index and stays 0-d).
pub(crate) fn index_select_shape(a: &[usize], dim: usize, n: usize) -> Result<Vec<usize>, String> {
    if a.is_empty() && dim == 0 {
        return if n == 1 {
            Ok(Vec::new())
        } else {
            Err(format!(
                "index_select: a 0-d input takes one index, got {n}"
            ))
        };
    }
    if dim >= a.len() {
        return Err(format!(
            "index_select: dimension {dim} is out of range for {a:?}"
        ));
    }
    let mut shape = a.to_vec();
    shape[dim] = n;
    Ok(shape)
}

/// `index_add`'s operands: `source` of `a`'s dtype and of `a`'s shape with `dim` resized to
/// the `n` indices.
pub(crate) fn check_index_add(
    a: (&[usize], DType),
    dim: usize,
    n: usize,
    source: (&[usize], DType),
) -> Result<(), String> {
    if source.1 != a.1 {
        return Err(format!(
            "index_add: source is {}, the input {}; they must agree",
            source.1, a.1
        ));
    }
    let want =
        index_select_shape(a.0, dim, n).map_err(|e| e.replace("index_select", "index_add"))?;
    if source.0 != want.as_slice() {
        return Err(format!(
            "index_add: source {:?} must be the input {:?} with dimension {dim} of size {n} \
             (the number of indices): {want:?}",
            source.0, a.0
        ));
    }
    Ok(())
}

/// Row-major strides of a shape, in elements.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// For each position of `shape` in row-major order, its offset under `strides`, dimension
/// `skip` left out (the one an index replaces).
fn offsets(shape: &[usize], strides: &[usize], skip: Option<usize>) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut at = vec![0usize; shape.len()];
    for _ in 0..n {
        out.push(
            at.iter()
                .enumerate()
                .filter(|(d, _)| Some(*d) != skip)
                .map(|(d, c)| c * strides[d])
                .sum(),
        );
        for d in (0..shape.len()).rev() {
            at[d] += 1;
            if at[d] < shape[d] {
                break;
            }
            at[d] = 0;
        }
    }
    out
}

/// The elements of `a` at `positions` (row-major offsets into `a`), as a tensor of `shape`.
fn pick(what: &str, a: &Tensor, positions: &[usize], shape: Vec<usize>) -> Result<Tensor, String> {
    with_elem!(a.dtype(), T => {
        let v = a.elems::<T>().ok_or_else(|| format!("{what}: input storage"))?;
        Ok(Tensor::new(shape, T::wrap(positions.iter().map(|&p| v[p]).collect())))
    }, other => Err(format!("{what}: dtype {other} is not supported by the cpu backend")))
}

/// `a` with `src[s]` added at `a[d]` for each `(d, s)` of `pairs`, in that order: in f32 for
/// f32, bf16 and f16, f64 for f64, wrapping i64 for i64 and i32; rounded once to `a`'s dtype.
fn accumulate(
    what: &str,
    a: &Tensor,
    src: &Tensor,
    pairs: impl Iterator<Item = (usize, usize)>,
) -> Result<Tensor, String> {
    let shape: crate::tensor::Dims<usize> = a.shape().into();
    let round = |t: Tensor| {
        t.to_dtype(a.dtype())
            .ok_or_else(|| format!("{what}: cannot round to {}", a.dtype()))
    };
    match a.dtype() {
        DType::F64 => {
            let (mut acc, s) = (a.to_f64_vec(), src.to_f64_vec());
            pairs.for_each(|(d, k)| acc[d] += s[k]);
            Ok(Tensor::from_f64(shape, acc))
        }
        DType::F32 | DType::BF16 | DType::F16 => {
            let (mut acc, s) = (a.to_f32_vec(), src.to_f32_vec());
            pairs.for_each(|(d, k)| acc[d] += s[k]);
            round(Tensor::from_f32(shape, acc))
        }
        DType::I64 | DType::I32 => {
            let (mut acc, s) = (a.to_i64_vec(), src.to_i64_vec());
            pairs.for_each(|(d, k)| acc[d] = acc[d].wrapping_add(s[k]));
            round(Tensor::from_i64(shape, acc))
        }
        other => Err(format!(
            "{what}: dtype {other} is not supported (the cpu backend adds floats and integers)"
        )),
    }
}

/// `torch.gather(a, dim, index)`: `out[p] = a[p with dimension dim set to index[p]]`, shaped
/// like `index`.
pub fn gather(a: &Tensor, dim: usize, index: &Tensor) -> Result<Tensor, String> {
    check_gather("gather", a.shape(), index.shape(), dim)?;
    let idx = index_values("gather", index)?;
    check_indices("gather", &idx, dim, dim_size(a.shape(), dim))?;
    let sa = strides(a.shape());
    let step = sa.get(dim).copied().unwrap_or(1);
    let base = offsets(index.shape(), &sa, Some(dim));
    let positions: Vec<usize> = base
        .iter()
        .zip(&idx)
        .map(|(b, &i)| b + i as usize * step)
        .collect();
    pick("gather", a, &positions, index.shape().to_vec())
}

/// `torch.scatter_add(a, dim, index, src)`: `a`, plus `src[p]` added at `a[p with dimension
/// dim set to index[p]]` for every position `p` of `index` (duplicates accumulate).
pub fn scatter_add(a: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<Tensor, String> {
    check_scatter(
        (a.shape(), a.dtype()),
        index.shape(),
        (src.shape(), src.dtype()),
        dim,
    )?;
    let idx = index_values("scatter_add", index)?;
    check_indices("scatter_add", &idx, dim, dim_size(a.shape(), dim))?;
    let sa = strides(a.shape());
    let step = sa.get(dim).copied().unwrap_or(1);
    let base = offsets(index.shape(), &sa, Some(dim));
    let from = offsets(index.shape(), &strides(src.shape()), None);
    let pairs = base
        .iter()
        .zip(&idx)
        .zip(&from)
        .map(|((b, &i), &s)| (b + i as usize * step, s));
    accumulate("scatter_add", a, src, pairs)
}

/// `torch.index_select(a, dim, index)`: the slices `index[0], index[1], ...` of `a` along
/// `dim`.
pub fn index_select(a: &Tensor, dim: usize, index: &Tensor) -> Result<Tensor, String> {
    let n = index_vector("index_select", index.shape())?;
    let shape = index_select_shape(a.shape(), dim, n)?;
    let idx = index_values("index_select", index)?;
    let (outer, len, inner) = lines(a.shape(), dim)?;
    check_indices("index_select", &idx, dim, len)?;
    let mut positions = Vec::with_capacity(outer * n * inner);
    for o in 0..outer {
        for &i in &idx {
            let at = (o * len + i as usize) * inner;
            positions.extend(at..at + inner);
        }
    }
    pick("index_select", a, &positions, shape)
}

/// `torch.index_add(a, dim, index, source)`: `a`, plus slice `i` of `source` added to slice
/// `index[i]` along `dim` for every `i` (duplicates accumulate).
pub fn index_add(
    a: &Tensor,
    dim: usize,
    index: &Tensor,
    source: &Tensor,
) -> Result<Tensor, String> {
    let m = index_vector("index_add", index.shape())?;
    check_index_add(
        (a.shape(), a.dtype()),
        dim,
        m,
        (source.shape(), source.dtype()),
    )?;
    let idx = index_values("index_add", index)?;
    let (outer, len, inner) = lines(a.shape(), dim)?;
    check_indices("index_add", &idx, dim, len)?;
    let pairs = (0..outer).flat_map(|o| {
        let idx = &idx;
        (0..m).flat_map(move |i| {
            let (to, from) = ((o * len + idx[i] as usize) * inner, (o * m + i) * inner);
            (0..inner).map(move |r| (to + r, from + r))
        })
    });
    accumulate("index_add", a, source, pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_and_scatter_add_follow_pytorch() {
        // torch 2.9.0: gather(x, 1, [[1, 1, 3], [0, 2, 2]]) of x = arange(8).reshape(2, 4)
        let x = Tensor::from_f32(vec![2, 4], (0..8).map(|v| v as f32).collect());
        let i = Tensor::from_i64(vec![2, 3], vec![1, 1, 3, 0, 2, 2]);
        let g = gather(&x, 1, &i).unwrap();
        assert_eq!(g.shape(), &[2, 3]);
        assert_eq!(g.to_f32_vec(), vec![1., 1., 3., 4., 6., 6.]);
        // scatter_add accumulates duplicates: [[0, 2, 0, 1], [1, 0, 2, 0]] for ones
        let z = Tensor::zeros(vec![2, 4], DType::F32).unwrap();
        let ones = Tensor::from_f32(vec![2, 3], vec![1.0; 6]);
        let s = scatter_add(&z, 1, &i, &ones).unwrap();
        assert_eq!(s.to_f32_vec(), vec![0., 2., 0., 1., 1., 0., 2., 0.]);
        let e = gather(&x, 1, &Tensor::from_i64(vec![1, 1], vec![-1])).unwrap_err();
        assert_eq!(
            e,
            "gather: index -1 is out of bounds for dimension 1 with size 4"
        );
        let e = scatter_add(&z, 1, &Tensor::from_i64(vec![1, 1], vec![4]), &ones).unwrap_err();
        assert_eq!(
            e,
            "scatter_add: index 4 is out of bounds for dimension 1 with size 4"
        );
    }

    #[test]
    fn index_select_and_index_add_follow_pytorch() {
        let x = Tensor::from_i64(vec![3, 2], vec![0, 1, 2, 3, 4, 5]);
        let i = Tensor::from_i64(vec![4], vec![2, 0, 2, 1]);
        let s = index_select(&x, 0, &i).unwrap();
        assert_eq!(s.to_i64_vec(), vec![4, 5, 0, 1, 4, 5, 2, 3]);
        let one = index_select(&x, 1, &Tensor::from_i64(vec![], vec![1])).unwrap();
        assert_eq!(
            (one.shape(), one.to_i64_vec()),
            (&[3, 1][..], vec![1, 3, 5])
        );
        let a = index_add(&x, 0, &i, &s).unwrap();
        // rows 2 (twice), 0 and 1 added to themselves
        assert_eq!(a.to_i64_vec(), vec![0, 2, 4, 6, 12, 15]);
        let e = index_select(&x, 0, &Tensor::from_i64(vec![1], vec![3])).unwrap_err();
        assert_eq!(
            e,
            "index_select: index 3 is out of bounds for dimension 0 with size 3"
        );
    }
}
