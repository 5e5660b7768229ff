//! The fsdp pass: snapshots of the rewritten forward and backward of a hand-made program and of
//! two real exports (an MLP, and nanoGPT with its tied embedding), zero2 and zero3, plus the
//! structure every rewrite must have: each parameter gathered before its first use, each
//! trainable gradient reduce-scattered once, shards the padded bucket over the world size,
//! padding that never reaches a parameter, a clean verifier, the same output every time.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use tracepass_ir::*;
use tracepass_passes::*;

/// A hand-made program: `a` (24 elements) and its bias `b` (3, so the bucket pads), a frozen
/// `c`, `e` tied to `a` (read by a second linear), and `u`, trainable but never reached by the
/// loss. The forward saves `a`, `c` and `e` for the backward.
fn hand_made() -> Program {
    let f32t = |s: &[usize]| Type::tensor(s, DType::F32, Device::CPU);
    let mut fb = TraceBuilder::new("computation", TraceKind::Forward);
    let x = fb.arg("x", f32t(&[2, 8]));
    let a = fb.arg("t_a", f32t(&[3, 8]));
    let b = fb.arg("t_b", f32t(&[3]));
    let c = fb.arg("t_c", f32t(&[3]));
    let e = fb.arg("t_e", f32t(&[3, 8]));
    let _u = fb.arg("t_u", f32t(&[5]));
    let h = fb
        .op("ltorch.linear", vec![x.into(), a.into(), b.into()])
        .unwrap();
    let h2 = fb.op("ltorch.mul", vec![h.into(), c.into()]).unwrap();
    let h3 = fb.op("ltorch.linear", vec![x.into(), e.into()]).unwrap();
    let out = fb.op("ltorch.add", vec![h2.into(), h3.into()]).unwrap();
    fb.ret(Arg::Tuple(vec![
        Arg::Dict(vec![(Arg::Str("output".into()), out.into())]),
        Arg::Tuple(vec![
            Arg::Tuple(vec![x.into(), a.into(), c.into(), e.into()]),
            Arg::Tuple(vec![]),
        ]),
    ]));
    let forward = fb.finish();
    let mut bb = TraceBuilder::new("backward_fn", TraceKind::Backward);
    let saved = bb.arg("saved_for_backward", Type::Collection);
    let _cot = bb.arg("cotangents", Type::Collection);
    let cs = bb.unpack_sequence(
        saved,
        vec![
            ("C0".into(), Type::Collection),
            ("C1".into(), Type::Collection),
        ],
    );
    let s = bb.unpack_sequence(
        cs[0],
        vec![
            ("x".into(), f32t(&[2, 8])),
            ("t_a".into(), f32t(&[3, 8])),
            ("t_c".into(), f32t(&[3])),
            ("t_e".into(), f32t(&[3, 8])),
        ],
    );
    let (x, a, c, e) = (s[0], s[1], s[2], s[3]);
    let g = bb.arg("g", f32t(&[2, 3]));
    // through the tied linear first (the later layer), then the first one
    let gt = bb
        .op("ltorch.permute", vec![g.into(), 1.into(), 0.into()])
        .unwrap();
    let ge = bb.op("ltorch.matmul", vec![gt.into(), x.into()]).unwrap();
    let gx2 = bb.op("ltorch.matmul", vec![g.into(), e.into()]).unwrap();
    let gh = bb.op("ltorch.mul", vec![g.into(), c.into()]).unwrap();
    let gb = bb
        .op("ltorch.sum", vec![gh.into(), Arg::int_tuple([0])])
        .unwrap();
    let ght = bb
        .op("ltorch.permute", vec![gh.into(), 1.into(), 0.into()])
        .unwrap();
    let ga = bb.op("ltorch.matmul", vec![ght.into(), x.into()]).unwrap();
    let gx1 = bb.op("ltorch.matmul", vec![gh.into(), a.into()]).unwrap();
    let gx = bb.op("ltorch.add", vec![gx1.into(), gx2.into()]).unwrap();
    bb.ret(Arg::Tuple(vec![
        gx.into(),
        ga.into(),
        gb.into(),
        Arg::None,
        ge.into(),
        Arg::None,
    ]));
    let backward = bb.finish();
    let mut p = Program::from_thunder(forward, backward).unwrap();
    let names: Vec<&str> = p.params.iter().map(|x| x.fqn.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "e", "u"]);
    p.params[3].tied_to = Some("a".into());
    // `u` is trainable; the backward returns nothing for it
    p.params[4].requires_grad = true;
    assert_eq!(p.unused_params(), ["u"]);
    p
}

