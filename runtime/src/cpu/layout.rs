//! Layout kernels, for every dtype: views that move no element (expand, unsqueeze, squeeze,
//! slice, split) and copies that move elements without arithmetic (pad, cat, flip, copy_).

use super::promote::promote_types;
use crate::exec::backend::Outputs;
use crate::tensor::{Dims, Elem, Tensor};
use crate::with_elem;
use tracepass_ir::DType;

/// A dimension index, negative counting from the end, checked against `rank` dims.
pub fn norm_dim(d: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let n = if d < 0 { d + r } else { d };
    if n < 0 || n >= r {
        return Err(format!(
            "dimension {d} is out of range for a tensor of rank {rank}"
        ));
    }
    Ok(n as usize)
}

/// `Tensor.expand(shape)`: size-1 dims (and new leading dims) broadcast with stride 0; `-1`
/// keeps a dim's size. A view.
pub fn expand(x: &Tensor, shape: &[i64]) -> Result<Tensor, String> {
    let (out, strides) = expand_dims(x.shape(), x.strides(), shape)?;
    x.view(out, strides, x.offset())
}

/// The shape and strides `expand` gives a view of `shape` with `strides` (the CUDA backend
/// plans its copies with it too).
pub fn expand_dims(
    xs: &[usize],
    st: &[isize],
    shape: &[i64],
) -> Result<(Dims<usize>, Dims<isize>), String> {
    if shape.len() < xs.len() {
        return Err(format!(
            "expand: the shape {shape:?} has fewer dims than the tensor's {xs:?}"
        ));
    }
    let lead = shape.len() - xs.len();
    let mut out = Dims::with_capacity(shape.len());
    let mut strides = Dims::with_capacity(shape.len());
    for (i, &want) in shape.iter().enumerate() {
        if i < lead {
            if want < 0 {
                return Err(format!(
                    "expand: size {want} is not allowed for the new leading dim {i}"
                ));
            }
            out.push(want as usize);
            strides.push(0);
            continue;
        }
        let (have, s) = (xs[i - lead], st[i - lead]);
        if want == -1 || want as usize == have && want >= 0 {
            out.push(have);
            strides.push(s);
        } else if have == 1 && want >= 0 {
            out.push(want as usize);
            strides.push(0);
        } else {
            return Err(format!(
                "expand: dim {i} of {xs:?} cannot be expanded to {want} (target {shape:?})"
            ));
        }
    }
    Ok((out, strides))
}

/// `torch.unsqueeze(x, dim)`: a new size-1 dim at `dim` (in `-rank-1..=rank`). A view.
pub fn unsqueeze(x: &Tensor, dim: i64) -> Result<Tensor, String> {
    let rank = x.shape().len();
    let d = norm_dim(dim, rank + 1)?;
    let mut shape = Dims::from(x.shape());
    let mut strides = Dims::from(x.strides());
    let s = if d < rank {
        strides[d] * shape[d] as isize
    } else {
        1
    };
    shape.insert(d, 1);
    strides.insert(d, s);
    x.view(shape, strides, x.offset())
}

/// `torch.squeeze(x, dims)`: drops the listed dims that have size 1 (others are kept, as in
/// PyTorch), or every size-1 dim when `dims` is `None`. A view.
pub fn squeeze(x: &Tensor, dims: Option<&[i64]>) -> Result<Tensor, String> {
    let rank = x.shape().len();
    let mut drop: smallvec::SmallVec<[bool; 8]> = smallvec::smallvec![false; rank];
    match dims {
        None => drop
            .iter_mut()
            .zip(x.shape())
            .for_each(|(d, &n)| *d = n == 1),
        Some(ds) => {
            for &d in ds {
                // a 0-d tensor accepts dim 0 and -1 and stays 0-d
                if rank == 0 {
                    norm_dim(d, 1)?;
                    continue;
                }
                let d = norm_dim(d, rank)?;
                drop[d] = x.shape()[d] == 1;
            }
        }
    }
    let keep = |i: &usize| !drop[*i];
    let shape: Dims<usize> = (0..rank).filter(keep).map(|i| x.shape()[i]).collect();
    let strides: Dims<isize> = (0..rank).filter(keep).map(|i| x.strides()[i]).collect();
    x.view(shape, strides, x.offset())
}

