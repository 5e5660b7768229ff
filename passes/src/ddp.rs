//! Distributed Data Parallel: pre-average each parameter gradient, pack gradients into buckets
//! in the order the backward produces them, all-reduce each bucket as soon as its last gradient
//! is ready, and wait/unpack at the end (sort-waits then moves each wait to its first consumer).

use crate::pass::{Changed, Pass, PassContext, PassError};
use crate::pipeline::PassSpec;
use crate::registry::{
    OptionDecl, OptionDefault, OptionKind, OptionValue, OptionValues, PassDecl, PassLevel, Show,
};
use rustc_hash::FxHashMap as HashMap;
use tracepass_ir::{
    ops, Arg, DType, Def, Device, NewNode, Node, Program, Rewriter, Shape, Type, ValueId,
    ValueIdMap, ValueIdSet, MAX_TENSOR_BYTES, UNSCHEDULED,
};

/// Where the division by the world size happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    /// Divide each gradient before the all-reduce (Thunder's and PyTorch's choice: no overflow in
    /// low precision).
    Pre,
    /// Divide the reduced gradients after the wait.
    Post,
}

/// Options of the ddp pass.
#[derive(Clone, Debug, PartialEq)]
pub struct DdpOptions {
    /// Number of ranks the gradients are averaged over (at least 1).
    pub world_size: usize,
    /// Bucket cap in MiB; `<= 0` means one all-reduce per gradient.
    pub bucket_mb: f64,
    /// Cap of the first bucket (PyTorch-style small first bucket, so communication starts early).
    pub first_bucket_mb: Option<f64>,
    /// Where the division by the world size happens.
    pub average: Average,
    /// Process group the collectives run on.
    pub group: String,
    /// When the all-reduces start: as soon as their bucket is ready (default), or after the
    /// whole backward, as Thunder 0.2.6 schedules them (for comparisons).
    pub launch: Launch,
}

/// Where the ddp pass places each bucket's division, pack and all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// Right after the bucket's last gradient is produced.
    Ready,
    /// After the last node of the backward (no overlap with backward compute).
    End,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            world_size: 1,
            bucket_mb: 25.0,
            first_bucket_mb: None,
            average: Average::Pre,
            group: "world".into(),
            launch: Launch::Ready,
        }
    }
}

/// The ddp pass. Build it with [`Ddp::new`], which checks the options as a pipeline would.
#[derive(Debug)]
pub struct Ddp {
    options: DdpOptions,
}

const MIB_RANGE: OptionKind = OptionKind::Float {
    min: f64::NEG_INFINITY,
    min_inclusive: true,
};

/// The `world_size` option the data-parallel passes (`ddp`, `fsdp`) share: required, 1 to
/// `u32::MAX` ranks.
pub(crate) const fn world_size_option(help: &'static str) -> OptionDecl {
    OptionDecl {
        name: "world_size",
        kind: OptionKind::Int {
            min: 1,
            max: u32::MAX as u64,
        },
        default: OptionDefault::Required,
        help,
        show: Show::Always,
    }
}

/// The `bucket_mb` option the data-parallel passes share: a cap in MiB, 25 by default, `<= 0`
/// for one bucket per tensor.
pub(crate) const fn bucket_mb_option(help: &'static str, show: Show) -> OptionDecl {
    OptionDecl {
        name: "bucket_mb",
        kind: MIB_RANGE,
        default: OptionDefault::Value("25"),
        help,
        show,
    }
}

/// `ddp`: its options, declared once (parsing, checking, printing and `--help` come from here).
pub static DDP: PassDecl = PassDecl {
    name: "ddp",
    help: "pre-averages parameter gradients, packs them into buckets, all-reduces each bucket asynchronously",
    level: PassLevel::Program,
    options: &[
        world_size_option("number of ranks the gradients are averaged over"),
        bucket_mb_option(
            "bucket cap in MiB; <= 0: one all-reduce per gradient",
            Show::Always,
        ),
        OptionDecl {
            name: "first_bucket_mb",
            kind: OptionKind::Float {
                min: 0.0,
                min_inclusive: false,
            },
            default: OptionDefault::Absent,
            help: "cap of the first bucket (PyTorch-style small first bucket)",
            show: Show::IfChanged,
        },
        OptionDecl {
            name: "average",
            kind: OptionKind::Choice(&["pre", "post"]),
            default: OptionDefault::Value("pre"),
            help: "divide by the world size before the all-reduce, or after the wait",
            show: Show::IfChanged,
        },
        OptionDecl {
            name: "group",
            kind: OptionKind::Word,
            default: OptionDefault::Value("world"),
            help: "process group the collectives run on",
            show: Show::IfChanged,
        },
        OptionDecl {
            name: "launch",
            kind: OptionKind::Choice(&["ready", "end"]),
            default: OptionDefault::Value("ready"),
            help: "start each all-reduce when its bucket is ready, or after the backward",
            show: Show::IfChanged,
        },
    ],
};

