//! Runs that used to give wrong numbers without an error (issue #26, items 1-9), through the
//! real binary: each test builds an export directory from a corpus one (copied, then mutated)
//! and checks that training either computes the right numbers or refuses, naming what is wrong.

mod common;

use common::{model, ok, run};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use tracepass_runtime::tensor::{save_tensors, TensorFile};
use tracepass_runtime::Tensor;

fn fails(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "succeeded:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(1));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A copy of corpus export `name` in a fresh temporary directory (the directory, and the
/// export inside it).
fn copy_export(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join(name);
    copy_dir(&model(name), &dst);
    (tmp, dst)
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), to).unwrap();
        }
    }
}

/// Rewrites the tensors of a safetensors file.
fn edit_tensors(path: &Path, f: impl FnOnce(&mut BTreeMap<String, Tensor>)) {
    let mut t = TensorFile::load(path).unwrap().tensors;
    f(&mut t);
    let list: Vec<(String, Tensor)> = t.into_iter().collect();
    save_tensors(path, &list).unwrap();
}

/// Relabels tensor `name` of a safetensors file as `dtype` (same bytes, another meaning); a
/// 2-byte dtype keeps the first half of the bytes, an 8-byte one takes the first half of the
/// elements, so the file stays valid.
fn relabel(path: &Path, name: &str, dtype: &str) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let size = |d: &str| match d {
        "F64" | "I64" => 8,
        "F32" | "I32" => 4,
        "F16" | "BF16" => 2,
        _ => 1,
    };
    let mut out = Vec::new();
    let mut entries: Vec<(String, serde_json::Value)> = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    entries.sort_by_key(|(_, v)| v["data_offsets"][0].as_u64().unwrap());
    let obj = header.as_object_mut().unwrap();
    for (k, v) in entries {
        let (a, b) = (
            v["data_offsets"][0].as_u64().unwrap() as usize,
            v["data_offsets"][1].as_u64().unwrap() as usize,
        );
        let shape: Vec<usize> = v["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let numel: usize = shape.iter().product();
        let (dt, len) = if k == name {
            (dtype.to_string(), numel * size(dtype))
        } else {
            (v["dtype"].as_str().unwrap().to_string(), b - a)
        };
        let mut chunk = data[a..b].to_vec();
        chunk.resize(len, 0);
        let start = out.len();
        out.extend_from_slice(&chunk);
        obj.insert(
            k.clone(),
            serde_json::json!({"dtype": dt, "shape": shape, "data_offsets": [start, out.len()]}),
        );
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&h);
    file.extend_from_slice(&out);
    std::fs::write(path, file).unwrap();
}

fn max_rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    assert_eq!(a.len(), b.len());
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    let scale = b.iter().map(|y| y.abs()).fold(0.0, f64::max).max(1e-12);
    diff / scale
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Item 1: with `--no-sync-steps K`, the synchronized gradient is the sum of every
/// micro-step's, the tie's (`lm_head.weight` = `transformer.wte.weight`) included.
#[test]
fn accumulated_gradients_sum_every_micro_step_including_the_tie() {
    let tmp = tempfile::tempdir().unwrap();
    let ng = model("nanogpt");
    let data = TensorFile::load(&ng.join("data.safetensors")).unwrap();
    let grads_of = |args: &[&str], out: &Path| {
        let mut a = vec![
            "train",
            "--model",
            s(&ng),
            "--world-size",
            "1",
            "--steps",
            "1",
            "--save-grads",
            s(out),
        ];
        a.extend_from_slice(args);
        ok(&run(&a));
        TensorFile::load(out).unwrap().tensors
    };
    // each micro-batch alone, as the one batch of a data file
    let mut singles = Vec::new();
    for m in 0..2 {
        let f = tmp.path().join(format!("data{m}.safetensors"));
        let list: Vec<(String, Tensor)> = ["idx", "targets"]
            .iter()
            .map(|k| {
                (
                    format!("{k}.0.0"),
                    data.tensors[&format!("{k}.{m}.0")].clone(),
                )
            })
            .collect();
        save_tensors(&f, &list).unwrap();
        let g = tmp.path().join(format!("g{m}.safetensors"));
        singles.push(grads_of(&["--data", s(&f)], &g));
    }
    let acc = grads_of(
        &["--no-sync-steps", "1"],
        &tmp.path().join("acc.safetensors"),
    );
    assert!(acc.contains_key("transformer.wte.weight"));
    for (name, g) in &acc {
        let (a, b) = (singles[0][name].to_f64_vec(), singles[1][name].to_f64_vec());
        let sum: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let want = Tensor::from_f64(g.shape(), sum);
        let err = max_rel_err(g, &want);
        assert!(err < 1e-4, "`{name}`: relative error {err}");
    }
}

