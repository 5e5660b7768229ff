//! Fully sharded data parallel (ZeRO-2/ZeRO-3, PyTorch's FSDP2, Thunder's `fsdp`): each rank
//! holds `1/world_size` of every bucket of parameters. The forward takes those shards and
//! all-gathers each bucket (prefetched ahead of its first use) into the parameters it replaces;
//! the backward reduce-scatters the pre-averaged gradients in the same bucket layout, so each
//! rank ends with the gradient of its own shard. `zero3` does not keep the gathered parameters
//! for the backward (it saves the shards and gathers again); `zero2` keeps them.
//!
//! A bucket is the flat concatenation of its members, zero-padded at the end to a multiple of
//! the world size; the padding is cut off before the members are unpacked, so it never reaches
//! a parameter. Each sharded parameter records its place ([`tracepass_ir::ParamShard`]).

use crate::ddp::{bucket_mb_option, plan_buckets, world_size_option, DdpOptions};
use crate::pass::{Changed, Pass, PassContext, PassError};
use crate::pipeline::PassSpec;
use crate::registry::{
    OptionDecl, OptionDefault, OptionKind, OptionValue, OptionValues, PassDecl, PassLevel, Show,
};
use rustc_hash::FxHashMap as HashMap;
use tracepass_ir::{
    ops, Arg, DType, Def, Device, Node, NodeIndex, ParamShard, Program, Rewriter, Shape, Trace,
    Type, ValueId, MAX_TENSOR_BYTES, UNSCHEDULED,
};

/// What the backward gets of the gathered parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharding {
    /// ZeRO-2 style: the gathered parameters are saved for the backward (memory for speed).
    Zero2,
    /// ZeRO-3 style: the forward saves the shards and the backward gathers them again.
    Zero3,
}

/// Options of the fsdp pass.
#[derive(Clone, Debug, PartialEq)]
pub struct FsdpOptions {
    /// Ranks the parameters are sharded over (at least 1).
    pub world_size: usize,
    /// Whether the backward gathers the parameters again.
    pub sharding: Sharding,
    /// Bucket cap in MiB; `<= 0` means one bucket per parameter.
    pub bucket_mb: f64,
    /// Buckets gathered ahead of the one being computed.
    pub prefetch: usize,
    /// Shard frozen parameters too (they are gathered, never reduce-scattered).
    pub shard_frozen: bool,
}

impl Default for FsdpOptions {
    fn default() -> Self {
        FsdpOptions {
            world_size: 1,
            sharding: Sharding::Zero3,
            bucket_mb: 25.0,
            prefetch: 1,
            shard_frozen: false,
        }
    }
}

/// `fsdp`: its options, declared once (parsing, checking, printing and `--help` come from here).
pub static FSDP: PassDecl = PassDecl {
    name: "fsdp",
    help: "shards parameters over the ranks: all-gathers them in the forward, reduce-scatters the gradients",
    level: PassLevel::Program,
    options: &[
        world_size_option("number of ranks the parameters are sharded over"),
        OptionDecl {
            name: "sharding",
            kind: OptionKind::Choice(&["zero3", "zero2"]),
            default: OptionDefault::Value("zero3"),
            help: "zero3: the backward gathers the parameters again; zero2: the forward keeps them for it",
            show: Show::Always,
        },
        bucket_mb_option(
            "bucket cap in MiB; <= 0: one bucket per parameter",
            Show::IfChanged,
        ),
        OptionDecl {
            name: "prefetch",
            kind: OptionKind::Int {
                min: 0,
                max: u32::MAX as u64,
            },
            default: OptionDefault::Value("1"),
            help: "buckets gathered ahead of the one being computed",
            show: Show::IfChanged,
        },
        OptionDecl {
            name: "shard_frozen",
            kind: OptionKind::Choice(&["false", "true"]),
            default: OptionDefault::Value("false"),
            help: "shard frozen parameters too (gathered, never reduce-scattered)",
            show: Show::IfChanged,
        },
    ],
};

impl FsdpOptions {
    /// The options as values of [`FSDP`]'s declaration.
    pub fn to_values(&self) -> OptionValues {
        let word = |s: &str| Some(OptionValue::Word(s.into()));
        let mut v = OptionValues::defaults(&FSDP);
        v.set("world_size", Some(OptionValue::Int(self.world_size as u64)))
            .set(
                "sharding",
                word(match self.sharding {
                    Sharding::Zero2 => "zero2",
                    Sharding::Zero3 => "zero3",
                }),
            )
            .set("bucket_mb", Some(OptionValue::Float(self.bucket_mb)))
            .set("prefetch", Some(OptionValue::Int(self.prefetch as u64)))
            .set(
                "shard_frozen",
                word(if self.shard_frozen { "true" } else { "false" }),
            );
        v
    }
    /// The pass with these options as a pipeline value (`fsdp(world_size=4,sharding=zero3)`).
    pub fn spec(&self) -> PassSpec {
        FSDP.spec(&self.to_values())
    }
    /// The options from checked values of [`FSDP`]'s declaration.
    pub fn from_values(v: &OptionValues) -> FsdpOptions {
        FsdpOptions {
            world_size: v.int("world_size") as usize,
            sharding: match v.word("sharding") {
                Some("zero2") => Sharding::Zero2,
                _ => Sharding::Zero3,
            },
            bucket_mb: v.float("bucket_mb").unwrap_or(25.0),
            prefetch: v.int("prefetch") as usize,
            shard_frozen: v.word("shard_frozen") == Some("true"),
        }
    }
    /// Checks the options as parsing them would.
    pub fn check(&self) -> Result<(), PassError> {
        FSDP.check(&self.to_values())
    }
}

