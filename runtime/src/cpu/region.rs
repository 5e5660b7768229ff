//! A fusion region's [`FusedLoop`] on the CPU: one pass over the output in chunks of
//! [`CHUNK`] elements. Each lane operation fills a chunk-sized buffer from earlier ones with a
//! straight loop over slices (which the compiler vectorises where the op allows: arithmetic,
//! and `tanh` through `fast_math`), so the values between ops live in a few KiB of cache and
//! no tensor is made for them. Every op calls the unfused kernel's own function
//! (`elementwise::unary_into` and friends), so a region's result has the unfused ops' bits.

use super::elementwise::{binary_into, pow_scalar_into, unary_into};
use super::real::Real;
use crate::exec::backend::Input;
use crate::exec::region::{FusedLoop, LaneOp};
use crate::tensor::Tensor;
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
    let sources: Vec<Source> = inputs
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
                .shape
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
    // the output from the buffer pool, the lanes its scratch (nothing allocated in a steady step)
    let mut out = super::buffer_pool::filled(n, 0f32);
    let mut lanes = super::buffer_pool::filled(f.ops.len() * CHUNK, 0f32);
    let mut start = 0;
    while start < n {
        let len = CHUNK.min(n - start);
        for (k, op) in f.ops.iter().enumerate() {
            let (before, rest) = lanes.split_at_mut(k * CHUNK);
            let dst = &mut rest[..len];
            let lane = |i: usize| &before[i * CHUNK..i * CHUNK + len];
            match op {
                LaneOp::Load { input, strides } => match &sources[*input] {
                    Source::Number(x) => dst.fill(*x),
                    Source::Elems(v) => load(v, &f.shape, strides, start, dst),
                },
                LaneOp::Const(x) => dst.fill(f32::of(*x)),
                LaneOp::Unary(u, a) => unary_into(*u, lane(*a), dst),
                LaneOp::Binary { op, a, b, alpha } => {
                    binary_into(*op, *alpha, lane(*a), lane(*b), dst)
                }
                LaneOp::PowScalar(a, e) => pow_scalar_into(lane(*a), *e, dst),
            }
        }
        let last = (f.ops.len() - 1) * CHUNK;
        out[start..start + len].copy_from_slice(&lanes[last..last + len]);
        start += len;
    }
    super::buffer_pool::give_scratch(lanes);
    for s in sources {
        if let Source::Elems(v) = s {
            super::buffer_pool::give_cow(v);
        }
    }
    Ok(Tensor::from_f32(f.shape.clone(), out))
}

/// Fills `dst` with the elements of `v` at loop positions `start..start + dst.len()`, read
/// through `strides` over `shape`.
fn load(v: &[f32], shape: &[usize], strides: &[usize], start: usize, dst: &mut [f32]) {
    let rank = shape.len();
    // contiguous over the loop: a copy; broadcast everywhere: one value
    let mut contiguous = true;
    let mut step = 1usize;
    for d in (0..rank).rev() {
        if shape[d] != 1 && strides[d] != step {
            contiguous = false;
        }
        step *= shape[d];
    }
    if contiguous {
        dst.copy_from_slice(&v[start..start + dst.len()]);
        return;
    }
    if strides.iter().all(|&s| s == 0) {
        dst.fill(v[0]);
        return;
    }
    // the loop index of `start`, then an odometer over the innermost dimension's runs
    let mut idx = vec![0usize; rank];
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
