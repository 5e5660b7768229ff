//! The `tracepass` binary end to end: outputs, exit codes and error messages.

mod common;

use common::{bin, run, stderr, stdout, testdata};
use std::path::PathBuf;

fn td(rel: &str) -> PathBuf {
    testdata("thunder").join(rel)
}

#[test]
fn show_prints_with_and_without_subsymbols() {
    let p = td("mlp/backward.trace");
    let o = run(&["show", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("      # t130 = prims.reshape(t64, (8, 4))"));
    let o = run(&["show", p.to_str().unwrap(), "--no-subsymbols"]);
    assert!(!stdout(&o).contains("prims.reshape"));
    assert!(stdout(&o).contains("t130 = torch.reshape(t64, (-1, 4))"));
}

#[test]
fn convert_round_trips_binary_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let src = td("mlp-ddp/backward.trace");
    let tpb = dir.path().join("b.tpb");
    let json = dir.path().join("b.json");
    let back = dir.path().join("b.trace");
    for (a, b) in [
        (src.as_path(), tpb.as_path()),
        (&tpb, &json),
        (&json, &back),
    ] {
        let o = run(&["convert", a.to_str().unwrap(), b.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let orig = stdout(&run(&["show", src.to_str().unwrap()]));
    assert_eq!(stdout(&run(&["show", back.to_str().unwrap()])), orig);
}

#[test]
fn verify_and_dot() {
    let p = td("mlp/joint.trace");
    let o = run(&["verify", p.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(stdout(&o).ends_with(": ok\n"));
    let o = run(&["dot", p.to_str().unwrap()]);
    assert!(stdout(&o).starts_with("digraph \"computation\" {"));
    assert!(stdout(&o).contains("[label=\"t18\"]"));
}

#[test]
fn bad_inputs_fail_with_a_message_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.trace");
    std::fs::write(
        &bad,
        std::fs::read_to_string(td("mlp/backward.trace"))
            .unwrap()
            .replace("torch.permute", "torch.permutate")
            // a printed decomposition into known prims would stand in for the unknown op
            .replace("prims.transpose", "prims.transposition"),
    )
    .unwrap();
    let o = run(&["verify", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("bad.trace: line 45, column 10: 1 unknown op: `torch.permutate`"),
        "{}",
        stderr(&o)
    );
    let corrupt = dir.path().join("c.tpb");
    std::fs::write(&corrupt, b"TRACEPB\0garbage").unwrap();
    let o = run(&["show", corrupt.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("c.tpb: file too short for the 24-byte header"),
        "{}",
        stderr(&o)
    );
    let o = run(&["show", "/nonexistent/x.trace"]);
    assert!(stderr(&o).contains("/nonexistent/x.trace"));
    let o = run(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn opt_rewrites_for_ddp() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ddp.trace");
    let o = run(&[
        "opt",
        td("mlp/backward.trace").to_str().unwrap(),
        "--forward",
        td("mlp/forward.trace").to_str().unwrap(),
        "--passes",
        "ddp(world_size=4,bucket_mb=0),sort-waits,dce",
        "-o",
        out.to_str().unwrap(),
        "--timing",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("sort-waits"), "timing table on stderr");
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.matches("dist.all_reduce_async(").count(), 4);
    assert_eq!(text.matches("prims.div(").count(), 4);
    // the written file is valid and re-verifies
    assert!(run(&["verify", out.to_str().unwrap()]).status.success());
}

#[test]
fn opt_errors_and_reproducer() {
    let o = run(&[
        "opt",
        td("mlp/backward.trace").to_str().unwrap(),
        "--passes",
        "ddp(world_size=0)",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bad value `0` for `world_size`: must be at least 1"));
    let o = run(&[
        "opt",
        td("mlp/backward.trace").to_str().unwrap(),
        "--passes",
        "dce,unroll",
    ]);
    assert!(stderr(&o).contains(
        "unknown pass `unroll`; valid passes: ddp, fsdp, sort-waits, no-sync, accumulate-grads, dce, cse"
    ));
    // ddp without the forward is a user error: a clear message and no reproducer
    let dir = tempfile::tempdir().unwrap();
    let o = run(&[
        "opt",
        td("mlp/backward.trace").to_str().unwrap(),
        "--passes",
        "ddp(world_size=2)",
        "--reproducer-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("no parameter metadata"), "{err}");
    assert!(!err.contains("reproducer"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // a pass that breaks the IR is a bug: its reproducer replays the failure
    let o = run(&[
        "opt",
        td("mlp/backward.trace").to_str().unwrap(),
        "--forward",
        td("mlp/forward.trace").to_str().unwrap(),
        "--passes",
        "ddp(world_size=2)",
        "--inject-fault",
        "ddp:corrupt",
        "--reproducer-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    let repro = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(err.contains(&repro.display().to_string()), "{err}");
    let o = run(&["opt", "--reproduce", repro.to_str().unwrap()]);
    assert!(stderr(&o).contains("replaying `ddp(world_size=2,bucket_mb=25)`"));
}

fn reference(name: &str) -> PathBuf {
    testdata("reference").join(name)
}

#[test]
fn train_is_the_main_job() {
    let dir = tempfile::tempdir().unwrap();
    let grads = dir.path().join("g.safetensors");
    let timeline = dir.path().join("t.json");
    let metrics = dir.path().join("m.json");
    let o = run(&[
        "train",
        "--world-size",
        "2",
        "--params",
        reference("params_seed0.safetensors").to_str().unwrap(),
        "--data",
        reference("data_seed0_ws2.safetensors").to_str().unwrap(),
        "--save-grads",
        grads.to_str().unwrap(),
        "--timeline",
        timeline.to_str().unwrap(),
        "--metrics-json",
        metrics.to_str().unwrap(),
        "--metrics",
        "--no-pin-ranks",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let losses: Vec<&str> = out.lines().filter(|l| l.starts_with("# ")).collect();
    assert_eq!(losses.len(), 10, "{out}");
    // the seed's format, and PyTorch's first loss to float32 precision
    assert!(
        losses[0].starts_with("# 0-th loss: -0.19985"),
        "{}",
        losses[0]
    );
    assert!(out.contains("overlap%"));
    assert!(stderr(&o).contains("trained 10 steps on 2 rank(s)"));
    let g = tracepass_runtime::tensor::TensorFile::load(&grads).unwrap();
    assert_eq!(
        g.tensors.keys().collect::<Vec<_>>(),
        vec!["l1.bias", "l1.weight", "l2.bias", "l2.weight"]
    );
    let tl: serde_json::Value = serde_json::from_slice(&std::fs::read(&timeline).unwrap()).unwrap();
    assert!(tl["traceEvents"].as_array().unwrap().len() > 100);
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&metrics).unwrap()).unwrap();
    assert_eq!(m.as_array().unwrap().len(), 2, "one list per rank");
    assert_eq!(m[0].as_array().unwrap().len(), 10, "one entry per step");
    assert!(m[1][3]["overlap_pct"].is_number());
    // memory planning: from the second step on the kernels' buffers come back from the last
    // step; what is still allocated comes with the buckets (an all-reduce between threads
    // gives the ranks one shared result buffer, which no rank's pool gets back: at most two
    // buffers per bucket, and which rank pays for them depends on who finishes last)
    for rank in m.as_array().unwrap() {
        let steps = rank.as_array().unwrap();
        let allocs = |s: &serde_json::Value| s["buffer_allocs"].as_u64().unwrap();
        let buckets = steps[1]["buckets"].as_array().unwrap().len() as u64;
        for s in &steps[1..] {
            assert!(
                allocs(s) <= 2 * buckets && allocs(s) < allocs(&steps[0]),
                "{s}"
            );
            assert_eq!(s["arena_bytes"], steps[0]["arena_bytes"]);
        }
        assert!(steps[0]["arena_bytes"].as_u64().unwrap() > 0);
    }
    assert!(out.contains("allocs  pool_MiB  arena_MiB"), "{out}");
}

#[test]
fn train_rejects_bad_options_with_exit_code_1() {
    for (args, want) in [
        (vec!["--world-size", "0"], "--world-size must be at least 1"),
        (
            vec!["--broadcast-from", "x"],
            "--broadcast-from x: expected a rank number or `none`",
        ),
        (
            vec!["--broadcast-from", "7", "--world-size", "2"],
            "--broadcast-from 7 is not a rank",
        ),
        (
            vec!["--bucket-mb", "nan"],
            "--bucket-mb NaN: must be a finite number",
        ),
        (
            vec!["--model", "deep-mlp:2,x,8"],
            "expected deep-mlp:LAYERS,WIDTH,BATCH",
        ),
        (vec!["--model", "resnet"], "unknown model"),
        (
            vec!["--optimizer", "lion"],
            "unknown optimizer (valid: adamw, sgd)",
        ),
        (vec!["--link", "5"], "expected LATENCY_US,BANDWIDTH_GBPS"),
        // without the feature it says so; with it, on a machine without a GPU, it says that
        (
            vec!["--device", "cuda"],
            if cfg!(feature = "cuda") {
                "--device cuda: no CUDA"
            } else {
                "built without the `cuda` feature"
            },
        ),
        (
            vec!["--params", "/nonexistent.safetensors"],
            "/nonexistent.safetensors",
        ),
        (
            vec!["--inject-fault", "1:0:panic", "--world-size", "2"],
            "rank 1 failed: panicked: injected fault",
        ),
    ] {
        let mut all = vec!["train"];
        all.extend(&args);
        let o = run(&all);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
        if !args.contains(&"--inject-fault") {
            assert!(
                !stderr(&o).contains("panicked at"),
                "{args:?}: a panic escaped: {}",
                stderr(&o)
            );
        }
    }
}

#[test]
fn simulate_predicts_and_sweeps_bucket_sizes() {
    let (b, f) = (td("mlp/backward.trace"), td("mlp/forward.trace"));
    let o = run(&[
        "simulate",
        b.to_str().unwrap(),
        "--forward",
        f.to_str().unwrap(),
        "--passes",
        "ddp(world_size=8,bucket_mb=0),sort-waits",
        "--world-size",
        "8",
        "--gpu",
        "h200",
        "--link",
        "ib-400g",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.contains("device: h200") && s.contains("4 all-reduces"),
        "{s}"
    );
    // the predicted memory per rank, from the memory plans of the forward and the backward
    let peak: f64 = s
        .split("memory per rank: peak ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no memory line: {s}"));
    assert!(peak > 0.0, "{s}");
    let o = run(&[
        "simulate",
        b.to_str().unwrap(),
        "--forward",
        f.to_str().unwrap(),
        "--world-size",
        "4",
        "--sweep-bucket-mb",
    ]);
    let s = stdout(&o);
    assert!(
        s.contains("| bucket_mb |") && s.contains("best bucket_mb:"),
        "{s}"
    );
    // the Thunder DDP export is stripped with no-sync before re-bucketing
    let o = run(&[
        "simulate",
        td("mlp-ddp/backward.trace").to_str().unwrap(),
        "--forward",
        td("mlp-ddp/forward.trace").to_str().unwrap(),
        "--world-size",
        "2",
        "--sweep-bucket-mb",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 10);
    for (args, want) in [
        (
            vec!["--gpu", "tpu"],
            "unknown device (valid: h100, h200, a100, l40s, cpu)",
        ),
        (vec!["--link", "smoke"], "nvlink, nvlink3"),
        (vec!["--world-size", "0"], "--world-size must be at least 1"),
    ] {
        let mut all = vec![
            "simulate",
            b.to_str().unwrap(),
            "--forward",
            f.to_str().unwrap(),
        ];
        if !args.contains(&"--world-size") {
            all.extend(["--world-size", "2"]);
        }
        all.extend(&args);
        let o = run(&all);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn killing_a_writer_leaves_the_previous_checkpoint_intact() {
    use tracepass_runtime::train::checkpoint;
    use tracepass_runtime::train::OptimizerKind;
    use tracepass_runtime::train::{Model, ModelSource};
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.safetensors");
    let model = Model::load(&ModelSource::DeepMlp {
        layers: 4,
        width: 512,
        batch: 8,
    })
    .unwrap();
    let (names, shapes) = (model.param_names(), model.param_shapes());
    for (i, delay_ms) in [150u64, 230, 370].into_iter().enumerate() {
        // a run that rewrites its 12 MB checkpoint after every step, killed at some moment
        let mut child = bin()
            .args([
                "train",
                "--model",
                "deep-mlp:4,512,8",
                "--steps",
                "100000",
                "--save",
                ck.to_str().unwrap(),
                "--save-every",
                "1",
                "--seed",
                &i.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // wait until this run has rewritten its checkpoint at least once (a loaded machine may
        // take a second a step), then kill it at some moment of a later write
        let start = std::time::Instant::now();
        let step_on_disk = || {
            checkpoint::load(&ck, &names, &shapes, OptimizerKind::adamw())
                .map(|c| c.step)
                .unwrap_or(0)
        };
        while step_on_disk() < 2 && start.elapsed() < std::time::Duration::from_secs(120) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        // whatever moment the kill hit, the file is a whole checkpoint
        let c = checkpoint::load(&ck, &names, &shapes, OptimizerKind::adamw())
            .expect("the checkpoint on disk is complete");
        assert!(c.step >= 2, "{}", c.step);
        std::fs::remove_file(&ck).unwrap();
    }
}

/// Every class of file error the CLI can meet: exit code 1 and a message naming file and cause.
#[test]
fn every_file_error_class_has_its_message_and_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let good = p("good.tpb");
    let o = run(&[
        "convert",
        td("mlp/backward.trace").to_str().unwrap(),
        good.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let bytes = std::fs::read(&good).unwrap();
    let mut cases: Vec<(PathBuf, &str)> = Vec::new();
    let mut write = |name: &str, b: &[u8], want: &'static str| {
        std::fs::write(p(name), b).unwrap();
        cases.push((p(name), want));
    };
    let mut magic = bytes.clone();
    magic[0] = b'X';
    write(
        "magic.tpb",
        &magic,
        "not a tracepass binary file: expected magic",
    );
    let mut version = bytes.clone();
    version[8] = 99;
    write(
        "version.tpb",
        &version,
        "unsupported format version 99 (this build reads versions 1 to 5)",
    );
    write(
        "trunc.tpb",
        &bytes[..bytes.len() - 10],
        "truncated: the header says",
    );
    write(
        "short.tpb",
        &bytes[..10],
        "file too short for the 24-byte header (10 bytes)",
    );
    let mut trailing = bytes.clone();
    trailing.extend_from_slice(b"extra");
    write(
        "trailing.tpb",
        &trailing,
        "5 bytes after the payload the header announces",
    );
    let mut flipped = bytes.clone();
    let at = bytes.len() / 2;
    flipped[at] ^= 0x40;
    write("flipped.tpb", &flipped, "checksum mismatch");
    write("bad.json", b"{\"Trace\": 3", "invalid JSON trace");
    write(
        "x.xyz",
        b"",
        "unknown file extension; use .trace (text), .tpb (binary) or .json",
    );
    write("syntax.trace", b"def f(x):\n  y = = 3\n", "line 2, column");
    cases.push((p("missing.trace"), "No such file or directory"));
    for (file, want) in &cases {
        let o = run(&["show", file.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{}", file.display());
        let e = stderr(&o);
        assert!(e.starts_with("error: "), "{e}");
        assert!(
            e.contains(file.file_name().unwrap().to_str().unwrap()),
            "names the file: {e}"
        );
        assert!(e.contains(want), "{}: {e}", file.display());
        assert!(!e.contains("panicked"), "{e}");
    }
    // a program cannot be written as one .trace; a lone trace is not a program
    let prog = p("prog.tpb");
    let program = tracepass_ir::synth::mlp_program(&tracepass_ir::synth::MlpSpec::seed()).unwrap();
    tracepass_ir::fsio::save(&prog, &tracepass_ir::Module::Program(program)).unwrap();
    let o = run(&[
        "convert",
        prog.to_str().unwrap(),
        p("prog.trace").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("a .trace file holds one trace, and this is a program"),
        "{}",
        stderr(&o)
    );
    assert!(!p("prog.trace").exists(), "nothing half-written");
}

#[test]
fn launched_processes_rendezvous_over_tcp() {
    // three processes on loopback: every rank receives rank 0's id bytes
    let o = run(&["launch", "--nproc-per-node", "3", "--", "rendezvous-check"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let digests: Vec<&str> = out
        .lines()
        .map(|l| l.split("id ").nth(1).unwrap_or("?"))
        .collect();
    assert_eq!(digests.len(), 3, "{out}");
    assert!(
        digests
            .iter()
            .all(|d| *d == digests[0] && d.ends_with("(128 bytes)")),
        "{out}"
    );
    for r in 0..3 {
        assert!(out.contains(&format!("rank {r} of 3")), "{out}");
    }
    // rank 0 alone: the missing rank is named, within the timeout
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = std::time::Instant::now();
    let o = bin()
        .args(["rendezvous-check", "--timeout", "0.5"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .output()
        .unwrap();
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("rank(s) [1] did not arrive within 0.5 s"),
        "{}",
        stderr(&o)
    );
    // a failing rank stops the launch with its number
    let o = run(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--",
        "train",
        "--device",
        "cuda",
        "--model",
        "resnet",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("exited with"), "{}", stderr(&o));
}
