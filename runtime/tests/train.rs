//! The trainer against PyTorch's reference numbers, against local gradients, against Thunder's
//! own DDP export and against finite differences; and how it fails on bad input.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tracepass_ir::DType;
use tracepass_passes::{parse_pipeline, DdpOptions, PassError, PassSpec};
use tracepass_runtime::tensor::Tensor;
use tracepass_runtime::train::{
    local_gradients, train, Fault, TrainConfig, TrainError, TrainReport,
};
use tracepass_runtime::train::{seeded_params, DataSource};
use tracepass_runtime::train::{Model, ModelSource};

fn reference(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/reference")
        .join(name)
}
fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/thunder")
        .join(rel)
}

fn quiet(_: usize, _: f64) {}

fn run(cfg: &TrainConfig) -> TrainReport {
    train(cfg, &quiet).expect("training runs")
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / scale)
        .fold(0.0, f64::max)
}

fn reference_config() -> TrainConfig {
    TrainConfig {
        world_size: 2,
        params: Some(reference("params_seed0.safetensors")),
        data: Some(reference("data_seed0_ws2.safetensors")),
        ..TrainConfig::default()
    }
}

#[test]
fn matches_pytorch_reference_losses_gradients_and_parameters() {
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(reference("expected_seed0_ws2.json")).unwrap(),
    )
    .unwrap();
    let r = run(&reference_config());
    let want_losses: Vec<f64> = serde_json::from_value(expected["losses"].clone()).unwrap();
    assert_eq!(r.losses.len(), 10);
    for (i, (got, want)) in r.losses.iter().zip(&want_losses).enumerate() {
        assert!(
            (got - want).abs() < 2e-6,
            "loss {i}: {got} vs PyTorch {want}"
        );
    }
    for (key, got) in [
        ("grads_step0", &r.grads_step0[0]),
        (
            "params_after",
            &r.params[0].iter().cloned().map(Some).collect::<Vec<_>>(),
        ),
    ] {
        for (name, g) in r.param_names.iter().zip(got.iter()) {
            let want: Vec<f64> = serde_json::from_value(expected[key][name].clone()).unwrap();
            let g = g.as_ref().expect("gradient").to_f64_vec();
            let rel = max_rel(&g, &want);
            // float32 noise: PyTorch's own f32 vs f64 results differ by about 1e-7
            assert!(rel < 1e-5, "{key} {name}: max relative difference {rel}");
        }
    }
    // (d) the loss goes down over the 10 steps
    assert!(r.losses[9] < r.losses[0] - 0.3, "{:?}", r.losses);
}

#[test]
fn seeded_run_learns() {
    let r = run(&TrainConfig::default());
    assert_eq!(r.losses.len(), 10);
    let first3: f64 = r.losses[..3].iter().sum();
    let last3: f64 = r.losses[7..].iter().sum();
    assert!(last3 < first3, "{:?}", r.losses);
}

/// Pinning rank threads to CPUs changes only where they run, never what they compute.
#[test]
fn pinned_and_unpinned_ranks_compute_the_same_bits() {
    let cfg = TrainConfig {
        steps: 4,
        ..TrainConfig::default()
    };
    let pinned = run(&cfg);
    let free = run(&TrainConfig {
        pin_ranks: false,
        ..cfg
    });
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&pinned.losses), bits(&free.losses));
    for (a, b) in pinned.params[0].iter().zip(&free.params[0]) {
        assert!(a.bitwise_eq(b));
    }
}

