//! Issue 19, "a command line that cannot mislead": each point through the real binary.

mod common;

use common::{bin, run_in, stderr, stdout, testdata};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
fn td(rel: &str) -> String {
    testdata("thunder").join(rel).display().to_string()
}
/// Runs in a temp dir (so anything written to the current folder lands there).
fn run(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    run_in(dir.path(), args)
}
fn losses(o: &Output) -> Vec<String> {
    stdout(o)
        .lines()
        .filter(|l| l.contains("-th loss: "))
        .map(str::to_string)
        .collect()
}
/// Exit code 1 and every `want` in stderr.
fn fails_with(o: &Output, want: &[&str]) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    for w in want {
        assert!(e.contains(w), "missing `{w}` in: {e}");
    }
    assert!(!e.contains("panicked"), "{e}");
}
fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Point 1: Every loss line reaches stdout, past 100 steps too; stderr has none of them.
#[test]
fn every_loss_line_is_printed_to_stdout() {
    let o = run(&["train", "--world-size", "2", "--steps", "150"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let l = losses(&o);
    assert_eq!(l.len(), 150, "{}", stdout(&o));
    for (i, line) in l.iter().enumerate() {
        assert!(line.starts_with(&format!("# {i}-th loss: ")), "{line}");
    }
    assert!(!stderr(&o).contains("-th loss"), "{}", stderr(&o));
}

/// Point 2: A pipeline, group or checkpoint that contradicts the run is an error naming both values.
#[test]
fn contradictions_between_pipeline_and_run_are_errors() {
    let o = run(&[
        "train",
        "--world-size",
        "2",
        "--passes",
        "ddp(world_size=3)",
    ]);
    fails_with(&o, &["world size 3", "--world-size 2"]);
    assert!(losses(&o).is_empty());
    for passes in ["dce", ""] {
        let o = run(&["train", "--world-size", "2", "--passes", passes]);
        fails_with(&o, &["no all-reduce", "2 ranks"]);
        assert!(losses(&o).is_empty());
        // one rank needs no synchronization: the same pipeline trains
        let o = run(&["train", "--steps", "2", "--passes", passes]);
        assert!(o.status.success(), "{passes}: {}", stderr(&o));
        assert_eq!(losses(&o).len(), 2);
    }
    let o = run(&[
        "train",
        "--world-size",
        "2",
        "--passes",
        "ddp(world_size=2,group=foo),sort-waits",
    ]);
    fails_with(&o, &["process group `foo`", "`world`"]);
    let o = run(&[
        "simulate",
        &td("mlp/backward.trace"),
        "--forward",
        &td("mlp/forward.trace"),
        "--world-size",
        "4",
        "--passes",
        "ddp(world_size=2),sort-waits",
    ]);
    fails_with(&o, &["world size 2", "--world-size 4"]);
    // a checkpoint of a 2-rank run resumed on 3 ranks
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.safetensors");
    let ck = ck.to_str().unwrap();
    let o = run(&["train", "--world-size", "2", "--steps", "2", "--save", ck]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["train", "--world-size", "3", "--steps", "4", "--resume", ck]);
    fails_with(&o, &["trained on 2 rank(s)", "--world-size 3"]);
    assert!(losses(&o).is_empty());
    let o = run(&["train", "--world-size", "2", "--steps", "4", "--resume", ck]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Point 3: `opt -o X.tpb` writes the whole program, `pack` makes one, and `train` reads programs
/// and traces in every format: each trains exactly like the built-in seed model.
#[test]
fn programs_round_trip_through_opt_pack_and_train() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    let seed = run(&["train", "--world-size", "2", "--steps", "3"]);
    assert!(seed.status.success(), "{}", stderr(&seed));
    let want = losses(&seed);
    assert_eq!(want.len(), 3);
    // opt with a forward keeps forward, backward and parameters
    let o = run(&[
        "opt",
        &td("mlp/backward.trace"),
        "--forward",
        &td("mlp/forward.trace"),
        "--passes",
        "dce",
        "-o",
        &p("prog.tpb"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["show", &p("prog.tpb"), "--forward"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("def "), "{}", stdout(&o));
    // ... so ddp runs on it without --forward
    let o = run(&[
        "opt",
        &p("prog.tpb"),
        "--passes",
        "ddp(world_size=2),sort-waits",
        "-o",
        &p("ddp.tpb"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // pack, and traces in the binary and JSON formats
    let o = run(&[
        "pack",
        &td("mlp/forward.trace"),
        &td("mlp/backward.trace"),
        "-o",
        &p("packed.json"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for (from, to) in [
        ("mlp/forward.trace", "f.tpb"),
        ("mlp/backward.trace", "b.json"),
    ] {
        assert!(run(&["convert", &td(from), &p(to)]).status.success());
    }
    for model in [
        vec!["--model", &p("prog.tpb")],
        vec!["--model", &p("packed.json")],
        vec!["--forward", &p("f.tpb"), "--backward", &p("b.json")],
    ] {
        let mut args = vec!["train", "--world-size", "2", "--steps", "3"];
        args.extend(&model);
        let o = run(&args);
        assert!(o.status.success(), "{model:?}: {}", stderr(&o));
        assert_eq!(losses(&o), want, "{model:?}");
    }
    // the already rewritten program trains too (its ddp is for 2 ranks)
    let o = run(&[
        "train",
        "--world-size",
        "2",
        "--steps",
        "3",
        "--model",
        &p("ddp.tpb"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(losses(&o), want);
    // what cannot be a program says so
    let o = run(&["train", "--model", &p("b.json")]);
    fails_with(&o, &["holds one trace, not a program", "tracepass pack"]);
    let o = run(&[
        "pack",
        &td("mlp/forward.trace"),
        &td("mlp/backward.trace"),
        "-o",
        &p("x.trace"),
    ]);
    fails_with(&o, &["write the program as .tpb or .json"]);
    let o = run(&[
        "pack",
        &td("mlp/forward.trace"),
        &td("mlp/backward.trace"),
        "--prologue",
        &td("mlp/forward.trace"),
        "-o",
        &p("y.tpb"),
    ]);
    // a file that is not a prologue is refused, naming it and the line
    fails_with(
        &o,
        &[
            "forward.trace: line 16, column 3",
            "not a statement Thunder prints in a prologue",
        ],
    );
    assert!(!dir.path().join("y.tpb").exists());
}

/// Point 4: User errors write no reproducer; internal failures (a panicking pass, a pass that
/// breaks the IR) write one next to the output or in --reproducer-dir, never in the temp folder.
#[test]
fn reproducers_only_for_internal_failures() {
    let cwd = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let repro_dir = tempfile::tempdir().unwrap();
    let mut pids = Vec::new();
    let mut go = |args: &[&str]| {
        let child = bin()
            .current_dir(cwd.path())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        pids.push(child.id());
        child.wait_with_output().unwrap()
    };
    let (b, f) = (td("mlp/backward.trace"), td("mlp/forward.trace"));
    // user errors: ddp without the forward, ddp twice
    let o = go(&["opt", &b, "--passes", "ddp(world_size=2)"]);
    fails_with(&o, &["no parameter metadata"]);
    assert!(!stderr(&o).contains("reproducer"), "{}", stderr(&o));
    let o = go(&[
        "opt",
        &b,
        "--forward",
        &f,
        "--passes",
        "ddp(world_size=2),ddp(world_size=2)",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(!stderr(&o).contains("reproducer"), "{}", stderr(&o));
    assert!(
        files_in(cwd.path()).is_empty(),
        "{:?}",
        files_in(cwd.path())
    );
    // a panicking pass: the reproducer lands next to the output
    let target = out.path().join("x.tpb");
    let o = go(&[
        "opt",
        &b,
        "--forward",
        &f,
        "--passes",
        "ddp(world_size=2),sort-waits",
        "--inject-fault",
        "sort-waits:panic",
        "-o",
        target.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("panicked: injected fault"), "{e}");
    let written = files_in(out.path());
    assert_eq!(written.len(), 1, "{written:?}");
    assert!(
        written[0].starts_with("tracepass-reproducer-"),
        "{written:?}"
    );
    assert!(e.contains(&written[0]), "{e}");
    // its replay runs the real passes, which work
    let repro = out.path().join(&written[0]);
    let o = go(&["opt", "--reproduce", repro.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("replaying `ddp(world_size=2,bucket_mb=25),sort-waits`"));
    assert!(stdout(&o).contains("dist.all_reduce_async("));
    // a pass that breaks the IR: caught by the verifier, reproducer in --reproducer-dir
    let o = go(&[
        "opt",
        &b,
        "--forward",
        &f,
        "--passes",
        "ddp(world_size=2),sort-waits",
        "--inject-fault",
        "ddp:corrupt",
        "--reproducer-dir",
        repro_dir.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("the IR is invalid after pass `ddp`"),
        "{}",
        stderr(&o)
    );
    assert_eq!(files_in(repro_dir.path()).len(), 1);
    // a replay that fails again (the same fault injected) writes no other reproducer
    let r = repro_dir
        .path()
        .join(&files_in(repro_dir.path())[0])
        .display()
        .to_string();
    let o = go(&[
        "opt",
        "--reproduce",
        &r,
        "--inject-fault",
        "ddp:corrupt",
        "--reproducer-dir",
        repro_dir.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("the IR is invalid after pass `ddp`"),
        "{}",
        stderr(&o)
    );
    assert_eq!(files_in(repro_dir.path()).len(), 1);
    assert!(
        files_in(cwd.path()).is_empty(),
        "{:?}",
        files_in(cwd.path())
    );
    assert_eq!(files_in(out.path()).len(), 1);
    for pid in pids {
        let stray = std::env::temp_dir().join(format!("tracepass-reproducer-{pid}.json"));
        assert!(!stray.exists(), "{}", stray.display());
    }
}

/// Point 5: An output that cannot be written is refused before the first step.
#[test]
fn outputs_are_checked_before_any_step() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let under_file = file.join("out.json").display().to_string();
    let missing = dir
        .path()
        .join("no/such/dir/out.json")
        .display()
        .to_string();
    let folder = dir.path().display().to_string();
    for (flag, path, want) in [
        ("--save", missing.as_str(), "does not exist"),
        ("--timeline", under_file.as_str(), "is not a folder"),
        ("--metrics-json", folder.as_str(), "is a folder"),
        ("--save-grads", missing.as_str(), "does not exist"),
    ] {
        let start = std::time::Instant::now();
        // a million steps would take minutes: the error must come first
        let o = run(&["train", "--steps", "1000000", flag, path]);
        fails_with(&o, &[flag, want]);
        assert!(losses(&o).is_empty(), "{flag}: trained first");
        assert!(start.elapsed() < std::time::Duration::from_secs(60));
    }
    let o = run(&[
        "opt",
        &td("mlp/backward.trace"),
        "--passes",
        "dce",
        "-o",
        &missing,
    ]);
    fails_with(&o, &["-o", "does not exist"]);
    let o = run(&["convert", &td("mlp/backward.trace"), &under_file]);
    fails_with(&o, &["is not a folder"]);
}

/// Point 6: Bad numbers get messages that say what is wrong with them; a rank's error is not
/// prefixed by its rank twice.
#[test]
fn bad_numbers_are_named() {
    for (args, want) in [
        (vec!["--world-size", "-1"], "-1 is negative"),
        (vec!["--steps", "-1"], "-1 is negative"),
        (vec!["--steps", "0"], "--steps 0: nothing to train"),
        (
            vec!["--lr", "-1"],
            "--lr -1: the learning rate must be a positive",
        ),
        (vec!["--link", "-1,10"], "latency must be between 0 and"),
        (
            vec!["--seed", "99999999999999999999999"],
            "is too large (at most 18446744073709551615)",
        ),
        (
            vec!["--collective-timeout", "-2"],
            "must be a positive number",
        ),
    ] {
        let mut all = vec!["train"];
        all.extend(&args);
        let o = run(&all);
        let e = stderr(&o);
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(!e.contains("unexpected argument"), "{args:?}: {e}");
        assert_ne!(o.status.code(), Some(0));
    }
    let o = run(&[
        "opt",
        &td("mlp/backward.trace"),
        "--passes",
        "ddp(world_size=99999999999999999999)",
    ]);
    fails_with(&o, &["too large"]);
    let o = run(&[
        "launch",
        "--nproc-per-node",
        "-1",
        "--",
        "train",
        "--device",
        "cuda",
    ]);
    assert!(stderr(&o).contains("-1 is negative"), "{}", stderr(&o));
    // a rank whose batch is missing: its number once
    let o = run(&[
        "train",
        "--world-size",
        "3",
        "--data",
        root()
            .join("testdata/reference/data_seed0_ws2.safetensors")
            .to_str()
            .unwrap(),
    ]);
    // found before any rank starts
    fails_with(&o, &["rank 2: ", "x.0.2"]);
    assert_eq!(stderr(&o).matches("rank 2").count(), 1, "{}", stderr(&o));
}

/// Point 7: Options do what they say or are refused.
#[test]
fn options_are_never_ignored() {
    let (b, f) = (td("mlp/backward.trace"), td("mlp/forward.trace"));
    let o = run(&[
        "opt",
        &b,
        "--forward",
        &f,
        "--passes",
        "dce",
        "--print-ir-after=nonexistent",
    ]);
    fails_with(
        &o,
        &[
            "--print-ir-after=nonexistent",
            "no pass `nonexistent`",
            "dce",
        ],
    );
    // a failing later pass still shows the IR after the earlier ones
    let o = run(&[
        "opt",
        &b,
        "--passes",
        "dce,ddp(world_size=2)",
        "--print-ir-after-all",
    ]);
    fails_with(
        &o,
        &["// ----- IR after dce -----", "no parameter metadata"],
    );
    // named links, as simulate takes them
    let o = run(&["train", "--steps", "1", "--link", "nvlink"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // a modelled all-reduce longer than the timeout is refused up front
    let start = std::time::Instant::now();
    let o = run(&[
        "train",
        "--model",
        "deep-mlp:2,1024,8",
        "--world-size",
        "2",
        "--link",
        "1000,0.01",
        "--collective-timeout",
        "2",
    ]);
    fails_with(&o, &["longer than --collective-timeout 2 s"]);
    assert!(start.elapsed() < std::time::Duration::from_secs(60));
    let o = run(&["train", "--save", "x.safetensors", "--save-every", "0"]);
    fails_with(&o, &["--save-every 0"]);
    // a resumed run reports the steps it ran
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.safetensors").display().to_string();
    assert!(run(&["train", "--steps", "5", "--save", &ck])
        .status
        .success());
    let o = run(&["train", "--steps", "10", "--resume", &ck]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(losses(&o).len(), 5);
    assert!(
        stderr(&o).contains("trained 5 steps (steps 5..9, resumed from step 5)"),
        "{}",
        stderr(&o)
    );
    // --show-backward prints before the first step: stdout and stderr into one file
    let log = dir.path().join("log");
    let fh = std::fs::File::create(&log).unwrap();
    let st = bin()
        .args(["train", "--steps", "2", "--show-backward"])
        .stdout(fh.try_clone().unwrap())
        .stderr(fh)
        .status()
        .unwrap();
    assert!(st.success());
    let text = std::fs::read_to_string(&log).unwrap();
    let (bwd, loss) = (
        text.find("def backward").expect("backward printed"),
        text.find("# 0-th loss").expect("loss printed"),
    );
    assert!(bwd < loss, "{text}");
}

/// Point 8: On CPU, `launch` refuses (ranks are threads of one process) and says what to run.
#[test]
fn launch_on_cpu_refuses_with_the_fix() {
    let o = run(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--",
        "train",
        "--steps",
        "3",
    ]);
    fails_with(
        &o,
        &[
            "threads of one process",
            "run `tracepass train --world-size 2 --steps 3` instead",
        ],
    );
    assert!(losses(&o).is_empty());
    let o = run(&["launch", "--nproc-per-node", "2", "--", "show", "x.trace"]);
    fails_with(&o, &["not a distributed command"]);
    // torchrun's environment on a CPU run
    let o = bin()
        .args(["train", "--steps", "2"])
        .env("WORLD_SIZE", "2")
        .env("RANK", "0")
        .output()
        .unwrap();
    fails_with(&o, &["WORLD_SIZE=2", "tracepass train --world-size 2"]);
    // a child's error appears once, marked with its rank
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
    let e = stderr(&o);
    assert!(e.contains("exited with"), "{e}");
    // every line but the launcher's own verdict comes from a rank, marked, at most once each
    let (own, from_ranks): (Vec<&str>, Vec<&str>) =
        e.lines().partition(|l| l.starts_with("error: rank "));
    assert_eq!(own.len(), 1, "{e}");
    assert!(!from_ranks.is_empty(), "{e}");
    assert!(from_ranks.iter().all(|l| l.starts_with("[rank ")), "{e}");
    for r in 0..2 {
        let n = from_ranks
            .iter()
            .filter(|l| l.starts_with(&format!("[rank {r}]")))
            .count();
        assert!(n <= 1, "{e}");
    }
}

/// Point 9: A backward without all-reduce is reported as such, not as -0 ms at 100% overlap.
#[test]
fn simulate_without_communication_says_so() {
    let o = run(&[
        "simulate",
        &td("mlp/backward.trace"),
        "--forward",
        &td("mlp/forward.trace"),
        "--world-size",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.contains("no communication") && s.contains("0 all-reduces"),
        "{s}"
    );
    assert!(!s.contains("-0.000") && !s.contains("100.0%"), "{s}");
}

/// Point 10: verify reports every parse error, and semantic errors with their line.
#[test]
fn verify_reports_every_error_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.trace");
    let text = std::fs::read_to_string(td("mlp/backward.trace")).unwrap();
    // unknown down to the prims its printed decomposition calls
    let text = text
        .replace("torch.permute", "torch.permutate")
        .replace("prims.transpose", "prims.transposition");
    std::fs::write(&bad, text).unwrap();
    let o = run(&["verify", bad.to_str().unwrap()]);
    fails_with(
        &o,
        &[
            // every unknown op of the trace is listed at once, with each line it is on
            "bad.trace: line 45, column 10: 1 unknown op: `torch.permutate` (line 45, 2 uses)",
            "1 parse error",
        ],
    );
    // what follows from a bad line (its names undefined later) is not reported again
    assert!(!stderr(&o).contains("undefined name"), "{}", stderr(&o));
    // a future waited twice: a semantic error, at the line of the statement shown
    let ddp = std::fs::read_to_string(td("mlp-ddp/backward.trace")).unwrap();
    let mut lines: Vec<&str> = ddp.lines().collect();
    let wait = lines
        .iter()
        .position(|l| {
            l.trim_start()
                .starts_with("t152 = torch_wait_prim_impl(ft151)")
        })
        .unwrap();
    lines.insert(
        wait + 1,
        "  t999 = torch_wait_prim_impl(ft151)  # t999: \"cpu f32[4, 64]\"",
    );
    let sem = dir.path().join("sem.trace");
    std::fs::write(&sem, lines.join("\n") + "\n").unwrap();
    let defined_at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("ft151 = "))
        .unwrap()
        + 1;
    let o = run(&["verify", sem.to_str().unwrap()]);
    fails_with(
        &o,
        &[
            &format!("sem.trace: line {defined_at}: future `ft151` is waited 2 times"),
            "1 violation",
        ],
    );
    assert!(run(&["verify", &td("mlp-ddp/backward.trace")])
        .status
        .success());
}

/// Point 12: The docs the README cites are in the repository, and every option of every command
/// is documented there.
#[test]
fn every_option_is_documented() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let cli_doc = std::fs::read_to_string(root().join("docs/CLI.md")).unwrap();
    for doc in [
        "docs/DESIGN.md",
        "docs/TRACE_FORMAT.md",
        "docs/EXPORT_FORMAT.md",
        "docs/CLI.md",
    ] {
        assert!(readme.contains(doc), "README does not cite {doc}");
        assert!(root().join(doc).is_file(), "{doc} missing");
    }
    assert!(!readme.contains("shared folder"));
    for cmd in [
        "show", "convert", "verify", "dot", "opt", "pack", "train", "simulate", "launch",
    ] {
        let o = run(&[cmd, "--help"]);
        assert!(o.status.success(), "{cmd}");
        let help = stdout(&o);
        for word in help.split_whitespace() {
            let flag = word.trim_matches(|c: char| !(c.is_alphanumeric() || c == '-'));
            if flag.starts_with("--") && flag.len() > 2 && flag != "--help" {
                let flag = flag.split('=').next().unwrap();
                assert!(
                    cli_doc.contains(&format!("{cmd} ")) && cli_doc.contains(flag),
                    "docs/CLI.md does not document `{cmd} {flag}`"
                );
            }
        }
    }
    let opt = stdout(&run(&["opt", "--help"]));
    for pass in tracepass_passes::PassRegistry::builtin().names() {
        assert!(opt.contains(pass), "opt --help does not list `{pass}`");
        assert!(cli_doc.contains(pass), "docs/CLI.md does not list `{pass}`");
    }
    assert!(opt.contains("Print the backward to stderr after each run of PASS"));
    assert!(cli_doc.contains("launch=ready|end"));
    assert!(cli_doc.contains("loss") && cli_doc.contains("negative"));
}