fn run(p: &Program, pipeline: &str) -> (Program, RunReport) {
    let mut q = p.clone();
    let r = PassManager::parse(pipeline)
        .unwrap()
        .run(&mut q, OpRegistry::builtin())
        .unwrap_or_else(|e| panic!("{pipeline}: {e}"));
    (q, r)
}

fn export(name: &str) -> Program {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/models")
        .join(name);
    load_export(&dir)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .program
}

fn nodes_of<'a>(t: &'a Trace, op: &'a str) -> impl Iterator<Item = (NodeIndex, &'a Node)> + 'a {
    t.schedule()
        .iter()
        .filter_map(move |i| t.node(*i).map(|n| (*i, n)))
        .filter(move |(_, n)| n.op == op)
}

fn count(t: &Trace, op: &str) -> usize {
    nodes_of(t, op).count()
}

fn numel(t: &Trace, v: ValueId) -> usize {
    t.ty(v)
        .and_then(Type::tensor_type)
        .map(|tt| tt.numel())
        .unwrap()
}

/// The value a node reads first.
fn operand(n: &Node) -> ValueId {
    n.args().first().and_then(Arg::as_value).unwrap()
}

/// The gather chain of a trace, per bucket: the all-gather's schedule position, the unpack's,
/// and the unpacked members with their offsets.
struct Gathered {
    gather_at: usize,
    unpack_at: usize,
    shard: ValueId,
    members: Vec<ValueId>,
    unpacked_numel: usize,
}

fn gathers(t: &Trace) -> HashMap<String, Gathered> {
    let pos = t.schedule_positions();
    let mut out = HashMap::new();
    for (idx, n) in nodes_of(t, ops::UNPACK) {
        let bucket = n.kwarg("bucket").and_then(Arg::as_str).unwrap().to_string();
        // unpack <- (slice) <- wait <- all_gather
        let mut v = operand(n);
        let unpacked_numel = numel(t, v);
        let gather = loop {
            let p = t.producer(v).expect("gathered buffers are made by nodes");
            let pn = t.node(p).unwrap();
            if pn.op == ops::ALL_GATHER {
                break p;
            }
            assert!(
                pn.op == ops::WAIT || pn.op == "prims.slice_prim",
                "{bucket}: unexpected {} between the gather and the unpack",
                pn.op
            );
            v = operand(pn);
        };
        let g = t.node(gather).unwrap();
        let prev = out.insert(
            bucket.clone(),
            Gathered {
                gather_at: pos[gather.index()] as usize,
                unpack_at: pos[idx.index()] as usize,
                shard: operand(g),
                members: n.outputs().to_vec(),
                unpacked_numel,
            },
        );
        assert!(
            prev.is_none(),
            "bucket {bucket} is gathered twice in one trace"
        );
    }
    out
}

/// The value `v` is a view of: back through unsqueeze, expand, reshape, permute and squeeze
/// statements that read nothing else.
fn view_root(t: &Trace, v: ValueId) -> ValueId {
    let views = [
        op::UNSQUEEZE,
        op::EXPAND,
        op::RESHAPE,
        op::PERMUTE,
        op::SQUEEZE,
    ];
    let mut cur = v;
    while let Some(n) = t.producer(cur).and_then(|i| t.node(i)) {
        let ins = n.operands();
        match ins.first() {
            Some(&src) if views.iter().any(|o| o.matches(n)) && ins.iter().all(|x| *x == src) => {
                cur = src
            }
            _ => break,
        }
    }
    cur
}