/// (a) synchronized gradients = mean of local gradients; bitwise the same on every rank and for
/// every bucket size.
#[test]
fn ddp_gradients_are_the_mean_of_local_gradients_bitwise_for_any_bucketing() {
    let model = Model::load(&ModelSource::Seed).unwrap();
    let params = seeded_params(&model.program.params, 0).unwrap();
    let data = DataSource::Seeded { seed: 0 };
    for world in [1usize, 2, 4] {
        // the mean of each rank's local gradients, in f64
        let mut mean: Vec<Vec<f64>> = Vec::new();
        for rank in 0..world {
            let batch = data.batch(0, rank, &model).unwrap();
            let (_, g) = local_gradients(&model, &params, batch).unwrap();
            for (i, gi) in g.iter().enumerate() {
                let v = gi.as_ref().unwrap().to_f64_vec();
                if mean.len() <= i {
                    mean.push(vec![0.0; v.len()]);
                }
                for (m, x) in mean[i].iter_mut().zip(v) {
                    *m += x / world as f64;
                }
            }
        }
        let mut first: Option<Vec<Tensor>> = None;
        for mb in [0.0, 0.001, 25.0] {
            let r = run(&TrainConfig {
                world_size: world,
                steps: 1,
                bucket_mb: mb,
                keep_all_ranks: true,
                ..TrainConfig::default()
            });
            assert_eq!(r.grads_step0.len(), world);
            let rank0: Vec<Tensor> = r.grads_step0[0]
                .iter()
                .map(|g| g.clone().unwrap())
                .collect();
            for (i, g) in rank0.iter().enumerate() {
                let rel = max_rel(&g.to_f64_vec(), &mean[i]);
                assert!(
                    rel < 1e-6,
                    "world {world}, bucket_mb {mb}, {}: {rel}",
                    r.param_names[i]
                );
            }
            for (rank, gs) in r.grads_step0.iter().enumerate() {
                for (g, g0) in gs.iter().zip(&rank0) {
                    assert!(
                        g.as_ref().unwrap().bitwise_eq(g0),
                        "world {world}, bucket_mb {mb}: rank {rank} differs from rank 0"
                    );
                }
            }
            match &first {
                None => first = Some(rank0),
                Some(f) => {
                    for (g, g0) in rank0.iter().zip(f) {
                        assert!(
                            g.bitwise_eq(g0),
                            "world {world}: bucket_mb {mb} changes the bits"
                        );
                    }
                }
            }
            // the number of all-reduces the bucket size asks for ran (plus the loss average)
            let buckets = r.metrics[0][0]
                .buckets
                .iter()
                .filter(|b| &*b.label != "loss")
                .count();
            let want = match mb {
                m if m <= 0.0 => 4,
                m if m < 0.002 => 2,
                _ => 1,
            };
            assert_eq!(buckets, want, "world {world}, bucket_mb {mb}");
        }
    }
}

/// (b) Thunder's own DDP backward (per-gradient and bucketed exports, world size 2) computes
/// the same synchronized gradients as ours.
#[test]
fn thunders_exported_ddp_backward_agrees_with_ours() {
    let ours = run(&TrainConfig {
        steps: 1,
        ..reference_config()
    });
    for dir in ["mlp-ddp", "mlp-ddp-bucketed"] {
        let theirs = run(&TrainConfig {
            steps: 1,
            model: ModelSource::Files {
                forward: testdata(&format!("{dir}/forward.trace")),
                backward: testdata(&format!("{dir}/backward.trace")),
            },
            ..reference_config()
        });
        assert_eq!(theirs.pipeline, "(as exported)");
        assert_eq!(theirs.param_names, ours.param_names);
        for (i, (a, b)) in theirs.grads_step0[0]
            .iter()
            .zip(&ours.grads_step0[0])
            .enumerate()
        {
            let (a, b) = (
                a.as_ref().unwrap().to_f64_vec(),
                b.as_ref().unwrap().to_f64_vec(),
            );
            let rel = max_rel(&a, &b);
            assert!(rel < 1e-6, "{dir} {}: {rel}", ours.param_names[i]);
        }
        assert!((theirs.losses[0] - ours.losses[0]).abs() < 1e-7);
    }
    // an export for world size 2 refuses to run on 4 ranks, and says how to fix it
    let e = train(
        &TrainConfig {
            world_size: 4,
            steps: 1,
            model: ModelSource::Files {
                forward: testdata("mlp-ddp/forward.trace"),
                backward: testdata("mlp-ddp/backward.trace"),
            },
            ..TrainConfig::default()
        },
        &quiet,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("exported with DDP for world size 2") && e.contains("no-sync,ddp"),
        "{e}"
    );
}

