//! The DDP pass on every real model of the corpus (`testdata/models/`, export directories made by
//! `python/tracepass/export` from Lightning Thunder 0.2.6): every trainable gradient is reduced
//! exactly once (a tie once), frozen parameters, buffers and inputs are left alone and named,
//! buckets follow the cap, waits sit right before their first use, and re-bucketing Thunder's
//! own DDP backward gives the same buckets as bucketing the plain one.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tracepass_ir::{canonical_text, load_export, ops, Arg, Export, OpRegistry, Program, Trace};
use tracepass_passes::{ddp::recorded_plan, PassManager, RunReport};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models")
}

/// Every export directory of the corpus, by name.
fn corpus() -> Vec<(String, Export)> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(corpus_dir())
        .expect("testdata/models exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("export.json").is_file())
        .collect();
    entries.sort();
    for dir in entries {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let e = load_export(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push((name, e));
    }
    assert!(out.len() >= 6, "the corpus holds {} exports", out.len());
    out
}

fn plain(corpus: &[(String, Export)]) -> impl Iterator<Item = &(String, Export)> {
    corpus.iter().filter(|(_, e)| e.info.world_size.is_none())
}

fn run(p: &Program, pipeline: &str) -> (Program, RunReport) {
    let mut q = p.clone();
    let r = PassManager::parse(pipeline)
        .unwrap()
        .run(&mut q, OpRegistry::builtin())
        .unwrap_or_else(|e| panic!("{pipeline}: {e}"));
    (q, r)
}

fn count(t: &Trace, op: &str) -> usize {
    t.nodes().filter(|(_, n)| n.op == op).count()
}

/// Trainable tensors with a gradient: parameters that need one and get one (a parameter the
/// loss never reaches has none to synchronize), a tie group counted once.
fn trainable_tensors(p: &Program) -> Vec<&tracepass_ir::Param> {
    let unused = p.unused_params();
    p.params
        .iter()
        .filter(|x| {
            x.requires_grad && !x.buffer && x.tied_to.is_none() && !unused.contains(&x.fqn.as_str())
        })
        .collect()
}

/// Bucket id of each synchronized gradient, by the parameter it is returned for.
fn buckets_by_param(p: &Program) -> BTreeMap<String, Vec<String>> {
    let t = &p.backward;
    let outs = p.gradient_values();
    let mut by_bucket: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for param in &p.params {
        let Some(Some(v)) = param.grad_output.and_then(|i| outs.get(i).copied()) else {
            continue;
        };
        let unpack = t.node(t.producer(v).unwrap()).unwrap();
        assert_eq!(unpack.op, ops::UNPACK, "{} is not unpacked", param.fqn);
        let id = unpack
            .kwarg("bucket")
            .unwrap()
            .as_str()
            .unwrap()
            .to_string();
        by_bucket.entry(id).or_default().push(param.fqn.clone());
    }
    for v in by_bucket.values_mut() {
        v.sort();
    }
    by_bucket
}

/// What a correct rewrite looks like, checked from the outside.
fn check_rewrite(name: &str, before: &Program, after: &Program, bucket_mb: f64) {
    let t = &after.backward;
    tracepass_ir::verify(t).unwrap_or_else(|e| panic!("{name}: {e}"));
    let trainable = trainable_tensors(before);
    let plan = recorded_plan(t);
    // one pre-averaging division per trainable tensor, and one member each in the buckets
    let new_divs = count(t, ops::DIV) - count(&before.backward, ops::DIV);
    assert_eq!(new_divs, trainable.len(), "{name}: divisions");
    let members: usize = plan.iter().map(|b| b.1.len()).sum();
    assert_eq!(members, trainable.len(), "{name}: bucket members");
    for op in [ops::BUCKET_PACK, ops::ALL_REDUCE, ops::WAIT, ops::UNPACK] {
        assert_eq!(count(t, op), plan.len(), "{name}: {op}");
    }
    // every trainable tensor's gradient is returned synchronized, once, at its position
    let synced = buckets_by_param(after);
    let synced_fqns: Vec<&String> = synced.values().flatten().collect();
    assert_eq!(
        synced_fqns.len(),
        trainable.len(),
        "{name}: synchronized gradients"
    );
    for p in &trainable {
        assert!(
            synced_fqns.contains(&&p.fqn),
            "{name}: {} is not synchronized",
            p.fqn
        );
    }
    // tied parameters return nothing of their own
    let outs = after.gradient_values();
    for p in before.params.iter().filter(|x| x.tied_to.is_some()) {
        assert_eq!(
            outs[p.forward_arg], None,
            "{name}: tied {} returns a gradient",
            p.fqn
        );
    }
    // frozen parameters and buffers: untouched
    let before_outs = before.gradient_values();
    for p in before
        .params
        .iter()
        .filter(|x| !x.requires_grad || x.buffer)
    {
        assert_eq!(before_outs[p.forward_arg], None);
        assert_eq!(
            outs[p.forward_arg], None,
            "{name}: {} got a gradient",
            p.fqn
        );
    }
    // data inputs keep their (local) gradients
    for (i, _) in before.data_inputs() {
        assert_eq!(
            before_outs[i].map(|v| before.backward.name(v)),
            outs[i].map(|v| t.name(v)),
            "{name}: input gradient {i} changed"
        );
    }
    // buckets close at the cap (bucket_mb <= 0: one gradient each)
    let cap = bucket_mb * (1u64 << 20) as f64;
    let sizes: Vec<usize> = plan.iter().map(|(_, ms, _)| ms.len()).collect();
    if bucket_mb <= 0.0 {
        assert!(sizes.iter().all(|s| *s == 1), "{name}: {sizes:?}");
    } else {
        for (k, (_, ms, nbytes)) in plan.iter().enumerate() {
            let last = t
                .ty(*ms.last().unwrap())
                .unwrap()
                .as_tensor()
                .unwrap()
                .nbytes();
            assert!(
                ((nbytes - last) as f64) < cap,
                "{name}: bucket {k} overfull"
            );
            if k + 1 < plan.len() {
                assert!(*nbytes as f64 >= cap, "{name}: bucket {k} closed early");
            }
        }
    }
    // waits as late as possible: right before their first consumer
    let pos: HashMap<_, usize> = t
        .schedule()
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, i))
        .collect();
    for (idx, n) in t.nodes() {
        if n.op == ops::WAIT {
            let first = t
                .users(n.outputs()[0])
                .iter()
                .map(|u| pos[u])
                .min()
                .unwrap();
            assert_eq!(first, pos[&idx] + 1, "{name}: a wait is early");
        }
    }
    // collectives in the same order on every rank: bucket order is schedule order
    let ids: Vec<&str> = plan.iter().map(|b| b.0.as_str()).collect();
    let mut sorted = ids.clone();
    sorted.sort_by_key(|s| s[1..].parse::<usize>().unwrap());
    assert_eq!(ids, sorted, "{name}: bucket order");
}

