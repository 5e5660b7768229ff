//! The simulator on sharded programs: a step's forward with its all-gathers and their waits,
//! then its backward, and each rank's predicted peak memory, which counts the gathered
//! parameter buckets: zero3 (gathers again in the backward) below zero2 (keeps them) below
//! DDP (whole parameters, gradients and AdamW state) on real exports.

use std::path::Path;
use tracepass_ir::{load_export, OpRegistry, Program, Type};
use tracepass_passes::PassManager;
use tracepass_runtime::comm::LinkModel;
use tracepass_runtime::sim::{
    predict_memory, simulate, simulate_step, DeviceModel, SimMemory, SimOptions,
    ADAMW_STATE_BYTES_PER_ELEMENT,
};

fn export(name: &str) -> Program {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/models")
        .join(name);
    load_export(&dir)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .program
}

fn rewrite(p: &Program, pipeline: &str) -> Program {
    let mut q = p.clone();
    PassManager::parse(pipeline)
        .unwrap()
        .run(&mut q, OpRegistry::builtin())
        .unwrap_or_else(|e| panic!("{pipeline}: {e}"));
    q
}

fn opts(world: usize) -> SimOptions {
    SimOptions {
        world_size: world,
        device: DeviceModel::named("h100").expect("known"),
        link: LinkModel::parse("5,400").expect("valid"),
        host_reduction: false,
    }
}

/// Padded bytes of each bucket fsdp made, by bucket.
fn buckets(p: &Program) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for x in &p.params {
        if let Some(s) = &x.shard {
            if !out.iter().any(|(b, _)| *b == s.bucket) {
                out.push((
                    s.bucket.clone(),
                    (s.bucket_numel + s.padding) * x.dtype.size_bytes(),
                ));
            }
        }
    }
    out
}

fn param_bytes(p: &Program) -> usize {
    p.params
        .iter()
        .map(|x| x.shape.iter().product::<usize>() * x.dtype.size_bytes())
        .sum()
}

#[test]
fn zero3_peaks_below_zero2_below_ddp() {
    for (name, world, mb) in [("nanogpt", 4, "0.05"), ("llama", 2, "0.05")] {
        let p = export(name);
        let ddp = predict_memory(&rewrite(&p, &format!("ddp(world_size={world}),sort-waits")));
        let mem = |s: &str| -> (Program, SimMemory) {
            let q = rewrite(
                &p,
                &format!("fsdp(world_size={world},sharding={s},bucket_mb={mb}),sort-waits"),
            );
            let m = predict_memory(&q);
            (q, m)
        };
        let (q2, zero2) = mem("zero2");
        let (q3, zero3) = mem("zero3");
        let what = format!("{name}: zero3 {zero3:?}\nzero2 {zero2:?}\nddp {ddp:?}");
        assert!(zero3.peak_bytes < zero2.peak_bytes, "{what}");
        assert!(zero2.peak_bytes < ddp.peak_bytes, "{what}");
        // DDP keeps every parameter whole and AdamW state for each, and gathers nothing
        let whole = param_bytes(&p);
        assert_eq!(ddp.params_bytes, whole, "{name}");
        assert_eq!(ddp.gathered_peak_bytes, 0);
        // a sharded rank keeps one shard per bucket (of the padded bucket) and their moments
        let bs = buckets(&q3);
        assert!(bs.len() > 2, "{name}: several buckets");
        let shards: usize = bs.iter().map(|(_, b)| b / world).sum();
        // (and whatever it does not shard whole: buffers, frozen parameters)
        let mut kept_args: Vec<usize> = q3
            .params
            .iter()
            .filter(|x| x.shard.is_none())
            .map(|x| x.forward_arg)
            .collect();
        kept_args.dedup();
        let kept: usize = kept_args
            .iter()
            .map(|i| match q3.forward.ty(q3.forward.args()[*i]) {
                Some(Type::Tensor(tt)) => tt.nbytes(),
                _ => 0,
            })
            .sum();
        for m in [&zero2, &zero3] {
            assert_eq!(m.params_bytes, shards + kept, "{what}");
            // two f32 moments per element of each shard (f32 models: twice its bytes)
            let moments = shards / 4 * ADAMW_STATE_BYTES_PER_ELEMENT;
            assert!(m.optimizer_bytes >= moments, "{what}");
            assert!(m.optimizer_bytes <= moments + 2 * kept, "{what}");
        }
        // the gathered buckets are counted: zero2 holds every bucket the backward reads
        // (gathered in the forward, saved), zero3 at least the largest bucket, not all at once
        let largest = bs.iter().map(|(_, b)| *b).max().unwrap();
        let all: usize = bs.iter().map(|(_, b)| *b).sum();
        assert!(zero3.gathered_peak_bytes >= largest, "{what}");
        assert!(zero3.gathered_peak_bytes < all, "{what}");
        assert!(
            zero2.gathered_peak_bytes > zero3.gathered_peak_bytes,
            "{what}"
        );
        assert_eq!(buckets(&q2), bs, "one layout for both stages");
        for m in [&zero2, &zero3] {
            assert!(m.transient_peak_bytes >= m.gathered_at_peak_bytes);
            assert_eq!(
                m.peak_bytes,
                m.params_bytes + m.optimizer_bytes + m.transient_peak_bytes
            );
            assert!(m.peak_bytes >= m.params_bytes + m.optimizer_bytes + largest);
        }
        // zero2 peaks in the backward with the gathered parameters saved
        assert!(zero2.gathered_at_peak_bytes > 0, "{what}");
    }
}