impl DdpOptions {
    /// The options as values of [`DDP`]'s declaration.
    pub fn to_values(&self) -> OptionValues {
        let mut v = OptionValues::defaults(&DDP);
        v.set("world_size", Some(OptionValue::Int(self.world_size as u64)))
            .set("bucket_mb", Some(OptionValue::Float(self.bucket_mb)))
            .set(
                "first_bucket_mb",
                self.first_bucket_mb.map(OptionValue::Float),
            )
            .set(
                "average",
                Some(OptionValue::Word(
                    match self.average {
                        Average::Pre => "pre",
                        Average::Post => "post",
                    }
                    .into(),
                )),
            )
            .set("group", Some(OptionValue::Word(self.group.clone())))
            .set(
                "launch",
                Some(OptionValue::Word(
                    match self.launch {
                        Launch::Ready => "ready",
                        Launch::End => "end",
                    }
                    .into(),
                )),
            );
        v
    }
    /// The pass with these options as a pipeline value (`ddp(world_size=4,bucket_mb=25)`).
    pub fn spec(&self) -> PassSpec {
        DDP.spec(&self.to_values())
    }
    /// The options from checked values of [`DDP`]'s declaration.
    pub fn from_values(v: &OptionValues) -> DdpOptions {
        DdpOptions {
            world_size: v.int("world_size") as usize,
            bucket_mb: v.float("bucket_mb").unwrap_or(25.0),
            first_bucket_mb: v.float("first_bucket_mb"),
            average: match v.word("average") {
                Some("post") => Average::Post,
                _ => Average::Pre,
            },
            group: v.word("group").unwrap_or("world").to_string(),
            launch: match v.word("launch") {
                Some("end") => Launch::End,
                _ => Launch::Ready,
            },
        }
    }
    /// Checks the options as parsing them would (`world_size` at least 1, finite sizes, ...).
    pub fn check(&self) -> Result<(), PassError> {
        DDP.check(&self.to_values())
    }
}

impl Ddp {
    /// The pass with checked options: `world_size: 0`, a NaN or infinite size, a first bucket
    /// of at most 0 MiB or a group that is not a word are errors.
    pub fn new(options: DdpOptions) -> Result<Ddp, PassError> {
        options.check()?;
        Ok(Ddp { options })
    }
    /// Its options.
    pub fn options(&self) -> &DdpOptions {
        &self.options
    }
    /// The pass from a pipeline spec (`ddp(world_size=4)`).
    pub fn from_spec(spec: &PassSpec) -> Result<Ddp, PassError> {
        Ddp::new(DdpOptions::from_values(&DDP.parse(&spec.options)?))
    }
}

/// The gradient of one trainable tensor: a parameter, or a tie group that is one tensor.
#[derive(Clone, Debug)]
pub(crate) struct GradGroup {
    /// The parameters' names, the primary (first in the module's order) first.
    pub(crate) fqns: Vec<String>,
    /// Each member's position in the backward's return.
    pub(crate) member_positions: Vec<usize>,
    /// Where the synchronized gradient is returned: the primary's position.
    pub(crate) primary_pos: usize,
    /// Positions that return a gradient now.
    pub(crate) positions: Vec<usize>,
    /// The gradient values at those positions (added up when a tie has several).
    pub(crate) values: Vec<ValueId>,
}

/// The trainable tensors with a gradient to synchronize, and the names of those the backward
/// returns no gradient for.
pub(crate) struct GradientGroups {
    pub(crate) groups: Vec<GradGroup>,
    /// Trainable parameters whose tensor gets no gradient at all: the loss never reaches them,
    /// which the trace proves statically. Like PyTorch (a `None` grad) and Thunder (no gradient
    /// returned), ddp leaves them alone and the trainer does not update them.
    pub(crate) unused: Vec<String>,
}

