//! Files through the real binary: no output may be one of the command's inputs (a file of an
//! input export directory included) or another output; temporary files do not outlive a save.

mod common;

use common::{bin, model, run, stderr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The command failed with exit code 1 and a message holding every one of `want`.
fn fails_with(o: &Output, want: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for w in want {
        assert!(err.contains(w), "missing `{w}` in: {err}");
    }
}

/// A copy of a model's export directory, and every file's bytes.
fn export_copy(dir: &Path, name: &str) -> (PathBuf, Vec<(PathBuf, Vec<u8>)>) {
    let to = dir.join(name);
    std::fs::create_dir_all(to.join("reference")).unwrap();
    let mut files = Vec::new();
    for sub in ["", "reference"] {
        for e in std::fs::read_dir(model(name).join(sub)).unwrap() {
            let e = e.unwrap();
            if e.path().is_file() {
                let dest = to.join(sub).join(e.file_name());
                std::fs::copy(e.path(), &dest).unwrap();
                files.push((dest.clone(), std::fs::read(&dest).unwrap()));
            }
        }
    }
    (to, files)
}

fn unchanged(files: &[(PathBuf, Vec<u8>)]) {
    for (p, bytes) in files {
        assert_eq!(&std::fs::read(p).unwrap(), bytes, "{} changed", p.display());
    }
}

#[test]
fn no_output_is_an_input_or_another_output() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, files) = export_copy(tmp.path(), "mlp");
    let d = |f: &str| dir.join(f).display().to_string();
    let dir_s = dir.display().to_string();
    let opt = run(&["opt", &dir_s, "--passes", "dce", "-o", &d("forward.trace")]);
    fails_with(
        &opt,
        &["-o", "forward.trace of the input ", "would destroy"],
    );
    for (flag, file) in [
        ("--save", "params.safetensors"),
        ("--save-grads", "data.safetensors"),
        ("--metrics-json", "export.json"),
        ("--timeline", "prologue.trace"),
        ("--timeline", "reference/loss.json"),
    ] {
        let o = run(&["train", "--model", &dir_s, "--steps", "1", flag, &d(file)]);
        fails_with(&o, &[flag, &format!("is {file} of the input --model")]);
    }
    // a separate --params or --data file, spelled another way
    let dotted = dir.join(".").join("params.safetensors");
    let o = run(&[
        "train",
        "--params",
        &d("params.safetensors"),
        "--save",
        dotted.to_str().unwrap(),
    ]);
    fails_with(&o, &["--save", "the input --params"]);
    unchanged(&files);

    // dot and convert onto their input, through a link too; pack onto its backward
    let f = tmp.path().join("f.trace");
    std::fs::copy(model("mlp").join("forward.trace"), &f).unwrap();
    let before = std::fs::read(&f).unwrap();
    let fs = f.to_str().unwrap();
    fails_with(&run(&["dot", fs, "-o", fs]), &["-o", "is the input "]);
    fails_with(&run(&["convert", fs, fs]), &["output", "is the input "]);
    #[cfg(unix)]
    {
        let link = tmp.path().join("link.trace");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        fails_with(
            &run(&["dot", fs, "-o", link.to_str().unwrap()]),
            &["is the input "],
        );
    }
    fails_with(
        &run(&["pack", fs, &d("backward.trace"), "-o", &d("backward.trace")]),
        &["-o", "the input backward"],
    );
    assert_eq!(std::fs::read(&f).unwrap(), before);

    // two outputs that are one file
    let out = tmp.path().join("m.json").display().to_string();
    let o = run(&[
        "train",
        "--steps",
        "1",
        "--timeline",
        &out,
        "--metrics-json",
        &out,
    ]);
    fails_with(&o, &["--timeline", "--metrics-json", "are the same file"]);
    assert!(!Path::new(&out).exists());
}

#[test]
fn a_resumed_checkpoint_may_be_saved_over() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("c.safetensors");
    let c = ckpt.to_str().unwrap();
    let o = run(&["train", "--steps", "1", "--save", c]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["train", "--steps", "2", "--resume", c, "--save", c]);
    assert!(o.status.success(), "{}", stderr(&o));
    // but no other output may replace it
    let o = run(&["train", "--steps", "3", "--resume", c, "--save-grads", c]);
    fails_with(&o, &["--save-grads", "the input --resume"]);
}

/// The temporary files in `dir` (`.NAME.tmp-PID-N`).
fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

#[cfg(unix)]
#[test]
fn a_signal_during_a_save_removes_its_temporary_file() {
    use std::os::unix::process::ExitStatusExt;
    for (sig, number) in [("TERM", 15), ("INT", 2)] {
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("ck.safetensors");
        // a 48 MB checkpoint rewritten after every step: its temporary file is there often
        let mut child = bin()
            .args([
                "train",
                "--model",
                "deep-mlp:4,1024,8",
                "--steps",
                "100000",
                "--save",
                ck.to_str().unwrap(),
                "--save-every",
                "1",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while temp_files(dir.path()).is_empty()
            && start.elapsed() < std::time::Duration::from_secs(120)
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!temp_files(dir.path()).is_empty(), "no save seen");
        let killed = Command::new("kill")
            .args([&format!("-{sig}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(number), "SIG{sig}: {status}");
        assert_eq!(temp_files(dir.path()), Vec::<String>::new(), "SIG{sig}");
    }
}

#[test]
fn a_save_removes_the_temporary_files_of_dead_processes() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.safetensors");
    // one left by a process that was killed outright (it has ended), one of a live one (this)
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let dead = dir
        .path()
        .join(format!(".ck.safetensors.tmp-{}-0", gone.id()));
    let live = dir
        .path()
        .join(format!(".ck.safetensors.tmp-{}-0", std::process::id()));
    let other = dir.path().join(format!(".other.tmp-{}-0", gone.id()));
    for f in [&dead, &live, &other] {
        std::fs::write(f, b"partial").unwrap();
    }
    let o = run(&["train", "--steps", "1", "--save", ck.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(ck.is_file());
    if cfg!(target_os = "linux") {
        assert!(!dead.exists(), "the dead process's temporary file is left");
    }
    assert!(live.exists(), "a live process's temporary file was removed");
    assert!(other.exists(), "another file's temporary file was removed");
}