#[test]
fn a_step_times_the_forwards_gathers_and_their_waits() {
    let p = export("nanogpt");
    for s in ["zero2", "zero3"] {
        let q = rewrite(
            &p,
            &format!("fsdp(world_size=4,sharding={s},bucket_mb=0.05),sort-waits"),
        );
        let n_buckets = buckets(&q).len();
        let r = simulate_step(&q, &opts(4)).unwrap();
        let phase = |ph: &str, what: &str| {
            r.buckets
                .iter()
                .filter(|b| b.phase == ph && b.label.starts_with(what))
                .count()
        };
        // every bucket gathered in the forward, each gather waited on
        assert_eq!(phase("forward", "gather:"), n_buckets, "{s}");
        assert_eq!(phase("forward", "scatter:"), 0);
        for b in &r.buckets {
            assert!(!b.wait_s.is_nan(), "{s}: {} never waited", b.label);
            assert!(b.wait_s >= b.launch_s && b.end_s >= b.start_s);
            assert!(b.start_s >= b.launch_s);
        }
        // a forward gather is waited before the forward ends; the forward takes time
        for b in r.buckets.iter().filter(|b| b.phase == "forward") {
            assert!(b.wait_s <= r.forward_s, "{s}: {}", b.label);
        }
        assert!(r.forward_s > 0.0 && r.step_s > r.forward_s);
        // zero3 gathers again in the backward; both reduce-scatter there
        let backward_gathers = phase("backward", "gather:");
        if s == "zero3" {
            assert!(backward_gathers > 0);
        } else {
            assert_eq!(backward_gathers, 0);
        }
        assert_eq!(phase("backward", "scatter:"), n_buckets, "{s}");
        // the bytes a forward gather moves are its padded bucket's
        let by_bucket = buckets(&q);
        for b in r.buckets.iter().filter(|b| b.phase == "forward") {
            let name = b.label.strip_prefix("gather:").unwrap();
            let want = by_bucket.iter().find(|(n, _)| n == name).unwrap().1;
            assert_eq!(b.bytes, want, "{s}: {}", b.label);
        }
        // the backward alone is what `simulate` of the backward times (the same model)
        let back = simulate(&q.backward, &opts(4)).unwrap();
        assert_eq!(back.buckets.len(), phase("backward", ""));
        assert!(r.memory.is_some());
        // the forward's compute adds to the backward's
        assert!(r.compute_s > back.compute_s);
    }
}

/// The shard arguments the forward takes are what the memory counts as parameters.
#[test]
fn shard_arguments_are_the_parameters_a_rank_keeps() {
    let p = export("mlp");
    let q = rewrite(&p, "fsdp(world_size=4,bucket_mb=0)");
    let m = predict_memory(&q);
    let f = &q.forward;
    let shards: usize = f
        .args()
        .iter()
        .filter(|a| f.name(**a).starts_with("shard_"))
        .map(|a| match f.ty(*a) {
            Some(Type::Tensor(tt)) => tt.nbytes(),
            _ => 0,
        })
        .sum();
    assert!(shards > 0);
    assert_eq!(m.params_bytes, shards);
}