/// Makes every f32 tensor of the model f64, so finite differences are accurate.
fn model_f64() -> Model {
    let mut m = Model::load(&ModelSource::Seed).unwrap();
    for t in [&mut m.program.forward, &mut m.program.backward] {
        let ids: Vec<_> = t.values().map(|(id, _)| id).collect();
        for id in ids {
            if let Some(tracepass_ir::Type::Tensor(tt)) = t.ty(id) {
                let mut tt = tt.clone();
                tt.dtype = DType::F64;
                t.set_ty(id, tracepass_ir::Type::Tensor(tt));
            }
        }
    }
    for p in &mut m.program.params {
        p.dtype = DType::F64;
    }
    m.data_args[0].ty.dtype = DType::F64;
    m
}

/// (c) the traced forward and backward agree with central finite differences of the loss.
#[test]
fn gradients_match_finite_differences() {
    let m = model_f64();
    let params = seeded_params(&m.program.params, 3).unwrap();
    let data = DataSource::Seeded { seed: 3 };
    let batch = data.batch(0, 0, &m).unwrap();
    let (loss, grads) = local_gradients(&m, &params, batch.clone()).unwrap();
    assert!(loss.is_finite());
    let h = 1e-6;
    let mut checked = 0;
    for (pi, p) in params.iter().enumerate() {
        let g = grads[pi].as_ref().unwrap().to_f64_vec();
        let base = p.to_f64_vec();
        // a spread of coordinates of every parameter
        for k in (0..base.len()).step_by((base.len() / 7).max(1)) {
            let at = |delta: f64| {
                let mut v = base.clone();
                v[k] += delta;
                let mut ps = params.clone();
                ps[pi] = Tensor::from_f64(p.shape(), v);
                local_gradients(&m, &ps, batch.clone()).unwrap().0
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            assert!(
                (fd - g[k]).abs() < 1e-7 + 1e-5 * g[k].abs(),
                "{} [{k}]: backward {} vs finite difference {fd}",
                m.program.params[pi].fqn,
                g[k]
            );
            checked += 1;
        }
    }
    assert!(checked >= 28);
}

#[test]
fn gradient_accumulation_reduces_the_sum_of_micro_steps() {
    let k = 2;
    let r = run(&TrainConfig {
        world_size: 2,
        steps: 1,
        no_sync_steps: k,
        keep_all_ranks: true,
        ..TrainConfig::default()
    });
    assert!(
        r.pipeline.starts_with("accumulate-grads,ddp("),
        "{}",
        r.pipeline
    );
    let model = Model::load(&ModelSource::Seed).unwrap();
    let params = seeded_params(&model.program.params, 0).unwrap();
    let data = DataSource::Seeded { seed: 0 };
    let mut want: Vec<Vec<f64>> = vec![Vec::new(); params.len()];
    for rank in 0..2 {
        for micro in 0..=k {
            let batch = data.batch(micro, rank, &model).unwrap();
            let (_, g) = local_gradients(&model, &params, batch).unwrap();
            for (i, gi) in g.iter().enumerate() {
                let v = gi.as_ref().unwrap().to_f64_vec();
                if want[i].is_empty() {
                    want[i] = vec![0.0; v.len()];
                }
                for (w, x) in want[i].iter_mut().zip(v) {
                    *w += x / 2.0;
                }
            }
        }
    }
    for (i, g) in r.grads_step0[0].iter().enumerate() {
        let rel = max_rel(&g.as_ref().unwrap().to_f64_vec(), &want[i]);
        assert!(rel < 1e-5, "{}: {rel}", r.param_names[i]);
        assert!(g
            .as_ref()
            .unwrap()
            .bitwise_eq(r.grads_step0[1][i].as_ref().unwrap()));
    }
    // only the synchronized micro-step communicates: one bucket per step
    let buckets = r.metrics[0][0]
        .buckets
        .iter()
        .filter(|b| &*b.label != "loss")
        .count();
    assert_eq!(buckets, 1);
}

#[test]
fn metrics_record_every_bucket_in_order() {
    let r = run(&TrainConfig {
        world_size: 2,
        steps: 2,
        bucket_mb: 0.0,
        timeline: true,
        ..TrainConfig::default()
    });
    for per_rank in &r.metrics {
        for m in per_rank {
            assert!(m.compute_s > 0.0 && m.step_s >= m.compute_s);
            assert!(m.overlap_s <= m.comm_s + 1e-12);
            assert!((m.exposed_comm_s - (m.comm_s - m.overlap_s)).abs() < 1e-12);
            let grads: Vec<_> = m.buckets.iter().filter(|b| &*b.label != "loss").collect();
            assert_eq!(grads.len(), 4);
            for b in grads {
                assert!(b.ready_us <= b.launch_us && b.launch_us <= b.comm_start_us + 1e-3);
                assert!(b.comm_start_us <= b.comm_end_us && b.wait_start_us <= b.wait_end_us);
                assert!(b.comm_end_us <= b.wait_end_us + 1e-3, "{b:?}");
            }
        }
    }
    let tl = tracepass_runtime::exec::timeline_json(&r.events);
    let events = tl["traceEvents"].as_array().unwrap();
    let comm = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == 1)
        .count();
    assert_eq!(comm, 2 * 2 * 4, "2 ranks x 2 steps x 4 buckets");
    assert!(events.iter().any(|e| e["name"]
        .as_str()
        .is_some_and(|n| n.starts_with("all_reduce b"))));
}

