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
use tracepass_runtime::tensor::{is_float, Storage, Tensor, TensorFile};

/// `testdata/opinfo`, or the folder `TRACEPASS_OPINFO_DIR` names (a fresh probe's output).
fn root() -> PathBuf {
    match std::env::var_os("TRACEPASS_OPINFO_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/opinfo"),
    }
}

/// Samples whose numbers are Thunder's own, not eager PyTorch's: the printed traces round the
/// halves at other places than PyTorch's kernels, and tracepass runs them as printed. Each was
/// checked by executing the sample's forward and backward traces with torch (Thunder's torch
/// executor, as the probe jitted them) on its inputs: that gives tracepass's numbers bit for
/// bit, and misses PyTorch's by as much. `(op, sample, why)`; the report puts `why` before
/// the comparison, and a listed sample that stops failing on its numbers fails the test (so
/// a stale reason is not kept).
const THUNDERS_NUMBERS: &[(&str, &str, &str)] = &[
    (
        "tanh",
        "f16-0",
        "Thunder's numbers (its trace runs tanh and its gradient `g * (1 - y*y)` in f32 on the \
         unrounded `y`; PyTorch's `tanh_backward` reads the f16-rounded output)",
    ),
    (
        "expm1",
        "bf16-0",
        "Thunder's numbers (its backward recomputes `expm1(x) + 1` in f32; PyTorch's gradient \
         reads the bf16-rounded output)",
    ),
    (
        "softmin",
        "f16-0",
        "Thunder's numbers (its backward is softmax's gradient as four f16 ops, each rounded; \
         PyTorch's `_softmax_backward_data` accumulates in f32 and rounds once)",
    ),
    (
        "scaled_dot_product_attention",
        "f16-0",
        "Thunder's numbers (its trace scales q and k, then runs matmul, softmax and matmul \
         with f16 results between them; PyTorch's fused CPU attention accumulates in f32)",
    ),
    (
        "grad_forward_scaled_dot_product_attention",
        "f16-0",
        "Thunder's numbers (its trace scales q and k, then runs matmul, softmax and matmul \
         with f16 results between them; PyTorch's fused CPU attention accumulates in f32)",
    ),
];

/// The known reason a sample's numbers differ from PyTorch's, if it has one.
fn thunders_numbers(op: &str, sample: &str) -> Option<&'static str> {
    THUNDERS_NUMBERS
        .iter()
        .find(|(o, s, _)| *o == op && *s == sample)
        .map(|(_, _, why)| *why)
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
    /// The sample's dtype tag (`f32`, `bf16`, `i64`, ...).
    dtype: String,
    sample: String,
    /// The first stage that failed (`Ok`: none).
    stage: Stage,
    reason: String,
}

/// Largest error allowed between `got` and PyTorch's `want`: relative to the tensor's scale
/// (largest magnitude), as Thunder's OpInfo tests compare (float32 1e-5, bfloat16 1.6e-2);
/// integers and booleans exactly.
/// `wider` is the (rtol, atol) Thunder's own test of the op allows in this dtype, where it
/// gives one; the larger of each applies.
fn tolerance(dtype: DType, scale: f64, wider: Wider) -> f64 {
    let (rtol, atol) = match dtype {
        DType::F64 => (1e-7, 1e-7),
        DType::F32 => (1e-5, 1e-6),
        DType::F16 => (1e-3, 1e-5),
        DType::BF16 => (1.6e-2, 1e-5),
        _ => (0.0, 0.0),
    };
    let (rtol, atol) = if is_float(dtype) {
        (
            wider.rtol.map_or(rtol, |r| r.max(rtol)),
            wider.atol.map_or(atol, |a| a.max(atol)),
        )
    } else {
        (rtol, atol)
    };
    rtol * scale + atol
}

/// The tolerances a sample's `index.json` entry carries (Thunder's, where wider).
#[derive(Clone, Copy, Debug, Default, serde::Deserialize)]
struct Wider {
    rtol: Option<f64>,
    atol: Option<f64>,
}

fn compare(
    name: &str,
    got: &Tensor,
    want: &Tensor,
    shapes_only: bool,
    wider: Wider,
) -> Result<(), String> {
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
    let tol = tolerance(want.dtype(), scale, wider);
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

/// How a sample's traces are read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// As Thunder printed them.
    AsPrinted,
    /// Every statement replaced by the decomposition Thunder prints below it, down to its
    /// prims (`tracepass_ir::decomposition` with no op counted as known): the prims vocabulary
    /// that the parser falls back on for torch-level ops it has no entry for.
    Prims,
}