/// Thunder's `prims.slice_prim(x, start, end, strides)`: per dim `start..end` stepping by
/// `stride` (already normalized: `0 <= start <= end <= size`, `stride >= 1`). A view.
pub fn slice(
    x: &Tensor,
    start: &[i64],
    end: &[i64],
    step: Option<&[i64]>,
) -> Result<Tensor, String> {
    let rank = x.shape().len();
    let ones: Dims<i64> = Dims::from_elem(1, rank);
    let step = step.unwrap_or(&ones);
    if start.len() != rank || end.len() != rank || step.len() != rank {
        return Err(format!(
            "slice: start {start:?}, end {end:?} and strides {step:?} must each have {rank} entries for {:?}",
            x.shape()
        ));
    }
    let mut offset = x.offset() as isize;
    let mut shape = Dims::with_capacity(rank);
    let mut strides = Dims::with_capacity(rank);
    for d in 0..rank {
        let (s, e, k, n) = (start[d], end[d], step[d], x.shape()[d] as i64);
        if s < 0 || s > e || e > n || k < 1 {
            return Err(format!(
                "slice: dim {d} of {:?}: start {s}, end {e}, stride {k} is not a valid slice of {n}",
                x.shape()
            ));
        }
        let len = (e - s + k - 1) / k;
        shape.push(len as usize);
        strides.push(x.strides()[d] * k as isize);
        if len > 0 {
            offset += s as isize * x.strides()[d];
        }
    }
    x.view(shape, strides, offset.max(0) as usize)
}

/// `torch.split(x, size, dim)` with one chunk size (the last chunk may be smaller) or
/// `torch.split(x, [sizes], dim)`. Views.
pub fn split(x: &Tensor, sizes: &SplitSizes<'_>, dim: i64) -> Result<Outputs<Tensor>, String> {
    let rank = x.shape().len();
    let d = norm_dim(dim, rank)?;
    let n = x.shape()[d];
    let lens: Dims<usize> = match sizes {
        SplitSizes::Chunk(c) => {
            if *c == 0 {
                if n != 0 {
                    return Err(format!("split: chunk size 0 for a dim of size {n}"));
                }
                smallvec::smallvec![0]
            } else {
                let count = n.div_ceil(*c).max(1);
                (0..count).map(|i| (*c).min(n - i * c)).collect()
            }
        }
        SplitSizes::Sizes(v) => {
            if v.iter().sum::<usize>() != n {
                return Err(format!(
                    "split: sizes {v:?} do not add up to dim {d}'s size {n}"
                ));
            }
            Dims::from_slice(v)
        }
    };
    let mut at = 0i64;
    let mut out = Outputs::with_capacity(lens.len());
    for len in lens {
        let start: Dims<i64> = (0..rank).map(|i| if i == d { at } else { 0 }).collect();
        let mut end: Dims<i64> = x.shape().iter().map(|&s| s as i64).collect();
        end[d] = at + len as i64;
        out.push(slice(x, &start, &end, None)?);
        at += len as i64;
    }
    Ok(out)
}

/// How `split` divides a dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SplitSizes<'a> {
    Chunk(usize),
    Sizes(&'a [usize]),
}

