//! `conv-input-grad`: Thunder's input gradient of a convolution becomes one transposed
//! convolution.
//!
//! For `y = conv(x, w, stride s, padding p, dilation d)`, Thunder writes `x`'s gradient as a
//! stride-1 convolution of the output gradient `g`, spread out by the stride (a `pad` with
//! `s - 1` interior zeros) and padded to its full extent, by `w` with its two channel dims
//! swapped (a chain of permutes and reshapes) and its taps flipped, then crops the outputs
//! that fall in the forward's padding (a negative `pad`). That is, by definition,
//! `convolution(g, w, None, s, p, d, transposed=True, output_padding, 1)`, and as one op a
//! backend can compute it as a product and a scatter (PyTorch's own CPU kernels do):
//! no multiplications by the inserted zeros (three in four at stride 2), no flipped copy of
//! the weight, no outputs computed to be dropped.
//!
//! The match is exact or nothing: the chain must read the weight with each group's two
//! channel dims swapped (followed as a layout through every permute and reshape), the flip
//! must reverse exactly the kernel's taps, the pads must insert zeros and crop only the
//! spatial dims, and the transposed convolution's own shape inference must give exactly the
//! type of the value it replaces. Values nothing else reads (the spread gradient, the flipped
//! weight and its views) go with the statements that made them.

use crate::pass::{Changed, PassContext, PassError, TracePass};
use tracepass_ir::{
    op, Arg, MetaOut, Node, NodeIndex, OpRegistry, RewriteError, Rewriter, Trace, ValueId,
    ValueIdSet,
};

/// The `conv-input-grad` pass (trace-level).
pub struct ConvInputGrad;

/// How a view reads a contiguous tensor's elements: every dim a run of factors `(size,
/// stride)`, major to minor. A reshape that merges dims whose strides do not line up (where
/// PyTorch would copy) keeps them as factors of one dim, so the chain Thunder writes for a
/// grouped convolution's weight, which regroups its channels, is followed as well.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Layout {
    dims: Vec<Vec<(i64, i64)>>,
}

impl Layout {
    fn contiguous(shape: &[usize]) -> Layout {
        let mut dims = vec![Vec::new(); shape.len()];
        let mut stride = 1i64;
        for (d, &n) in shape.iter().enumerate().rev() {
            dims[d].push((n as i64, stride));
            stride *= n as i64;
        }
        Layout { dims }
    }

    /// The layout with its dims in the order `perm` gives (negative dims count from the end).
    fn permuted(&self, perm: &[i64]) -> Option<Layout> {
        let r = self.dims.len();
        if perm.len() != r {
            return None;
        }
        let mut seen = vec![false; r];
        let mut dims = Vec::with_capacity(r);
        for &p in perm {
            let p = if p < 0 { p + r as i64 } else { p };
            let i = usize::try_from(p).ok().filter(|&i| i < r)?;
            if std::mem::replace(&mut seen[i], true) {
                return None;
            }
            dims.push(self.dims[i].clone());
        }
        Some(Layout { dims })
    }

    /// The layout reshaped to `shape`: the factors, major to minor (merged where they read
    /// one run), regrouped into dims of the new sizes, a factor split where a dim ends inside it (`None` where the sizes do
    /// not divide, or for an empty tensor).
    fn reshaped(&self, shape: &[usize]) -> Option<Layout> {
        let all = Layout {
            dims: vec![self.dims.iter().flatten().copied().collect()],
        };
        if all.dims[0].iter().any(|&(n, _)| n < 1) {
            return None;
        }
        let mut factors: std::collections::VecDeque<(i64, i64)> =
            all.normalized().into_iter().flatten().collect();
        let mut dims = Vec::with_capacity(shape.len());
        for &size in shape {
            let size = i64::try_from(size).ok().filter(|&n| n >= 1)?;
            let (mut dim, mut have) = (Vec::new(), 1i64);
            while have < size {
                if size % have != 0 {
                    return None;
                }
                let need = size / have;
                let (n, stride) = factors.pop_front()?;
                if n <= need {
                    dim.push((n, stride));
                    have *= n;
                } else if n % need == 0 {
                    dim.push((need, stride * (n / need)));
                    factors.push_front((n / need, stride));
                    have *= need;
                } else {
                    return None;
                }
            }
            if have != size {
                return None;
            }
            dims.push(dim);
        }
        factors.is_empty().then_some(Layout { dims })
    }

    /// Each dim's factors without those of one element, and with neighbours that read one
    /// run merged: two layouts that read the same elements in the same order are equal.
    fn normalized(&self) -> Vec<Vec<(i64, i64)>> {
        self.dims
            .iter()
            .map(|dim| {
                let mut out: Vec<(i64, i64)> = Vec::new();
                for &(n, s) in dim.iter().filter(|(n, _)| *n != 1) {
                    match out.last_mut() {
                        Some(last) if last.1 == n * s => *last = (last.0 * n, s),
                        _ => out.push((n, s)),
                    }
                }
                out
            })
            .collect()
    }