/// Groups trainable parameters into tensors (ties are one) and finds each one's gradients in
/// the backward's return. A tensor without any gradient is unused (reported, left alone);
/// a gradient returned for something that is not a trainable parameter is an error naming it.
pub(crate) fn gradient_groups(p: &Program) -> Result<GradientGroups, String> {
    let grads_out = p.gradient_values();
    let mut groups: Vec<GradGroup> = Vec::new();
    let mut seen = ValueIdSet::default();
    // by name, so that a model of many parameters is not searched once for each of them
    let by_fqn: HashMap<&str, &tracepass_ir::Param> =
        p.params.iter().map(|x| (x.fqn.as_str(), x)).collect();
    let mut group_of: HashMap<&str, usize> = HashMap::default();
    for param in p.params.iter().filter(|x| x.requires_grad && !x.buffer) {
        let primary = param.tied_to.as_deref().unwrap_or(&param.fqn);
        let primary_param = by_fqn.get(primary).copied().ok_or_else(|| {
            format!(
                "`{}` is tied to `{primary}`, which is not a parameter",
                param.fqn
            )
        })?;
        let at = |x: &tracepass_ir::Param| x.grad_output.unwrap_or(x.forward_arg);
        let gi = match group_of.get(primary) {
            Some(&i) => i,
            None => {
                group_of.insert(primary, groups.len());
                groups.push(GradGroup {
                    fqns: vec![primary.to_string()],
                    member_positions: vec![at(primary_param)],
                    primary_pos: at(primary_param),
                    positions: Vec::new(),
                    values: Vec::new(),
                });
                groups.len() - 1
            }
        };
        let g = &mut groups[gi];
        if param.fqn != primary {
            g.fqns.push(param.fqn.clone());
            g.member_positions.push(at(param));
        }
    }
    for g in &mut groups {
        let mut unique = g.member_positions.clone();
        unique.dedup();
        unique.sort_unstable();
        unique.dedup();
        for pos in unique {
            if let Some(Some(v)) = grads_out.get(pos) {
                g.positions.push(pos);
                if seen.insert(*v) {
                    g.values.push(*v);
                } else {
                    return Err(format!(
                        "gradient `{}` is returned for `{}` and for another parameter that is not tied to it",
                        p.backward.name(*v),
                        g.fqns[0]
                    ));
                }
            }
        }
    }
    let (groups, unused): (Vec<GradGroup>, Vec<GradGroup>) =
        groups.into_iter().partition(|g| !g.values.is_empty());
    let unused: Vec<String> = unused.into_iter().flat_map(|g| g.fqns).collect();
    // gradients of frozen parameters or buffers would be returned unsynchronized
    for param in p.params.iter().filter(|x| !x.requires_grad || x.buffer) {
        if let Some(Some(v)) = param.grad_output.and_then(|i| grads_out.get(i)) {
            return Err(format!(
                "the backward returns gradient `{}` for `{}`, which {}",
                p.backward.name(*v),
                param.fqn,
                if param.buffer {
                    "is a buffer"
                } else {
                    "does not require a gradient"
                }
            ));
        }
    }
    Ok(GradientGroups { groups, unused })
}

/// Names what ddp leaves alone, so a user can check nothing was missed.
fn report_left_alone(p: &Program, found: &GradientGroups, cx: &mut PassContext) {
    let groups = &found.groups;
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let frozen: Vec<String> = p
        .params
        .iter()
        .filter(|x| !x.requires_grad && !x.buffer)
        .map(|x| x.fqn.clone())
        .collect();
    let buffers: Vec<String> = p
        .params
        .iter()
        .filter(|x| x.buffer)
        .map(|x| x.fqn.clone())
        .collect();
    let inputs: Vec<String> = p.data_inputs().into_iter().map(|(_, n)| n).collect();
    let tied: Vec<String> = groups
        .iter()
        .filter(|g| g.fqns.len() > 1)
        .map(|g| g.fqns.join(" = "))
        .collect();
    cx.stat("ddp.frozen", frozen.len() as u64);
    cx.stat("ddp.buffers", buffers.len() as u64);
    cx.stat("ddp.inputs", inputs.len() as u64);
    cx.note("ddp.frozen", list(frozen));
    cx.note("ddp.buffers", list(buffers));
    cx.note("ddp.inputs", list(inputs));
    cx.note("ddp.tied", list(tied));
    cx.stat("ddp.unused", found.unused.len() as u64);
    cx.note("ddp.unused", list(found.unused.clone()));
}