#[test]
fn every_trace_of_the_corpus_verifies_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    for (name, e) in corpus() {
        let p = &e.program;
        for t in [&p.forward, &p.backward] {
            tracepass_ir::verify(t).unwrap_or_else(|err| panic!("{name}: {err}"));
            let text = tracepass_ir::print_trace(t);
            let back =
                tracepass_ir::parse_trace(&text).unwrap_or_else(|err| panic!("{name}: {err}"));
            assert_eq!(
                tracepass_ir::print_trace(&back),
                text,
                "{name}: text round trip"
            );
        }
        let module = tracepass_ir::Module::Program(p.clone());
        for ext in ["tpb", "json"] {
            let path = dir.path().join(format!("{name}.{ext}"));
            tracepass_ir::fsio::save(&path, &module).unwrap();
            let tracepass_ir::Module::Program(q) = tracepass_ir::fsio::load(&path).unwrap() else {
                panic!("{name}.{ext} is not a program");
            };
            assert_eq!(q.params, p.params, "{name}.{ext}: parameters");
            for (a, b) in [(&p.forward, &q.forward), (&p.backward, &q.backward)] {
                assert_eq!(
                    tracepass_ir::print_trace(a),
                    tracepass_ir::print_trace(b),
                    "{name}.{ext}: trace"
                );
            }
        }
    }
}

#[test]
fn ddp_synchronizes_every_trainable_gradient_once() {
    let corpus = corpus();
    for (name, e) in plain(&corpus) {
        for mb in [0.0, 0.05, 1.0, 25.0] {
            let pipeline = format!("ddp(world_size=2,bucket_mb={mb}),sort-waits");
            let (after, _) = run(&e.program, &pipeline);
            check_rewrite(&format!("{name} at {mb} MiB"), &e.program, &after, mb);
        }
    }
}

