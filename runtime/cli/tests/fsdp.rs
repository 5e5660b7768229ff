//! The fsdp pass through the `tracepass` binary: `opt` rewrites a corpus export and writes a
//! program that `verify` accepts, `simulate` times a sharded backward, `train` trains sharded
//! (the losses DDP has, a fraction of its state per rank in `--metrics`) and refuses a program
//! fsdp rewrote already, before it runs any step.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn mlp() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/models/mlp")
        .to_string_lossy()
        .into_owned()
}
fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tracepass"))
        .args(args)
        .output()
        .unwrap()
}
fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", stderr(o));
    stdout(o)
}
fn sharded_program(dir: &Path) -> PathBuf {
    let out = dir.join("mlp_fsdp.tpb");
    ok(&run(&[
        "opt",
        &mlp(),
        "--passes",
        "fsdp(world_size=4,sharding=zero3)",
        "-o",
        out.to_str().unwrap(),
    ]));
    out
}

#[test]
fn opt_shards_a_corpus_export() {
    let o = run(&[
        "opt",
        &mlp(),
        "--passes",
        "fsdp(world_size=4,sharding=zero3)",
        "--stats",
    ]);
    let backward = ok(&o);
    // the backward gathers the saved parameters again and reduce-scatters the gradients
    assert!(backward.contains("dist.all_gather_async("), "{backward}");
    assert!(
        backward.contains("dist.reduce_scatter_async("),
        "{backward}"
    );
    assert!(!backward.contains("dist.all_reduce_async("), "{backward}");
    let err = stderr(&o);
    assert!(err.contains("stat fsdp.buckets: 1"), "{err}");
    assert!(err.contains("stat fsdp.sharded: 10"), "{err}");
    // the whole program, verified again from the file
    let dir = tempfile::tempdir().unwrap();
    let p = sharded_program(dir.path());
    let v = ok(&run(&["verify", p.to_str().unwrap()]));
    assert!(v.contains(": ok"), "{v}");
    // and its text form: the forward takes the shard
    let text = dir.path().join("mlp_fsdp.json");
    ok(&run(&[
        "convert",
        p.to_str().unwrap(),
        text.to_str().unwrap(),
    ]));
    let json = std::fs::read_to_string(&text).unwrap();
    // 7178 elements pad to 7180, split four ways
    let placement = "\"shard\": {\n          \"bucket\": \"b0\",\n          \"offset\": 0,\n          \"numel\": 64,\n          \"bucket_numel\": 7178,\n          \"padding\": 2,\n          \"world_size\": 4\n        }";
    assert!(json.contains(placement), "shard placements are written");
}