/// One bucket of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    /// Its name (`b0`, `b1`, ...), in closing order.
    pub id: String,
    /// Gradient values, in production order.
    pub members: Vec<ValueId>,
    /// Element offset of each member in the flat buffer.
    pub offsets: Vec<usize>,
    /// Element count of each member.
    pub numels: Vec<usize>,
    /// Shape of each member.
    pub shapes: Vec<Shape>,
    /// Bytes of the flat buffer.
    pub nbytes: usize,
    /// The members' dtype.
    pub dtype: DType,
    /// The members' device.
    pub device: Device,
}

/// Groups gradients (given in production order) into buckets: per (group, dtype, device) a bucket
/// closes once its bytes reach the cap; the gradient that crosses the cap stays in it.
pub fn plan_buckets(grads: &[(ValueId, Shape, DType, Device)], opts: &DdpOptions) -> Vec<Bucket> {
    const MIB: f64 = (1u64 << 20) as f64;
    let mut open: HashMap<(DType, Device), Bucket> = HashMap::default();
    let mut opened_order: Vec<(DType, Device)> = Vec::new();
    let mut closed: Vec<Bucket> = Vec::new();
    let mut count_per_kind: HashMap<(DType, Device), usize> = HashMap::default();
    for (v, shape, dtype, device) in grads {
        let key = (*dtype, *device);
        // saturating: `run` refuses shapes and buckets over MAX_TENSOR_BYTES, and a plan is
        // never made of sizes that wrapped around
        let numel = shape.iter().fold(1usize, |n, d| n.saturating_mul(*d));
        let b = open.entry(key).or_insert_with(|| {
            opened_order.push(key);
            Bucket {
                id: String::new(),
                members: Vec::new(),
                offsets: Vec::new(),
                numels: Vec::new(),
                shapes: Vec::new(),
                nbytes: 0,
                dtype: *dtype,
                device: *device,
            }
        });
        let offset = b
            .offsets
            .last()
            .zip(b.numels.last())
            .map_or(0, |(o, n)| o.saturating_add(*n));
        b.members.push(*v);
        b.offsets.push(offset);
        b.numels.push(numel);
        b.shapes.push(shape.clone());
        b.nbytes = b
            .nbytes
            .saturating_add(numel.saturating_mul(dtype.size_bytes()));
        let nth = count_per_kind.get(&key).copied().unwrap_or(0);
        let cap_mb = match (nth, opts.first_bucket_mb) {
            (0, Some(f)) => f,
            _ => opts.bucket_mb,
        };
        if opts.bucket_mb <= 0.0 || b.nbytes as f64 >= cap_mb * MIB {
            let mut done = open.remove(&key).expect("bucket just used");
            opened_order.retain(|k| *k != key);
            *count_per_kind.entry(key).or_insert(0) += 1;
            done.id = format!("b{}", closed.len());
            closed.push(done);
        }
    }
    // the rest close after the backward, in the order their last gradient was produced
    let mut rest: Vec<Bucket> = opened_order
        .into_iter()
        .filter_map(|k| open.remove(&k))
        .collect();
    let pos: HashMap<ValueId, usize> = grads.iter().enumerate().map(|(i, g)| (g.0, i)).collect();
    rest.sort_by_key(|b| b.members.last().map(|m| pos[m]));
    for mut b in rest {
        b.id = format!("b{}", closed.len());
        closed.push(b);
    }
    closed
}

/// Reads back the bucket plan recorded on `dist.bucket_pack` nodes, in schedule order.
pub fn recorded_plan(t: &tracepass_ir::Trace) -> Vec<(String, Vec<ValueId>, usize)> {
    t.nodes()
        .filter(|(_, n)| n.op == ops::BUCKET_PACK)
        .map(|(_, n)| {
            let id = n
                .kwarg("bucket")
                .and_then(Arg::as_str)
                .unwrap_or("")
                .to_string();
            let members = n
                .args()
                .first()
                .and_then(Arg::as_seq)
                .map_or_else(Vec::new, |s| s.iter().filter_map(Arg::as_value).collect());
            let nbytes = n.kwarg("nbytes").and_then(Arg::as_int).unwrap_or(0) as usize;
            (id, members, nbytes)
        })
        .collect()
}