/// Item 2: parameters and batches are used in the dtype the trace declares, never converted.
#[test]
fn parameters_and_batches_of_another_dtype_are_refused() {
    let train = |dir: &Path| {
        run(&[
            "train",
            "--model",
            s(dir),
            "--world-size",
            "1",
            "--steps",
            "1",
        ])
    };
    for dtype in ["I32", "I64", "BOOL", "F16", "BF16", "F64"] {
        let (_tmp, dir) = copy_export("mlp");
        relabel(&dir.join("params.safetensors"), "fc1.weight", dtype);
        let err = fails(&train(&dir));
        assert!(
            err.contains("parameter `fc1.weight` is stored as")
                && err.contains("the trace's is f32"),
            "{dtype}: {err}"
        );
    }
    for dtype in ["I64", "F64"] {
        let (_tmp, dir) = copy_export("mlp");
        relabel(&dir.join("data.safetensors"), "x.0.0", dtype);
        let err = fails(&train(&dir));
        assert!(
            err.contains("`x.0.0` is") && err.contains("the model takes f32 for `x`"),
            "{dtype}: {err}"
        );
    }
    // token indices stored as floats would be truncated
    let (_tmp, dir) = copy_export("nanogpt");
    relabel(&dir.join("data.safetensors"), "idx.0.0", "F32");
    let err = fails(&train(&dir));
    assert!(err.contains("`idx.0.0` is f32"), "{err}");
    // float class targets
    let (_tmp, dir) = copy_export("mlp");
    relabel(&dir.join("data.safetensors"), "targets.0.0", "F64");
    let err = fails(&train(&dir));
    assert!(err.contains("`targets.0.0` is f64"), "{err}");
    // class targets of another shape
    let (_tmp, dir) = copy_export("mlp");
    edit_tensors(&dir.join("data.safetensors"), |t| {
        t.insert(
            "targets.0.0".into(),
            Tensor::from_i64(vec![3], vec![0, 1, 2]),
        );
    });
    let err = fails(&train(&dir));
    assert!(err.contains("`targets.0.0` has shape [3]"), "{err}");
    // an unchanged copy trains
    let (_tmp, dir) = copy_export("mlp");
    ok(&train(&dir));
}

/// Item 3: every batch a run reads is checked before step 0; a missing one is an error naming
/// it, never replaced by another step's.
#[test]
fn a_missing_batch_is_named_before_training() {
    let train = |dir: &Path, ws: &str| {
        run(&[
            "train",
            "--model",
            s(dir),
            "--world-size",
            ws,
            "--steps",
            "2",
        ])
    };
    for missing in [&["x.2.1"][..], &["targets.2.1"], &["x.2.1", "targets.2.1"]] {
        let (_tmp, dir) = copy_export("mlp");
        edit_tensors(&dir.join("data.safetensors"), |t| {
            for k in missing {
                t.remove(*k).unwrap();
            }
        });
        let err = fails(&train(&dir, "2"));
        let name = missing[0].split('.').next().unwrap();
        assert!(
            err.contains(&format!(
                "`{name}.2.1` is missing, but `{name}.3.1` is there"
            )),
            "{missing:?}: {err}"
        );
        assert!(!err.contains("-th loss"), "{err}");
    }
    // the last step of one rank only: ranks would cycle differently
    let (_tmp, dir) = copy_export("mlp");
    let last = TensorFile::load(&dir.join("data.safetensors"))
        .unwrap()
        .tensors
        .keys()
        .filter_map(|k| {
            k.strip_prefix("x.")?
                .strip_suffix(".1")?
                .parse::<usize>()
                .ok()
        })
        .max()
        .unwrap();
    edit_tensors(&dir.join("data.safetensors"), |t| {
        t.remove(&format!("x.{last}.1")).unwrap();
        t.remove(&format!("targets.{last}.1")).unwrap();
    });
    let err = fails(&train(&dir, "2"));
    assert!(err.contains("rank 1") && err.contains("rank 0"), "{err}");
    // a later batch of another shape is found before training, not at its step
    let (_tmp, dir) = copy_export("mlp");
    edit_tensors(&dir.join("data.safetensors"), |t| {
        let x = t["x.1.0"].clone();
        let x = x.reshape(vec![x.numel()]).unwrap();
        t.insert("x.1.0".into(), x);
    });
    let o = train(&dir, "1");
    let err = fails(&o);
    assert!(err.contains("`x.1.0` has shape"), "{err}");
    assert!(String::from_utf8_lossy(&o.stdout).is_empty());
}