/// `torch.cat(xs, dim)`: dtypes promoted as PyTorch does; 1-d empty tensors are skipped (the
/// legacy rule).
pub fn cat(xs: &[&Tensor], dim: i64) -> Result<Tensor, String> {
    let parts: smallvec::SmallVec<[&Tensor; 8]> =
        xs.iter().copied().filter(|t| t.shape() != [0]).collect();
    let Some(first) = parts.first() else {
        let d = xs.first().map_or(DType::F32, |t| t.dtype());
        return Tensor::zeros([0], d).ok_or_else(|| format!("cat: dtype {d} not held"));
    };
    let rank = first.shape().len();
    if rank == 0 {
        return Err("cat: zero-dimensional tensors cannot be concatenated".into());
    }
    let d = norm_dim(dim, rank)?;
    let mut dtype = first.dtype();
    let mut total = 0;
    for (i, t) in parts.iter().enumerate() {
        let ok = t.shape().len() == rank
            && (0..rank).all(|k| k == d || t.shape()[k] == first.shape()[k]);
        if !ok {
            return Err(format!(
                "cat: tensor {i} has shape {:?}, which does not fit {:?} along dim {d}",
                t.shape(),
                first.shape()
            ));
        }
        dtype = promote_types(dtype, t.dtype());
        total += t.shape()[d];
    }
    let outer: usize = first.shape()[..d].iter().product();
    let inner: usize = first.shape()[d + 1..].iter().product();
    let mut shape = Dims::from_slice(first.shape());
    shape[d] = total;
    with_elem!(dtype, T => {
        let conv: smallvec::SmallVec<[Tensor; 8]> = parts
            .iter()
            .map(|t| convert(t, dtype))
            .collect::<Result<_, _>>()?;
        let elems: smallvec::SmallVec<[_; 8]> = conv
            .iter()
            .map(|t| t.elems::<T>().ok_or("cat: dtype conversion failed"))
            .collect::<Result<_, _>>()?;
        let mut out: Vec<T> = crate::cpu::buffer_pool::take(outer * total * inner);
        for o in 0..outer {
            for (t, e) in conv.iter().zip(&elems) {
                let block = t.shape()[d] * inner;
                out.extend_from_slice(&e[o * block..(o + 1) * block]);
            }
        }
        elems.into_iter().for_each(crate::cpu::buffer_pool::give_cow);
        Ok(Tensor::new(shape, T::wrap(out)))
    }, other => Err(format!("cat: dtype {other} is not supported by the cpu backend")))
}

/// The tensor in `dtype` (shared when it already is).
pub(crate) fn convert(t: &Tensor, dtype: DType) -> Result<Tensor, String> {
    if t.dtype() == dtype {
        Ok(t.clone())
    } else {
        t.to_dtype(dtype)
            .ok_or_else(|| format!("cannot convert {} to {dtype}", t.dtype()))
    }
}

/// Thunder's `prims.pad(x, value, config)`: per dim `(lo, hi, interior)`, `interior` elements
/// between neighbours first, then `lo`/`hi` at the ends (negative crops).
pub fn pad(x: &Tensor, value: f64, config: &[(i64, i64, i64)]) -> Result<Tensor, String> {
    let xs = x.shape();
    let rank = xs.len();
    if config.len() != rank {
        return Err(format!(
            "pad: {} (lo, hi, interior) triples for a tensor of rank {rank} ({xs:?})",
            config.len()
        ));
    }
    let mut shape = Dims::with_capacity(rank);
    for (d, (&n, &(lo, hi, interior))) in xs.iter().zip(config).enumerate() {
        if interior < 0 {
            return Err(format!(
                "pad: dim {d} has negative interior padding {interior}"
            ));
        }
        let n = n as i64;
        let len = lo + hi + n + (n - 1).max(0) * interior;
        if len < 0 {
            return Err(format!(
                "pad: dim {d} of size {n} padded by ({lo}, {hi}, {interior}) has negative size {len}"
            ));
        }
        shape.push(len as usize);
    }
    with_elem!(x.dtype(), T => Ok(pad_typed::<T>(x, T::from_f64(value), config, shape)),
        other => Err(format!("pad: dtype {other} is not supported by the cpu backend")))
}