    /// Whether this is how a convolution with `groups` groups reads a transposed
    /// convolution's weight `w` (`[C_in, C_out / groups, *kernel]`, contiguous): as
    /// `[C_out, C_in / groups, *kernel]`, each group's two channel dims swapped.
    fn transposes_per_group(&self, w: &[usize], groups: i64) -> bool {
        if w.len() < 3 || self.dims.len() != w.len() || groups < 1 {
            return false;
        }
        let (cin, cog) = (w[0] as i64, w[1] as i64);
        if cin % groups != 0 {
            return false;
        }
        let base = Layout::contiguous(w);
        let (s0, s1) = (base.dims[0][0].1, base.dims[1][0].1);
        let cig = cin / groups;
        let mut want = base.clone();
        want.dims[0] = vec![(groups, cig * s0), (cog, s1)];
        want.dims[1] = vec![(cig, s0)];
        self.normalized() == want.normalized()
    }
}

/// The permutation a `permute` node applies: `permute(t, (1, 0, 2))` or `permute(t, 1, 0, 2)`.
fn permutation(n: &Node) -> Option<Vec<i64>> {
    match n.args() {
        [_, one] => one.as_int_list(),
        [_, rest @ ..] => rest.iter().map(Arg::as_int).collect(),
        _ => None,
    }
}

/// Follows `value` back through permutes and reshapes to the value they view. Returns that
/// value, how `value` reads its elements, and the chain's nodes from `value`'s producer back.
fn view_chain(t: &Trace, value: ValueId) -> Option<(ValueId, Layout, Vec<NodeIndex>)> {
    let mut chain = Vec::new();
    let mut cur = value;
    while let Some(idx) = t.producer(cur) {
        let n = t.node(idx)?;
        if !(op::PERMUTE.matches(n) || op::RESHAPE.matches(n)) || !n.kwargs().is_empty() {
            break;
        }
        let (Some(Arg::Value(src)), [out]) = (n.args().first(), n.outputs()) else {
            break;
        };
        if *out != cur {
            break;
        }
        chain.push(idx);
        cur = *src;
    }
    let mut view = Layout::contiguous(&t.ty(cur)?.as_tensor()?.shape);
    for &idx in chain.iter().rev() {
        let n = t.node(idx)?;
        view = if op::PERMUTE.matches(n) {
            view.permuted(&permutation(n)?)?
        } else {
            view.reshaped(&t.ty(*n.outputs().first()?)?.as_tensor()?.shape)?
        };
    }
    Some((cur, view, chain))
}

/// Value `d` of a per-dim parameter of `dims` dims (`(1,)` is one value for every dim).
fn at(v: &[i64], d: usize, dims: usize) -> Option<i64> {
    match v.len() {
        1 => v.first().copied(),
        n if n == dims => v.get(d).copied(),
        _ => None,
    }
}

/// A `prims.pad` of `value` by zeros that leaves the batch and channel dims alone: its
/// `(low, high, interior)` for each spatial dim.
fn spatial_pad(t: &Trace, pad: &Node, value: ValueId) -> Option<Vec<(i64, i64, i64)>> {
    if !op::prims::PAD.matches(pad)
        || !pad.kwargs().is_empty()
        || pad.args().first() != Some(&Arg::Value(value))
        || pad.args().get(1).and_then(Arg::as_f64) != Some(0.0)
    {
        return None;
    }
    let rank = t.ty(value)?.as_tensor()?.shape.len();
    let dims = pad.args().get(2)?.as_seq().filter(|d| d.len() == rank)?;
    let mut spatial = Vec::with_capacity(rank.saturating_sub(2));
    for (d, entry) in dims.iter().enumerate() {
        let [lo, hi, interior] = entry.as_int_list()?[..] else {
            return None;
        };
        if d < 2 {
            if (lo, hi, interior) != (0, 0, 0) {
                return None;
            }
        } else {
            spatial.push((lo, hi, interior));
        }
    }
    Some(spatial)
}

/// One input gradient found: the transposed convolution that replaces it, the statement it
/// replaces (the crop, or the convolution when there is none) and the statements that only
/// fed it.
struct Found {
    node: Node,
    replaces: NodeIndex,
    dead: Vec<NodeIndex>,
}

/// Whether `v` is read only by `reader` and not returned.
fn only_read_by(t: &Trace, returned: &ValueIdSet, v: ValueId, reader: NodeIndex) -> bool {
    t.users(v) == [reader] && !returned.contains(&v)
}