/// Item 5: tied parameters are one tensor; a file that gives them different values is refused,
/// naming both.
#[test]
fn a_tie_with_two_values_is_refused() {
    let (_tmp, dir) = copy_export("nanogpt");
    edit_tensors(&dir.join("params.safetensors"), |t| {
        let w = &t["lm_head.weight"];
        let mut v = w.to_f32_vec();
        v[3] += 0.5;
        let w = Tensor::from_f32(w.shape(), v);
        t.insert("lm_head.weight".into(), w);
    });
    let err = fails(&run(&[
        "train",
        "--model",
        s(&dir),
        "--world-size",
        "1",
        "--steps",
        "1",
    ]));
    assert!(
        err.contains("`lm_head.weight` and `transformer.wte.weight` are tied")
            || err.contains("`transformer.wte.weight` and `lm_head.weight` are tied"),
        "{err}"
    );
    assert!(err.contains("element 3"), "{err}");
}

fn losses(out: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| l.split_once("-th loss: ")?.1.parse().ok())
        .collect()
}

/// Item 6: training stops at the first non-finite loss, gradient norm or parameter, naming the
/// step and the rank, and never replaces a good checkpoint with a non-finite one.
#[test]
fn non_finite_training_stops_and_keeps_the_good_checkpoint() {
    let train = |dir: &Path, extra: &[&str]| {
        let mut a = vec!["train", "--model", s(dir), "--world-size", "2"];
        a.extend_from_slice(extra);
        run(&a)
    };
    // every target is ignore_index: PyTorch's mean over no targets is NaN
    let (tmp, dir) = copy_export("mlp");
    edit_tensors(&dir.join("data.safetensors"), |t| {
        for (k, v) in t.iter_mut() {
            if k.starts_with("targets.") {
                *v = Tensor::from_i64(v.shape(), vec![-100; v.numel()]);
            }
        }
    });
    let err = fails(&train(&dir, &["--steps", "3"]));
    assert!(err.contains("failed: step 0: the loss is NaN"), "{err}");
    // asked to, it trains on and says the loss is NaN
    let (out, _) = ok(&train(&dir, &["--steps", "2", "--allow-non-finite"]));
    assert!(losses(&out).iter().all(|l| l.is_nan()), "{out}");
    // a NaN in one rank's batch of step 1: that step and rank are named
    let (_t2, dir) = copy_export("mlp");
    edit_tensors(&dir.join("data.safetensors"), |t| {
        let x = &t["x.1.1"];
        let mut v = x.to_f32_vec();
        v[5] = f32::NAN;
        let x = Tensor::from_f32(x.shape(), v);
        t.insert("x.1.1".into(), x);
    });
    let err = fails(&train(&dir, &["--steps", "3"]));
    assert!(
        err.contains("rank 1 failed: step 1: the loss is NaN"),
        "{err}"
    );
    // a NaN in the parameters is named before training
    let (_t3, dir) = copy_export("mlp");
    edit_tensors(&dir.join("params.safetensors"), |t| {
        let w = &t["fc2.bias"];
        let mut v = w.to_f32_vec();
        v[7] = f32::INFINITY;
        let w = Tensor::from_f32(w.shape(), v);
        t.insert("fc2.bias".into(), w);
    });
    let err = fails(&train(&dir, &["--steps", "1"]));
    assert!(
        err.contains("parameter `fc2.bias` holds inf at element 7"),
        "{err}"
    );
    // a diverging learning rate: the good checkpoint of an earlier run stays as it was
    let dir = model("mlp");
    let ck = tmp.path().join("ck.safetensors");
    ok(&train(&dir, &["--steps", "1", "--save", s(&ck)]));
    let good = std::fs::read(&ck).unwrap();
    let err = fails(&train(
        &dir,
        &[
            "--steps",
            "30",
            "--optimizer",
            "sgd",
            "--lr",
            "1e30",
            "--save",
            s(&ck),
            "--save-every",
            "1",
        ],
    ));
    assert!(err.contains("step ") && err.contains("rank "), "{err}");
    assert!(
        err.contains("non-finite")
            || err.contains("is NaN")
            || err.contains("is inf")
            || err.contains("holds"),
        "{err}"
    );
    let saved = std::fs::read(&ck).unwrap();
    let f = TensorFile::load(&ck).unwrap();
    for (n, t) in &f.tensors {
        assert!(
            t.to_f64_vec().iter().all(|v| v.is_finite()),
            "checkpoint tensor `{n}` is not finite"
        );
    }
    // the run either stopped before its first checkpoint or saved only finite ones
    if saved != good {
        assert!(f.metadata["step"].parse::<usize>().unwrap() >= 1);
    }
}

