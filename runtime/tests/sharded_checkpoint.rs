//! Sharded checkpoints (`--save` of an `fsdp` run): every rank writes only its own shards and
//! rank 0 a manifest; they resume at another world size and sharding, in an unsharded run of
//! their world size and in `checkpoint::read`, as the gathered (whole) checkpoint of the same
//! state does; a damaged, missing or half-written save is refused and never costs the previous
//! checkpoint.

mod common;

use common::training::{assert_same_params, cfg, run};
use std::path::{Path, PathBuf};
use tracepass_runtime::tensor::{save_tensors_with, Tensor, TensorFile};
use tracepass_runtime::train::checkpoint::{self, CheckpointError};
use tracepass_runtime::train::sharded_checkpoint::{shard_dir, SaveFormat, ShardedCheckpoint};
use tracepass_runtime::train::{train, TrainConfig, TrainError};

fn resume(mut c: TrainConfig, from: &Path) -> TrainConfig {
    c.resume = Some(from.to_path_buf());
    c
}

/// The files of a save: the manifest and its rank files.
fn rank_files(ck: &Path) -> Vec<PathBuf> {
    let s = ShardedCheckpoint::open(ck)
        .expect("manifest")
        .expect("a sharded checkpoint");
    s.manifest
        .files
        .iter()
        .map(|f| shard_dir(ck).join(&f.file))
        .collect()
}

/// Bytes of the tensors a safetensors file holds.
fn tensor_bytes(f: &TensorFile) -> usize {
    f.tensors
        .values()
        .map(|t| t.numel() * t.dtype().size_bytes())
        .sum()
}

/// The whole checkpoint at `path` as if written by `world_size` ranks (what an unsharded run
/// requires to resume it).
fn relabel(path: &Path, world_size: usize) {
    let f = TensorFile::load(path).expect("checkpoint");
    let mut meta = f.metadata.clone();
    meta.insert("world_size".into(), world_size.to_string());
    let tensors: Vec<(String, Tensor)> = f.tensors.into_iter().collect();
    save_tensors_with(path, &tensors, &meta).expect("relabelled");
}

const ZERO3_2: &str = "fsdp(world_size=2,sharding=zero3,bucket_mb=0.01)";

#[test]
fn a_sharded_checkpoint_resumes_at_any_world_size_and_in_any_mode() {
    let dir = tempfile::tempdir().expect("tmp");
    // a tie (nanogpt), frozen parameters (mlp-frozen, sharded too), an unused parameter
    for (name, passes) in [
        ("nanogpt", ZERO3_2.to_string()),
        (
            "mlp-frozen",
            "fsdp(world_size=2,sharding=zero3,bucket_mb=0,shard_frozen=true)".into(),
        ),
        ("unused", ZERO3_2.into()),
    ] {
        let ck = dir.path().join(format!("{name}.ck"));
        let whole = dir.path().join(format!("{name}.whole.safetensors"));
        // 5 steps at 2 ranks, zero3: sharded by default, and the gathered form of the same state
        let mut first = cfg(name, 2, 5, &passes);
        first.save = Some(ck.clone());
        run(&first);
        first.save = Some(whole.clone());
        first.save_format = SaveFormat::Whole;
        run(&first);
        assert_eq!(rank_files(&ck).len(), 2, "{name}");

        // the sharded checkpoint reads as the whole one, tensor for tensor
        let (a, b) = (
            checkpoint::read(&ck).expect("sharded"),
            checkpoint::read(&whole).expect("whole"),
        );
        assert_eq!((a.step, a.optimizer_step), (b.step, b.optimizer_step));
        assert_eq!((&a.tied, &a.no_gradient), (&b.tied, &b.no_gradient));
        for (x, y) in [
            (&a.params, &b.params),
            (&a.exp_avg, &b.exp_avg),
            (&a.exp_avg_sq, &b.exp_avg_sq),
        ] {
            assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>());
            for (k, t) in x {
                assert!(
                    t.bitwise_eq(&y[k]),
                    "{name}: `{k}` differs from the gathered one"
                );
            }
        }

        // at 2 ranks again: the uninterrupted run
        let uninterrupted = run(&cfg(name, 2, 10, &passes));
        let again = run(&resume(cfg(name, 2, 10, &passes), &ck));
        assert_eq!(again.first_step, 5);
        assert_same_params(
            &again,
            &uninterrupted,
            &format!("{name} resumed at 2 ranks"),
        );

        // at 4 ranks, zero2, another bucketing: as from the gathered checkpoint, and as DDP
        let zero2 = "fsdp(world_size=4,sharding=zero2,bucket_mb=0)";
        let resharded = run(&resume(cfg(name, 4, 10, zero2), &ck));
        let from_whole = run(&resume(cfg(name, 4, 10, zero2), &whole));
        assert_same_params(&resharded, &from_whole, &format!("{name} resharded 2 -> 4"));
        relabel(&whole, 4);
        let ddp4 = run(&resume(cfg(name, 4, 10, "ddp(world_size=4)"), &whole));
        assert_same_params(
            &resharded,
            &ddp4,
            &format!("{name} resharded 2 -> 4 vs DDP"),
        );

        // unsharded at its own world size: DDP at 2 ranks continues the uninterrupted run
        let ddp = run(&resume(
            cfg(name, 2, 10, "ddp(world_size=2),sort-waits"),
            &ck,
        ));
        assert_same_params(&ddp, &uninterrupted, &format!("{name} resumed as DDP"));
    }
}

