//! Thunder's OpInfo samples (`testdata/opinfo/`, made by `python -m tracepass.export.opinfo`):
//! each sample's forward and backward traces parse and verify, and running them on the CPU
//! (`tracepass_runtime::run::run_pair`) gives PyTorch's outputs and input gradients within the
//! dtype's tolerance. Coverage may not fall below what `testdata/opinfo/coverage.json`
//! records; `TRACEPASS_OPINFO_REPORT=1` (what `cargo xtask opinfo-report` sets) rewrites that
//! floor and the table of `testdata/opinfo/README.md` from this run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use tracepass_ir::{parse_trace, verify, DType, Effect, OpRegistry, Trace};
use tracepass_runtime::comm::{CommOptions, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::run::{run_pair, Named, RunOptions};
use tracepass_runtime::tensor::{Tensor, TensorFile};

/// `testdata/opinfo`, or the folder `TRACEPASS_OPINFO_DIR` names (a fresh probe's output).
fn root() -> PathBuf {
    match std::env::var_os("TRACEPASS_OPINFO_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/opinfo"),
    }
}

/// How far a sample got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Parse,
    Verify,
    Run,
    Numbers,
    Ok,
}

struct Outcome {
    op: String,
    sample: String,
    /// The first stage that failed (`Ok`: none).
    stage: Stage,
    reason: String,
}

/// Largest error allowed between `got` and PyTorch's `want`: relative to the tensor's scale
/// (largest magnitude), as Thunder's OpInfo tests compare (float32 1e-5, bfloat16 1.6e-2).
fn tolerance(dtype: DType, scale: f64) -> f64 {
    let (rtol, atol) = match dtype {
        DType::F64 => (1e-7, 1e-9),
        DType::F32 => (1e-5, 1e-6),
        DType::F16 => (1e-3, 1e-5),
        DType::BF16 => (1.6e-2, 1e-5),
        _ => (0.0, 0.0),
    };
    rtol * scale + atol
}

fn compare(name: &str, got: &Tensor, want: &Tensor, shapes_only: bool) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!(
            "`{name}`: shape {:?}, PyTorch {:?}",
            got.shape(),
            want.shape()
        ));
    }
    if got.dtype() != want.dtype() {
        return Err(format!(
            "`{name}`: dtype {}, PyTorch {}",
            got.dtype(),
            want.dtype()
        ));
    }
    if shapes_only {
        return Ok(());
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f64, |m, x| m.max(x.abs()));
    let tol = tolerance(want.dtype(), scale);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol;
        if !same {
            return Err(format!(
                "`{name}`[{i}]: {a}, PyTorch {b} (tolerance {tol:.2e})"
            ));
        }
    }
    Ok(())
}

fn load(path: &Path) -> Result<Trace, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    parse_trace(&text).map_err(|e| first_line(&e.to_string()))
}

fn first_line(s: &str) -> String {
    let l = s.lines().next().unwrap_or_default();
    if l.len() > 240 {
        format!("{}...", &l[..l.floor_char_boundary(240)])
    } else {
        l.to_string()
    }
}

/// `s` with its lines joined (a node of several outputs prints over several lines), cut at
/// 480 bytes: the node and the kernel table's reason both fit.
fn one_line(s: &str) -> String {
    let l = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if l.len() > 480 {
        format!("{}...", &l[..l.floor_char_boundary(480)])
    } else {
        l
    }
}

fn random(t: &Trace) -> bool {
    let reg = OpRegistry::builtin();
    t.nodes()
        .any(|(_, n)| reg.effect(n.op.as_str()) == Effect::Random)
}

