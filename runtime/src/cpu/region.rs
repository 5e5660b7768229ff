//! A fusion region's [`FusedLoop`] on the CPU: one pass over the output in chunks of
//! [`CHUNK`] elements. Each lane operation fills a chunk-sized buffer from earlier ones (a
//! literal, and an operand read in loop order, read where they are; the last op straight into
//! the output) with a straight loop over slices (which the compiler vectorises where the op allows: arithmetic,
//! and `tanh` through `fast_math`), so the values between ops live in a few KiB of cache and
//! no tensor is made for them. Every op calls the unfused kernel's own function
//! (`elementwise::unary_into` and friends), so a region's result has the unfused ops' bits.
//! The chunk loop is compiled for this CPU's vector unit (`simd::vectorized`), and with more
//! than one thread in the rank's pool a large region is split into whole-chunk ranges that
//! run in parallel (each element computed the same way, so the bits do not change).

use super::elementwise::{binary_into, binary_scalar_into, pow_scalar_into, unary_into};
use super::real::Real;
use super::simd::vectorized;
use crate::exec::backend::Input;
use crate::exec::region::{FusedLoop, LaneOp, LaneRead};
use crate::tensor::Tensor;
use rayon::prelude::*;
use std::borrow::Cow;

/// Elements per chunk: small enough that every lane of a long region stays in L1/L2.
pub const CHUNK: usize = 256;

/// An operand as the loop reads it.
enum Source<'a> {
    Elems(Cow<'a, [f32]>),
    Number(f32),
}