/// The fsdp pass. Build it with [`Fsdp::new`], which checks the options as a pipeline would.
#[derive(Debug)]
pub struct Fsdp {
    options: FsdpOptions,
}

impl Fsdp {
    /// The pass with checked options.
    pub fn new(options: FsdpOptions) -> Result<Fsdp, PassError> {
        options.check()?;
        Ok(Fsdp { options })
    }
    /// Its options.
    pub fn options(&self) -> &FsdpOptions {
        &self.options
    }
    /// The pass from a pipeline spec (`fsdp(world_size=4)`).
    pub fn from_spec(spec: &PassSpec) -> Result<Fsdp, PassError> {
        Fsdp::new(FsdpOptions::from_values(&FSDP.parse(&spec.options)?))
    }
}

/// Whether a trace holds a sharded collective (a program fsdp already rewrote).
pub fn shards(t: &Trace) -> bool {
    t.nodes()
        .any(|(_, n)| n.op == ops::ALL_GATHER || n.op == ops::REDUCE_SCATTER)
}

/// One tensor to shard: a parameter, or a tie group (one tensor behind several arguments).
#[derive(Clone, Debug)]
struct Tensor {
    /// Indices into `Program::params`, the primary first.
    params: Vec<usize>,
    /// The members' forward arguments (one per distinct argument).
    args: Vec<ValueId>,
    shape: Shape,
    dtype: DType,
    device: Device,
    /// Whether it gets a gradient (trainable and reached by the loss).
    trainable: bool,
    /// Schedule position of its first reader in the forward (the node count when none).
    first_use: usize,
}