#[test]
fn an_unsharded_run_of_another_world_size_is_refused_as_for_a_whole_checkpoint() {
    let dir = tempfile::tempdir().expect("tmp");
    let ck = dir.path().join("ck");
    let mut first = cfg("mlp", 2, 3, ZERO3_2);
    first.save = Some(ck.clone());
    run(&first);
    let err = train(
        &resume(cfg("mlp", 1, 5, "ddp(world_size=1)"), &ck),
        &|_, _| {},
    )
    .expect_err("another world size");
    assert!(
        matches!(&err, TrainError::Config(m) if m.contains("trained on 2 rank(s)")),
        "{err}"
    );
}

#[test]
fn each_rank_writes_about_a_world_size_share_of_the_gathered_checkpoint() {
    let dir = tempfile::tempdir().expect("tmp");
    for ws in [2, 4] {
        let passes = format!("fsdp(world_size={ws},sharding=zero3,bucket_mb=0.05)");
        let (ck, whole) = (dir.path().join("ck"), dir.path().join("whole.safetensors"));
        let mut c = cfg("nanogpt", ws, 2, &passes);
        c.save = Some(ck.clone());
        run(&c);
        c.save = Some(whole.clone());
        c.save_format = SaveFormat::Whole;
        run(&c);
        let whole_bytes = tensor_bytes(&TensorFile::load(&whole).expect("whole"));
        let files: Vec<TensorFile> = rank_files(&ck)
            .iter()
            .map(|p| TensorFile::load(p).expect("rank file"))
            .collect();
        assert_eq!(files.len(), ws);
        let manifest = ShardedCheckpoint::open(&ck)
            .expect("open")
            .expect("sharded")
            .manifest;
        // a bucket's padding (under ws elements) is all a rank writes beyond its share
        let padding: usize = manifest.buckets.iter().map(|b| b.padding).sum::<usize>() * 12;
        let sizes: Vec<usize> = files.iter().map(tensor_bytes).collect();
        // nothing written twice: the ranks together write the whole once, plus the padding
        assert!(
            sizes.iter().sum::<usize>() <= whole_bytes + padding,
            "ws {ws}: {sizes:?} of {whole_bytes}"
        );
        for (rank, (f, &size)) in files.iter().zip(&sizes).enumerate() {
            // only shards, no whole parameter, on ranks other than 0
            if rank > 0 {
                assert!(
                    f.tensors.keys().all(|k| k.contains(".shard_")),
                    "rank {rank}: {:?}",
                    f.tensors.keys().collect::<Vec<_>>()
                );
            }
            let share = whole_bytes / ws;
            assert!(
                size <= share + share / 20 + padding,
                "ws {ws} rank {rank}: {size} bytes, a share is {share}"
            );
            if rank > 0 {
                assert!(
                    size * 10 >= share * 9,
                    "ws {ws} rank {rank}: {size} of {share}"
                );
            }
        }
    }
}