/// Item 7: a checkpoint records a CRC-32 per tensor; a flipped bit is refused on resume.
#[test]
fn a_damaged_checkpoint_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mlp = model("mlp");
    let ck = tmp.path().join("ck.safetensors");
    let train = |extra: &[&str]| {
        let mut a = vec!["train", "--model", s(&mlp), "--world-size", "1"];
        a.extend_from_slice(extra);
        run(&a)
    };
    ok(&train(&["--steps", "1", "--save", s(&ck)]));
    let f = TensorFile::load(&ck).unwrap();
    assert!(
        f.metadata.contains_key("crc32.param.fc1.weight"),
        "{:?}",
        f.metadata
    );
    // one bit of the last tensor's data
    let mut bytes = std::fs::read(&ck).unwrap();
    let n = bytes.len();
    bytes[n - 4] ^= 0x01;
    let bad = tmp.path().join("bad.safetensors");
    std::fs::write(&bad, &bytes).unwrap();
    let err = fails(&train(&["--steps", "2", "--resume", s(&bad)]));
    assert!(
        err.contains("bad.safetensors: the checkpoint is damaged: tensor `")
            && err.contains("does not match its checksum"),
        "{err}"
    );
    // the intact one resumes
    let (out, _) = ok(&train(&["--steps", "2", "--resume", s(&ck)]));
    assert_eq!(losses(&out).len(), 1, "{out}");
    // a checkpoint written before checksums (format 1) still resumes, unchecked
    let old = tmp.path().join("old.safetensors");
    let mut meta = f.metadata.clone();
    meta.retain(|k, _| !k.starts_with("crc32."));
    meta.insert("format".into(), "tracepass-checkpoint-1".into());
    let list: Vec<(String, Tensor)> = f.tensors.clone().into_iter().collect();
    tracepass_runtime::tensor::save_tensors_with(&old, &list, &meta).unwrap();
    let (out, _) = ok(&train(&["--steps", "2", "--resume", s(&old)]));
    assert_eq!(losses(&out).len(), 1, "{out}");
}

/// Item 4: the world size of a Thunder-DDP export is what its backward divides the gradients
/// by; an `export.json` that says otherwise is refused instead of scaling the gradients.
#[test]
fn a_ddp_export_whose_json_misstates_the_world_size_is_refused() {
    for lie in [1, 3] {
        let (_tmp, dir) = copy_export("mlp-ddp");
        let path = dir.join("export.json");
        let mut j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        j["world_size"] = serde_json::json!(lie);
        std::fs::write(&path, j.to_string()).unwrap();
        for ws in [lie.to_string(), "2".to_string()] {
            let err = fails(&run(&[
                "train",
                "--model",
                s(&dir),
                "--world-size",
                &ws,
                "--steps",
                "1",
            ]));
            assert!(
                err.contains(&format!("export.json says world_size {lie}"))
                    && err.contains("divides the gradients by 2"),
                "{lie} on {ws}: {err}"
            );
        }
    }
    // Thunder's bucketed DDP packs the divided gradients: the divisor is read through the pack
    let thunder = model("../thunder/mlp-ddp-bucketed");
    let err = fails(&run(&[
        "train",
        "--forward",
        s(&thunder.join("forward.trace")),
        "--backward",
        s(&thunder.join("backward.trace")),
        "--world-size",
        "4",
        "--steps",
        "1",
    ]));
    assert!(
        err.contains("exported with DDP for world size 2") && err.contains("--world-size 4"),
        "{err}"
    );
    // the export as it is trains on its world size
    ok(&run(&[
        "train",
        "--model",
        s(&model("mlp-ddp")),
        "--world-size",
        "2",
        "--steps",
        "1",
    ]));
}

