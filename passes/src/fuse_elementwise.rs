//! `fuse-elementwise`: chains of elementwise and broadcast ops become one fusion region
//! (`tracepass.fusion`, see [`tracepass_ir::region`]), which a backend runs as one loop over
//! its inputs (the CPU) or one kernel (CUDA), with no tensor for the values in between.
//!
//! A region is a DAG of fusable nodes with one output, its root: every other member's one
//! output is read only by members of the same region (one or several: `x * x`, or GELU's
//! backward reading `x` in three places), and is not returned by the trace. So no value a
//! region computes is needed outside it, and the region can sit where its root was (every
//! member comes before the root, and so does everything the members read). A region has at
//! least two members. What is fusable: the elementwise arithmetic and math ops
//! listed in [`FUSABLE`] (true division only: a rounding mode is not fused) and the broadcasts
//! `expand` and `unsqueeze`, each with one tensor output. A division read by a `dist.*` op
//! (DDP's pre-averaging, which the runtime folds into the bucket copy, and which the trainer
//! reads to check the world size) stays a node of its own.

use crate::pass::{Changed, PassContext, PassError, TracePass};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use tracepass_ir::op::{self, Op};
use tracepass_ir::{
    body_lines, free_names, ops, Arg, Lhs, Node, NodeIndex, RewriteError, Rewriter, Trace, Type,
    ValueId,
};

/// The `fuse-elementwise` pass (trace-level).
pub struct FuseElementwise;

/// The op families a region may hold (both their `ltorch.*` and `prims.*` members).
pub const FUSABLE: &[Op] = &[
    op::ADD,
    op::SUB,
    op::MUL,
    op::DIV,
    op::TRUE_DIVIDE,
    op::NEG,
    op::ABS,
    op::EXP,
    op::EXPM1,
    op::LOG,
    op::LOG1P,
    op::SQRT,
    op::RSQRT,
    op::RECIPROCAL,
    op::TANH,
    op::SIGMOID,
    op::RELU,
    op::ERF,
    op::SIN,
    op::COS,
    op::POW,
    op::MAXIMUM,
    op::MINIMUM,
    op::GELU,
    op::SILU,
    op::EXPAND,
    op::UNSQUEEZE,
];

/// What one run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FusionStats {
    /// Regions made.
    pub regions: usize,
    /// Nodes they replaced.
    pub fused: usize,
}

fn fusable(t: &Trace, n: &Node) -> bool {
    let [out] = n.outputs() else { return false };
    FUSABLE.iter().any(|f| f.matches(n))
        && !(op::DIV.matches(n) && n.kwarg("rounding_mode").is_some_and(|a| *a != Arg::None))
        && matches!(t.ty(*out), Some(Type::Tensor(_)))
}

/// Groups the trace's fusable chains into regions; returns what it did.
pub fn fuse_elementwise(t: &mut Trace) -> Result<FusionStats, RewriteError> {
    fuse_elementwise_keeping(t, &[])
}

/// [`fuse_elementwise`], keeping `kept` as values of their own (a runner reads them after
/// the trace ends, as the trainer reads a forward's buffer updates) besides what the trace
/// returns.
pub fn fuse_elementwise_keeping(
    t: &mut Trace,
    kept: &[ValueId],
) -> Result<FusionStats, RewriteError> {
    let mut keep: HashSet<ValueId> = t.returned_values().into_iter().collect();
    keep.extend(kept.iter().copied());
    let schedule: Vec<NodeIndex> = t.schedule().to_vec();
    // regions as their members, root first, in reverse schedule order
    let mut groups: Vec<Vec<NodeIndex>> = Vec::new();
    let mut group_of: HashMap<NodeIndex, usize> = HashMap::default();
    for &idx in schedule.iter().rev() {
        let Some(node) = t.node(idx) else { continue };
        if !fusable(t, node) {
            continue;
        }
        let out = node.outputs()[0];
        let users = t.users(out);
        let read_by_dist = users.iter().any(|u| {
            t.node(*u)
                .is_some_and(|n| n.op.as_str().starts_with("dist."))
        });
        if read_by_dist {
            continue;
        }
        // every reader is a member of one region (the readers come later in the schedule, so
        // their regions are known): the value joins it and is never made as a tensor
        let mut user_groups = users.iter().map(|u| group_of.get(u).copied());
        let joins = match user_groups.next() {
            Some(Some(g)) if !keep.contains(&out) && user_groups.all(|h| h == Some(g)) => Some(g),
            _ => None,
        };
        let g = joins.unwrap_or_else(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(idx);
        group_of.insert(idx, g);
    }
    let mut rw = Rewriter::new();
    let mut stats = FusionStats::default();
    for group in groups.iter().filter(|g| g.len() >= 2) {
        let root = group[0];
        let members: Vec<NodeIndex> = group.iter().rev().copied().collect();
        let Some(region) = region_node(t, &members) else {
            continue;
        };
        rw.replace(root, region);
        for &m in &members[..members.len() - 1] {
            rw.erase(m);
        }
        stats.regions += 1;
        stats.fused += members.len();
    }
    rw.apply(t)?;
    Ok(stats)
}

/// The region statement for `members` (schedule order, the root last): its operands are the
/// values the members read and do not define, in order of first reading, as the body's text
/// names them. `None` when the text would not name them so (a region is then not made).
fn region_node(t: &Trace, members: &[NodeIndex]) -> Option<Node> {
    let defined: HashSet<ValueId> = members
        .iter()
        .filter_map(|m| t.node(*m))
        .flat_map(|n| n.outputs().iter().copied())
        .collect();
    let mut operands: Vec<ValueId> = Vec::new();
    for m in members {
        let n = t.node(*m)?;
        let mut push = |v: ValueId| {
            if !defined.contains(&v) && !operands.contains(&v) {
                operands.push(v);
            }
        };
        n.args().iter().for_each(|a| a.for_each_value(&mut push));
        n.kwargs()
            .iter()
            .for_each(|(_, a)| a.for_each_value(&mut push));
    }
    let body = body_lines(t, members);
    let texts: Vec<&str> = body.iter().map(|s| s.text.as_str()).collect();
    let names: Vec<String> = operands.iter().map(|v| t.name(*v)).collect();
    if free_names(&texts) != names {
        return None;
    }
    let root = t.node(*members.last()?)?;
    let mut node = Node::new(
        ops::FUSION,
        operands.into_iter().map(Arg::Value).collect(),
        root.outputs().to_vec(),
    );
    node.lhs = Lhs::Single;
    *node.subsymbols_mut() = body;
    Some(node)
}

impl TracePass for FuseElementwise {
    fn name(&self) -> &str {
        "fuse-elementwise"
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        let s = fuse_elementwise(t).map_err(|e| PassError::rewrite("fuse-elementwise", e))?;
        cx.stat("fuse-elementwise.regions", s.regions as u64);
        cx.stat("fuse-elementwise.fused", s.fused as u64);
        Ok((s.regions > 0).into())
    }
}