/// The parameters fsdp sharded, by bucket: (fqn, shard placement), primaries only.
fn sharded(after: &Program) -> HashMap<String, Vec<(&Param, &ParamShard)>> {
    let mut out: HashMap<String, Vec<(&Param, &ParamShard)>> = HashMap::new();
    for x in &after.params {
        if let Some(s) = &x.shard {
            out.entry(s.bucket.clone()).or_default().push((x, s));
        }
    }
    out
}

/// Everything an fsdp rewrite must be, checked against the program before it.
fn check_fsdp(before: &Program, after: &Program, world: usize, zero3: bool) {
    verify(&after.forward).unwrap();
    verify(&after.backward).unwrap();
    let f = &after.forward;
    let by_bucket = sharded(after);
    assert!(!by_bucket.is_empty());
    let unused = before.unused_params();
    // what is sharded: trainable parameters with a gradient; frozen ones, buffers and unused
    // ones keep their argument
    for x in &before.params {
        let now = after.param(&x.fqn).unwrap();
        let expect_sharded = x.requires_grad && !x.buffer && !unused.contains(&x.fqn.as_str());
        assert_eq!(now.shard.is_some(), expect_sharded, "{}", x.fqn);
        let name = before.forward.name(before.forward.args()[x.forward_arg]);
        if expect_sharded {
            assert!(
                f.find_value(&name).is_none(),
                "{name} is still in the forward"
            );
        } else {
            assert_eq!(f.name(f.args()[now.forward_arg]), name);
        }
    }
    // shards: the padded bucket over the world size; the padding is under one per rank and
    // never unpacked
    let fg = gathers(f);
    assert_eq!(fg.len(), by_bucket.len());
    for (bucket, members) in &by_bucket {
        let s = members[0].1;
        assert!(members
            .iter()
            .all(|(_, m)| m.bucket_numel == s.bucket_numel));
        assert_eq!((s.bucket_numel + s.padding) % world, 0);
        assert!(s.padding < world);
        let g = &fg[bucket];
        let arg = f.args()[members[0].0.forward_arg];
        assert_eq!(g.shard, arg, "{bucket} gathers its own shard argument");
        assert_eq!(f.name(arg), format!("shard_{bucket}"));
        assert_eq!(numel(f, arg), s.shard_numel());
        assert_eq!(numel(f, arg) * world, s.bucket_numel + s.padding);
        assert_eq!(
            g.unpacked_numel, s.bucket_numel,
            "{bucket}: padding unpacked"
        );
        // each parameter is unpacked at its offset with its shape
        for (x, m) in members {
            let out = g
                .members
                .iter()
                .zip(
                    nodes_of(f, ops::UNPACK)
                        .find(|(_, n)| n.outputs() == g.members)
                        .unwrap()
                        .1
                        .kwarg("offsets")
                        .and_then(Arg::as_int_list)
                        .unwrap(),
                )
                .find(|(_, o)| *o as usize == m.offset)
                .map(|(v, _)| *v)
                .unwrap_or_else(|| panic!("{}: nothing unpacked at offset {}", x.fqn, m.offset));
            let tt = f.ty(out).and_then(Type::tensor_type).unwrap();
            assert_eq!(tt.shape.to_vec(), x.shape, "{}", x.fqn);
            assert_eq!(m.numel, x.shape.iter().product::<usize>());
        }
        // gathered before its first use, and the wait as late as that use allows
        let pos = f.schedule_positions();
        let first = g
            .members
            .iter()
            .flat_map(|v| f.users(*v))
            .map(|u| pos[u.index()] as usize)
            .min();
        if let Some(first) = first {
            assert!(g.gather_at < g.unpack_at && g.unpack_at < first, "{bucket}");
        }
    }
    // collectives are chained: every rank issues them in one order
    for t in [&after.forward, &after.backward] {
        let coll: Vec<NodeIndex> = t
            .schedule()
            .iter()
            .copied()
            .filter(|i| {
                let op = &t.node(*i).unwrap().op;
                *op == ops::ALL_GATHER || *op == ops::REDUCE_SCATTER
            })
            .collect();
        for w in coll.windows(2) {
            assert!(
                t.predecessors(w[1])
                    .any(|(p, e)| p == w[0] && e == Edge::Order),
                "collectives not chained in `{}`",
                t.name
            );
        }
    }
    // the backward: zero3 gathers every saved parameter again, zero2 gathers nothing
    let b = &after.backward;
    let bg = gathers(b);
    // a saved value is a parameter, or a view of one (`expand(unsqueeze(w))`)
    let saved_params: HashSet<String> = {
        let fwd_saved: Vec<ValueId> = before
            .forward_saved()
            .into_iter()
            .map(|v| view_root(&before.forward, v))
            .collect();
        by_bucket
            .values()
            .flatten()
            .filter(|(x, _)| {
                fwd_saved
                    .contains(&before.forward.args()[before.param(&x.fqn).unwrap().forward_arg])
            })
            .map(|(_, s)| s.bucket.clone())
            .collect()
    };
    if zero3 {
        let got: HashSet<String> = bg.keys().cloned().collect();
        assert_eq!(got, saved_params, "zero3 gathers the saved buckets again");
        for (bucket, g) in &bg {
            assert_eq!(b.name(g.shard), format!("shard_{bucket}"));
            let pos = b.schedule_positions();
            if let Some(first) = g
                .members
                .iter()
                .flat_map(|v| b.users(*v))
                .map(|u| pos[u.index()] as usize)
                .min()
            {
                assert!(g.unpack_at < first);
            }
        }
        // no gathered parameter is saved, nor a view of one (it would keep the bucket alive
        // into the backward): the forward saves shards
        for v in after.forward_saved() {
            let name = f.name(v);
            let root = view_root(f, v);
            assert!(
                !f.nodes()
                    .any(|(_, n)| n.op == ops::UNPACK && n.outputs().contains(&root)),
                "zero3 saves gathered `{name}`"
            );
        }
    } else {
        assert!(bg.is_empty(), "zero2 keeps the gathered parameters");
    }
    // every trainable gradient is reduce-scattered exactly once, in its bucket's layout
    let trainable_buckets: Vec<&String> = by_bucket
        .iter()
        .filter(|(_, m)| m.iter().any(|(x, _)| x.grad_output.is_some()))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(count(b, ops::REDUCE_SCATTER), trainable_buckets.len());
    assert_eq!(count(b, ops::ALL_REDUCE), 0);
    let mut packed: HashSet<ValueId> = HashSet::new();
    for (_, n) in nodes_of(b, ops::BUCKET_PACK) {
        let bucket = n.kwarg("bucket").and_then(Arg::as_str).unwrap();
        let members = &by_bucket[bucket];
        let primaries = members.iter().filter(|(x, _)| x.tied_to.is_none()).count();
        let items = n.args()[0].as_seq().unwrap();
        assert_eq!(items.len(), primaries, "{bucket}");
        for it in items {
            assert!(packed.insert(it.as_value().unwrap()), "packed twice");
        }
        let out = n.outputs()[0];
        assert_eq!(numel(b, out), members[0].1.bucket_numel);
        // pack -> (pad) -> reduce-scatter, once
        let mut v = out;
        loop {
            let users = b.users(v);
            assert_eq!(users.len(), 1, "{bucket}: the packed gradients go one way");
            let u = b.node(users[0]).unwrap();
            if u.op == ops::REDUCE_SCATTER {
                let fut = u.outputs()[0];
                assert_eq!(numel(b, fut), members[0].1.shard_numel());
                break;
            }
            assert_eq!(u.op, "prims.pad");
            v = u.outputs()[0];
        }
    }
    // returns: one gradient per forward argument; a shard's is its reduce-scatter's wait
    let grads = after.gradient_values();
    assert_eq!(grads.len(), f.args().len());
    for (bucket, members) in &by_bucket {
        let pos = members[0].0.forward_arg;
        let trainable = trainable_buckets.contains(&bucket);
        match grads[pos] {
            Some(g) => {
                assert!(trainable);
                let w = b.node(b.producer(g).unwrap()).unwrap();
                assert_eq!(w.op, ops::WAIT);
                let rs = b.node(b.producer(operand(w)).unwrap()).unwrap();
                assert_eq!(rs.op, ops::REDUCE_SCATTER);
                assert_eq!(numel(b, g), members[0].1.shard_numel());
            }
            None => assert!(!trainable, "{bucket} returns no gradient shard"),
        }
    }
}

