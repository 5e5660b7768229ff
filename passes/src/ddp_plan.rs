//! The DDP plan without the rewrite: which returned gradients are synchronized, how they are
//! bucketed and after which value each bucket's all-reduce is issued. Runtimes that execute the
//! backward themselves (Lightning Thunder, through `tracepass.thunder`) map this plan onto their
//! own statements; the choice of gradients and buckets is the `ddp` pass's, shared with it
//! ([`crate::ddp`]'s gradient selection and [`plan_buckets`]), so both always agree.

use crate::ddp::{gradient_groups, plan_buckets, DdpOptions};
use tracepass_ir::{
    inline_fusion_regions, parse_trace, Def, Device, Param, ParseError, Program, Trace, Type,
    ValueId, MAX_TENSOR_BYTES, UNSCHEDULED,
};

/// One trainable parameter as the runtime sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanParam {
    /// Its fully qualified name (`transformer.h.0.attn.c_attn.weight`).
    pub fqn: String,
    /// Position of its gradient in the backward's return (`None`: the backward returns none).
    pub grad_output: Option<usize>,
    /// Frozen parameters (false) are never reduced.
    pub requires_grad: bool,
    /// The parameter it shares its tensor with (the first of the tie in the module's order).
    pub tied_to: Option<String>,
}

/// The synchronization of one trainable tensor (a tie is one).
#[derive(Clone, Debug, PartialEq)]
pub struct GradientPlan {
    /// The parameters, the primary first.
    pub fqns: Vec<String>,
    /// Names of the returned gradient values (several for a tie: they are added first).
    pub values: Vec<String>,
    /// Their positions in the backward's return.
    pub positions: Vec<usize>,
    /// Where the synchronized gradient is returned (the others of a tie return `None`).
    pub return_position: usize,
    /// The value after whose producer the gradient is complete (`None`: it is a trace input).
    pub ready_after: Option<String>,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its bytes.
    pub nbytes: usize,
}

/// One bucket: one all-reduce.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketPlan {
    /// `b0`, `b1`, ... in the order the all-reduces are issued.
    pub id: String,
    /// Indices into [`DdpPlan::gradients`], in ready order.
    pub gradients: Vec<usize>,
    /// Bytes of the flat buffer.
    pub nbytes: usize,
    /// The members' dtype as Thunder spells it in trace comments (`f32`, `bf16`).
    pub dtype: String,
    /// The members' device (`cpu`, `cuda:0`).
    pub device: String,
    /// The value after whose producer the all-reduce is issued (`None`: at the start).
    pub after: Option<String>,
}

/// The whole plan: gradients in ready order, buckets in issue order.
#[derive(Clone, Debug, PartialEq)]
pub struct DdpPlan {
    /// One entry per trainable tensor, in the order the backward completes them.
    pub gradients: Vec<GradientPlan>,
    /// The buckets.
    pub buckets: Vec<BucketPlan>,
    /// Trainable parameters the backward returns no gradient for (the loss never reaches
    /// them): left alone, like frozen ones.
    pub unused: Vec<String>,
}

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The backward's text does not parse (an op tracepass does not know, a form it cannot read).
    #[error("the backward trace does not parse: {0}")]
    Parse(#[from] ParseError),
    /// The options make no data-parallel step.
    #[error("{0}")]
    Options(String),
    /// The parameters and the backward disagree (a gradient missing, a position out of range).
    #[error("{0}")]
    Gradients(String),
}

/// Plans DDP for a backward trace given as Thunder prints it. Executor fusion regions
/// (`nvFusion0`, `TorchCompile1`) are read through their bodies
/// ([`inline_fusion_regions`]): a value a region returns is named by the body's statement that
/// computes it, so a runtime places work after that value's region.
pub fn plan_ddp_text(
    backward: &str,
    params: &[PlanParam],
    world_size: usize,
    bucket_mb: f64,
) -> Result<DdpPlan, PlanError> {
    let (text, _regions) = inline_fusion_regions(backward);
    plan_ddp(parse_trace(&text)?, params, world_size, bucket_mb)
}