/// Copies the checkpoint `ck` (manifest and rank files) to `to`.
fn copy_checkpoint(ck: &Path, to: &Path) {
    std::fs::copy(ck, to).expect("manifest");
    let (from_dir, to_dir) = (shard_dir(ck), shard_dir(to));
    std::fs::create_dir_all(&to_dir).expect("dir");
    for e in std::fs::read_dir(&from_dir).expect("shards") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), to_dir.join(e.file_name())).expect("rank file");
    }
}

fn resume_error(c: TrainConfig, ck: &Path) -> String {
    match train(&resume(c, ck), &|_, _| {}) {
        Ok(_) => panic!("{} resumed", ck.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_damaged_missing_or_half_written_save_is_refused_and_the_previous_one_still_loads() {
    let dir = tempfile::tempdir().expect("tmp");
    let ck = dir.path().join("ck");
    let mut first = cfg("mlp", 2, 3, ZERO3_2);
    first.save = Some(ck.clone());
    run(&first);
    let next = || cfg("mlp", 2, 5, ZERO3_2);
    let files = rank_files(&ck);
    let name1 = files[1]
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();

    // a flipped bit in rank 1's file: named, as damaged
    let bad = dir.path().join("flipped");
    copy_checkpoint(&ck, &bad);
    let f1 = shard_dir(&bad).join(&name1);
    let mut bytes = std::fs::read(&f1).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    std::fs::write(&f1, &bytes).expect("write");
    let e = resume_error(next(), &bad);
    assert!(e.contains(&name1) && e.contains("damaged"), "{e}");
    let Err(CheckpointError::Corrupt { .. }) = checkpoint::read(&bad) else {
        panic!("a flipped bit reads")
    };

    // rank 1's file missing
    let missing = dir.path().join("missing");
    copy_checkpoint(&ck, &missing);
    std::fs::remove_file(shard_dir(&missing).join(&name1)).expect("rm");
    let e = resume_error(next(), &missing);
    assert!(
        e.contains(&name1) && e.contains("rank 1's file") && e.contains("missing"),
        "{e}"
    );
    let Err(CheckpointError::MissingShard { rank: 1, .. }) = checkpoint::read(&missing) else {
        panic!("a missing rank file reads")
    };

    // cut short (a copy that stopped half way)
    let cut = dir.path().join("cut");
    copy_checkpoint(&ck, &cut);
    let f1 = shard_dir(&cut).join(&name1);
    let len = std::fs::metadata(&f1).expect("len").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f1)
        .and_then(|f| f.set_len(len / 2))
        .expect("truncate");
    let e = resume_error(next(), &cut);
    assert!(e.contains(&name1), "{e}");

    // a manifest that does not match its files: another CRC, another world size
    let edited = dir.path().join("edited");
    copy_checkpoint(&ck, &edited);
    let text = std::fs::read_to_string(&edited).expect("manifest");
    let m: serde_json::Value = serde_json::from_str(&text).expect("json");
    let crc = m["files"][1]["crc32"]
        .as_object()
        .and_then(|o| o.values().next())
        .and_then(|v| v.as_str())
        .expect("a crc")
        .to_string();
    std::fs::write(&edited, text.replacen(&crc, "00000000", 1)).expect("write");
    let e = resume_error(next(), &edited);
    assert!(e.contains(&name1) && e.contains("manifest"), "{e}");
    std::fs::write(
        &edited,
        text.replace("\"world_size\": 2", "\"world_size\": 3"),
    )
    .expect("write");
    let e = resume_error(next(), &edited);
    assert!(e.contains("edited") && e.contains("world size 3"), "{e}");

    // a layout that does not fit the model
    let e = resume_error(cfg("nanogpt", 2, 5, ZERO3_2), &ck);
    assert!(e.contains("parameters are not the model's"), "{e}");

    // a save that stopped half way (rank files of a new save written, one of them cut short,
    // no manifest yet) leaves the previous checkpoint as it was: it still resumes, and the
    // next save removes nothing the manifest names
    let dir_files = shard_dir(&ck);
    std::fs::write(
        dir_files.join("step00000005-abcdef.rank0-of-2.safetensors"),
        b"partial",
    )
    .expect("partial");
    std::fs::copy(
        &files[1],
        dir_files.join("step00000005-abcdef.rank1-of-2.safetensors"),
    )
    .expect("copy");
    let mut cont = next();
    cont.save = Some(ck.clone());
    let resumed = run(&resume(cont, &ck));
    assert_eq!(resumed.first_step, 3);
    // the new save replaced the old one: its files and the half-written save's are gone
    let now = rank_files(&ck);
    assert!(now.iter().all(|p| p.exists()) && !files.iter().any(|p| p.exists()));
    let left: Vec<_> = std::fs::read_dir(&dir_files)
        .expect("shards")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(left.len(), now.len(), "{left:?}");
    let uninterrupted = run(&cfg("mlp", 2, 5, ZERO3_2));
    assert_same_params(&resumed, &uninterrupted, "resumed past a half-written save");
}

#[test]
fn a_failed_save_keeps_the_previous_checkpoint() {
    let dir = tempfile::tempdir().expect("tmp");
    let ck = dir.path().join("ck");
    let mut first = cfg("mlp", 2, 3, ZERO3_2);
    first.save = Some(ck.clone());
    run(&first);
    let manifest = std::fs::read(&ck).expect("manifest");
    let files = rank_files(&ck);
    // resume from a copy, saving to `ck`, whose shard directory cannot take new files (a file
    // stands where it must be)
    let copy = dir.path().join("copy");
    std::fs::copy(&ck, &copy).expect("copy");
    copy_dir(&shard_dir(&ck), &shard_dir(&copy));
    let shards = shard_dir(&ck);
    let kept = dir.path().join("kept");
    std::fs::rename(&shards, &kept).expect("move");
    std::fs::write(&shards, b"not a directory").expect("block");
    let mut cont = resume(cfg("mlp", 2, 5, ZERO3_2), &copy);
    cont.save = Some(ck.clone());
    let err = train(&cont, &|_, _| {}).expect_err("the save cannot be written");
    assert!(err.to_string().contains("saving the checkpoint"), "{err}");
    assert_eq!(
        std::fs::read(&ck).expect("manifest"),
        manifest,
        "the manifest changed"
    );
    std::fs::remove_file(&shards).expect("unblock");
    std::fs::rename(&kept, &shards).expect("back");
    assert!(files.iter().all(|p| p.exists()));
    let resumed = run(&resume(cfg("mlp", 2, 5, ZERO3_2), &ck));
    assert_eq!(resumed.first_step, 3);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("dir");
    for e in std::fs::read_dir(from).expect("dir") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
    }
}

/// Frozen parameters saved whole in rank 0's file (not sharded) resume sharded when the new run
/// asks (`shard_frozen=true`), and the other way round: each new shard is read from wherever
/// the saved layout put its ranges.
#[test]
fn tensors_saved_whole_resume_sharded_and_the_other_way_round() {
    let dir = tempfile::tempdir().expect("tmp");
    let frozen = |ws: usize, shard: bool| {
        format!("fsdp(world_size={ws},sharding=zero3,bucket_mb=0.01,shard_frozen={shard})")
    };
    for (saved, resumed) in [(false, true), (true, false)] {
        let (ck, whole) = (dir.path().join("ck"), dir.path().join("whole"));
        let mut first = cfg("mlp-frozen", 2, 3, &frozen(2, saved));
        first.save = Some(ck.clone());
        run(&first);
        first.save = Some(whole.clone());
        first.save_format = SaveFormat::Whole;
        run(&first);
        let got = run(&resume(cfg("mlp-frozen", 4, 6, &frozen(4, resumed)), &ck));
        let want = run(&resume(
            cfg("mlp-frozen", 4, 6, &frozen(4, resumed)),
            &whole,
        ));
        assert_same_params(&got, &want, &format!("shard_frozen {saved} -> {resumed}"));
        // the frozen parameters (their moments never left zero) are exactly as saved
        let saved_ck = checkpoint::read(&ck).expect("read");
        let mut frozen_seen = 0;
        for (name, t) in got.param_names.iter().zip(&got.params[0]) {
            let still = saved_ck
                .exp_avg
                .get(name)
                .is_some_and(|m| m.to_f64_vec().iter().all(|x| *x == 0.0));
            if still {
                frozen_seen += 1;
                assert!(t.bitwise_eq(&saved_ck.params[name]), "`{name}` changed");
            }
        }
        assert!(frozen_seen > 0, "no frozen parameter");
    }
}