/// Whether a backward already synchronizes gradients (as Thunder's own DDP export does): ddp
/// refuses such a trace, and `no-sync` strips it first.
pub fn synchronizes(t: &tracepass_ir::Trace) -> bool {
    t.nodes()
        .any(|(_, n)| n.op == ops::ALL_REDUCE || n.op == ops::BUCKET_PACK)
}

impl Pass for Ddp {
    fn name(&self) -> &str {
        "ddp"
    }
    fn spec(&self) -> String {
        DDP.spell(&self.options.to_values())
    }

    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        let fail = |m: String| PassError::Failed {
            pass: "ddp".into(),
            message: m,
        };
        if p.params.is_empty() {
            return Err(fail(
                "no parameter metadata: give a program, or pair the backward with its forward (--forward FILE) so parameter gradients can be told from input gradients".into(),
            ));
        }
        if synchronizes(&p.backward) {
            // this pipeline (or the one that wrote the file) ran ddp already: a second would
            // reduce every gradient twice
            if p.backward
                .provenance
                .iter()
                .any(|r| r.pass.starts_with("ddp"))
            {
                return Err(fail(
                    "the backward already synchronizes gradients (ddp ran on it); run `no-sync` first to re-bucket it"
                        .into(),
                ));
            }
            // Thunder's own DDP (an export traced under `thunder.distributed.ddp`): its
            // divisions and all-reduces are replaced by this pass's, as `no-sync,ddp` would
            let n = crate::no_sync::no_sync(&mut p.backward)
                .map_err(|e| PassError::rewrite("ddp", e))?;
            cx.note(
                "ddp.replaced",
                format!("the exported DDP backward's {n} collectives (Thunder's) were replaced"),
            );
        }
        let opts = &self.options;
        // 1. the gradients to synchronize: one per trainable tensor (a tie is one tensor)
        let found = gradient_groups(p).map_err(fail)?;
        report_left_alone(p, &found, cx);
        let groups = found.groups;
        let t = &mut p.backward;
        let pos_before = t.schedule_positions();
        let slot_of_value = |t: &tracepass_ir::Trace, v: ValueId| match t.value(v).map(|x| x.def) {
            Some(Def::Node(n, _)) => pos_before
                .get(n.index())
                .filter(|p| **p != UNSCHEDULED)
                .map(|p| *p as usize),
            _ => None,
        };
        // tied tensors' gradients add up first: `ltorch.add` after the later of the two
        let mut names = t.name_gen();
        let mut sums: ValueIdMap<(Node, Option<usize>)> = ValueIdMap::default();
        let mut grads: Vec<ValueId> = Vec::with_capacity(groups.len());
        for g in &groups {
            let mut acc = g.values[0];
            for &v in &g.values[1..] {
                let ty = t.ty(acc).cloned().expect("gradients are typed");
                let out = t.new_value(names.fresh("t"), ty);
                let acc_slot = match sums.get(&acc) {
                    Some((_, slot)) => *slot,
                    None => slot_of_value(t, acc),
                };
                let slot = acc_slot.max(slot_of_value(t, v));
                let add = Node::new(ops::ADD, vec![Arg::Value(acc), Arg::Value(v)], vec![out]);
                sums.insert(out, (add, slot));
                acc = out;
            }
            grads.push(acc);
        }
        let t = &mut p.backward;
        // production order: schedule position of the producer (arguments first)
        let pos = t.schedule_positions();
        // one look at each gradient's value (its producer and its type): in a large trace the
        // gradients' values are far apart, and each look is a trip to memory
        let mut ordered = Vec::with_capacity(grads.len());
        for (i, g) in grads.iter().enumerate() {
            let value = t.value(*g);
            let slot = match (sums.get(g), value.map(|v| v.def)) {
                (Some((_, slot)), _) => *slot,
                (None, Some(Def::Node(n, _))) => pos
                    .get(n.index())
                    .filter(|p| **p != UNSCHEDULED)
                    .map(|p| *p as usize),
                _ => None,
            };
            ordered.push((slot, i, *g, value.map(|v| v.ty)));
        }
        ordered.sort_by_key(|(slot, i, _, _)| (*slot, *i));
        let slot_of: ValueIdMap<Option<usize>> =
            ordered.iter().map(|(slot, _, g, _)| (*g, *slot)).collect();
        let mut described = Vec::with_capacity(ordered.len());
        for (_, _, g, ty) in &ordered {
            match ty {
                Some(Type::Tensor(tt)) if tt.checked_nbytes().is_none() => {
                    return Err(fail(format!(
                        "gradient `{}` has type {tt}, over {MAX_TENSOR_BYTES} bytes",
                        t.name(*g)
                    )))
                }
                Some(Type::Tensor(tt)) => {
                    described.push((*g, tt.shape.clone(), tt.dtype, tt.device))
                }
                other => {
                    return Err(fail(format!(
                        "gradient `{}` is not a tensor ({})",
                        t.name(*g),
                        other.map_or("undefined".into(), |t| t.to_string())
                    )))
                }
            }
        }
        let buckets = plan_buckets(&described, opts);
        if let Some(b) = buckets.iter().find(|b| b.nbytes > MAX_TENSOR_BYTES) {
            return Err(fail(format!(
                "bucket {} would hold over {MAX_TENSOR_BYTES} bytes; lower bucket_mb",
                b.id
            )));
        }
        cx.stat("ddp.gradients", described.len() as u64);
        cx.stat("ddp.buckets", buckets.len() as u64);
        cx.stat(
            "ddp.tied",
            groups.iter().filter(|g| g.fqns.len() > 1).count() as u64,
        );