fn both(p: &Program, world: usize, extra: &str) -> Vec<(&'static str, Program)> {
    ["zero2", "zero3"]
        .into_iter()
        .map(|s| {
            let (q, _) = run(p, &format!("fsdp(world_size={world},sharding={s}{extra})"));
            check_fsdp(p, &q, world, s == "zero3");
            (s, q)
        })
        .collect()
}

#[test]
fn hand_made_rewrites() {
    let p = hand_made();
    for (s, q) in both(&p, 4, "") {
        insta::assert_snapshot!(format!("hand_made_{s}_forward"), canonical_text(&q.forward));
        insta::assert_snapshot!(
            format!("hand_made_{s}_backward"),
            canonical_text(&q.backward)
        );
    }
}

#[test]
fn hand_made_layout_pads_and_leaves_frozen_unused_alone() {
    let p = hand_made();
    let (q, r) = run(&p, "fsdp(world_size=4)");
    let stat = |k: &str| r.stats.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    assert_eq!(stat("fsdp.buckets"), Some(1));
    assert_eq!(stat("fsdp.sharded"), Some(2), "a, b (e is a)");
    assert_eq!(stat("fsdp.padding"), Some(1), "24 + 3 elements pad to 28");
    let a = q.param("a").unwrap().shard.clone().unwrap();
    let e = q.param("e").unwrap().shard.clone().unwrap();
    let b = q.param("b").unwrap().shard.clone().unwrap();
    assert_eq!(
        (a.offset, b.offset, e.offset),
        (0, 24, 0),
        "the tie is one tensor"
    );
    assert_eq!(a.shard_numel(), 7);
    assert_eq!(q.param("a").unwrap().grad_output, Some(3));
    assert_eq!(
        q.param("e").unwrap().grad_output,
        None,
        "one gradient for a tie"
    );
    assert!(q.param("c").unwrap().shard.is_none(), "frozen");
    assert!(q.param("u").unwrap().shard.is_none(), "unused");
    let args: Vec<String> = q
        .forward
        .args()
        .iter()
        .map(|a| q.forward.name(*a))
        .collect();
    assert_eq!(args, ["x", "t_c", "t_u", "shard_b0"]);
    // the tie's gradients add up before the division: both reach the one reduce-scatter
    let pack = nodes_of(&q.backward, ops::BUCKET_PACK).next().unwrap().1;
    let items = pack.args()[0].as_seq().unwrap();
    let a_grad = items[0].as_value().unwrap();
    let div = q
        .backward
        .node(q.backward.producer(a_grad).unwrap())
        .unwrap();
    assert_eq!(div.op, ops::DIV);
    let add = q
        .backward
        .node(q.backward.producer(operand(div)).unwrap())
        .unwrap();
    assert_eq!(add.op, ops::ADD);
}