/// Plans DDP for a parsed backward: pre-averaged gradients (divided by `world_size`), bucketed
/// in ready order with `bucket_mb` MiB caps (`<= 0`: one per gradient), as the `ddp` pass does.
pub fn plan_ddp(
    backward: Trace,
    params: &[PlanParam],
    world_size: usize,
    bucket_mb: f64,
) -> Result<DdpPlan, PlanError> {
    if world_size < 2 {
        return Err(PlanError::Options(format!(
            "world size {world_size}: data parallelism needs at least 2 ranks"
        )));
    }
    let opts = DdpOptions {
        world_size,
        bucket_mb,
        ..DdpOptions::default()
    };
    opts.check()
        .map_err(|e| PlanError::Options(format!("bad ddp options: {e}")))?;
    let n_ret = match &backward.ret {
        tracepass_ir::Arg::Tuple(items) | tracepass_ir::Arg::List(items) => items.len(),
        _ => {
            return Err(PlanError::Gradients(
                "the backward does not return a tuple of gradients".into(),
            ))
        }
    };
    let mut program_params = Vec::with_capacity(params.len());
    for (i, p) in params.iter().enumerate() {
        if let Some(pos) = p.grad_output.filter(|pos| *pos >= n_ret) {
            return Err(PlanError::Gradients(format!(
                "parameter `{}`: gradient position {pos} is past the backward's {n_ret} returned values",
                p.fqn
            )));
        }
        if let Some(t) = &p.tied_to {
            if !params.iter().any(|q| &q.fqn == t) {
                return Err(PlanError::Gradients(format!(
                    "parameter `{}` is tied to `{t}`, which is not among the parameters",
                    p.fqn
                )));
            }
        }
        program_params.push(Param {
            fqn: p.fqn.clone(),
            forward_arg: p.grad_output.unwrap_or(n_ret + i),
            grad_output: p.grad_output,
            shape: Vec::new(),
            dtype: tracepass_ir::DType::F32,
            device: Device::CPU,
            requires_grad: p.requires_grad,
            tied_to: p.tied_to.clone(),
            buffer: false,
            shard: None,
        });
    }
    let program = Program {
        forward: Trace::new("", tracepass_ir::TraceKind::Forward),
        backward,
        params: program_params,
        broadcast_from: None,
    };
    if crate::ddp::synchronizes(&program.backward) {
        return Err(PlanError::Gradients(
            "the backward already all-reduces gradients (is Thunder's own DDP applied too?)".into(),
        ));
    }
    let found = gradient_groups(&program).map_err(PlanError::Gradients)?;
    let (groups, unused) = (found.groups, found.unused);
    let t = &program.backward;
    let pos = t.schedule_positions();
    let slot = |v: ValueId| match t.value(v).map(|x| x.def) {
        Some(Def::Node(n, _)) => pos
            .get(n.index())
            .filter(|p| **p != UNSCHEDULED)
            .map(|p| *p as usize),
        _ => None,
    };
    // each tensor is ready when the last of its gradient values is: (slot, module order)
    let mut ready = Vec::with_capacity(groups.len());
    for (i, g) in groups.iter().enumerate() {
        let last = g.values.iter().copied().max_by_key(|v| slot(*v));
        let Some(last) = last else {
            return Err(PlanError::Gradients(format!(
                "internal: `{}` has no gradient value",
                g.fqns[0]
            )));
        };
        let tt = match t.ty(last) {
            Some(Type::Tensor(tt)) => tt.clone(),
            other => {
                return Err(PlanError::Gradients(format!(
                    "gradient `{}` of `{}` is not a tensor ({})",
                    t.name(last),
                    g.fqns[0],
                    other.map_or("undefined".into(), |x| x.to_string())
                )))
            }
        };
        if tt.checked_nbytes().is_none() {
            return Err(PlanError::Gradients(format!(
                "gradient `{}` has type {tt}, over {MAX_TENSOR_BYTES} bytes",
                t.name(last)
            )));
        }
        ready.push((slot(last), i, last, tt));
    }
    ready.sort_by_key(|(s, i, _, _)| (*s, *i));
    let described: Vec<_> = ready
        .iter()
        .map(|(_, _, v, tt)| (*v, tt.shape.clone(), tt.dtype, tt.device))
        .collect();
    let buckets = plan_buckets(&described, &opts);
    let index_of: rustc_hash::FxHashMap<ValueId, usize> = ready
        .iter()
        .enumerate()
        .map(|(k, (_, _, v, _))| (*v, k))
        .collect();
    let gradients = ready
        .iter()
        .map(|(s, i, last, tt)| {
            let g = &groups[*i];
            GradientPlan {
                fqns: g.fqns.clone(),
                values: g.values.iter().map(|v| t.name(*v)).collect(),
                positions: g.positions.clone(),
                return_position: g.primary_pos,
                ready_after: s.map(|_| t.name(*last)),
                shape: tt.shape.to_vec(),
                nbytes: tt.nbytes(),
            }
        })
        .collect::<Vec<_>>();
    let buckets = buckets
        .into_iter()
        .map(|b| {
            let members: Vec<usize> = b.members.iter().map(|m| index_of[m]).collect();
            let after = members
                .last()
                .and_then(|k| gradients[*k].ready_after.clone());
            BucketPlan {
                id: b.id,
                gradients: members,
                nbytes: b.nbytes,
                dtype: b.dtype.to_string(),
                device: b.device.to_string(),
                after,
            }
        })
        .collect();
    Ok(DdpPlan {
        gradients,
        buckets,
        unused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(names: &[(&str, usize)]) -> Vec<PlanParam> {
        names
            .iter()
            .map(|(f, p)| PlanParam {
                fqn: f.to_string(),
                grad_output: Some(*p),
                requires_grad: true,
                tied_to: None,
            })
            .collect()
    }

    const BW: &str = "def backward_fn(saved_for_backward, cotangents):\n  # saved_for_backward: \"Collection\"\n  # cotangents: \"Collection\"\n  C0, = saved_for_backward\n  # C0: \"Collection\"\n  g, = cotangents\n  # g: \"cpu f32[4, 4]\"\n  x, w, = C0\n  # x: \"cpu f32[4, 4]\"\n  # w: \"cpu f32[4, 4]\"\n  gb = torch.sum(g, 0)  # gb: \"cpu f32[4]\"\n  gw = torch.matmul(g, x)  # gw: \"cpu f32[4, 4]\"\n  gx = torch.matmul(g, w)  # gx: \"cpu f32[4, 4]\"\n  return (gx, gw, gb)\n";

    #[test]
    fn buckets_follow_ready_order_and_close_at_the_cap() {
        let p = params(&[("l.weight", 1), ("l.bias", 2)]);
        let one = plan_ddp_text(BW, &p, 2, 25.0).unwrap();
        assert_eq!(one.buckets.len(), 1);
        // the bias is ready first
        assert_eq!(one.gradients[0].fqns, ["l.bias"]);
        assert_eq!(one.gradients[1].fqns, ["l.weight"]);
        assert_eq!(one.buckets[0].after.as_deref(), Some("gw"));
        assert_eq!(one.buckets[0].nbytes, 80);
        let each = plan_ddp_text(BW, &p, 2, 0.0).unwrap();
        let afters: Vec<_> = each.buckets.iter().map(|b| b.after.clone()).collect();
        assert_eq!(afters, [Some("gb".into()), Some("gw".into())]);
    }

    #[test]
    fn a_tie_is_reduced_once_and_frozen_parameters_never() {
        let mut p = params(&[("a", 0), ("b", 1), ("c", 2)]);
        p[1].tied_to = Some("a".into());
        p[2].requires_grad = false;
        p[2].grad_output = None;
        let plan = plan_ddp_text(BW, &p, 4, 25.0).unwrap();
        assert_eq!(plan.gradients.len(), 1);
        let g = &plan.gradients[0];
        assert_eq!(g.fqns, ["a", "b"]);
        assert_eq!(g.values, ["gx", "gw"]);
        assert_eq!(g.return_position, 0);
        assert_eq!(g.ready_after.as_deref(), Some("gx"));
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let p = params(&[("l.weight", 1), ("l.bias", 2)]);
        let e = plan_ddp_text(BW, &p, 1, 25.0).unwrap_err().to_string();
        assert!(e.contains("world size 1"), "{e}");
        let unknown = BW.replace("torch.sum(g, 0)", "torch.frobnicate(g, 0)");
        let e = plan_ddp_text(&unknown, &p, 2, 25.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("frobnicate") && e.contains("line 11"), "{e}");
        let mut missing = params(&[("l.weight", 1), ("l.bias", 2)]);
        missing[0].grad_output = Some(7);
        let e = plan_ddp_text(BW, &missing, 2, 25.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`l.weight`") && e.contains("position 7"), "{e}");
        // a parameter the backward returns no gradient for is unused: left alone, named
        let none = BW.replace("return (gx, gw, gb)", "return (gx, None, gb)");
        let plan = plan_ddp_text(&none, &p, 2, 25.0).unwrap();
        assert_eq!(plan.unused, ["l.weight"]);
        assert_eq!(plan.gradients.len(), 1);
        let e = plan_ddp_text(BW, &p, 2, f64::NAN).unwrap_err().to_string();
        assert!(e.contains("bucket_mb"), "{e}");
    }
}