fn load(path: &Path, reading: Reading) -> Result<Trace, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let text = match reading {
        Reading::AsPrinted => text,
        Reading::Prims => tracepass_ir::inline_unknown_decompositions(&text, |_| false).0,
    };
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

fn check(dir: &Path, wider: Wider, reading: Reading) -> (Stage, String) {
    let fwd = match load(&dir.join("forward.trace"), reading) {
        Ok(t) => t,
        Err(e) => return (Stage::Parse, format!("forward: {e}")),
    };
    let bwd_path = dir.join("backward.trace");
    let bwd = if bwd_path.is_file() {
        match load(&bwd_path, reading) {
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
        if let Err(e) = compare(name, g, want, shapes_only, wider) {
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
    /// The (op, dtype tag) pairs the probe tried: the dtypes each op supports.
    #[serde(default)]
    tried: Vec<(String, String)>,
}

#[derive(serde::Deserialize)]
struct SampleEntry {
    op: String,
    dtype: String,
    dir: String,
    #[serde(flatten)]
    wider: Wider,
}

#[derive(serde::Deserialize)]
struct Failure {
    op: String,
    dtype: String,
    error: String,
}

/// The recorded floor, per dtype tag: samples that got at least this far.
type Floor = BTreeMap<String, Coverage>;

/// Samples of one dtype that got at least this far.
#[derive(serde::Deserialize, serde::Serialize, Debug, Default, PartialEq)]
struct Coverage {
    samples: usize,
    parse: usize,
    verify: usize,
    run: usize,
    numbers: usize,
}

fn coverage<'a>(outcomes: impl Iterator<Item = &'a Outcome> + Clone) -> Coverage {
    let past = |s: Stage| outcomes.clone().filter(|o| o.stage > s).count();
    Coverage {
        samples: outcomes.clone().count(),
        parse: past(Stage::Parse),
        verify: past(Stage::Verify),
        run: past(Stage::Run),
        numbers: past(Stage::Numbers),
    }
}

/// The order dtypes are listed in: the probe's, then any other by name.
fn dtype_rank(tag: &str) -> (usize, &str) {
    const ORDER: [&str; 7] = ["f32", "f64", "bf16", "f16", "i64", "i32", "b8"];
    (
        ORDER.iter().position(|t| *t == tag).unwrap_or(ORDER.len()),
        tag,
    )
}

/// Coverage of each dtype tag the samples are in.
fn floor(outcomes: &[Outcome]) -> Floor {
    let tags: std::collections::BTreeSet<&str> =
        outcomes.iter().map(|o| o.dtype.as_str()).collect();
    tags.into_iter()
        .map(|t| {
            (
                t.to_string(),
                coverage(outcomes.iter().filter(move |o| o.dtype == t)),
            )
        })
        .collect()
}

fn pct(n: usize, d: usize) -> String {
    if d == 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * n as f64 / d as f64)
    }
}