#[test]
fn frozen_parameters_are_sharded_when_asked() {
    let p = hand_made();
    let (q, r) = run(&p, "fsdp(world_size=4,shard_frozen=true,bucket_mb=0)");
    verify(&q.forward).unwrap();
    verify(&q.backward).unwrap();
    let c = q.param("c").unwrap();
    let s = c.shard.clone().unwrap();
    assert_eq!((s.numel, s.padding), (3, 1));
    assert_eq!(
        c.grad_output, None,
        "a frozen bucket is never reduce-scattered"
    );
    assert_eq!(
        r.stats
            .iter()
            .find(|(n, _)| n == "fsdp.reduce_scattered")
            .unwrap()
            .1,
        2,
        "a and b, one bucket each"
    );
    assert_eq!(q.gradient_values()[c.forward_arg], None);
    assert_eq!(count(&q.forward, ops::ALL_GATHER), 3);
}

#[test]
fn prefetch_issues_gathers_ahead_and_sort_waits_keeps_them_there() {
    // one bucket per parameter of the MLP: ten gathers, used one after the other
    let p = export("mlp");
    for prefetch in [0usize, 1, 2] {
        for tail in ["", ",sort-waits"] {
            let pipeline = format!("fsdp(world_size=4,bucket_mb=0,prefetch={prefetch}){tail}");
            let (q, _) = run(&p, &pipeline);
            check_fsdp(&p, &q, 4, true);
            let f = &q.forward;
            let pos = f.schedule_positions();
            let mut buckets: Vec<Gathered> = gathers(f).into_values().collect();
            buckets.sort_by_key(|b| b.unpack_at);
            assert_eq!(buckets.len(), 10);
            let first_use: Vec<usize> = buckets
                .iter()
                .map(|b| {
                    b.members
                        .iter()
                        .flat_map(|v| f.users(*v))
                        .map(|u| pos[u.index()] as usize)
                        .min()
                        .unwrap()
                })
                .collect();
            for k in 0..buckets.len() {
                let at = buckets[k].gather_at;
                if k > 0 {
                    assert!(
                        buckets[k - 1].gather_at < at,
                        "{pipeline}: gathers in order"
                    );
                }
                if k <= prefetch {
                    // the first ones are issued before any compute that needs a parameter
                    assert!(at < first_use[0], "{pipeline}: bucket {k}");
                    continue;
                }
                let a = k - prefetch;
                // issued when bucket k - prefetch starts, not before bucket k - prefetch - 1
                // started
                assert!(at < first_use[a], "{pipeline}: bucket {k} issued late");
                if first_use[a - 1] < first_use[a] {
                    assert!(at > first_use[a - 1], "{pipeline}: bucket {k} issued early");
                }
            }
        }
    }
}