#[test]
fn bucket_counts_follow_the_gradient_sizes() {
    let corpus = corpus();
    for (name, e) in plain(&corpus) {
        let trainable = trainable_tensors(&e.program).len();
        let bytes: usize = trainable_tensors(&e.program)
            .iter()
            .map(|p| p.shape.iter().product::<usize>() * p.dtype.size_bytes())
            .sum();
        let n = |mb: f64| {
            let (after, _) = run(&e.program, &format!("ddp(world_size=2,bucket_mb={mb})"));
            recorded_plan(&after.backward).len()
        };
        assert_eq!(n(0.0), trainable, "{name}: one bucket per gradient at 0");
        // the corpus models are small: 25 MiB holds every gradient of a dtype in one bucket
        assert!(bytes < 25 << 20);
        assert_eq!(n(25.0), 1, "{name}: one bucket at 25 MiB");
    }
}

#[test]
fn thunder_ddp_rebucketed_equals_ddp_on_the_plain_backward() {
    let corpus = corpus();
    let by_name: HashMap<&str, &Export> = corpus.iter().map(|(n, e)| (n.as_str(), e)).collect();
    let mut pairs = 0;
    for (name, e) in corpus.iter().filter(|(_, e)| e.info.world_size.is_some()) {
        let Some(plain) = name.strip_suffix("-ddp").and_then(|p| by_name.get(p)) else {
            continue;
        };
        let ws = e.info.world_size.unwrap();
        for mb in [0.0, 0.05, 25.0] {
            let ddp = format!("ddp(world_size={ws},bucket_mb={mb}),sort-waits");
            let (ours, _) = run(&plain.program, &ddp);
            let (rebucketed, _) = run(&e.program, &format!("no-sync,{ddp}"));
            check_rewrite(&format!("{name} at {mb} MiB"), &e.program, &rebucketed, mb);
            assert_eq!(
                buckets_by_param(&rebucketed),
                buckets_by_param(&ours),
                "{name} at {mb} MiB: buckets differ"
            );
            // `ddp` alone replaces Thunder's DDP the same way
            let (direct, report) = run(&e.program, &ddp);
            assert_eq!(
                canonical_text(&direct.backward),
                canonical_text(&rebucketed.backward).replacen("# Constructed by no-sync\n", "", 1),
                "{name} at {mb} MiB"
            );
            assert!(
                report.notes.iter().any(|(k, _)| k == "ddp.replaced"),
                "{name}: {:?}",
                report.notes
            );
        }
        pairs += 1;
    }
    assert!(pairs >= 3, "{pairs} plain/ddp pairs in the corpus");
}

#[test]
fn ties_are_reduced_once_and_named() {
    let corpus = corpus();
    let mut tied_models = 0;
    for (name, e) in plain(&corpus) {
        let tied: Vec<_> = e
            .program
            .params
            .iter()
            .filter(|p| p.tied_to.is_some())
            .collect();
        if tied.is_empty() {
            continue;
        }
        tied_models += 1;
        let (after, report) = run(&e.program, "ddp(world_size=2,bucket_mb=0)");
        let note = |k: &str| report.notes.iter().find(|(n, _)| n == k).unwrap().1.clone();
        for p in tied {
            let primary = p.tied_to.as_ref().unwrap();
            assert!(
                note("ddp.tied").contains(&format!("{primary} = {}", p.fqn)),
                "{name}"
            );
            // the gradients of both names are added before the one reduction
            let outs = after.gradient_values();
            let prim = e.program.param(primary).unwrap();
            let v = outs[prim.forward_arg].unwrap();
            let t = &after.backward;
            let unpack = t.node(t.producer(v).unwrap()).unwrap();
            let reduced_in = t
                .node(t.producer(unpack.args()[0].as_value().unwrap()).unwrap())
                .unwrap();
            assert_eq!(reduced_in.op, ops::WAIT);
            let sums = t
                .nodes()
                .filter(|(_, n)| {
                    n.op == ops::ADD && {
                        let before_outs = e.program.gradient_values();
                        let a = before_outs[p.forward_arg].unwrap();
                        let b = before_outs[prim.forward_arg].unwrap();
                        n.args() == [Arg::Value(b), Arg::Value(a)]
                            || n.args() == [Arg::Value(a), Arg::Value(b)]
                    }
                })
                .count();
            assert_eq!(sums, 1, "{name}: the tied gradients are added once");
        }
    }
    assert!(tied_models >= 1);
}

