//! `fold-conv-crop`: a convolution whose only reader crops its output (a `pad` with negative
//! low and high amounts on the spatial dims) computes just the outputs it keeps.
//!
//! Thunder writes a convolution's input gradient as a "full" convolution of the output
//! gradient (padded by `dilation * (kernel - 1)`) with the flipped weight, then drops the
//! outputs that fall in the forward's padding with a negative pad: for a 3x3 convolution with
//! padding 1 on a 2x2 image, it computes 4x4 outputs and keeps 2x2, four times the work. An
//! output `i` of a convolution reads the input window starting at `i * stride - padding`, so
//! dropping the first `l` outputs is the same as padding by `padding - l * stride`; the fold
//! applies when that is not negative, equal on every dim's two sides (torch's padding is
//! symmetric), and the smaller convolution has exactly the outputs the crop kept. Every kept
//! output reads the same window, zeros included, with the same weights in the same order, so
//! it is the same sum.

use crate::pass::{Changed, PassContext, PassError, TracePass};
use tracepass_ir::{op, Arg, MetaOut, Node, OpRegistry, RewriteError, Rewriter, Trace, ValueIdSet};

/// The `fold-conv-crop` pass (trace-level).
pub struct FoldConvCrop;

/// Value `d` of a per-dim parameter of `dims` dims (`(1,)` is one value for every dim).
fn at(v: &[i64], d: usize, dims: usize) -> Option<i64> {
    match v.len() {
        1 => v.first().copied(),
        n if n == dims => v.get(d).copied(),
        _ => None,
    }
}

/// How many outputs the crop drops at the low end of each spatial dim, if `config` (a pad's
/// `[(low, high, interior), ...]` over `rank` dims) leaves the batch and channel dims alone,
/// inserts nothing, only removes, and removes something.
fn low_crops(config: &Arg, rank: usize) -> Option<Vec<i64>> {
    let dims = config.as_seq().filter(|d| d.len() == rank)?;
    let mut lows = Vec::with_capacity(rank);
    let mut removes = false;
    for (d, entry) in dims.iter().enumerate() {
        let [lo, hi, interior] = entry.as_int_list()?[..] else {
            return None;
        };
        if interior != 0 || lo > 0 || hi > 0 || (d < 2 && (lo != 0 || hi != 0)) {
            return None;
        }
        removes |= lo < 0 || hi < 0;
        if d >= 2 {
            lows.push(-lo);
        }
    }
    removes.then_some(lows)
}

/// The convolution `conv` with the padding that gives exactly the outputs `pad` keeps, if
/// there is one.
fn folded(t: &Trace, reg: &OpRegistry, conv: &Node, pad: &Node) -> Option<Node> {
    let a = conv.args();
    if !conv.kwargs().is_empty()
        || !pad.kwargs().is_empty()
        || a.len() != 9
        || a[6] != Arg::Bool(false)
    {
        return None;
    }
    let &kept = pad.outputs().first()?;
    let kept_ty = t.ty(kept)?;
    let lows = low_crops(pad.args().get(2)?, kept_ty.as_tensor()?.shape.len())?;
    let dims = lows.len();
    let (stride, padding) = (a[3].as_int_list()?, a[4].as_int_list()?);
    let mut new_padding = Vec::with_capacity(dims);
    for (d, &l) in lows.iter().enumerate() {
        let (s, pd) = (at(&stride, d, dims)?, at(&padding, d, dims)?);
        // dropping the first `l` outputs starts every window `l * stride` later
        let p2 = pd.checked_sub(l.checked_mul(s)?)?;
        if s < 1 || p2 < 0 {
            return None;
        }
        new_padding.push(Arg::Int(p2));
    }
    let same = new_padding.windows(2).all(|p| p[0] == p[1]);
    let padding_arg = match (&a[4], same) {
        (Arg::Tuple(v), true) if v.len() == 1 => Arg::Tuple(vec![new_padding[0].clone()]),
        (Arg::List(v), true) if v.len() == 1 => Arg::List(vec![new_padding[0].clone()]),
        (Arg::List(_), _) => Arg::List(new_padding),
        _ => Arg::Tuple(new_padding),
    };
    let mut args = a.to_vec();
    args[4] = padding_arg;
    // the smaller convolution must have exactly the kept outputs: the op's own shape
    // inference checks the high end of every dim (torch's padding is the same on both sides)
    match reg.infer(t, &conv.op, &args, &[]) {
        Ok(MetaOut::Types(types)) if types == [kept_ty.clone()] => {}
        _ => return None,
    }
    Some(conv.with_operands(args, vec![kept]))
}

/// Folds every crop that can be folded; returns how many.
pub fn fold_conv_crop(t: &mut Trace, reg: &OpRegistry) -> Result<usize, RewriteError> {
    let returned: ValueIdSet = t.returned_values().into_iter().collect();
    let mut rw = Rewriter::new();
    let mut folds = 0;
    for (idx, n) in t.nodes() {
        // `ltorch.convolution` and `prims.convolution`: `a, weight, bias, stride, padding,
        // dilation, transposed, output_padding, groups`
        let [out] = n.outputs()[..] else { continue };
        if !op::CONVOLUTION.matches(n) || returned.contains(&out) {
            continue;
        }
        // read by one pad, as its input and nowhere else
        let [reader] = t.users(out)[..] else { continue };
        let Some(pad) = t.node(reader).filter(|r| {
            op::PAD.matches(r)
                && r.args().first() == Some(&Arg::Value(out))
                && r.args().iter().filter(|a| **a == Arg::Value(out)).count() == 1
        }) else {
            continue;
        };
        if let Some(new) = folded(t, reg, n, pad) {
            rw.replace(idx, new);
            rw.erase(reader);
            folds += 1;
        }
    }
    rw.apply(t)?;
    Ok(folds)
}

impl TracePass for FoldConvCrop {
    fn name(&self) -> &str {
        "fold-conv-crop"
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        let n =
            fold_conv_crop(t, cx.registry).map_err(|e| PassError::rewrite("fold-conv-crop", e))?;
        cx.stat("fold-conv-crop.folded", n as u64);
        Ok((n > 0).into())
    }
}