impl Tensor {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One bucket: members in layout order, each rank holding `shard_numel` of it.
#[derive(Clone, Debug)]
struct Bucket {
    id: String,
    /// Indices into the tensor list.
    members: Vec<usize>,
    offsets: Vec<usize>,
    numel: usize,
    padding: usize,
    dtype: DType,
    device: Device,
    trainable: bool,
}

impl Bucket {
    fn padded(&self) -> usize {
        self.numel + self.padding
    }
}

/// Buckets in order of first use: ddp's planner ([`crate::ddp::plan_buckets`]) run on the
/// trainable and the frozen tensors apart (a bucket per (dtype, device, trainable) closes once
/// its bytes reach the cap; the tensor that crosses it stays in it); then each is padded.
fn plan(tensors: &[Tensor], order: &[usize], opts: &FsdpOptions) -> Vec<Bucket> {
    let cap = DdpOptions {
        world_size: opts.world_size,
        bucket_mb: opts.bucket_mb,
        ..DdpOptions::default()
    };
    // a tensor is known to the planner by its first argument
    let tensor_of: HashMap<ValueId, usize> =
        order.iter().map(|&i| (tensors[i].args[0], i)).collect();
    let rank_in_order: HashMap<usize, usize> =
        order.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let mut done: Vec<Bucket> = Vec::new();
    for trainable in [true, false] {
        let group: Vec<(ValueId, Shape, DType, Device)> = order
            .iter()
            .map(|&i| &tensors[i])
            .filter(|t| t.trainable == trainable)
            .map(|t| (t.args[0], t.shape.clone(), t.dtype, t.device))
            .collect();
        done.extend(plan_buckets(&group, &cap).into_iter().map(|b| Bucket {
            id: String::new(),
            members: b.members.iter().map(|v| tensor_of[v]).collect(),
            numel: b.numels.iter().sum(),
            offsets: b.offsets,
            padding: 0,
            dtype: b.dtype,
            device: b.device,
            trainable,
        }));
    }
    // named in order of first use (then of the first member's place in `order`): `b0` is
    // gathered first
    done.sort_by_key(|b| {
        (
            tensors[b.members[0]].first_use,
            rank_in_order[&b.members[0]],
        )
    });
    let w = opts.world_size;
    for (k, b) in done.iter_mut().enumerate() {
        b.id = format!("b{k}");
        b.padding = (w - b.numel % w) % w;
    }
    done
}

fn fail(m: impl Into<String>) -> PassError {
    PassError::Failed {
        pass: "fsdp".into(),
        message: m.into(),
    }
}

fn tensor_of(shape: impl AsRef<[usize]>, dtype: DType, device: Device) -> Type {
    Type::tensor(shape, dtype, device)
}

/// The gather of one bucket: `all_gather_async` -> `wait` -> (slice off the padding) ->
/// `unpack`, whose outputs stand for the members.
struct Gather {
    gather: Node,
    rest: Vec<Node>,
    outs: Vec<ValueId>,
}

fn gather_nodes(t: &mut Trace, b: &Bucket, tensors: &[Tensor], shard: ValueId, w: usize) -> Gather {
    let mut names = t.name_gen();
    let full_ty = tensor_of(vec![b.padded()], b.dtype, b.device);
    let Type::Tensor(full_tt) = &full_ty else {
        unreachable!("a tensor type")
    };
    let fut = t.new_value(names.fresh("ft"), Type::Future(full_tt.clone()));
    let gather = Node::new(
        ops::ALL_GATHER,
        vec![Arg::Value(shard), Arg::Str("world".into())],
        vec![fut],
    )
    .with_kwarg("world_size", Arg::Int(w as i64));
    let full = t.new_value(names.fresh("t"), full_ty);
    let mut rest = vec![Node::new(ops::WAIT, vec![Arg::Value(fut)], vec![full])];
    let mut flat = full;
    if b.padding > 0 {
        flat = t.new_value(
            names.fresh("t"),
            tensor_of(vec![b.numel], b.dtype, b.device),
        );
        rest.push(Node::new(
            "prims.slice_prim",
            vec![
                Arg::Value(full),
                Arg::int_tuple([0]),
                Arg::int_tuple([b.numel as i64]),
            ],
            vec![flat],
        ));
    }
    let outs: Vec<ValueId> = b
        .members
        .iter()
        .map(|m| {
            let x = &tensors[*m];
            t.new_value(
                names.fresh("t"),
                tensor_of(x.shape.clone(), b.dtype, b.device),
            )
        })
        .collect();
    let shapes = Arg::Tuple(
        b.members
            .iter()
            .map(|m| Arg::int_tuple(tensors[*m].shape.iter().map(|d| *d as i64)))
            .collect(),
    );
    rest.push(
        Node::new(ops::UNPACK, vec![Arg::Value(flat)], outs.clone())
            .with_kwarg("bucket", Arg::Str(b.id.clone()))
            .with_kwarg(
                "offsets",
                Arg::int_tuple(b.offsets.iter().map(|o| *o as i64)),
            )
            .with_kwarg("shapes", shapes),
    );
    Gather { gather, rest, outs }
}

/// Queues every bucket's gather in `t`: the wait and unpack right before the bucket's first
/// reader (`first[k]`, a schedule position; the node count for none), the all-gather
/// `prefetch` buckets earlier (right before the first reader of bucket `k - prefetch`, or at
/// `start`), held there for sort-waits by an order edge from the node before that reader.
/// Buckets are in order of first use. Returns the unpacked members per bucket.
#[allow(clippy::too_many_arguments)]
fn queue_gathers(
    t: &mut Trace,
    rw: &mut Rewriter,
    buckets: &[&Bucket],
    shards: &[ValueId],
    first: &[usize],
    tensors: &[Tensor],
    opts: &FsdpOptions,
    start: Option<NodeIndex>,
) -> Vec<Vec<ValueId>> {
    let sched = t.schedule().to_vec();
    let n = sched.len();
    let gathers: Vec<Gather> = buckets
        .iter()
        .zip(shards)
        .map(|(b, s)| gather_nodes(t, b, tensors, *s, opts.world_size))
        .collect();
    let mut outs = Vec::with_capacity(buckets.len());
    for (
        k,
        Gather {
            gather: g,
            rest,
            outs: members,
        },
    ) in gathers.into_iter().enumerate()
    {
        let a = k.saturating_sub(opts.prefetch);
        // the all-gather
        if a == 0 {
            match start {
                Some(s) => rw.insert_before(s, g),
                None => rw.insert_at_start(g),
            };
        } else if first[a] < n {
            let id = rw.insert_before(sched[first[a]], g);
            if first[a] > 0 {
                rw.add_order_edge(sched[first[a] - 1], id);
            }
        } else {
            rw.insert_at_end(g);
        }
        // wait, slice, unpack
        for node in rest {
            if first[k] < n {
                rw.insert_before(sched[first[k]], node);
            } else {
                rw.insert_at_end(node);
            }
        }
        outs.push(members);
    }
    outs
}

/// The schedule position of the first node reading any of `values` (`n` when none does).
fn first_reader(t: &Trace, pos: &[u32], values: &[ValueId]) -> usize {
    values
        .iter()
        .flat_map(|v| t.users(*v))
        .filter_map(|u| pos.get(u.index()).copied())
        .filter(|p| *p != UNSCHEDULED)
        .map(|p| p as usize)
        .min()
        .unwrap_or(t.schedule().len())
}

/// A saved value that is a view of a sharded tensor (`expand(unsqueeze(w))`, as a norm's weight
/// is saved): the tensor, and the forward's view statements from the tensor's argument outward.
/// zero3 saves the shard in its place and the backward makes the views again from the gathered
/// tensor: saving the view would keep the whole gathered bucket alive into the backward (a
/// view shares its source's storage), which is what zero3 is there to avoid.
#[derive(Clone, Debug)]
struct ViewChain {
    tensor: usize,
    nodes: Vec<NodeIndex>,
}

/// The ops whose result is a view of their one tensor operand.
const VIEW_OPS: [tracepass_ir::op::Op; 5] = [
    tracepass_ir::op::UNSQUEEZE,
    tracepass_ir::op::EXPAND,
    tracepass_ir::op::RESHAPE,
    tracepass_ir::op::PERMUTE,
    tracepass_ir::op::SQUEEZE,
];

/// `v`'s chain of views back to a sharded tensor's argument in `f`, if it is one: each step a
/// view op reading no value but the previous one.
fn view_chain(f: &Trace, tensors: &[Tensor], v: ValueId) -> Option<ViewChain> {
    let mut nodes = Vec::new();
    let mut cur = v;
    loop {
        if let Some(ti) = tensors.iter().position(|x| x.args.contains(&cur)) {
            if nodes.is_empty() {
                return None; // the tensor itself, saved as such
            }
            nodes.reverse();
            return Some(ViewChain { tensor: ti, nodes });
        }
        let idx = f.producer(cur)?;
        let n = f.node(idx)?;
        if !VIEW_OPS.iter().any(|op| op.matches(n)) || n.outputs().len() != 1 {
            return None;
        }
        let ins = n.operands();
        let src = *ins.first()?;
        if ins.iter().any(|x| *x != src) {
            return None;
        }
        nodes.push(idx);
        cur = src;
    }
}

/// Chains a trace's collectives in schedule order with order edges, so every rank issues them
/// in one order whatever reorders the trace later.
fn chain_collectives(t: &mut Trace) -> Result<(), PassError> {
    let collectives: Vec<NodeIndex> = t
        .schedule()
        .iter()
        .copied()
        .filter(|i| {
            t.node(*i)
                .is_some_and(|n| n.op == ops::ALL_GATHER || n.op == ops::REDUCE_SCATTER)
        })
        .collect();
    let mut rw = Rewriter::new();
    for pair in collectives.windows(2) {
        rw.add_order_edge(pair[0], pair[1]);
    }
    rw.apply(t).map_err(|e| PassError::rewrite("fsdp", e))?;
    Ok(())
}

impl Pass for Fsdp {
    fn name(&self) -> &str {
        "fsdp"
    }
    fn spec(&self) -> String {
        FSDP.spell(&self.options.to_values())
    }

    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        let opts = &self.options;
        let w = opts.world_size;
        if p.params.is_empty() || p.is_lone() {
            return Err(fail(
                "needs a program (forward, backward and parameters): give an export directory, a program file, or the backward with --forward",
            ));
        }
        if shards(&p.forward) || shards(&p.backward) || p.params.iter().any(|x| x.shard.is_some()) {
            return Err(fail("the program is sharded already (fsdp ran on it)"));
        }
        if crate::ddp::synchronizes(&p.backward) {
            return Err(fail(
                "the backward already all-reduces gradients (ddp, or Thunder's own DDP); fsdp replaces ddp: run `no-sync` first, or give the plain export",
            ));
        }
        // the forward saves shards and the backward returns gradient shards: not the types
        // they returned before, by design
        cx.changed_parameter_returns(p);
        if !matches!(p.backward.ret, Arg::Tuple(_) | Arg::List(_)) {
            return Err(fail("the backward's return is not a tuple of gradients"));
        }
        let grads_out = p.gradient_values();
        let unused: Vec<String> = p.unused_params().into_iter().map(String::from).collect();
        // 1. the tensors to shard: trainable parameters with a gradient (a tie is one tensor),
        // and frozen ones when asked
        let mut tensors: Vec<Tensor> = Vec::new();
        let mut by_primary: HashMap<String, usize> = HashMap::default();
        let mut frozen_left = Vec::new();
        for (i, param) in p.params.iter().enumerate() {
            if param.buffer {
                continue;
            }
            let primary = param.tied_to.clone().unwrap_or_else(|| param.fqn.clone());
            let trainable = param.requires_grad;
            if trainable && unused.contains(&param.fqn) {
                continue;
            }
            if !trainable && !opts.shard_frozen {
                frozen_left.push(param.fqn.clone());
                continue;
            }
            if !trainable {
                if let Some(Some(g)) = param.grad_output.and_then(|k| grads_out.get(k)) {
                    return Err(fail(format!(
                        "the backward returns gradient `{}` for `{}`, which does not require a gradient",
                        p.backward.name(*g),
                        param.fqn
                    )));
                }
            }
            let arg = *p.forward.args().get(param.forward_arg).ok_or_else(|| {
                fail(format!(
                    "`{}` is forward argument {}, which the forward does not take",
                    param.fqn, param.forward_arg
                ))
            })?;
            match by_primary.get(&primary) {
                Some(&k) => {
                    tensors[k].params.push(i);
                    if !tensors[k].args.contains(&arg) {
                        tensors[k].args.push(arg);
                    }
                }
                None => {
                    let Some(Type::Tensor(tt)) = p.forward.ty(arg) else {
                        return Err(fail(format!("parameter `{}` is not a tensor", param.fqn)));
                    };
                    if tt.checked_nbytes().is_none() {
                        return Err(fail(format!(
                            "parameter `{}` has type {tt}, over {MAX_TENSOR_BYTES} bytes",
                            param.fqn
                        )));
                    }
                    by_primary.insert(primary.clone(), tensors.len());
                    tensors.push(Tensor {
                        params: vec![i],
                        args: vec![arg],
                        shape: tt.shape.clone(),
                        dtype: tt.dtype,
                        device: tt.device,
                        trainable,
                        first_use: 0,
                    });
                }
            }
        }
        if tensors.is_empty() {
            return Err(fail(
                "no parameter to shard: every parameter is frozen (shard_frozen=true shards them), a buffer, or unused",
            ));
        }
        // the primary first within a tie
        for x in &mut tensors {
            x.params.sort_by_key(|i| p.params[*i].tied_to.is_some());
        }
        let fwd_pos = p.forward.schedule_positions();
        for x in &mut tensors {
            x.first_use = first_reader(&p.forward, &fwd_pos, &x.args);
        }
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|i| {
            (
                tensors[*i].first_use,
                p.params[tensors[*i].params[0]].forward_arg,
            )
        });
        let buckets = plan(&tensors, &order, opts);
        if let Some(b) = buckets
            .iter()
            .find(|b| b.padded().saturating_mul(b.dtype.size_bytes()) > MAX_TENSOR_BYTES)
        {
            return Err(fail(format!(
                "bucket {} would hold over {MAX_TENSOR_BYTES} bytes; lower bucket_mb",
                b.id
            )));
        }
        let bucket_of: HashMap<usize, (usize, usize)> = buckets
            .iter()
            .enumerate()
            .flat_map(|(bi, b)| {
                b.members
                    .iter()
                    .enumerate()
                    .map(move |(k, m)| (*m, (bi, k)))
            })
            .collect();