/// Item 9: the pipelines the docs give run: an accumulating pipeline given whole, and a real
/// model's program file (`opt -o`, `pack --prologue`) with its loss named on the command line.
#[test]
fn documented_pipelines_and_program_files_train() {
    let tmp = tempfile::tempdir().unwrap();
    let mlp = model("mlp");
    let train = |extra: &[&str]| {
        let mut a = vec!["train", "--world-size", "2", "--steps", "2"];
        a.extend_from_slice(extra);
        run(&a)
    };
    let (default, err) = ok(&train(&["--model", s(&mlp), "--no-sync-steps", "1"]));
    assert!(err.contains("accumulate-grads,ddp(world_size=2"), "{err}");
    let (given, _) = ok(&train(&[
        "--model",
        s(&mlp),
        "--no-sync-steps",
        "1",
        "--passes",
        "accumulate-grads,ddp(world_size=2),sort-waits",
    ]));
    assert_eq!(losses(&given), losses(&default));
    assert_eq!(losses(&given).len(), 2);
    let err = fails(&train(&[
        "--model",
        s(&mlp),
        "--passes",
        "accumulate-grads,ddp(world_size=2),sort-waits",
    ]));
    assert!(err.contains("--no-sync-steps is 0"), "{err}");

    // nanoGPT's program, from `opt -o` and from `pack --prologue`, trains as its export does
    let ng = model("nanogpt");
    let one = |extra: &[&str]| {
        let mut a = vec!["train", "--world-size", "1", "--steps", "2"];
        a.extend_from_slice(extra);
        ok(&run(&a)).0
    };
    let export = losses(&one(&["--model", s(&ng)]));
    let opt = tmp.path().join("opt.tpb");
    ok(&run(&["opt", s(&ng), "--passes", "cse", "-o", s(&opt)]));
    let pack = tmp.path().join("pack.tpb");
    ok(&run(&[
        "pack",
        s(&ng.join("forward.trace")),
        s(&ng.join("backward.trace")),
        "--prologue",
        s(&ng.join("prologue.trace")),
        "-o",
        s(&pack),
    ]));
    let (params, data) = (ng.join("params.safetensors"), ng.join("data.safetensors"));
    let files = [
        "--params",
        s(&params),
        "--data",
        s(&data),
        "--loss",
        "cross_entropy",
    ];
    for prog in [&opt, &pack] {
        let mut a = vec!["--model", s(prog)];
        a.extend_from_slice(&files);
        let l = losses(&one(&a));
        assert_eq!(l.len(), 2);
        assert_eq!(l[0], export[0], "{}", prog.display());
    }
    // `opt -o` keeps the export's tie, so the whole run is the export's
    let mut a = vec!["--model", s(&opt)];
    a.extend_from_slice(&files);
    assert_eq!(losses(&one(&a)), export);
}

/// Item 8: time a rank spends waiting for a slower one is reported (`sync_wait`), and the
/// parts of a step add up to it: compute + exposed communication + sync wait + other.
#[test]
fn waiting_for_a_slow_rank_is_accounted() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("metrics.json");
    let (out, _) = ok(&run(&[
        "train",
        "--model",
        s(&model("mlp")),
        "--world-size",
        "2",
        "--steps",
        "2",
        "--metrics",
        "--metrics-json",
        s(&json),
        "--inject-fault",
        "1:0:slow",
    ]));
    assert!(out.contains("exposed_ms  sync_wait_ms  other_ms"), "{out}");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let at = |rank: usize, step: usize, key: &str| m[rank][step][key].as_f64().unwrap();
    for rank in 0..2 {
        for step in 0..2 {
            let parts = ["compute_s", "exposed_comm_s", "sync_wait_s", "other_s"];
            for p in parts {
                assert!(at(rank, step, p) >= 0.0, "{p} of rank {rank} step {step}");
            }
            let sum: f64 = parts.iter().map(|p| at(rank, step, p)).sum();
            let step_s = at(rank, step, "step_s");
            assert!(
                (sum - step_s).abs() < 1e-6,
                "rank {rank} step {step}: parts {sum} s, step {step_s} s"
            );
        }
    }
    // rank 1 slept 200 ms before its backward in step 0: rank 0 waited for it at its first
    // all-reduce, and rank 1's own delay is its other time, not waiting
    assert!(at(0, 0, "sync_wait_s") > 0.1, "{m}");
    assert!(at(1, 0, "other_s") > 0.1, "{m}");
    assert!(
        at(1, 0, "sync_wait_s") < at(0, 0, "sync_wait_s") / 2.0,
        "{m}"
    );
    // the bucket's wait on rank 0 is accounted: not exposed communication, sync wait
    let bucket_wait: f64 = m[0][0]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["wait_end_us"].as_f64().unwrap() - b["wait_start_us"].as_f64().unwrap())
        .sum();
    assert!(bucket_wait * 1e-6 > 0.1, "{m}");
    let accounted = at(0, 0, "sync_wait_s") + at(0, 0, "exposed_comm_s");
    assert!(accounted >= bucket_wait * 1e-6 * 0.99, "{m}");
}