/// The transposed convolution `conv` (a node of `t` at `idx`) computes, with the crop that
/// follows it, if it is Thunder's input gradient.
fn found(
    t: &Trace,
    reg: &OpRegistry,
    returned: &ValueIdSet,
    idx: NodeIndex,
    conv: &Node,
) -> Option<Found> {
    let a = conv.args();
    if !conv.kwargs().is_empty() || a.len() != 9 || a[6] != Arg::Bool(false) || a[2] != Arg::None {
        return None;
    }
    let groups = a[8].as_int().filter(|&g| g >= 1)?;
    let (Arg::Value(spread), Arg::Value(flipped)) = (&a[0], &a[1]) else {
        return None;
    };
    let [out] = conv.outputs()[..] else {
        return None;
    };
    let rank = t.ty(out)?.as_tensor()?.shape.len();
    let dims = rank.checked_sub(2).filter(|d| *d >= 1)?;
    let mut dead = Vec::new();

    // the weight: flipped over exactly its taps, from a view of `w` with its channels swapped
    let flip_idx = t.producer(*flipped)?;
    let flip = t.node(flip_idx)?;
    if !op::FLIP.matches(flip) || !flip.kwargs().is_empty() {
        return None;
    }
    let Some(Arg::Value(swapped)) = flip.args().first() else {
        return None;
    };
    let fshape = t.ty(*flipped)?.as_tensor()?.shape.clone();
    let mut flips: Vec<usize> = Vec::new();
    for d in flip.args().get(1)?.as_int_list()? {
        let d = if d < 0 { d + rank as i64 } else { d };
        flips.push(usize::try_from(d).ok().filter(|&d| d < rank)?);
    }
    // a dim of one element reads the same flipped or not
    let reversed = |d: usize| flips.contains(&d) || fshape[d] == 1;
    if !(0..rank).all(|d| reversed(d) == (d >= 2 || fshape[d] == 1)) {
        return None;
    }
    let (w, view, chain) = view_chain(t, *swapped)?;
    let wty = t.ty(w)?.as_tensor()?;
    if !view.transposes_per_group(&wty.shape, groups) {
        return None;
    }
    if only_read_by(t, returned, *flipped, idx) {
        dead.push(flip_idx);
        let mut reader = flip_idx;
        for &c in &chain {
            let v = *t.node(c)?.outputs().first()?;
            if !only_read_by(t, returned, v, reader) {
                break;
            }
            dead.push(c);
            reader = c;
        }
    }

    // the gradient, spread out by the stride (or read as it is at stride 1)
    let (g, spread_by) = match t.producer(*spread).and_then(|p| Some((p, t.node(p)?))) {
        Some((p, pad)) => match spatial_pad(t, pad, pad.args().first()?.as_value()?) {
            Some(cfg) => {
                if only_read_by(t, returned, *spread, idx) {
                    dead.push(p);
                }
                (pad.args().first()?.as_value()?, cfg)
            }
            None => (*spread, vec![(0, 0, 0); dims]),
        },
        None => (*spread, vec![(0, 0, 0); dims]),
    };
    if spread_by.len() != dims || t.ty(g)?.as_tensor()?.dtype != wty.dtype {
        return None;
    }

    // the crop of the result, if that is all that reads it
    let users = t.users(out);
    let crop = match users[..] {
        [reader] if !returned.contains(&out) => t
            .node(reader)
            .and_then(|n| spatial_pad(t, n, out))
            .filter(|cfg| cfg.iter().all(|&(_, _, interior)| interior == 0))
            .map(|cfg| (reader, cfg)),
        _ => None,
    };
    let (result, replaces) = match &crop {
        Some((reader, _)) => {
            dead.push(idx);
            (*t.node(*reader)?.outputs().first()?, *reader)
        }
        None => (out, idx),
    };

    let (stride, padding, dilation) = (
        a[3].as_int_list()?,
        a[4].as_int_list()?,
        a[5].as_int_list()?,
    );
    let (mut new_stride, mut new_padding, mut output_padding) = (vec![], vec![], vec![]);
    for d in 0..dims {
        let (s, q, dl) = (
            at(&stride, d, dims)?,
            at(&padding, d, dims)?,
            at(&dilation, d, dims)?,
        );
        let (lo, hi, interior) = spread_by[d];
        if s != 1 || dl < 1 || q < 0 || lo < 0 || hi < 0 || interior < 0 {
            return None;
        }
        let full = dl * (wty.shape[2 + d] as i64 - 1);
        // zeros the convolution reads before and after the spread gradient
        let (mut low, mut high) = (lo + q, hi + q);
        if let Some((_, cfg)) = &crop {
            let (a, b) = (cfg[d].0, cfg[d].1);
            // outputs the pad adds are zeros only where the convolution would read only zeros
            if (a > 0 && low < full) || (b > 0 && high < full) {
                return None;
            }
            low += a;
            high += b;
        }
        let (pad, extra, step) = (full - low, high - low, interior + 1);
        if pad < 0 || extra < 0 || extra >= step.max(dl) {
            return None;
        }
        new_stride.push(step);
        new_padding.push(pad);
        output_padding.push(extra);
    }
    let args = vec![
        Arg::Value(g),
        Arg::Value(w),
        Arg::None,
        Arg::int_tuple(new_stride),
        Arg::int_tuple(new_padding),
        a[5].clone(),
        Arg::Bool(true),
        Arg::int_tuple(output_padding),
        Arg::Int(groups),
    ];
    let want = t.ty(result)?.clone();
    match reg.infer(t, &conv.op, &args, &[]) {
        Ok(MetaOut::Types(types)) if types == [want] => {}
        _ => return None,
    }
    Some(Found {
        node: conv.with_operands(args, vec![result]),
        replaces,
        dead,
    })
}