/// Runs `f` on `inputs` (f32 tensors or numbers), giving the output tensor.
pub fn run_fused(f: &FusedLoop, inputs: &[Input<'_, Tensor>]) -> Result<Tensor, String> {
    let sources: smallvec::SmallVec<[Source; 8]> = inputs
        .iter()
        .map(|i| match i {
            Input::Tensor(t) => {
                if t.dtype() != tracepass_ir::DType::F32 {
                    return Err(format!("a fused region reads f32, not {}", t.dtype()));
                }
                Ok(Source::Elems(f32::elems(t)))
            }
            Input::Scalar(x) => Ok(Source::Number(f32::of(*x))),
        })
        .collect::<Result<_, _>>()?;
    // every load reads within its operand
    for op in &f.ops {
        if let LaneOp::Load { input, strides } = op {
            let Some(Source::Elems(v)) = sources.get(*input) else {
                if sources.get(*input).is_none() {
                    return Err(format!("region operand {input} is missing"));
                }
                continue;
            };
            let last: usize = f
                .dims
                .iter()
                .zip(strides)
                .map(|(&n, &s)| n.saturating_sub(1) * s)
                .sum();
            if f.numel() > 0 && last >= v.len() {
                return Err(format!(
                    "region operand {input} has {} elements, the loop reads element {last}",
                    v.len()
                ));
            }
        }
    }
    let n = f.numel();
    // the output from the buffer pool, the lanes its scratch (nothing allocated in a steady
    // step); every element of the output is written, chunk by chunk, so it is not zeroed first
    let mut out = super::buffer_pool::overwritten::<f32>(n);
    let threads = super::pool_threads();
    if threads > 1 && n >= PARALLEL_MIN {
        // whole chunks per part, so every element is computed exactly as on one thread
        let part = n.div_ceil(threads * 4).div_ceil(CHUNK) * CHUNK;
        out.par_chunks_mut(part)
            .enumerate()
            .for_each(|(i, dst)| run_range(f, &sources, i * part, dst));
    } else {
        run_range(f, &sources, 0, &mut out);
    }
    for s in sources {
        if let Source::Elems(v) = s {
            super::buffer_pool::give_cow(v);
        }
    }
    Ok(Tensor::from_f32(&f.shape, out))
}

/// Outputs smaller than this run on one thread.
const PARALLEL_MIN: usize = 1 << 16;

/// How an op reads an earlier op's value within one chunk.
enum Operand<'a> {
    Elems(&'a [f32]),
    Number(f32),
}

/// Computes loop positions `first..first + dst.len()` into `dst`, chunk by chunk, in code
/// compiled for this CPU's vector unit. A literal, and an operand read in loop order, are
/// read where they are (no lane is filled for them); the last op writes into `dst`.
fn run_range(f: &FusedLoop, sources: &[Source<'_>], first: usize, dst: &mut [f32]) {
    let mut lanes = super::buffer_pool::filled(f.ops.len() * CHUNK, 0f32);
    let last = f.ops.len() - 1;
    vectorized(
        #[inline(always)]
        || {
            let mut at = 0;
            while at < dst.len() {
                let len = CHUNK.min(dst.len() - at);
                let start = first + at;
                for (k, op) in f.ops.iter().enumerate() {
                    let (before, rest) = lanes.split_at_mut(k * CHUNK);
                    let out = if k == last {
                        &mut dst[at..at + len]
                    } else {
                        &mut rest[..len]
                    };
                    let operand = |i: usize| match f.reads[i] {
                        LaneRead::Lane => Operand::Elems(&before[i * CHUNK..i * CHUNK + len]),
                        LaneRead::Const(x) => Operand::Number(f32::of(x)),
                        LaneRead::InOrder(input) => match &sources[input] {
                            Source::Elems(v) => Operand::Elems(&v[start..start + len]),
                            Source::Number(x) => Operand::Number(*x),
                        },
                    };
                    match op {
                        LaneOp::Load { .. } | LaneOp::Const(_) if f.reads[k] != LaneRead::Lane => {}
                        LaneOp::Load { input, strides } => match &sources[*input] {
                            Source::Number(x) => out.fill(*x),
                            Source::Elems(v) => load(v, &f.dims, strides, start, out),
                        },
                        LaneOp::Const(x) => out.fill(f32::of(*x)),
                        LaneOp::Unary(u, a) => match operand(*a) {
                            Operand::Elems(v) => unary_into(*u, v, out),
                            Operand::Number(x) => {
                                let mut y = [0f32];
                                unary_into(*u, &[x], &mut y);
                                out.fill(y[0]);
                            }
                        },
                        LaneOp::Binary { op, a, b, alpha } => match (operand(*a), operand(*b)) {
                            (Operand::Elems(x), Operand::Elems(y)) => {
                                binary_into(*op, *alpha, x, y, out)
                            }
                            (Operand::Elems(x), Operand::Number(y)) => {
                                binary_scalar_into(*op, *alpha, (x, y), false, out)
                            }
                            (Operand::Number(x), Operand::Elems(y)) => {
                                binary_scalar_into(*op, *alpha, (y, x), true, out)
                            }
                            (Operand::Number(x), Operand::Number(y)) => {
                                let mut z = [0f32];
                                binary_scalar_into(*op, *alpha, (&[x], y), false, &mut z);
                                out.fill(z[0]);
                            }
                        },
                        LaneOp::PowScalar(a, e) => match operand(*a) {
                            Operand::Elems(v) => pow_scalar_into(v, *e, out),
                            Operand::Number(x) => {
                                let mut y = [0f32];
                                pow_scalar_into(&[x], *e, &mut y);
                                out.fill(y[0]);
                            }
                        },
                    }
                }
                at += len;
            }
        },
    );
    super::buffer_pool::give_scratch(lanes);
}

/// Fills `dst` with the elements of `v` at loop positions `start..start + dst.len()`, read
/// through `strides` over `shape`. (An operand read in loop order does not come here:
/// `run_range` reads it in place, as `FusedLoop::reads` says.)
fn load(v: &[f32], shape: &[usize], strides: &[usize], start: usize, dst: &mut [f32]) {
    let rank = shape.len();
    // broadcast everywhere: one value
    if strides.iter().all(|&s| s == 0) {
        dst.fill(v[0]);
        return;
    }
    // the loop index of `start`, then an odometer over the innermost dimension's runs (on the
    // stack: a region loads each broadcast input once per chunk)
    let mut idx: crate::tensor::Dims<usize> = smallvec::SmallVec::from_elem(0, rank);
    let mut rem = start;
    for d in (0..rank).rev() {
        idx[d] = rem % shape[d];
        rem /= shape[d];
    }
    let mut pos: usize = idx.iter().zip(strides).map(|(i, s)| i * s).sum();
    let inner = rank - 1;
    let (n_in, s_in) = (shape[inner], strides[inner]);
    let mut k = 0;
    while k < dst.len() {
        let run = (n_in - idx[inner]).min(dst.len() - k);
        let out = &mut dst[k..k + run];
        if s_in == 0 {
            out.fill(v[pos]);
        } else if s_in == 1 {
            out.copy_from_slice(&v[pos..pos + run]);
        } else {
            for (j, o) in out.iter_mut().enumerate() {
                *o = v[pos + j * s_in];
            }
        }
        k += run;
        pos += run * s_in;
        idx[inner] += run;
        // carry into the outer dimensions
        let mut d = inner;
        while idx[d] == shape[d] && d > 0 {
            pos -= shape[d] * strides[d];
            idx[d] = 0;
            d -= 1;
            idx[d] += 1;
            pos += strides[d];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_follow_strides_across_chunk_and_row_ends() {
        // a [3, 5] loop reading a row vector [5] (strides [0, 1]) and a column [3] ([1, 0])
        let row: Vec<f32> = (0..5).map(|x| x as f32).collect();
        let col: Vec<f32> = (0..3).map(|x| 10.0 * x as f32).collect();
        for start in 0..15 {
            for len in 1..=(15 - start) {
                let mut d = vec![0f32; len];
                load(&row, &[3, 5], &[0, 1], start, &mut d);
                let want: Vec<f32> = (start..start + len).map(|i| (i % 5) as f32).collect();
                assert_eq!(d, want, "row {start}+{len}");
                load(&col, &[3, 5], &[1, 0], start, &mut d);
                let want: Vec<f32> = (start..start + len)
                    .map(|i| 10.0 * (i / 5) as f32)
                    .collect();
                assert_eq!(d, want, "col {start}+{len}");
            }
        }
        // a transposed read: [2, 3] over a [3, 2] operand
        let t: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let mut d = vec![0f32; 6];
        load(&t, &[2, 3], &[1, 2], 0, &mut d);
        assert_eq!(d, [0., 2., 4., 1., 3., 5.]);
    }
}