// ----- bad input -----

fn fails(cfg: &TrainConfig) -> String {
    train(cfg, &quiet).expect_err("must fail").to_string()
}

#[test]
fn parameters_that_do_not_fit_the_trace_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.safetensors");
    let model = Model::load(&ModelSource::Seed).unwrap();
    let mut params: Vec<(String, Tensor)> = model
        .program
        .params
        .iter()
        .map(|q| q.fqn.clone())
        .zip(seeded_params(&model.program.params, 0).unwrap())
        .collect();
    params[1].1 = Tensor::from_f32(vec![3], vec![0.0; 3]);
    tracepass_runtime::tensor::save_tensors(&p, &params).unwrap();
    let e = fails(&TrainConfig {
        params: Some(p.clone()),
        ..TrainConfig::default()
    });
    assert!(
        e.contains(&format!("parameter `{}` has shape [3]", params[1].0)),
        "{e}"
    );
    params.remove(0);
    tracepass_runtime::tensor::save_tensors(&p, &params).unwrap();
    let e = fails(&TrainConfig {
        params: Some(p),
        ..TrainConfig::default()
    });
    assert!(e.contains("no tensor named `l1.bias`"), "{e}");
    let e = fails(&TrainConfig {
        data: Some(reference("data_seed0_ws2.safetensors")),
        world_size: 3,
        ..TrainConfig::default()
    });
    assert!(e.contains("no tensor named `x.0.2`"), "{e}");
}

#[test]
fn a_trace_with_an_op_without_kernel_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(testdata("mlp/backward.trace")).unwrap();
    // an op without its printed decomposition (with one, the parser reads the decomposition)
    let text = text.replacen(
        "t142 = torch.mul(t126, t126)  # t142: \"cpu f32[8, 64]\"\n    # t142 = ltorch.mul(t126, t126)  # t142: \"cpu f32[8, 64]\"\n      # t142 = prims.mul(t126, t126)  # t142: \"cpu f32[8, 64]\"\n",
        "t142 = torch.frobnicate(t126, t126)  # t142: \"cpu f32[8, 64]\"\n",
        1,
    );
    assert!(text.contains("frobnicate"));
    let b = dir.path().join("b.trace");
    std::fs::write(&b, text).unwrap();
    let e = fails(&TrainConfig {
        model: ModelSource::Files {
            forward: testdata("mlp/forward.trace"),
            backward: b,
        },
        ..TrainConfig::default()
    });
    assert!(e.contains("torch.frobnicate(t126, t126)"), "{e}");
}