/// Rewrites every input gradient that matches; returns how many.
pub fn conv_input_grad(t: &mut Trace, reg: &OpRegistry) -> Result<usize, RewriteError> {
    let returned: ValueIdSet = t.returned_values().into_iter().collect();
    let mut rw = Rewriter::new();
    let mut rewritten = 0;
    for (idx, n) in t.nodes() {
        if !op::CONVOLUTION.matches(n) {
            continue;
        }
        let Some(f) = found(t, reg, &returned, idx, n) else {
            continue;
        };
        rw.replace(f.replaces, f.node);
        for d in f.dead {
            rw.erase(d);
        }
        rewritten += 1;
    }
    rw.apply(t)?;
    Ok(rewritten)
}

impl TracePass for ConvInputGrad {
    fn name(&self) -> &str {
        "conv-input-grad"
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        let n = conv_input_grad(t, cx.registry)
            .map_err(|e| PassError::rewrite("conv-input-grad", e))?;
        cx.stat("conv-input-grad.rewritten", n as u64);
        Ok((n > 0).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Layouts through permutes and reshapes: Thunder's chain for a weight's channel swap
    /// (plain and grouped) is one, a regrouping or a wrong group count is not.
    #[test]
    fn layouts_follow_thunders_weight_chains() {
        let chain =
            |w: &[usize], perm1: &[i64], shape2: &[usize], perm3: &[i64], shape4: &[usize]| {
                Layout::contiguous(w)
                    .permuted(perm1)
                    .and_then(|v| v.reshaped(shape2))
                    .and_then(|v| v.permuted(perm3))
                    .and_then(|v| v.reshaped(shape4))
                    .expect("a layout")
            };
        // [4, 3, 2, 2], one group
        let one = chain(
            &[4, 3, 2, 2],
            &[1, 0, 2, 3],
            &[3, 1, 4, 2, 2],
            &[1, 0, 2, 3, 4],
            &[3, 4, 2, 2],
        );
        assert!(one.transposes_per_group(&[4, 3, 2, 2], 1));
        assert!(!one.transposes_per_group(&[4, 3, 2, 2], 2));
        // [12, 4, 1, 1] in 3 groups (ShuffleNet's grouped 1x1): the last reshape merges the
        // group with the swapped channels, which PyTorch would copy
        let grouped = chain(
            &[12, 4, 1, 1],
            &[1, 0, 2, 3],
            &[4, 3, 4, 1, 1],
            &[1, 0, 2, 3, 4],
            &[12, 4, 1, 1],
        );
        assert!(grouped.transposes_per_group(&[12, 4, 1, 1], 3));
        assert!(!grouped.transposes_per_group(&[12, 4, 1, 1], 1));
        // depthwise: [8, 1, 2, 2] in 8 groups
        let depthwise = chain(
            &[8, 1, 2, 2],
            &[1, 0, 2, 3],
            &[1, 8, 1, 2, 2],
            &[1, 0, 2, 3, 4],
            &[8, 1, 2, 2],
        );
        assert!(depthwise.transposes_per_group(&[8, 1, 2, 2], 8));
        // a reshape that regroups the channels is no swap, nor is the weight itself
        let w = Layout::contiguous(&[4, 3, 2, 2]);
        let regrouped = w.reshaped(&[3, 4, 2, 2]).expect("contiguous");
        assert!(!regrouped.transposes_per_group(&[4, 3, 2, 2], 1));
        assert!(!Layout::contiguous(&[3, 3, 2, 2]).transposes_per_group(&[3, 3, 2, 2], 1));
        // sizes that do not divide, repeated dims
        assert_eq!(w.reshaped(&[5, 2, 2, 2]), None);
        assert_eq!(w.permuted(&[0, 0, 1, 2]), None);
        assert_eq!(
            w.permuted(&[-3, -4, 2, 3]).map(|v| v.normalized()),
            w.permuted(&[1, 0, 2, 3]).map(|v| v.normalized())
        );
    }
}