        let saved_before = p.forward_saved();
        let saved_names = p.backward_saved();
        // zero3: saved views of sharded tensors, made again in the backward
        let chains: HashMap<ValueId, ViewChain> = if opts.sharding == Sharding::Zero3 {
            saved_before
                .iter()
                .filter_map(|v| view_chain(&p.forward, &tensors, *v).map(|c| (*v, c)))
                .collect()
        } else {
            HashMap::default()
        };
        // the saved views' places now hold shards too
        if let Arg::Tuple(items) = &p.forward.ret {
            if let Some(Arg::Tuple(saved)) = items.get(1) {
                if let Some(Arg::Tuple(first)) = saved.first() {
                    for (i, x) in first.iter().enumerate() {
                        if x.as_value().is_some_and(|v| chains.contains_key(&v)) {
                            cx.changed_return(true, &[1, 0, i as u32]);
                        }
                    }
                }
            }
        }
        let chain_nodes: Vec<(ValueId, Vec<Node>, Vec<Type>)> = chains
            .iter()
            .map(|(v, c)| {
                let nodes: Vec<Node> = c
                    .nodes
                    .iter()
                    .filter_map(|i| p.forward.node(*i).cloned())
                    .collect();
                let tys: Vec<Type> = nodes
                    .iter()
                    .filter_map(|n| p.forward.ty(n.outputs()[0]).cloned())
                    .collect();
                (*v, nodes, tys)
            })
            .collect();
        if opts.sharding == Sharding::Zero3 && saved_names.len() != saved_before.len() {
            // the forward will save shards; a backward that does not unpack them one for one
            // could not be told which of its values to gather again
            return Err(fail(format!(
                "zero3: the forward saves {} values but the backward unpacks {}",
                saved_before.len(),
                saved_names.len()
            )));
        }
        // 2. the forward: shard arguments in place of the parameters, gathered before use
        let sharded_args: Vec<ValueId> = tensors.iter().flat_map(|x| x.args.clone()).collect();
        let f = &mut p.forward;
        let shard_args: Vec<ValueId> = buckets
            .iter()
            .map(|b| {
                let name = format!("shard_{}", b.id);
                if f.find_value(&name).is_some() {
                    return Err(fail(format!("the forward already has a value `{name}`")));
                }
                Ok(f.new_value(name, tensor_of(vec![b.padded() / w], b.dtype, b.device)))
            })
            .collect::<Result<_, _>>()?;
        let old_args = f.args().to_vec();
        let kept: Vec<usize> = (0..old_args.len())
            .filter(|i| !sharded_args.contains(&old_args[*i]))
            .collect();
        let mut new_args: Vec<ValueId> = kept.iter().map(|i| old_args[*i]).collect();
        new_args.extend(&shard_args);
        let new_index = |old: usize| kept.iter().position(|k| *k == old);
        let f = &mut p.forward;
        let first: Vec<usize> = buckets
            .iter()
            .map(|b| tensors[b.members[0]].first_use)
            .collect();
        let bucket_refs: Vec<&Bucket> = buckets.iter().collect();
        let mut rw = Rewriter::new();
        let outs = queue_gathers(
            f,
            &mut rw,
            &bucket_refs,
            &shard_args,
            &first,
            &tensors,
            opts,
            None,
        );
        f.set_args(new_args.clone());
        rw.apply(f).map_err(|e| PassError::rewrite("fsdp", e))?;
        // the rewriter rewires a value's readers before it inserts the value's producer, so
        // the replacements go in a second rewrite, once the gathered values are defined
        let mut rw = Rewriter::new();
        for (ti, x) in tensors.iter().enumerate() {
            let (bi, k) = bucket_of[&ti];
            for a in &x.args {
                rw.replace_all_uses(*a, outs[bi][k]);
            }
        }
        // the return: `flat_args` names the new arguments; zero3 saves shards, not parameters
        let shard_of_arg = |a: ValueId| -> Option<ValueId> {
            tensors
                .iter()
                .position(|x| x.args.contains(&a))
                .or_else(|| chains.get(&a).map(|c| c.tensor))
                .map(|ti| shard_args[bucket_of[&ti].0])
        };
        let mut ret = f.ret.clone();
        if let Arg::Tuple(items) = &mut ret {
            if let Some(Arg::Dict(entries)) = items.get_mut(0) {
                for (k, v) in entries.iter_mut() {
                    if k.as_str() == Some("flat_args") {
                        *v = Arg::List(new_args.iter().map(|a| Arg::Value(*a)).collect());
                    }
                }
            }
            if opts.sharding == Sharding::Zero3 {
                if let Some(Arg::Tuple(saved)) = items.get_mut(1) {
                    if let Some(Arg::Tuple(first)) = saved.first_mut() {
                        for s in first.iter_mut() {
                            if let Some(sh) = s.as_value().and_then(shard_of_arg) {
                                *s = Arg::Value(sh);
                            }
                        }
                    }
                }
            }
        }
        rw.set_return(ret);
        rw.apply(f).map_err(|e| PassError::rewrite("fsdp", e))?;
        f.purge_undefined_values();
        chain_collectives(f)?;
        cx.changed_trace(true);