        // 2. rewrite: new nodes go right after their trigger (the gradient's producer), waits
        // and unpacks at the end
        let per_grad = if opts.average == Average::Post { 2 } else { 1 };
        let added = per_grad * described.len() + 4 * buckets.len();
        t.reserve(added, added + described.len());
        let mut rw = Rewriter::new();
        rw.reserve(added + sums.len());
        let ws = opts.world_size as f64;
        // queues a node after the gradient in `slot` (at the start for a gradient that is an
        // argument; at the end with `launch=end`)
        let queue =
            |rw: &mut Rewriter, t: &tracepass_ir::Trace, slot: Option<usize>, n: Node| match (
                slot,
                opts.launch,
            ) {
                (None, _) => rw.insert_at_start(n),
                (Some(_), Launch::End) => rw.insert_at_end(n),
                (Some(s), Launch::Ready) => rw.insert_after(t.schedule()[s], n),
            };
        let mut divided: ValueIdMap<ValueId> =
            ValueIdMap::with_capacity_and_hasher(described.len(), Default::default());
        let mut tail: Vec<Node> = Vec::new();
        let mut replacement: ValueIdMap<ValueId> =
            ValueIdMap::with_capacity_and_hasher(described.len(), Default::default());
        let mut last_collective: Option<NewNode> = None;
        let bucket_of_last: ValueIdMap<usize> = buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.members.last().map(|m| (*m, i)))
            .collect();
        for (g, shape, dtype, device) in &described {
            let slot = slot_of[g];
            if let Some((add, _)) = sums.remove(g) {
                // the sum of tied gradients: its own adds are in `sums`, chained before it
                let mut cur = add.args().first().and_then(Arg::as_value);
                let mut chain = vec![add];
                while let Some((prev, _)) = cur.and_then(|c| sums.remove(&c)) {
                    cur = prev.args().first().and_then(Arg::as_value);
                    chain.push(prev);
                }
                for n in chain.into_iter().rev() {
                    queue(&mut rw, t, slot, n);
                }
            }
            if opts.average == Average::Pre {
                let ty = Type::tensor(shape.clone(), *dtype, *device);
                let out = t.new_value(names.fresh("t"), ty);
                let div = Node::new(ops::DIV, vec![Arg::Value(*g), Arg::Float(ws)], vec![out]);
                queue(&mut rw, t, slot, div);
                divided.insert(*g, out);
            } else {
                divided.insert(*g, *g);
            }
            let Some(&bi) = bucket_of_last.get(g) else {
                continue;
            };
            let b = &buckets[bi];
            // pack + all-reduce right after the bucket's last gradient
            let total: usize = b.numels.iter().sum();
            let buf_ty = Type::tensor(vec![total], b.dtype, b.device);
            let buf = t.new_value(names.fresh("t"), buf_ty.clone());
            let members: Vec<Arg> = b.members.iter().map(|m| Arg::Value(divided[m])).collect();
            let pack = Node::new(ops::BUCKET_PACK, vec![Arg::List(members)], vec![buf])
                .with_kwarg("bucket", Arg::Str(b.id.clone()))
                .with_kwarg(
                    "offsets",
                    Arg::int_tuple(b.offsets.iter().map(|o| *o as i64)),
                )
                .with_kwarg("nbytes", Arg::Int(b.nbytes as i64));
            queue(&mut rw, t, slot, pack);
            let fut_ty = match &buf_ty {
                Type::Tensor(tt) => Type::Future(tt.clone()),
                _ => unreachable!("buffer is a tensor"),
            };
            let fut = t.new_value(names.fresh("ft"), fut_ty);
            let ar = Node::new(
                ops::ALL_REDUCE,
                vec![
                    Arg::Value(buf),
                    Arg::Str("sum".into()),
                    Arg::Str(opts.group.clone()),
                ],
                vec![fut],
            );
            let ar_idx = queue(&mut rw, t, slot, ar);
            if let Some(prev) = last_collective {
                rw.add_order_edge(prev, ar_idx);
            }
            last_collective = Some(ar_idx);
            // wait + unpack at the end
            let reduced = t.new_value(names.fresh("t"), buf_ty);
            let wait = Node::new(ops::WAIT, vec![Arg::Value(fut)], vec![reduced]);
            let outs: Vec<ValueId> = b
                .members
                .iter()
                .zip(&b.shapes)
                .map(|(_, s)| {
                    t.new_value(names.fresh("t"), Type::tensor(s.clone(), b.dtype, b.device))
                })
                .collect();
            let shapes = Arg::Tuple(
                b.shapes
                    .iter()
                    .map(|s| Arg::int_tuple(s.iter().map(|d| *d as i64)))
                    .collect(),
            );
            let unpack = Node::new(ops::UNPACK, vec![Arg::Value(reduced)], outs.clone())
                .with_kwarg("bucket", Arg::Str(b.id.clone()))
                .with_kwarg(
                    "offsets",
                    Arg::int_tuple(b.offsets.iter().map(|o| *o as i64)),
                )
                .with_kwarg("shapes", shapes);
            tail.extend([wait, unpack]);
            for (m, o) in b.members.iter().zip(&outs) {
                let fin = if opts.average == Average::Post {
                    let ty = t.ty(*o).cloned().expect("just made");
                    let d = t.new_value(names.fresh("t"), ty);
                    tail.push(Node::new(
                        ops::DIV,
                        vec![Arg::Value(*o), Arg::Float(ws)],
                        vec![d],
                    ));
                    d
                } else {
                    *o
                };
                replacement.insert(*m, fin);
            }
        }
        for n in tail {
            rw.insert_at_end(n);
        }
        // 3. every group's synchronized gradient goes to its primary position; tied positions
        // return None (the tensor is one, and so is its gradient)
        let mut ret = t.ret.clone();
        let (Arg::Tuple(items) | Arg::List(items)) = &mut ret else {
            return Err(fail("the backward's return is no longer a tuple".into()));
        };
        for (g, sum) in groups.iter().zip(&grads) {
            let fin = replacement.get(sum).copied().ok_or_else(|| {
                fail(format!(
                    "internal: the gradient of `{}` was not synchronized",
                    g.fqns[0]
                ))
            })?;
            for &pos in &g.positions {
                items[pos] = Arg::None;
            }
            items[g.primary_pos] = Arg::Value(fin);
        }
        rw.set_return(ret);
        rw.apply(t).map_err(|e| PassError::rewrite("ddp", e))?;
        let index: HashMap<String, usize> = p
            .params
            .iter()
            .enumerate()
            .map(|(i, x)| (x.fqn.clone(), i))
            .collect();
        for g in &groups {
            for (fqn, pos) in g.fqns.iter().zip(&g.member_positions) {
                if let Some(&i) = index.get(fqn) {
                    p.params[i].grad_output = (*pos == g.primary_pos).then_some(*pos);
                }
            }
        }
        // only the backward changes
        cx.changed_trace(false);
        Ok(Changed::from(!buckets.is_empty()))
    }
}
