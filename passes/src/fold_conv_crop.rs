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
use tracepass_ir::{op, Arg, NodeIndex, RewriteError, Rewriter, Trace, ValueIdSet};

/// The `fold-conv-crop` pass (trace-level).
pub struct FoldConvCrop;

/// A per-dim parameter's values (`(1,)` is one value for every dim).
fn ints(a: &Arg) -> Option<Vec<i64>> {
    match a {
        Arg::Tuple(v) | Arg::List(v) => v
            .iter()
            .map(|x| match x {
                Arg::Int(i) => Some(*i),
                _ => None,
            })
            .collect(),
        Arg::Int(i) => Some(vec![*i]),
        _ => None,
    }
}

/// Value `d` of a per-dim parameter of `dims` dims.
fn at(v: &[i64], d: usize, dims: usize) -> Option<i64> {
    match v.len() {
        1 => v.first().copied(),
        n if n == dims => v.get(d).copied(),
        _ => None,
    }
}

/// The `(low, high)` crop of each spatial dim, if `config` (a pad's `[(low, high, interior),
/// ...]`) leaves the batch and channel dims alone, inserts nothing, and only removes.
fn crops(config: &Arg, rank: usize) -> Option<Vec<(i64, i64)>> {
    let (Arg::List(dims) | Arg::Tuple(dims)) = config else {
        return None;
    };
    if dims.len() != rank {
        return None;
    }
    let mut out = Vec::with_capacity(rank);
    for (d, entry) in dims.iter().enumerate() {
        let v = ints(entry)?;
        let [lo, hi, interior] = v[..] else {
            return None;
        };
        if interior != 0 || lo > 0 || hi > 0 || (d < 2 && (lo != 0 || hi != 0)) {
            return None;
        }
        if d >= 2 {
            out.push((-lo, -hi));
        }
    }
    out.iter().any(|&(l, h)| l > 0 || h > 0).then_some(out)
}

/// The convolution `conv` with padding that gives exactly the outputs `pad` keeps, if there
/// is one.
fn folded(t: &Trace, conv: NodeIndex, pad: NodeIndex) -> Option<tracepass_ir::Node> {
    let (c, p) = (t.node(conv)?, t.node(pad)?);
    if !c.kwargs().is_empty() || !p.kwargs().is_empty() || c.args().len() != 9 {
        return None;
    }
    let a = c.args();
    let shape = |arg: &Arg| match arg {
        Arg::Value(v) => t.ty(*v)?.as_tensor().map(|tt| tt.shape.to_vec()),
        _ => None,
    };
    let (x, w) = (shape(&a[0])?, shape(&a[1])?);
    let out = shape(&Arg::Value(*c.outputs().first()?))?;
    let kept = shape(&Arg::Value(*p.outputs().first()?))?;
    let dims = x.len().checked_sub(2).filter(|&d| d > 0)?;
    if w.len() != x.len() || out.len() != x.len() || kept.len() != x.len() {
        return None;
    }
    if a[6] != Arg::Bool(false) {
        return None;
    }
    let (stride, padding, dilation) = (ints(&a[3])?, ints(&a[4])?, ints(&a[5])?);
    let crop = crops(p.args().get(2)?, x.len())?;
    let mut new_padding = Vec::with_capacity(dims);
    for d in 0..dims {
        let (s, pd, dl) = (
            at(&stride, d, dims)?,
            at(&padding, d, dims)?,
            at(&dilation, d, dims)?,
        );
        let (l, h) = crop[d];
        if s < 1 || dl < 1 {
            return None;
        }
        let p2 = pd.checked_sub(l.checked_mul(s)?)?;
        if p2 < 0 {
            return None;
        }
        let (n, k) = (i64::try_from(x[d + 2]).ok()?, i64::try_from(w[d + 2]).ok()?);
        let span = n + 2 * p2 - dl * (k - 1) - 1;
        let count = if span < 0 { 0 } else { span / s + 1 };
        let want = i64::try_from(out[d + 2]).ok()? - l - h;
        if count != want || Ok(want) != i64::try_from(kept[d + 2]) {
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
    Some(c.with_operands(args, p.outputs().to_vec()))
}

/// Folds every crop that can be folded; returns how many.
pub fn fold_conv_crop(t: &mut Trace) -> Result<usize, RewriteError> {
    let returned: ValueIdSet = t.returned_values().into_iter().collect();
    let mut rw = Rewriter::new();
    let mut folds = 0;
    for (idx, n) in t.nodes() {
        // `ltorch.convolution` and `prims.convolution`: `a, weight, bias, stride, padding,
        // dilation, transposed, output_padding, groups`
        if !op::CONVOLUTION.matches(n) {
            continue;
        }
        let Some(&out) = n.outputs().first() else {
            continue;
        };
        if n.outputs().len() != 1 || returned.contains(&out) {
            continue;
        }
        let [reader] = t.users(out)[..] else { continue };
        let reads_once = t.node(reader).is_some_and(|r| {
            op::PAD.matches(r) && r.args().first() == Some(&Arg::Value(out)) && {
                let uses = r.args().iter().filter(|a| **a == Arg::Value(out)).count();
                uses == 1
            }
        });
        if !reads_once {
            continue;
        }
        if let Some(new) = folded(t, idx, reader) {
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
        let n = fold_conv_crop(t).map_err(|e| PassError::rewrite("fold-conv-crop", e))?;
        cx.stat("fold-conv-crop.folded", n as u64);
        Ok((n > 0).into())
    }
}