        // 3. the backward: zero3 gathers the saved parameters again
        let b = &mut p.backward;
        let pos = b.schedule_positions();
        if opts.sharding == Sharding::Zero3 {
            // per bucket: the saved values of its members (backward side), by member
            let mut per_bucket: Vec<Vec<(usize, ValueId)>> = vec![Vec::new(); buckets.len()];
            // the saved views to make again: backward value -> (forward value)
            let mut remake: HashMap<ValueId, ValueId> = HashMap::default();
            for (fv, bv) in saved_before.iter().zip(&saved_names) {
                let ti = tensors
                    .iter()
                    .position(|x| x.args.contains(fv))
                    .or_else(|| chains.get(fv).map(|c| c.tensor));
                if let Some(ti) = ti {
                    let (bi, k) = bucket_of[&ti];
                    per_bucket[bi].push((k, *bv));
                    if chains.contains_key(fv) {
                        remake.insert(*bv, *fv);
                    }
                }
            }
            let needed: Vec<usize> = (0..buckets.len())
                .filter(|bi| !per_bucket[*bi].is_empty())
                .collect();
            if !needed.is_empty() {
                // the saved values become shards (the forward saves them in their place)
                let mut holders = Vec::new();
                for &bi in &needed {
                    let bk = &buckets[bi];
                    let ty = tensor_of(vec![bk.padded() / w], bk.dtype, bk.device);
                    for (j, (_, bv)) in per_bucket[bi].iter().enumerate() {
                        b.set_ty(*bv, ty.clone());
                        // a bucket saved in several places (its members were) is one shard
                        // saved again: `shard_b0`, `shard_b0_1`, ...
                        let name = match j {
                            0 => format!("shard_{}", bk.id),
                            j => format!("shard_{}_{j}", bk.id),
                        };
                        b.set_name(*bv, &name);
                    }
                    holders.push(per_bucket[bi][0].1);
                }
                let mut order: Vec<usize> = (0..needed.len()).collect();
                let firsts: Vec<usize> = needed
                    .iter()
                    .map(|bi| {
                        let vals: Vec<ValueId> = per_bucket[*bi].iter().map(|(_, v)| *v).collect();
                        first_reader(b, &pos, &vals)
                    })
                    .collect();
                order.sort_by_key(|i| (firsts[*i], *i));
                let ordered: Vec<&Bucket> = order.iter().map(|i| &buckets[needed[*i]]).collect();
                let ordered_first: Vec<usize> = order.iter().map(|i| firsts[*i]).collect();
                // placeholders the gathers read, resolved to the saved shards last
                let placeholders: Vec<ValueId> = order
                    .iter()
                    .map(|i| {
                        let ty = b.ty(holders[*i]).cloned().expect("typed above");
                        let name = format!("{}_placeholder", b.name(holders[*i]));
                        b.new_value(name, ty)
                    })
                    .collect();
                let start = b.schedule().get(ordered_first[0]).copied();
                let mut rw = Rewriter::new();
                let outs_b = queue_gathers(
                    b,
                    &mut rw,
                    &ordered,
                    &placeholders,
                    &ordered_first,
                    &tensors,
                    opts,
                    start,
                );
                rw.apply(b).map_err(|e| PassError::rewrite("fsdp", e))?;
                // a saved view is made again from the gathered tensor, right before its
                // first reader (after the gather's unpack, which precedes the bucket's first
                // reader)
                let mut target: HashMap<ValueId, ValueId> = HashMap::default();
                let mut rw = Rewriter::new();
                let pos_b = b.schedule_positions();
                let sched_b = b.schedule().to_vec();
                let mut names_b = b.name_gen();
                for (oi, i) in order.iter().enumerate() {
                    for (k, bv) in &per_bucket[needed[*i]] {
                        let mut cur = outs_b[oi][*k];
                        if let Some((_, nodes, tys)) = remake
                            .get(bv)
                            .and_then(|fv| chain_nodes.iter().find(|(v, _, _)| v == fv))
                        {
                            let at = first_reader(b, &pos_b, &[*bv]);
                            for (n, ty) in nodes.iter().zip(tys) {
                                let out = b.new_value(names_b.fresh("t"), ty.clone());
                                let src = n.operands()[0];
                                let mut nn = n.with_operands(n.args().to_vec(), vec![out]);
                                nn.map_operands(&mut |v| if v == src { cur } else { v });
                                if at < sched_b.len() {
                                    rw.insert_before(sched_b[at], nn);
                                } else {
                                    rw.insert_at_end(nn);
                                }
                                cur = out;
                            }
                        }
                        target.insert(*bv, cur);
                    }
                }
                rw.apply(b).map_err(|e| PassError::rewrite("fsdp", e))?;
                let mut rw = Rewriter::new();
                for (bv, v) in &target {
                    rw.replace_all_uses(*bv, *v);
                }
                rw.apply(b).map_err(|e| PassError::rewrite("fsdp", e))?;
                let mut rw = Rewriter::new();
                for (oi, i) in order.iter().enumerate() {
                    rw.replace_all_uses(placeholders[oi], holders[*i]);
                }
                rw.apply(b).map_err(|e| PassError::rewrite("fsdp", e))?;
                b.purge_undefined_values();
            }
        }