#[test]
fn inputs_that_do_not_match_the_trace_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    // data of the wrong shape
    let d = dir.path().join("d.safetensors");
    let x = Tensor::from_f32(vec![8, 16], vec![0.0; 128]);
    let y = Tensor::from_f32(vec![8, 4], vec![0.25; 32]);
    tracepass_runtime::tensor::save_tensors(&d, &[("x.0.0".into(), x), ("y.0.0".into(), y)])
        .unwrap();
    let e = fails(&TrainConfig {
        data: Some(d),
        world_size: 1,
        steps: 1,
        ..TrainConfig::default()
    });
    assert!(
        e.contains("`x.0.0` has shape [8, 16] but the model takes [8, 32]"),
        "{e}"
    );
    // a forward whose declared input disagrees with what its own ops compute
    let f = dir.path().join("f.trace");
    let text = std::fs::read_to_string(testdata("mlp/forward.trace")).unwrap();
    std::fs::write(
        &f,
        text.replacen("# x: \"cpu f32[8, 32]\"", "# x: \"cpu f32[16, 32]\"", 1),
    )
    .unwrap();
    let e = fails(&TrainConfig {
        model: ModelSource::Files {
            forward: f,
            backward: testdata("mlp/backward.trace"),
        },
        ..TrainConfig::default()
    });
    assert!(
        e.contains(
            "`t120` is declared \"cpu f32[8, 64]\" but ltorch.linear gives \"cpu f32[16, 64]\""
        ),
        "{e}"
    );
}