#[test]
fn simulate_times_a_sharded_backward() {
    let o = run(&[
        "simulate",
        &mlp(),
        "--world-size",
        "4",
        "--passes",
        "fsdp(world_size=4,sharding=zero3,bucket_mb=0.01),sort-waits",
        "--json",
    ]);
    let s = ok(&o);
    // zero3 with small buckets: gathers (forward and backward) and reduce-scatters on the
    // communication stream, and the memory of a rank
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    let buckets = v["buckets"].as_array().unwrap();
    let of = |phase: &str, label: &str| {
        buckets
            .iter()
            .filter(|b| b["phase"] == phase && b["label"] == label)
            .count()
    };
    assert_eq!(
        of("forward", "gather:b0"),
        1,
        "the forward's gather of b0: {s}"
    );
    assert_eq!(
        of("backward", "gather:b0"),
        1,
        "zero3 gathers b0 again: {s}"
    );
    assert_eq!(of("backward", "scatter:b0"), 1, "{s}");
    assert!(v["forward_s"].as_f64().unwrap() > 0.0, "{s}");
    let m = &v["memory"];
    assert!(m["gathered_peak_bytes"].as_u64().unwrap() > 0, "{s}");
    assert!(m["peak_bytes"].as_u64().unwrap() > m["params_bytes"].as_u64().unwrap());
    // the text form: forward and backward, the collectives by kind, the memory per rank
    let text = ok(&run(&[
        "simulate",
        &mlp(),
        "--world-size",
        "4",
        "--passes",
        "fsdp(world_size=4,sharding=zero2,bucket_mb=0.01),sort-waits",
    ]));
    assert!(text.contains("| forward "), "{text}");
    assert!(text.contains(" all-gathers, "), "{text}");
    assert!(text.contains("memory per rank: peak "), "{text}");
    assert!(text.contains("gathered buckets"), "{text}");
    let o = run(&[
        "simulate",
        &mlp(),
        "--world-size",
        "2",
        "--passes",
        "fsdp(world_size=4),sort-waits",
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("world size 4") && e.contains("--world-size 2"),
        "{e}"
    );
}

#[test]
fn train_shards_and_reports_what_each_rank_holds() {
    let train = |passes: &str| {
        ok(&run(&[
            "train",
            "--model",
            &mlp(),
            "--world-size",
            "2",
            "--steps",
            "2",
            "--passes",
            passes,
            "--metrics",
        ]))
    };
    let ddp = train("ddp(world_size=2)");
    let zero3 = train("fsdp(world_size=2,sharding=zero3,bucket_mb=0.01)");
    // the same losses as DDP
    let losses = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.contains("-th loss"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(losses(&zero3).len(), 2, "{zero3}");
    assert_eq!(losses(&zero3), losses(&ddp));
    // per-rank state and the exposed gather and scatter time
    assert!(
        zero3.contains("state_mib  gather_exposed_ms  scatter_exposed_ms"),
        "{zero3}"
    );
    let state = |s: &str| -> f64 {
        let row = s
            .lines()
            .find(|l| l.trim_start().starts_with("0     0"))
            .unwrap_or_else(|| panic!("no row for step 0, rank 0: {s}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        cols[11].parse().unwrap()
    };
    assert!(state(&zero3) < 0.6 * state(&ddp), "{zero3}\n{ddp}");
}

#[test]
fn train_refuses_a_program_fsdp_sharded_already() {
    // the trainer shards the plain model itself
    let dir = tempfile::tempdir().unwrap();
    let p = sharded_program(dir.path());
    let o = run(&[
        "train",
        "--model",
        p.to_str().unwrap(),
        "--world-size",
        "4",
        "--steps",
        "2",
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("the program is sharded (fsdp ran on it)"), "{e}");
    assert!(e.contains("--passes 'fsdp(world_size=N"), "{e}");
    assert!(!stdout(&o).contains("-th loss"), "no step ran");
}

/// `train --save` of a sharded run writes a manifest and one file per rank; `--resume` takes it
/// at another world size; `--checkpoint-format whole` gathers; `sharded` needs fsdp.
#[test]
fn train_saves_shards_and_resumes_them_at_another_world_size() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let ck_s = ck.to_str().unwrap();
    let m = mlp();
    ok(&run(&[
        "train",
        "--model",
        &m,
        "--world-size",
        "2",
        "--steps",
        "2",
        "--passes",
        "fsdp(world_size=2,sharding=zero3,bucket_mb=0)",
        "--save",
        ck_s,
    ]));
    let manifest = std::fs::read_to_string(&ck).unwrap();
    assert!(
        manifest.contains("\"format\": \"tracepass-sharded-checkpoint\""),
        "{manifest}"
    );
    let shards: Vec<_> = std::fs::read_dir(dir.path().join("ck.shards"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(shards.len(), 2, "{shards:?}");
    assert!(
        shards
            .iter()
            .any(|f| f.ends_with(".rank1-of-2.safetensors")),
        "{shards:?}"
    );
    let out = ok(&run(&[
        "train",
        "--model",
        &m,
        "--world-size",
        "4",
        "--steps",
        "4",
        "--passes",
        "fsdp(world_size=4,sharding=zero2)",
        "--resume",
        ck_s,
        "--save",
        ck_s,
        "--checkpoint-format",
        "whole",
    ]));
    assert!(out.contains("3-th loss"), "{out}");
    // now one safetensors file of whole tensors, and the shards it replaced are gone
    let bytes = std::fs::read(&ck).unwrap();
    assert!(!bytes.starts_with(b"{"), "a whole checkpoint");
    assert!(!dir.path().join("ck.shards").exists());
    let o = run(&[
        "train",
        "--model",
        &m,
        "--world-size",
        "2",
        "--steps",
        "1",
        "--save",
        ck_s,
        "--checkpoint-format",
        "sharded",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("only a sharded run"), "{}", stderr(&o));
}