        // 4. the backward: reduce-scatter each trainable bucket's pre-averaged gradients
        let b = &mut p.backward;
        let pos = b.schedule_positions();
        let sched = b.schedule().to_vec();
        let slot_of = |b: &Trace, v: ValueId| match b.value(v).map(|x| x.def) {
            Some(Def::Node(n, _)) => pos
                .get(n.index())
                .filter(|q| **q != UNSCHEDULED)
                .map(|q| *q as usize),
            _ => None,
        };
        let mut names = b.name_gen();
        let mut rw = Rewriter::new();
        let queue_after = |rw: &mut Rewriter, slot: Option<usize>, n: Node| match slot {
            None => rw.insert_at_start(n),
            Some(s) => rw.insert_after(sched[s], n),
        };
        let mut shard_grads: Vec<Option<ValueId>> = vec![None; buckets.len()];
        let mut tail = Vec::new();
        let mut reduced = 0usize;
        for (bi, bk) in buckets.iter().enumerate().filter(|(_, b)| b.trainable) {
            let mut members: Vec<ValueId> = Vec::with_capacity(bk.members.len());
            let mut last: Option<usize> = None;
            for m in &bk.members {
                let x = &tensors[*m];
                let mut gs: Vec<ValueId> = Vec::new();
                for pi in &x.params {
                    if let Some(Some(g)) = p.params[*pi].grad_output.and_then(|k| grads_out.get(k))
                    {
                        if !gs.contains(g) {
                            gs.push(*g);
                        }
                    }
                }
                let Some(&g0) = gs.first() else {
                    return Err(fail(format!(
                        "internal: `{}` is sharded as trainable but has no gradient",
                        p.params[x.params[0]].fqn
                    )));
                };
                let ty = tensor_of(x.shape.clone(), bk.dtype, bk.device);
                let mut acc = g0;
                let mut slot = slot_of(b, g0);
                // a tie's gradients add up, after the later of them
                for &g in &gs[1..] {
                    slot = slot.max(slot_of(b, g));
                    let out = b.new_value(names.fresh("t"), ty.clone());
                    queue_after(
                        &mut rw,
                        slot,
                        Node::new(ops::ADD, vec![Arg::Value(acc), Arg::Value(g)], vec![out]),
                    );
                    acc = out;
                }
                let div = b.new_value(names.fresh("t"), ty);
                queue_after(
                    &mut rw,
                    slot,
                    Node::new(
                        ops::DIV,
                        vec![Arg::Value(acc), Arg::Float(w as f64)],
                        vec![div],
                    ),
                );
                members.push(div);
                last = last.max(slot);
            }
            // after the bucket's last gradient: pack, pad, reduce-scatter
            let flat = b.new_value(
                names.fresh("t"),
                tensor_of(vec![bk.numel], bk.dtype, bk.device),
            );
            queue_after(
                &mut rw,
                last,
                Node::new(
                    ops::BUCKET_PACK,
                    vec![Arg::List(members.iter().map(|v| Arg::Value(*v)).collect())],
                    vec![flat],
                )
                .with_kwarg("bucket", Arg::Str(bk.id.clone()))
                .with_kwarg(
                    "offsets",
                    Arg::int_tuple(bk.offsets.iter().map(|o| *o as i64)),
                )
                .with_kwarg(
                    "nbytes",
                    Arg::Int((bk.numel * bk.dtype.size_bytes()) as i64),
                ),
            );
            let mut buf = flat;
            if bk.padding > 0 {
                buf = b.new_value(
                    names.fresh("t"),
                    tensor_of(vec![bk.padded()], bk.dtype, bk.device),
                );
                queue_after(
                    &mut rw,
                    last,
                    Node::new(
                        "prims.pad",
                        vec![
                            Arg::Value(flat),
                            Arg::Float(0.0),
                            Arg::Tuple(vec![Arg::int_tuple([0, bk.padding as i64, 0])]),
                        ],
                        vec![buf],
                    ),
                );
            }
            let shard_ty = tensor_of(vec![bk.padded() / w], bk.dtype, bk.device);
            let Type::Tensor(shard_tt) = &shard_ty else {
                unreachable!("a tensor type")
            };
            let fut = b.new_value(names.fresh("ft"), Type::Future(shard_tt.clone()));
            queue_after(
                &mut rw,
                last,
                Node::new(
                    ops::REDUCE_SCATTER,
                    vec![
                        Arg::Value(buf),
                        Arg::Str("sum".into()),
                        Arg::Str("world".into()),
                    ],
                    vec![fut],
                )
                .with_kwarg("world_size", Arg::Int(w as i64)),
            );
            let g = b.new_value(names.fresh("t"), shard_ty);
            tail.push(Node::new(ops::WAIT, vec![Arg::Value(fut)], vec![g]));
            shard_grads[bi] = Some(g);
            reduced += 1;
        }
        for n in tail {
            rw.insert_at_end(n);
        }
        // one gradient per new forward argument: the kept arguments' own, then each shard's
        let old_ret = match &b.ret {
            Arg::Tuple(items) | Arg::List(items) => items.clone(),
            _ => return Err(fail("the backward's return is not a tuple of gradients")),
        };
        let mut new_ret: Vec<Arg> = kept
            .iter()
            .map(|i| old_ret.get(*i).cloned().unwrap_or(Arg::None))
            .collect();
        new_ret.extend(shard_grads.iter().map(|g| g.map_or(Arg::None, Arg::Value)));
        rw.set_return(Arg::Tuple(new_ret));
        rw.apply(b).map_err(|e| PassError::rewrite("fsdp", e))?;
        chain_collectives(b)?;
        cx.changed_trace(false);