#[test]
fn a_rank_that_panics_stops_every_rank_quickly() {
    let start = Instant::now();
    let e = train(
        &TrainConfig {
            world_size: 4,
            steps: 5,
            fault: Some(Fault::Panic { rank: 2, step: 1 }),
            collective_timeout: Duration::from_secs(30),
            ..TrainConfig::default()
        },
        &quiet,
    )
    .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    match &e {
        TrainError::Rank { rank, message } => {
            assert_eq!(*rank, 2);
            assert!(
                message.contains("injected fault: rank 2 panics in step 1"),
                "{message}"
            );
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_rank_that_never_arrives_times_out_naming_it() {
    let start = Instant::now();
    let e = train(
        &TrainConfig {
            world_size: 3,
            steps: 3,
            fault: Some(Fault::Vanish { rank: 1, step: 1 }),
            collective_timeout: Duration::from_millis(500),
            ..TrainConfig::default()
        },
        &quiet,
    )
    .unwrap_err()
    .to_string();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    assert!(e.contains("rank 1"), "{e}");
}

#[test]
fn bad_options_are_rejected_before_anything_runs() {
    for (cfg, want) in [
        (
            TrainConfig {
                world_size: 0,
                ..TrainConfig::default()
            },
            "--world-size must be at least 1",
        ),
        (
            TrainConfig {
                broadcast_from: Some(4),
                ..TrainConfig::default()
            },
            "--broadcast-from 4 is not a rank",
        ),
        (
            TrainConfig {
                bucket_mb: f64::NAN,
                ..TrainConfig::default()
            },
            "--bucket-mb must be a finite number",
        ),
        (
            TrainConfig {
                passes: Some(parse_pipeline("ddp(world_size=4),frob").unwrap()),
                ..TrainConfig::default()
            },
            "unknown pass `frob`",
        ),
        (
            TrainConfig {
                world_size: 2,
                passes: Some(parse_pipeline("ddp(world_size=3),sort-waits").unwrap()),
                ..TrainConfig::default()
            },
            "is for world size 3, but this run has --world-size 2",
        ),
        (
            TrainConfig {
                world_size: 2,
                passes: Some(parse_pipeline("fsdp(world_size=2,sharding=zero3),ddp(world_size=2)").unwrap()),
                ..TrainConfig::default()
            },
            "`ddp` does not go with fsdp",
        ),
        (
            TrainConfig {
                world_size: 2,
                passes: Some(parse_pipeline("fsdp(world_size=4)").unwrap()),
                ..TrainConfig::default()
            },
            "is for world size 4, but this run has --world-size 2 (it would shard the parameters 4 ways)",
        ),
        (
            TrainConfig {
                world_size: 2,
                passes: Some(parse_pipeline("dce").unwrap()),
                ..TrainConfig::default()
            },
            "has no all-reduce, so 2 ranks would each train their own model",
        ),
        (
            TrainConfig {
                save: Some("ck.safetensors".into()),
                save_every: Some(0),
                ..TrainConfig::default()
            },
            "--save-every 0",
        ),
    ] {
        let e = fails(&cfg);
        assert!(e.contains(want), "{e}");
    }
}

/// Pipelines are values: one built from typed options trains as its string does, and what
/// goes wrong comes back as the passes' own error, not as its text.
#[test]
fn pipelines_are_values_and_their_errors_stay_typed() {
    let built = vec![
        DdpOptions {
            world_size: 2,
            bucket_mb: 0.001,
            ..DdpOptions::default()
        }
        .spec(),
        PassSpec::new("sort-waits"),
    ];
    let parsed = parse_pipeline("ddp(world_size=2,bucket_mb=0.001),sort-waits").unwrap();
    assert_eq!(built, parsed);
    let cfg = |passes| TrainConfig {
        world_size: 2,
        steps: 2,
        passes: Some(passes),
        ..TrainConfig::default()
    };
    let (a, b) = (run(&cfg(built)), run(&cfg(parsed)));
    assert_eq!(a.losses, b.losses);
    assert_eq!(a.pipeline, "ddp(world_size=2,bucket_mb=0.001),sort-waits");

    let unknown = vec![PassSpec::new("frob")];
    match train(&cfg(unknown), &|_, _| {}) {
        Err(TrainError::Pipeline { source, .. }) => match *source {
            PassError::UnknownPass { name, .. } => assert_eq!(name, "frob"),
            other => panic!("expected an unknown pass, got {other:?}"),
        },
        other => panic!("expected an unknown-pass error, got {other:?}"),
    }
    let mut bad = PassSpec::new("ddp");
    bad.options.push(("world_size".into(), "two".into()));
    match train(&cfg(vec![bad]), &|_, _| {}) {
        Err(TrainError::Pipeline { source, .. }) => {
            assert!(source.to_string().contains("world_size"), "{source}")
        }
        other => panic!("expected a bad-option error, got {other:?}"),
    }
}

#[test]
fn ranks_about_to_issue_different_collectives_stop_before_the_first() {
    let start = Instant::now();
    let e = fails(&TrainConfig {
        world_size: 3,
        fault: Some(Fault::Mismatch { rank: 2 }),
        ..TrainConfig::default()
    });
    assert!(start.elapsed() < Duration::from_secs(10));
    // rank 2 buckets per gradient: its first gradient all-reduce differs from rank 0's bucket
    assert!(
        e.contains("collective #1 differs between ranks: rank 0 issued all_reduce sum of 2372 x f32 on group `world` (bucket b0), rank 2 issued all_reduce sum of 256 x f32 on group `world` (bucket b0)"),
        "{e}"
    );
}

#[test]
fn a_resumed_run_continues_with_the_same_losses() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.safetensors");
    let full = run(&TrainConfig {
        world_size: 2,
        steps: 8,
        ..TrainConfig::default()
    });
    let first = run(&TrainConfig {
        world_size: 2,
        steps: 4,
        save: Some(ck.clone()),
        ..TrainConfig::default()
    });
    assert_eq!(first.losses[..], full.losses[..4]);
    let rest = run(&TrainConfig {
        world_size: 2,
        steps: 8,
        resume: Some(ck.clone()),
        ..TrainConfig::default()
    });
    assert_eq!(rest.first_step, 4);
    // bit for bit: same parameters, optimizer moments, step counter and data
    assert_eq!(rest.losses[..], full.losses[4..]);
    for (a, b) in rest.params[0].iter().zip(&full.params[0]) {
        assert!(a.bitwise_eq(b));
    }
    // a checkpoint at or past the end, another optimizer, or a garbled file are errors
    let e = fails(&TrainConfig {
        world_size: 2,
        steps: 4,
        resume: Some(ck.clone()),
        ..TrainConfig::default()
    });
    assert!(
        e.contains("is at step 4; --steps 4 leaves nothing to do"),
        "{e}"
    );
    let e = fails(&TrainConfig {
        world_size: 2,
        steps: 9,
        resume: Some(ck.clone()),
        optimizer: tracepass_runtime::train::OptimizerKind::Sgd { lr: 0.1 },
        ..TrainConfig::default()
    });
    assert!(e.contains("saved by adamw, but this run uses sgd"), "{e}");
    // the default world size (4) is not the checkpoint's (2)
    let e = fails(&TrainConfig {
        steps: 9,
        resume: Some(ck.clone()),
        ..TrainConfig::default()
    });
    assert!(
        e.contains("was trained on 2 rank(s), but this run has --world-size 4"),
        "{e}"
    );
    let e = fails(&TrainConfig {
        steps: 9,
        resume: Some(reference("params_seed0.safetensors")),
        ..TrainConfig::default()
    });
    assert!(e.contains("not a tracepass checkpoint"), "{e}");
}

/// A model larger than any machine's memory is refused with the sizes, before anything is
/// allocated (an allocation that fails would abort the process with no message of ours).
#[test]
fn a_model_too_large_for_memory_is_an_error_not_an_abort() {
    let e = fails(&TrainConfig {
        // one 10^9 x 10^9 layer: 4 * 10^18 bytes of f32 weight, a possible tensor
        model: ModelSource::DeepMlp {
            layers: 1,
            width: 1_000_000_000,
            batch: 1,
        },
        world_size: 2,
        steps: 1,
        ..TrainConfig::default()
    });
    if cfg!(target_os = "linux") {
        // the kernel says how much memory there is: refused up front, with the sizes
        assert!(e.contains("the model does not fit in memory"), "{e}");
        assert!(e.contains("GiB is available"), "{e}");
    } else {
        // elsewhere the allocation itself is fallible
        assert!(e.contains("cannot allocate"), "{e}");
    }
}

/// A checkpoint names its tied parameters, so a reader without the model (Python's
/// `tracepass.load_checkpoint`) can make them one tensor again; a model without ties records
/// none.
#[test]
fn a_checkpoint_records_ties_and_reads_without_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.safetensors");
    let report = run(&TrainConfig {
        model: ModelSource::Export(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models/nanogpt"),
        ),
        world_size: 1,
        steps: 1,
        save: Some(ck.clone()),
        pin_ranks: false,
        ..TrainConfig::default()
    });
    let c = tracepass_runtime::train::checkpoint::read(&ck).unwrap();
    assert_eq!(
        c.tied,
        vec![vec![
            "transformer.wte.weight".to_string(),
            "lm_head.weight".to_string()
        ]]
    );
    assert_eq!((c.step, c.optimizer.as_str()), (1, "adamw"));
    let mut names = report.param_names.clone();
    names.sort();
    assert_eq!(c.params.keys().cloned().collect::<Vec<_>>(), names);
    assert!(c.params["lm_head.weight"].bitwise_eq(&c.params["transformer.wte.weight"]));
    assert_eq!(
        c.exp_avg["lm_head.weight"].numel(),
        c.params["lm_head.weight"].numel()
    );

    let seed = dir.path().join("seed.safetensors");
    run(&TrainConfig {
        world_size: 1,
        steps: 1,
        save: Some(seed.clone()),
        pin_ranks: false,
        ..TrainConfig::default()
    });
    assert!(tracepass_runtime::train::checkpoint::read(&seed)
        .unwrap()
        .tied
        .is_empty());
}

/// A program fsdp rewrote already is refused, naming why (the trainer shards the plain model
/// itself), as the unsharded program is not.
#[test]
fn a_sharded_program_is_refused() {
    let model = Model::load(&ModelSource::Seed).unwrap();
    let mut p = model.program.clone();
    tracepass_passes::PassManager::parse("fsdp(world_size=2)")
        .unwrap()
        .run(&mut p, tracepass_ir::OpRegistry::builtin())
        .unwrap();
    let e = tracepass_runtime::train::check_trainable(None, &p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the program is sharded (fsdp ran on it)"), "{e}");
    assert!(e.contains("--passes 'fsdp(world_size=N"), "{e}");
    tracepass_runtime::train::check_trainable(None, &model.program).unwrap();
    let ddp = parse_pipeline("ddp(world_size=2),sort-waits").unwrap();
    tracepass_runtime::train::check_trainable(Some(&ddp), &model.program).unwrap();
}