#[test]
fn sort_waits_moves_waits_to_their_first_use() {
    let p = export("mlp");
    let (q, _) = run(
        &p,
        "fsdp(world_size=4,sharding=zero3,bucket_mb=0.01),sort-waits",
    );
    check_fsdp(&p, &q, 4, true);
    for t in [&q.forward, &q.backward] {
        let pos = t.schedule_positions();
        for (idx, n) in nodes_of(t, ops::WAIT) {
            let out = n.outputs()[0];
            let first = t.users(out).into_iter().map(|u| pos[u.index()]).min();
            let at = pos[idx.index()];
            match first {
                // right before its first reader
                Some(first) => assert_eq!(first, at + 1, "in `{}`", t.name),
                None => assert!(t.returned_values().contains(&out)),
            }
        }
    }
    // each reduce-scatter as early as its operands allow: right after the buffer is padded
    let b = &q.backward;
    let pos = b.schedule_positions();
    assert!(count(b, ops::REDUCE_SCATTER) > 1);
    for (idx, n) in nodes_of(b, ops::REDUCE_SCATTER) {
        let producer = b.producer(operand(n)).unwrap();
        assert_eq!(pos[producer.index()] + 1, pos[idx.index()]);
    }
}

#[test]
fn real_exports_zero2_and_zero3() {
    for (name, world) in [("mlp", 4), ("nanogpt", 3)] {
        let p = export(name);
        for (s, q) in both(&p, world, "") {
            insta::assert_snapshot!(format!("{name}_{s}_forward"), canonical_text(&q.forward));
            insta::assert_snapshot!(format!("{name}_{s}_backward"), canonical_text(&q.backward));
        }
        // small buckets too
        both(&p, world, ",bucket_mb=0.01");
    }
}