fn report(
    index: &Index,
    outcomes: &[Outcome],
    floor: &Floor,
    prims: &[Outcome],
    prims_floor: &Floor,
) -> String {
    let mut tags: Vec<&str> = floor.keys().map(String::as_str).collect();
    tags.sort_by_key(|t| dtype_rank(t));
    let tried = |tag: &str| {
        let n = index.tried.iter().filter(|(_, t)| t == tag).count();
        // an index from before `tried`: every sample and failure is one op tried
        if n == 0 {
            let ops: std::collections::BTreeSet<&str> = index
                .samples
                .iter()
                .filter(|e| e.dtype == tag)
                .map(|e| e.op.as_str())
                .chain(
                    index
                        .failures
                        .iter()
                        .filter(|f| f.dtype == tag)
                        .map(|f| f.op.as_str()),
                )
                .collect();
            ops.len()
        } else {
            n
        }
    };
    let total = coverage(outcomes.iter());
    let mut s = String::new();
    let _ = writeln!(s, "# Thunder's OpInfo samples through tracepass\n");
    let _ = writeln!(
        s,
        "Made by `cargo xtask opinfo-report` (the test `runtime/tests/opinfo.rs` with \
         `TRACEPASS_OPINFO_REPORT=1`) from the samples `python -m tracepass.export.opinfo --out \
         testdata/opinfo` wrote with Thunder {} and PyTorch {}, from {} ops of Thunder's OpInfo \
         database: one sample for each (op, dtype) pair `index.json` lists as `tried`, which \
         are the dtypes each op supports among the ops the probe reached in that dtype (the \
         *ops tried* column; a pair not listed was not probed, so a dtype with fewer ops tried \
         than float32 covers only part of the database); CPU; float inputs with gradients, \
         integer and bool samples without; each with its final forward and backward traces, \
         and PyTorch's outputs and input gradients for seeded cotangents. *run ok* means `run_pair` on the CPU backend \
         gives PyTorch's numbers within the dtype's tolerance, relative to the tensor's largest \
         magnitude (Thunder's OpInfo tolerances: float64 1e-7, float32 1e-5, float16 1e-3, \
         bfloat16 1.6e-2; integers and bool exactly); ops that draw random numbers are compared \
         by shape and dtype. Percentages are of the samples Thunder jits.\n",
        index.thunder, index.torch, index.ops
    );
    let _ = writeln!(
        s,
        "| dtype | ops tried | Thunder jits | parse | verify | run | run ok |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    let row = |s: &mut String, label: &str, tried: usize, c: &Coverage| {
        let _ = writeln!(
            s,
            "| {label} | {tried} | {} | {} ({}) | {} ({}) | {} ({}) | {} ({}) |",
            c.samples,
            c.parse,
            pct(c.parse, c.samples),
            c.verify,
            pct(c.verify, c.samples),
            c.run,
            pct(c.run, c.samples),
            c.numbers,
            pct(c.numbers, c.samples)
        );
    };
    let table = |s: &mut String, floor: &Floor, total: &Coverage| {
        let mut all_tried = 0;
        for t in &tags {
            let n = tried(t);
            all_tried += n;
            if let Some(c) = floor.get(*t) {
                row(s, t, n, c);
            }
        }
        row(s, "all", all_tried, total);
    };
    table(&mut s, floor, &total);
    let _ = writeln!(
        s,
        "\n## Read through Thunder's prims\n\nThe same samples with every statement replaced by \
         the decomposition Thunder prints below it, down to its prims: what the parser reads \
         when a trace calls a torch-level op tracepass has no entry for \
         (`ir/src/decomposition.rs`). Floors in `coverage-prims.json`.\n"
    );
    let _ = writeln!(
        s,
        "| dtype | ops tried | Thunder jits | parse | verify | run | run ok |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    table(&mut s, prims_floor, &coverage(prims.iter()));
    let _ = writeln!(
        s,
        "\nSamples that pass as printed but not through prims:\n\n\
         | op | sample | fails at | reason |\n|---|---|---|---|"
    );
    for (o, p) in outcomes.iter().zip(prims) {
        if o.stage == Stage::Ok && p.stage != Stage::Ok {
            let _ = writeln!(
                s,
                "| `{}` | {} | {:?} | {} |",
                p.op,
                p.sample,
                p.stage,
                p.reason.replace('|', "\\|").replace('\n', " ")
            );
        }
    }
    let _ = writeln!(s, "\n## Samples that do not pass\n");
    let _ = writeln!(s, "| op | sample | fails at | reason |\n|---|---|---|---|");
    let mut failing: Vec<&Outcome> = outcomes.iter().filter(|o| o.stage != Stage::Ok).collect();
    failing.sort_by(|a, b| (dtype_rank(&a.dtype), &a.op).cmp(&(dtype_rank(&b.dtype), &b.op)));
    for o in failing {
        let reason = match thunders_numbers(&o.op, &o.sample) {
            Some(why) if o.stage == Stage::Numbers => format!("{why}: {}", o.reason),
            _ => o.reason.clone(),
        };
        let _ = writeln!(
            s,
            "| `{}` | {} | {:?} | {} |",
            o.op,
            o.sample,
            o.stage,
            reason.replace('|', "\\|").replace('\n', " ")
        );
    }
    let _ = writeln!(s, "\n## Samples Thunder cannot jit\n");
    let _ = writeln!(s, "| op | dtype | Thunder's error |\n|---|---|---|");
    let mut failures: Vec<&Failure> = index.failures.iter().collect();
    failures.sort_by(|a, b| (dtype_rank(&a.dtype), &a.op).cmp(&(dtype_rank(&b.dtype), &b.op)));
    for f in failures {
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

fn outcomes(root: &Path, index: &Index, reading: Reading) -> Vec<Outcome> {
    index
        .samples
        .iter()
        .map(|e| {
            let (stage, reason) = check(&root.join(&e.op).join(&e.dir), e.wider, reading);
            Outcome {
                op: e.op.clone(),
                dtype: e.dtype.clone(),
                sample: e.dir.clone(),
                stage,
                reason,
            }
        })
        .collect()
}

/// Where `now` fell below the floor recorded in `file` (samples per dtype must agree).
fn regressions(root: &Path, file: &str, now: &Floor) -> Vec<String> {
    let recorded: Floor = serde_json::from_str(
        &std::fs::read_to_string(root.join(file)).expect("testdata/opinfo coverage floor"),
    )
    .expect("coverage floor (one entry per dtype tag)");
    let samples = |f: &Floor| -> Vec<(String, usize)> {
        f.iter().map(|(t, c)| (t.clone(), c.samples)).collect()
    };
    assert_eq!(
        samples(now),
        samples(&recorded),
        "{file}: the samples per dtype changed: run `cargo xtask opinfo-report`"
    );
    let mut regressed = Vec::new();
    for (tag, was) in &recorded {
        let cov = &now[tag];
        for (what, n, w) in [
            ("parse", cov.parse, was.parse),
            ("verify", cov.verify, was.verify),
            ("run", cov.run, was.run),
            ("numbers", cov.numbers, was.numbers),
        ] {
            if n < w {
                regressed.push(format!("{file}: {tag} {what}: {n} samples, {w} recorded"));
            }
        }
    }
    regressed
}

#[test]
fn opinfo_samples_match_pytorch() {
    let root = root();
    let index: Index = serde_json::from_str(
        &std::fs::read_to_string(root.join("index.json")).expect("testdata/opinfo/index.json"),
    )
    .expect("index.json");
    let printed = outcomes(&root, &index, Reading::AsPrinted);
    let prims = outcomes(&root, &index, Reading::Prims);
    let now = floor(&printed);
    let now_prims = floor(&prims);
    eprintln!("{now:?}\nthrough prims: {now_prims:?}");
    // a known reason for a sample that no longer misses PyTorch's numbers is stale
    let stale: Vec<String> = THUNDERS_NUMBERS
        .iter()
        .filter(|(op, sample, _)| {
            printed
                .iter()
                .any(|o| o.op == *op && o.sample == *sample && o.stage != Stage::Numbers)
        })
        .map(|(op, sample, _)| format!("{op}/{sample}"))
        .collect();
    assert!(
        stale.is_empty(),
        "THUNDERS_NUMBERS lists samples that no longer fail on their numbers: {stale:?}"
    );
    if std::env::var_os("TRACEPASS_OPINFO_REPORT").is_some() {
        let report = report(&index, &printed, &now, &prims, &now_prims);
        std::fs::write(root.join("README.md"), report).expect("README");
        for (file, f) in [("coverage.json", &now), ("coverage-prims.json", &now_prims)] {
            std::fs::write(
                root.join(file),
                serde_json::to_string_pretty(f).expect("json") + "\n",
            )
            .expect("coverage floor");
        }
        return;
    }
    let mut regressed = regressions(&root, "coverage.json", &now);
    regressed.extend(regressions(&root, "coverage-prims.json", &now_prims));
    let failing: Vec<String> = printed
        .iter()
        .chain(&prims)
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
        false,
        Wider::default()
    )
    .is_ok());
    assert!(compare(
        "x",
        &Tensor::from_f32(vec![2], vec![1.0005, 100.0]),
        &want,
        false,
        Wider::default()
    )
    .is_ok());
    assert!(compare(
        "x",
        &Tensor::from_f32(vec![2], vec![1.01, 100.0]),
        &want,
        false,
        Wider::default()
    )
    .is_err());
    assert!(compare(
        "x",
        &Tensor::from_f32(vec![1, 2], vec![1.0, 100.0]),
        &want,
        false,
        Wider::default()
    )
    .is_err());
    // Thunder's wider tolerance for the op applies
    let wider = Wider {
        rtol: Some(1e-1),
        atol: None,
    };
    assert!(compare(
        "x",
        &Tensor::from_f32(vec![2], vec![1.01, 100.0]),
        &want,
        false,
        wider
    )
    .is_ok());
    // integers compare exactly, whatever the op's float tolerance
    let ints = |v: Vec<i64>| Tensor::new(vec![2], Storage::I64(v));
    assert!(compare(
        "i",
        &ints(vec![1, 1000]),
        &ints(vec![1, 1000]),
        false,
        wider
    )
    .is_ok());
    assert!(compare(
        "i",
        &ints(vec![2, 1000]),
        &ints(vec![1, 1000]),
        false,
        wider
    )
    .is_err());
}