fn pad_typed<T: Elem>(
    x: &Tensor,
    value: T,
    config: &[(i64, i64, i64)],
    shape: Dims<usize>,
) -> Tensor {
    let n_out: usize = shape.iter().product();
    let mut out = crate::cpu::buffer_pool::filled(n_out, value);
    let src = match x.elems::<T>() {
        Some(s) => s,
        None => return Tensor::new(shape, T::wrap(out)),
    };
    let xs = x.shape();
    let rank = xs.len();
    if rank == 0 || x.numel() == 0 || n_out == 0 {
        if rank == 0 && n_out == 1 && !src.is_empty() {
            out[0] = src[0];
        }
        return Tensor::new(shape, T::wrap(out));
    }
    let ostr = crate::tensor::contiguous_strides(&shape);
    // input index `i` along dim `d`: its output index, if inside the output
    let place = |d: usize, i: usize| -> Option<usize> {
        let (lo, _, interior) = config[d];
        let o = lo + i as i64 * (interior + 1);
        (o >= 0 && o < shape[d] as i64).then_some(o as usize)
    };
    let inner = xs[rank - 1];
    let outer = x.numel() / inner;
    let mut idx: Dims<usize> = Dims::from_elem(0, rank - 1);
    let contiguous_last = config[rank - 1].2 == 0;
    for k in 0..outer {
        if k > 0 {
            for d in (0..rank - 1).rev() {
                idx[d] += 1;
                if idx[d] < xs[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        let mut base = 0usize;
        let mut inside = true;
        for d in 0..rank - 1 {
            match place(d, idx[d]) {
                Some(o) => base += o * ostr[d] as usize,
                None => {
                    inside = false;
                    break;
                }
            }
        }
        if !inside {
            continue;
        }
        let row = &src[k * inner..(k + 1) * inner];
        if contiguous_last {
            // the kept part of the row is one run
            let lo = config[rank - 1].0;
            let first = (-lo).max(0) as usize;
            let stop = ((shape[rank - 1] as i64 - lo).max(0) as usize).min(inner);
            if first < stop {
                let o = base + (lo + first as i64) as usize;
                out[o..o + stop - first].copy_from_slice(&row[first..stop]);
            }
        } else {
            for (j, &e) in row.iter().enumerate() {
                if let Some(o) = place(rank - 1, j) {
                    out[base + o] = e;
                }
            }
        }
    }
    crate::cpu::buffer_pool::give_cow(src);
    Tensor::new(shape, T::wrap(out))
}

/// `torch.flip(x, dims)`: a contiguous copy with the listed dims reversed.
pub fn flip(x: &Tensor, dims: &[i64]) -> Result<Tensor, String> {
    let rank = x.shape().len();
    let mut strides = Dims::from_slice(x.strides());
    let mut offset = x.offset() as isize;
    let mut seen: Dims<bool> = Dims::from_elem(false, rank);
    for &d in dims {
        let d = norm_dim(d, rank)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(format!("flip: dim {d} is listed twice in {dims:?}"));
        }
        if x.shape()[d] > 0 {
            offset += (x.shape()[d] as isize - 1) * strides[d];
        }
        strides[d] = -strides[d];
    }
    if x.numel() == 0 {
        return Ok(x.contiguous());
    }
    Ok(x.view(x.shape(), strides, offset as usize)?.contiguous())
}

/// Thunder's `copy_(src, dst)` as a value: `src` broadcast to `dst`'s shape and cast to its
/// dtype, contiguous (the caller rebinds `dst` to it).
pub fn copy_into(src: &Tensor, dst: &Tensor) -> Result<Tensor, String> {
    let shape: Dims<i64> = dst.shape().iter().map(|&s| s as i64).collect();
    let e = expand(src, &shape).map_err(|e| format!("copy_: {e}"))?;
    // storage is immutable and shared, so the result may alias `src`
    Ok(convert(&e, dst.dtype())?.contiguous())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iota(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_f32(shape, (0..n).map(|i| i as f32).collect())
    }

    #[test]
    fn expand_unsqueeze_squeeze_are_views() {
        let x = iota(&[3]);
        let u = unsqueeze(&x, 0).expect("ok");
        assert_eq!(u.shape(), &[1, 3]);
        let e = expand(&u, &[2, -1]).expect("ok");
        assert_eq!(e.to_f32_vec(), vec![0., 1., 2., 0., 1., 2.]);
        assert!(std::sync::Arc::ptr_eq(e.storage_arc(), x.storage_arc()));
        let c = unsqueeze(&x, -1).expect("ok");
        assert_eq!(c.shape(), &[3, 1]);
        let e = expand(&c, &[2, 3, 2]).expect("ok");
        assert_eq!(
            e.to_f32_vec(),
            vec![0., 0., 1., 1., 2., 2., 0., 0., 1., 1., 2., 2.]
        );
        assert!(expand(&x, &[2, 4]).is_err());
        assert!(expand(&x, &[3, -1, 3]).is_err());
        assert!(unsqueeze(&x, 2).is_err());
        let s = squeeze(&e.contiguous().reshape([2, 1, 3, 1, 2]).expect("ok"), None).expect("ok");
        assert_eq!(s.shape(), &[2, 3, 2]);
        let s = squeeze(&iota(&[1, 2, 1]), Some(&[0, 1])).expect("ok");
        assert_eq!(s.shape(), &[2, 1]);
        let b = Tensor::from_bool(vec![2], vec![true, false]);
        let b2 = expand(&unsqueeze(&b, 0).expect("ok"), &[2, 2]).expect("ok");
        assert_eq!(b2.to_bool_vec(), vec![true, false, true, false]);
    }

    #[test]
    fn slice_and_split_match_python_slicing() {
        let x = iota(&[4, 5]);
        let s = slice(&x, &[1, 0], &[4, 5], Some(&[2, 2])).expect("ok");
        assert_eq!(s.shape(), &[2, 3]);
        assert_eq!(s.to_f32_vec(), vec![5., 7., 9., 15., 17., 19.]);
        let e = slice(&x, &[2, 3], &[2, 5], None).expect("ok");
        assert_eq!(e.shape(), &[0, 2]);
        assert!(slice(&x, &[0, 0], &[5, 5], None).is_err());
        assert!(slice(&x, &[0, 0], &[4, 5], Some(&[1, 0])).is_err());
        let parts = split(&x, &SplitSizes::Chunk(2), 1).expect("ok");
        assert_eq!(
            parts.iter().map(|p| p.shape()[1]).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        assert_eq!(parts[2].to_f32_vec(), vec![4., 9., 14., 19.]);
        let parts = split(&x, &SplitSizes::Sizes(&[1, 3]), -2).expect("ok");
        assert_eq!(
            parts[1].to_f32_vec(),
            (5..20).map(|i| i as f32).collect::<Vec<_>>()
        );
        assert!(split(&x, &SplitSizes::Sizes(&[1, 2]), 0).is_err());
        // cat undoes split
        let refs: Vec<&Tensor> = parts.iter().collect();
        assert!(cat(&refs, 0).expect("ok").bitwise_eq(&x));
    }

    #[test]
    fn cat_joins_along_any_dim_and_promotes() {
        let a = iota(&[2, 2]);
        let b = Tensor::from_i64(vec![2, 1], vec![7, 8]);
        let c = cat(&[&a, &b], 1).expect("ok");
        assert_eq!(c.dtype(), DType::F32);
        assert_eq!(c.to_f32_vec(), vec![0., 1., 7., 2., 3., 8.]);
        let empty = Tensor::from_f32(vec![0], vec![]);
        assert!(cat(&[&empty, &a], 0).expect("ok").bitwise_eq(&a));
        assert!(cat(&[&a, &iota(&[3, 3])], 0).is_err());
        // a transposed operand is read in its logical order
        let t = a.permute(&[1, 0]).expect("2-d");
        assert_eq!(
            cat(&[&t, &a], 0).expect("ok").to_f32_vec(),
            vec![0., 2., 1., 3., 0., 1., 2., 3.]
        );
    }

    /// Pads by the definition: every input element lands at lo + i * (interior + 1).
    fn naive_pad(
        x: &[f32],
        shape: &[usize],
        v: f32,
        cfg: &[(i64, i64, i64)],
    ) -> (Vec<usize>, Vec<f32>) {
        let out: Vec<usize> = shape
            .iter()
            .zip(cfg)
            .map(|(&n, &(l, h, i))| (l + h + n as i64 + (n as i64 - 1).max(0) * i) as usize)
            .collect();
        let mut o = vec![v; out.iter().product()];
        let ost = crate::tensor::contiguous_strides(&out);
        let ist = crate::tensor::contiguous_strides(shape);
        for (k, &e) in x.iter().enumerate() {
            let mut pos = 0i64;
            let mut inside = true;
            for d in 0..shape.len() {
                let i = (k as isize / ist[d]) as usize % shape[d];
                let p = cfg[d].0 + i as i64 * (cfg[d].2 + 1);
                inside &= p >= 0 && p < out[d] as i64;
                pos += p * ost[d] as i64;
            }
            if inside {
                o[pos as usize] = e;
            }
        }
        (out, o)
    }

    #[test]
    fn pad_matches_the_definition_with_negative_and_interior_padding() {
        let x = iota(&[2, 3, 4]);
        let v = x.to_f32_vec();
        for cfg in [
            vec![(0, 0, 0), (1, 1, 0), (1, 1, 0)],
            vec![(0, 0, 0), (-1, -1, 0), (-1, 2, 0)],
            vec![(1, 0, 1), (0, -2, 2), (2, -3, 1)],
            vec![(0, 0, 0), (0, 0, 0), (-2, 1, 3)],
        ] {
            let got = pad(&x, -1.0, &cfg).expect("ok");
            let (shape, want) = naive_pad(&v, x.shape(), -1.0, &cfg);
            assert_eq!(got.shape(), &shape[..], "{cfg:?}");
            assert_eq!(got.to_f32_vec(), want, "{cfg:?}");
        }
        // the cnn backward's crop: 10 x 10 -> 8 x 8
        let y = iota(&[1, 1, 10, 10]);
        let c = pad(&y, 0.0, &[(0, 0, 0), (0, 0, 0), (-1, -1, 0), (-1, -1, 0)]).expect("ok");
        assert_eq!(c.shape(), &[1, 1, 8, 8]);
        assert_eq!(c.to_f32_vec()[..3], [11., 12., 13.]);
        assert!(pad(&x, 0.0, &[(0, 0, 0)]).is_err());
        assert!(pad(&x, 0.0, &[(0, 0, 0), (-4, 0, 0), (0, 0, 0)]).is_err());
        let i = pad(&Tensor::from_i64(vec![2], vec![5, 6]), 9.0, &[(1, 0, 1)]).expect("ok");
        assert_eq!(i.to_i64_vec(), vec![9, 5, 9, 6]);
    }

    #[test]
    fn flip_reverses_dims_and_copy_into_casts_and_broadcasts() {
        let x = iota(&[2, 2, 3]);
        let f = flip(&x, &[0, 2]).expect("ok");
        assert_eq!(
            f.to_f32_vec(),
            vec![8., 7., 6., 11., 10., 9., 2., 1., 0., 5., 4., 3.]
        );
        assert!(flip(&x, &[1, -2]).is_err());
        assert!(flip(&flip(&x, &[1]).expect("ok"), &[1])
            .expect("ok")
            .bitwise_eq(&x));
        let dst = Tensor::from_i64(vec![2, 2], vec![0; 4]);
        let src = Tensor::from_f32(vec![2], vec![1.9, -2.5]);
        let c = copy_into(&src, &dst).expect("ok");
        assert_eq!(c.dtype(), DType::I64);
        assert_eq!(c.to_i64_vec(), vec![1, -2, 1, -2]);
        assert!(copy_into(&iota(&[3]), &dst).is_err());
    }
}
