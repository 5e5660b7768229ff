//! `fuse-elementwise` through the binary: `opt` prints the regions with their bodies and
//! writes a program that reads back, and `train --passes` with it prints the unfused losses.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/models")
        .join(name)
}
fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tracepass"))
        .args(args)
        .output()
        .expect("the tracepass binary")
}
fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

#[test]
fn opt_prints_regions_and_train_gives_the_unfused_losses() {
    let mlp = model("mlp");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let prog = dir.path().join("fused.tpb");
    let pipeline = "ddp(world_size=2),fuse-elementwise,sort-waits";
    let backward = mlp.join("backward.trace");
    let printed = ok(&run(&["opt", s(&backward), "--passes", "fuse-elementwise"]));
    assert!(printed.contains("= tracepass.fusion("), "{printed}");
    // the body is printed under the region, one level deeper
    let at = printed.find("= tracepass.fusion(").expect("a region");
    let next = printed[at..].lines().nth(1).expect("a body line");
    assert!(next.starts_with("    # t"), "{next}");
    ok(&run(&[
        "opt",
        s(&backward),
        "--forward",
        s(&mlp.join("forward.trace")),
        "--passes",
        pipeline,
        "-o",
        s(&prog),
    ]));
    let shown = ok(&run(&["show", s(&prog)]));
    assert!(shown.contains("= tracepass.fusion("), "{shown}");
    let train = |passes: &str| {
        ok(&run(&[
            "train",
            "--model",
            s(&mlp),
            "--world-size",
            "2",
            "--steps",
            "3",
            "--passes",
            passes,
        ]))
    };
    let fused = train(pipeline);
    let plain = train("ddp(world_size=2),sort-waits");
    assert!(fused.lines().count() >= 3, "{fused}");
    assert_eq!(fused, plain);
}