#[test]
fn frozen_parameters_buffers_and_inputs_are_named() {
    for (name, e) in corpus() {
        if e.info.world_size.is_some() {
            continue;
        }
        let (_, report) = run(&e.program, "ddp(world_size=2)");
        let note = |k: &str| report.notes.iter().find(|(n, _)| n == k).unwrap().1.clone();
        for p in &e.program.params {
            if p.buffer {
                assert!(note("ddp.buffers").contains(&p.fqn), "{name}: {}", p.fqn);
            } else if !p.requires_grad {
                assert!(note("ddp.frozen").contains(&p.fqn), "{name}: {}", p.fqn);
            }
        }
        for (_, input) in e.program.data_inputs() {
            assert!(note("ddp.inputs").contains(&input), "{name}: {input}");
        }
    }
}

/// A trainable parameter whose gradient the backward does not return (the loss never reaches
/// it) is left alone and named as unused, on every plain export; its position returns None.
#[test]
fn a_trainable_parameter_without_a_gradient_is_left_alone_and_named() {
    let corpus = corpus();
    for (name, e) in plain(&corpus) {
        let mut p = e.program.clone();
        let Some(victim) = p
            .params
            .iter()
            .find(|x| x.requires_grad && x.tied_to.is_none() && x.grad_output.is_some())
            .cloned()
        else {
            continue;
        };
        if p.params
            .iter()
            .any(|x| x.tied_to.as_deref() == Some(&victim.fqn))
        {
            continue;
        }
        if let Arg::Tuple(items) = &mut p.backward.ret {
            items[victim.forward_arg] = Arg::None;
        }
        let before = p.clone();
        let (after, report) = run(&p, "ddp(world_size=2),sort-waits");
        let note = report
            .notes
            .iter()
            .find(|(k, _)| k == "ddp.unused")
            .map(|x| x.1.clone())
            .unwrap_or_default();
        assert!(note.split(", ").any(|n| n == victim.fqn), "{name}: {note}");
        check_rewrite(name, &before, &after, 25.0);
        let Arg::Tuple(items) = &after.backward.ret else {
            panic!("{name}: the backward returns a tuple")
        };
        assert!(matches!(items[victim.forward_arg], Arg::None), "{name}");
    }
}

#[test]
fn rewritten_backwards_snapshot() {
    for (name, e) in corpus() {
        let pipeline = match e.info.world_size {
            None => "ddp(world_size=2,bucket_mb=0.05),sort-waits".to_string(),
            Some(ws) => format!("no-sync,ddp(world_size={ws},bucket_mb=0.05),sort-waits"),
        };
        let (after, _) = run(&e.program, &pipeline);
        insta::assert_snapshot!(
            format!("{name}_backward_ddp"),
            canonical_text(&after.backward)
        );
    }
}

/// Parameter names come from the prologue: bare `weight`/`bias` arguments (the CNN's first
/// conv) and names Thunder made up (`param`, MPNet's last LayerNorm bias) are parameters too,
/// each the module path the prologue fetched it by (a tensor attribute's: its sub-module's).
#[test]
fn parameters_come_from_the_prologue_not_from_names() {
    for (name, e) in corpus() {
        let prologue =
            std::fs::read_to_string(corpus_dir().join(&name).join("prologue.trace")).unwrap();
        for (i, a) in e.program.forward.args().iter().enumerate() {
            let arg = e.program.forward.name(*a);
            if let Some(p) = e.program.params.iter().find(|p| p.forward_arg == i) {
                assert!(!p.fqn.is_empty());
                if !arg.starts_with("t_") {
                    // `module.get_parameter('fqn')`, or a sub-module's tensor attribute
                    // (`embed_positions: ... = m1.embed_positions`, GPT-J's constants)
                    let fetched = prologue.lines().any(|l| {
                        let attr = l.rsplit_once(" = ").and_then(|(_, r)| r.split_once('.'));
                        l.trim_start().starts_with(&format!("{arg}: "))
                            && (l.contains(&format!("('{}')", p.fqn))
                                || attr.is_some_and(|(_, a)| p.fqn.ends_with(&format!(".{a}"))))
                    });
                    assert!(fetched, "{name}: {arg} -> {}", p.fqn);
                }
            }
        }
    }
}