#[test]
fn nanogpt_tie_is_sharded_once_and_read_twice() {
    let p = export("nanogpt");
    let (q, _) = run(&p, "fsdp(world_size=3)");
    let wte = q.param("transformer.wte.weight").unwrap();
    let head = q.param("lm_head.weight").unwrap();
    assert_eq!(head.tied_to.as_deref(), Some("transformer.wte.weight"));
    assert_eq!(wte.shard, head.shard.clone());
    let unpacked: Vec<usize> = nodes_of(&q.forward, ops::UNPACK)
        .flat_map(|(_, n)| n.kwarg("shapes").and_then(Arg::as_seq).unwrap().to_vec())
        .filter(|s| s.as_int_list() == Some(vec![128, 64]))
        .map(|_| 1)
        .collect();
    assert_eq!(unpacked.len(), 1, "the tied embedding is unpacked once");
    // both of its uses read that one gathered tensor: embedding and head
    let (_, n) = nodes_of(&q.forward, ops::UNPACK)
        .find(|(_, n)| {
            n.kwarg("shapes")
                .and_then(Arg::as_seq)
                .unwrap()
                .iter()
                .any(|s| s.as_int_list() == Some(vec![128, 64]))
        })
        .unwrap();
    let k = n
        .kwarg("shapes")
        .and_then(Arg::as_seq)
        .unwrap()
        .iter()
        .position(|s| s.as_int_list() == Some(vec![128, 64]))
        .unwrap();
    let v = n.outputs()[k];
    assert!(q.forward.users(v).len() >= 2);
}

#[test]
fn output_is_deterministic() {
    let p = export("nanogpt");
    let pipeline = "fsdp(world_size=4,sharding=zero3,bucket_mb=0.05),sort-waits";
    let (a, _) = run(&p, pipeline);
    let (b, _) = run(&p, pipeline);
    assert_eq!(canonical_text(&a.forward), canonical_text(&b.forward));
    assert_eq!(canonical_text(&a.backward), canonical_text(&b.backward));
    assert_eq!(a.params, b.params);
}

#[test]
fn sharded_programs_survive_the_binary_format() {
    let (q, _) = run(&hand_made(), "fsdp(world_size=4)");
    let m = Module::Program(q);
    let back = codec::decode(&codec::encode(&m).unwrap()).unwrap();
    assert!(back == m);
}

#[test]
fn refusals_name_the_reason() {
    let p = hand_made();
    let err = |p: &Program, pipeline: &str| {
        let mut q = p.clone();
        PassManager::parse(pipeline)
            .unwrap()
            .run(&mut q, OpRegistry::builtin())
            .unwrap_err()
            .to_string()
    };
    let e = err(&p, "fsdp(world_size=2),fsdp(world_size=2)");
    assert!(e.contains("sharded already"), "{e}");
    let e = err(&p, "ddp(world_size=2),fsdp(world_size=2)");
    assert!(e.contains("already all-reduces"), "{e}");
    let lone = Program::lone(p.backward.clone());
    let e = err(&lone, "fsdp(world_size=2)");
    assert!(e.contains("needs a program"), "{e}");
    // no-sync cannot undo sharding: the backward's contract is gradient shards
    let e = err(&p, "fsdp(world_size=2),no-sync");
    assert!(e.contains("reduce-scatter"), "{e}");
    assert!(PassManager::parse("fsdp(world_size=0)").is_err());
    assert!(PassManager::parse("fsdp(world_size=2,sharding=zero1)").is_err());
}

/// Accumulation over micro-steps with fsdp keeps the reduce-scatter (as ZeRO does): each
/// micro-step's gradient shard is added to the running sum, an argument of the shard's shape.
#[test]
fn accumulation_adds_up_gradient_shards() {
    let p = hand_made();
    let (q, r) = run(&p, "fsdp(world_size=4),accumulate-grads");
    verify(&q.backward).unwrap();
    assert_eq!(
        r.stats
            .iter()
            .find(|(n, _)| n == "accumulate-grads.gradients")
            .unwrap()
            .1,
        1,
        "one bucket, one shard"
    );
    let b = &q.backward;
    let acc: Vec<ValueId> = b
        .args()
        .iter()
        .copied()
        .filter(|a| b.name(*a).starts_with("acc_"))
        .collect();
    assert_eq!(acc.len(), 1);
    assert_eq!(numel(b, acc[0]), 7, "the accumulator is a shard");
    assert_eq!(count(b, ops::REDUCE_SCATTER), 1);
    let g = q.gradient_values()[q.param("a").unwrap().grad_output.unwrap()].unwrap();
    let add = b.node(b.producer(g).unwrap()).unwrap();
    assert_eq!(add.op, ops::ADD);
    assert_eq!(
        b.node(b.producer(operand(add)).unwrap()).unwrap().op,
        ops::WAIT
    );
}