fn check(dir: &Path) -> (Stage, String) {
    let fwd = match load(&dir.join("forward.trace")) {
        Ok(t) => t,
        Err(e) => return (Stage::Parse, format!("forward: {e}")),
    };
    let bwd_path = dir.join("backward.trace");
    let bwd = if bwd_path.is_file() {
        match load(&bwd_path) {
            Ok(t) => Some(t),
            Err(e) => return (Stage::Parse, format!("backward: {e}")),
        }
    } else {
        None
    };
    if let Err(e) = verify(&fwd) {
        return (
            Stage::Verify,
            format!("forward: {}", first_line(&e.to_string())),
        );
    }
    if let Some(b) = &bwd {
        if let Err(e) = verify(b) {
            return (
                Stage::Verify,
                format!("backward: {}", first_line(&e.to_string())),
            );
        }
    }
    let inputs: Named = match TensorFile::load(&dir.join("inputs.safetensors")) {
        Ok(f) => f.tensors,
        Err(e) => return (Stage::Run, format!("inputs: {e}")),
    };
    let expected = match TensorFile::load(&dir.join("expected.safetensors")) {
        Ok(f) => f.tensors,
        Err(e) => return (Stage::Run, format!("expected: {e}")),
    };
    let group = ThreadGroup::new(1, CommOptions::default());
    let mut comm = group.comm(0);
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_pair(
            &CpuBackend,
            &mut comm,
            &fwd,
            bwd.as_ref(),
            &inputs,
            RunOptions::default(),
        )
    }));
    let got = match run {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => return (Stage::Run, one_line(&e.to_string())),
        Err(_) => return (Stage::Run, "a kernel panicked".into()),
    };
    let shapes_only = random(&fwd);
    for (name, want) in &expected {
        let Some(g) = got.get(name) else {
            // a backward that returns `None` for an input means a zero gradient, as PyTorch
            // gives (copysign's sign operand)
            if name.starts_with("grad.") && want.to_f64_vec().iter().all(|&x| x == 0.0) {
                continue;
            }
            let why = match name.strip_prefix("grad.") {
                Some(arg) if bwd.is_some() => format!(
                    ": the backward returns `None` for `{arg}`, whose gradient PyTorch gives \
                     nonzero (Thunder's gradient rule drops it)"
                ),
                _ => String::new(),
            };
            return (Stage::Numbers, format!("no `{name}` in the results{why}"));
        };
        if let Err(e) = compare(name, g, want, shapes_only) {
            return (Stage::Numbers, e);
        }
    }
    (Stage::Ok, String::new())
}

#[derive(serde::Deserialize)]
struct Index {
    thunder: String,
    torch: String,
    ops: usize,
    samples: Vec<SampleEntry>,
    failures: Vec<Failure>,
}

#[derive(serde::Deserialize)]
struct SampleEntry {
    op: String,
    dir: String,
}

#[derive(serde::Deserialize)]
struct Failure {
    op: String,
    dtype: String,
    error: String,
}

/// The recorded floor: samples that got at least this far.
#[derive(serde::Deserialize, serde::Serialize, Debug, Default, PartialEq)]
struct Coverage {
    samples: usize,
    parse: usize,
    verify: usize,
    run: usize,
    numbers: usize,
}

fn coverage(outcomes: &[Outcome]) -> Coverage {
    let past = |s: Stage| outcomes.iter().filter(|o| o.stage > s).count();
    Coverage {
        samples: outcomes.len(),
        parse: past(Stage::Parse),
        verify: past(Stage::Verify),
        run: past(Stage::Run),
        numbers: past(Stage::Numbers),
    }
}

fn pct(n: usize, d: usize) -> String {
    if d == 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * n as f64 / d as f64)
    }
}

fn report(index: &Index, outcomes: &[Outcome], cov: &Coverage) -> String {
    let ops_ok = |pred: &dyn Fn(&Outcome) -> bool| {
        let mut by_op: BTreeMap<&str, bool> = BTreeMap::new();
        for o in outcomes {
            let e = by_op.entry(o.op.as_str()).or_insert(true);
            *e &= pred(o);
        }
        by_op.values().filter(|&&b| b).count()
    };
    let jitted_ops = ops_ok(&|_| true);
    let mut s = String::new();
    let _ = writeln!(s, "# Thunder's OpInfo samples through tracepass\n");
    let _ = writeln!(
        s,
        "Made by `cargo xtask opinfo-report` (the test `runtime/tests/opinfo.rs` with \
         `TRACEPASS_OPINFO_REPORT=1`) from the samples `python -m tracepass.export.opinfo --out \
         testdata/opinfo` wrote with Thunder {} and PyTorch {}: each op's first float32 sample \
         (CPU, inputs with gradients), its final forward and backward traces, and PyTorch's \
         outputs and input gradients for seeded cotangents. *run ok* means `run_pair` on the \
         CPU backend gives PyTorch's numbers within the dtype's tolerance (float32: 1e-5 of the \
         tensor's largest magnitude, plus 1e-6); ops that draw random numbers are compared by \
         shape and dtype.\n",
        index.thunder, index.torch
    );
    let _ = writeln!(s, "| | ops | samples |\n|---|---:|---:|");
    let _ = writeln!(
        s,
        "| tried | {} | {} |",
        index.ops,
        outcomes.len() + index.failures.len()
    );
    let _ = writeln!(s, "| Thunder jits | {} | {} |", jitted_ops, cov.samples);
    for (label, n, stage) in [
        ("tracepass parses", cov.parse, Stage::Parse),
        ("tracepass verifies", cov.verify, Stage::Verify),
        ("tracepass runs", cov.run, Stage::Run),
        ("run ok (PyTorch's numbers)", cov.numbers, Stage::Numbers),
    ] {
        let _ = writeln!(
            s,
            "| {label} | {} | {} ({}) |",
            ops_ok(&|o: &Outcome| o.stage > stage),
            n,
            pct(n, cov.samples)
        );
    }
    let _ = writeln!(s, "\n## Samples that do not pass\n");
    let _ = writeln!(s, "| op | sample | fails at | reason |\n|---|---|---|---|");
    for o in outcomes.iter().filter(|o| o.stage != Stage::Ok) {
        let _ = writeln!(
            s,
            "| `{}` | {} | {:?} | {} |",
            o.op,
            o.sample,
            o.stage,
            o.reason.replace('|', "\\|").replace('\n', " ")
        );
    }
    let _ = writeln!(s, "\n## Ops Thunder cannot jit\n");
    let _ = writeln!(s, "| op | dtype | Thunder's error |\n|---|---|---|");
    for f in &index.failures {
        let _ = writeln!(
            s,
            "| `{}` | {} | {} |",
            f.op,
            f.dtype,
            f.error.replace('|', "\\|").replace('\n', " ")
        );
    }
    s
}