        // 5. the parameters: where each one lives now
        let n_kept = kept.len();
        for (i, param) in p.params.iter_mut().enumerate() {
            let placed = tensors
                .iter()
                .position(|x| x.params.contains(&i))
                .map(|ti| (ti, bucket_of[&ti]));
            match placed {
                Some((ti, (bi, k))) => {
                    let bk = &buckets[bi];
                    let primary = tensors[ti].params[0] == i;
                    param.forward_arg = n_kept + bi;
                    param.grad_output = (bk.trainable && primary).then_some(n_kept + bi);
                    param.shard = Some(ParamShard {
                        bucket: bk.id.clone(),
                        offset: bk.offsets[k],
                        numel: tensors[ti].numel(),
                        bucket_numel: bk.numel,
                        padding: bk.padding,
                        world_size: w,
                    });
                }
                None => {
                    let fa = new_index(param.forward_arg).ok_or_else(|| {
                        fail(format!(
                            "internal: `{}` lost its forward argument",
                            param.fqn
                        ))
                    })?;
                    param.forward_arg = fa;
                    param.grad_output = param.grad_output.and_then(new_index);
                }
            }
        }
        let list = |v: Vec<String>| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        cx.stat("fsdp.buckets", buckets.len() as u64);
        cx.stat("fsdp.sharded", tensors.len() as u64);
        cx.stat("fsdp.reduce_scattered", reduced as u64);
        cx.stat(
            "fsdp.padding",
            buckets.iter().map(|b| b.padding as u64).sum(),
        );
        cx.stat("fsdp.frozen", frozen_left.len() as u64);
        cx.note("fsdp.frozen", list(frozen_left));
        cx.stat("fsdp.unused", unused.len() as u64);
        cx.note("fsdp.unused", list(unused));
        Ok(Changed::from(true))
    }
}