#[test]
fn opinfo_samples_match_pytorch() {
    let root = root();
    let index: Index = serde_json::from_str(
        &std::fs::read_to_string(root.join("index.json")).expect("testdata/opinfo/index.json"),
    )
    .expect("index.json");
    let outcomes: Vec<Outcome> = index
        .samples
        .iter()
        .map(|e| {
            let (stage, reason) = check(&root.join(&e.op).join(&e.dir));
            Outcome {
                op: e.op.clone(),
                sample: e.dir.clone(),
                stage,
                reason,
            }
        })
        .collect();
    let cov = coverage(&outcomes);
    eprintln!("{cov:?}");
    let floor_path = root.join("coverage.json");
    if std::env::var_os("TRACEPASS_OPINFO_REPORT").is_some() {
        std::fs::write(root.join("README.md"), report(&index, &outcomes, &cov)).expect("README");
        std::fs::write(
            &floor_path,
            serde_json::to_string_pretty(&cov).expect("json") + "\n",
        )
        .expect("coverage.json");
        return;
    }
    let floor: Coverage = serde_json::from_str(
        &std::fs::read_to_string(&floor_path).expect("testdata/opinfo/coverage.json"),
    )
    .expect("coverage.json");
    assert_eq!(
        cov.samples, floor.samples,
        "the number of samples changed: run `cargo xtask opinfo-report`"
    );
    let regressed: Vec<String> = [
        ("parse", cov.parse, floor.parse),
        ("verify", cov.verify, floor.verify),
        ("run", cov.run, floor.run),
        ("numbers", cov.numbers, floor.numbers),
    ]
    .iter()
    .filter(|(_, now, was)| now < was)
    .map(|(what, now, was)| format!("{what}: {now} samples, {was} recorded"))
    .collect();
    let failing: Vec<String> = outcomes
        .iter()
        .filter(|o| o.stage != Stage::Ok)
        .map(|o| format!("{}/{}: {:?}: {}", o.op, o.sample, o.stage, o.reason))
        .collect();
    assert!(
        regressed.is_empty(),
        "OpInfo coverage fell: {}\nfailing samples:\n{}",
        regressed.join("; "),
        failing.join("\n")
    );
}

#[test]
fn a_wrong_number_fails_the_comparison() {
    let want = Tensor::from_f32(vec![2], vec![1.0, 100.0]);
    assert!(compare(
        "x",
        &Tensor::from_f32(vec![2], vec![1.0, 100.0]),
        &want,
        false
    )
    .is_ok());
    assert!(compare(
        "x",
        &Tensor::from_f32(vec![2], vec![1.0005, 100.0]),
        &want,
        false
    )
    .is_ok());
    assert!(compare(
        "x",
        &Tensor::from_f32(vec![2], vec![1.01, 100.0]),
        &want,
        false
    )
    .is_err());
    assert!(compare(
        "x",
        &Tensor::from_f32(vec![1, 2], vec![1.0, 100.0]),
        &want,
        false
    )
    .is_err());
}
