//! Sharded checkpoints of an `fsdp` run: every rank writes only what it owns (its shard of each
//! bucket and of the optimizer moments; rank 0 also the unsharded tensors) to a file of its own,
//! and rank 0 then writes a manifest at the checkpoint's path that names those files, the
//! layout and every tensor's CRC-32. Nothing is gathered to save.
//!
//! Atomic as a whole: the rank files of a save carry a fresh id in their names
//! (`PATH.shards/ID.rank1-of-4.safetensors`), so they never overwrite the files the current
//! manifest names; the manifest is replaced last, by rename. A crash before that leaves the
//! previous checkpoint as it was (plus unreferenced files); after it, the new one is complete.
//! The previous save's files are removed once the new manifest is in place.
//!
//! A sharded checkpoint loads at any world size: a sharded run reads, rank by rank and one old
//! file at a time, only the ranges of its own new shards ([`ShardedCheckpoint::local`]); an
//! unsharded run and `tracepass.load_checkpoint` get whole tensors
//! ([`ShardedCheckpoint::whole`]).

use crate::tensor::file::{tensor_crc32, TensorFile};
use crate::tensor::Tensor;
use crate::train::checkpoint::CheckpointError;
use crate::train::model::Model;
use crate::train::optim::{Optimizer, OptimizerKind};
use crate::train::shard::ShardLayout;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tracepass_ir::DType;

/// The manifest's `format`, and its version (a reader refuses a newer one).
pub const MANIFEST_FORMAT: &str = "tracepass-sharded-checkpoint";
pub const MANIFEST_VERSION: u32 = 1;
/// The `format` metadata of a rank file.
const SHARD_FORMAT: &str = "tracepass-checkpoint-shard-1";

/// Which form `--save` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SaveFormat {
    /// Sharded when the run is sharded, else one file.
    #[default]
    Auto,
    /// One safetensors file of whole tensors (a sharded run gathers them).
    Whole,
    /// A manifest and one file per rank (sharded runs only).
    Sharded,
}

impl SaveFormat {
    pub fn parse(s: &str) -> Result<SaveFormat, String> {
        match s {
            "auto" => Ok(SaveFormat::Auto),
            "whole" => Ok(SaveFormat::Whole),
            "sharded" => Ok(SaveFormat::Sharded),
            _ => Err(format!(
                "checkpoint format `{s}`: expected auto, whole or sharded"
            )),
        }
    }
}

/// The index of a sharded checkpoint, written last.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// Names this save's rank files; differs from save to save.
    pub save_id: String,
    pub step: usize,
    /// `adamw` or `sgd`, and its hyper-parameters.
    pub optimizer: String,
    pub hyper_params: BTreeMap<String, f64>,
    pub optimizer_step: u64,
    pub world_size: usize,
    /// `zero2` or `zero3`, as the pipeline said (informational).
    pub sharding: Option<String>,
    pub tied: Vec<Vec<String>>,
    pub no_gradient: Vec<String>,
    /// Every parameter of the model, in order.
    pub params: Vec<ParamEntry>,
    pub buckets: Vec<BucketEntry>,
    /// One per rank, in rank order.
    pub files: Vec<FileEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ParamEntry {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// Where it lives when sharded; `None`: whole, in rank 0's file.
    pub bucket: Option<usize>,
    pub offset: usize,
    /// It holds optimizer state (not in `no_gradient`; a tie's primary when sharded).
    pub state: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BucketEntry {
    pub name: String,
    pub dtype: DType,
    /// Elements of the members, and the zeros after them.
    pub numel: usize,
    pub padding: usize,
    /// Elements of one rank's shard: `(numel + padding) / world_size`.
    pub shard_numel: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FileEntry {
    pub rank: usize,
    /// Relative to the checkpoint's `.shards` directory.
    pub file: String,
    pub bytes: u64,
    /// Tensor name -> CRC-32 (8 hex digits).
    pub crc32: BTreeMap<String, String>,
}

/// The directory of a sharded checkpoint's rank files: `PATH.shards` next to `PATH`.
pub fn shard_dir(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".shards");
    PathBuf::from(s)
}

fn rank_file_name(save_id: &str, rank: usize, world: usize) -> String {
    format!("{save_id}.rank{rank}-of-{world}.safetensors")
}

fn bucket_tensor(kind: &str, bucket: &str) -> String {
    format!("{kind}.shard_{bucket}")
}

pub(crate) fn kind_name(k: OptimizerKind) -> &'static str {
    match k {
        OptimizerKind::AdamW { .. } => "adamw",
        OptimizerKind::Sgd { .. } => "sgd",
    }
}

fn hyper_params(k: OptimizerKind) -> BTreeMap<String, f64> {
    let v: Vec<(&str, f64)> = match k {
        OptimizerKind::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => vec![
            ("lr", lr),
            ("beta1", beta1),
            ("beta2", beta2),
            ("eps", eps),
            ("weight_decay", weight_decay),
        ],
        OptimizerKind::Sgd { lr } => vec![("lr", lr)],
    };
    v.into_iter().map(|(k, x)| (k.to_string(), x)).collect()
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Io {
        path: path.display().to_string(),
        what: e.to_string(),
    }
}

/// What one rank writes: its shard of every bucket (parameters and both moments) and, on rank
/// 0, the unsharded parameters with their moments.
pub struct RankSave<'a> {
    pub path: &'a Path,
    pub save_id: &'a str,
    pub rank: usize,
    pub layout: &'a ShardLayout,
    pub model: &'a Model,
    /// The rank's local list (see [`ShardLayout::shard_params`]) and optimizer over it.
    pub params: &'a [Tensor],
    pub opt: &'a Optimizer,
}

impl RankSave<'_> {
    /// Writes the rank's file (atomically: temp file, fsync, rename); its size in bytes.
    pub fn write(&self) -> Result<u64, CheckpointError> {
        let l = self.layout;
        let n = l.place.len();
        let names = self.model.param_names();
        let (_, m, v) = self.opt.state();
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        let moments = |i: usize, tensors: &mut Vec<(String, Tensor)>, name: &str| {
            if self.opt.is_stateless(i) {
                return;
            }
            if let (Some(m), Some(v)) = (m.get(i), v.get(i)) {
                for (k, x) in [("exp_avg", m), ("exp_avg_sq", v)] {
                    tensors.push((
                        format!("{k}.{name}"),
                        Tensor::from_f32(vec![x.len()], x.clone()),
                    ));
                }
            }
        };
        if self.rank == 0 {
            for (j, name) in names.iter().enumerate() {
                if l.place[j].is_none() {
                    tensors.push((format!("param.{name}"), self.params[j].clone()));
                    moments(j, &mut tensors, name);
                }
            }
        }
        for (bi, b) in l.buckets.iter().enumerate() {
            let shard = format!("shard_{}", b.name);
            let t = self.params.get(n + bi).ok_or_else(|| {
                io_err(
                    self.path,
                    format!("rank {} holds no shard of {}", self.rank, b.name),
                )
            })?;
            tensors.push((format!("param.{shard}"), t.clone()));
            moments(n + bi, &mut tensors, &shard);
        }
        let meta: BTreeMap<String, String> = [
            ("format".to_string(), SHARD_FORMAT.to_string()),
            ("save_id".to_string(), self.save_id.to_string()),
            ("rank".to_string(), self.rank.to_string()),
            ("world_size".to_string(), l.world_size.to_string()),
        ]
        .into_iter()
        .chain(
            tensors
                .iter()
                .map(|(n, t)| (format!("crc32.{n}"), format!("{:08x}", tensor_crc32(t)))),
        )
        .collect();
        let dir = shard_dir(self.path);
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let file = dir.join(rank_file_name(self.save_id, self.rank, l.world_size));
        crate::tensor::file::save_tensors_with(&file, &tensors, &meta)?;
        Ok(std::fs::metadata(&file).map_or(0, |m| m.len()))
    }
}

/// What rank 0 records beyond the layout when it writes the manifest.
pub struct ManifestInfo<'a> {
    pub path: &'a Path,
    pub save_id: &'a str,
    pub step: usize,
    pub layout: &'a ShardLayout,
    pub model: &'a Model,
    pub opt: &'a Optimizer,
    pub sharding: Option<String>,
}

/// Rank 0, once every rank's file is written: reads their headers (the CRC-32s each rank
/// computed), writes the manifest atomically over `path`, then removes the files of the
/// checkpoint it replaced.
pub fn write_manifest(info: &ManifestInfo) -> Result<Manifest, CheckpointError> {
    let l = info.layout;
    let names = info.model.param_names();
    let unused = info.model.unused_mask();
    let dir = shard_dir(info.path);
    let mut files = Vec::with_capacity(l.world_size);
    for rank in 0..l.world_size {
        let file = rank_file_name(info.save_id, rank, l.world_size);
        let p = dir.join(&file);
        let meta = crate::tensor::file::read_metadata(&p)?;
        let crc32 = meta
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("crc32.").map(|n| (n.to_string(), v.clone())))
            .collect();
        let bytes = std::fs::metadata(&p).map_err(|e| io_err(&p, e))?.len();
        files.push(FileEntry {
            rank,
            file,
            bytes,
            crc32,
        });
    }
    let params = (0..l.place.len())
        .map(|j| {
            let (bucket, offset) = match l.place[j] {
                Some((bi, off)) => (Some(bi), off),
                None => (None, 0),
            };
            let primary = bucket.is_none_or(|bi| l.buckets[bi].members.iter().any(|m| m.0 == j));
            ParamEntry {
                name: names[j].clone(),
                shape: l.shapes[j].clone(),
                dtype: l.dtypes[j],
                bucket,
                offset,
                state: !unused.get(j).copied().unwrap_or(false) && primary,
            }
        })
        .collect();
    let (opt_step, _, _) = info.opt.state();
    let manifest = Manifest {
        format: MANIFEST_FORMAT.to_string(),
        version: MANIFEST_VERSION,
        save_id: info.save_id.to_string(),
        step: info.step,
        optimizer: kind_name(info.opt.kind()).to_string(),
        hyper_params: hyper_params(info.opt.kind()),
        optimizer_step: opt_step,
        world_size: l.world_size,
        sharding: info.sharding.clone(),
        tied: info
            .model
            .ties
            .iter()
            .map(|g| g.iter().map(|&i| names[i].clone()).collect())
            .collect(),
        no_gradient: info
            .model
            .program
            .unused_params()
            .into_iter()
            .map(str::to_string)
            .collect(),
        params,
        buckets: l
            .buckets
            .iter()
            .map(|b| BucketEntry {
                name: b.name.clone(),
                dtype: b.dtype,
                numel: b.numel,
                padding: b.padding,
                shard_numel: b.shard_numel(l.world_size),
            })
            .collect(),
        files,
    };
    // the checkpoint this one replaces: its files go once the new manifest is in place
    let previous = ShardedCheckpoint::open(info.path).ok().flatten();
    let json = serde_json::to_string_pretty(&manifest).map_err(|e| io_err(info.path, e))?;
    tracepass_ir::fsio::write_atomic(info.path, json.as_bytes())
        .map_err(|e| io_err(info.path, e))?;
    if let Some(prev) = previous.filter(|p| p.manifest.save_id != manifest.save_id) {
        prev.remove_files();
    }
    remove_orphans(&dir, &manifest);
    Ok(manifest)
}

/// Removes rank files in `dir` that `manifest` does not name: those of saves that stopped
/// before their manifest. No other save of this run is writing now (every rank waits for
/// rank 0 at the next save's first all-reduce), so none is in progress.
fn remove_orphans(dir: &Path, manifest: &Manifest) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with("step")
            && name.ends_with(".safetensors")
            && name.contains(".rank")
            && name.contains("-of-");
        if ours && !manifest.files.iter().any(|f| f.file == name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Parameters (or a rank's local list) with their first and second moments.
pub type State = (Vec<Tensor>, Vec<Vec<f32>>, Vec<Vec<f32>>);

/// A sharded checkpoint on disk: its manifest, read and checked.
#[derive(Clone, Debug)]
pub struct ShardedCheckpoint {
    pub path: PathBuf,
    pub dir: PathBuf,
    pub manifest: Manifest,
}

/// Where a range of a wanted tensor comes from.
enum Source {
    /// Elements `start..start + len` of tensor `name` in rank `rank`'s file.
    Read {
        rank: usize,
        name: String,
        start: usize,
        len: usize,
    },
    Zeros(usize),
}

/// What to read: parameter values or one of the moments.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Param,
    ExpAvg,
    ExpAvgSq,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Param => "param",
            Kind::ExpAvg => "exp_avg",
            Kind::ExpAvgSq => "exp_avg_sq",
        }
    }
}

/// A tensor to assemble: its pieces in order.
struct Want {
    dtype: DType,
    shape: Vec<usize>,
    pieces: Vec<Source>,
}

impl ShardedCheckpoint {
    /// Reads the manifest at `path`; `None` when `path` is not one (a whole checkpoint).
    pub fn open(path: &Path) -> Result<Option<ShardedCheckpoint>, CheckpointError> {
        let p = path.display().to_string();
        // a file that cannot be opened is the whole-checkpoint reader's to report
        let Ok(mut file) = std::fs::File::open(path) else {
            return Ok(None);
        };
        // sniff the head only: a whole checkpoint may be large
        let mut head = Vec::with_capacity(256);
        std::io::Read::read_to_end(&mut std::io::Read::take(&mut file, 256), &mut head)
            .map_err(|e| io_err(path, e))?;
        if !head.starts_with(b"{") || !String::from_utf8_lossy(&head).contains(MANIFEST_FORMAT) {
            return Ok(None);
        }
        let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Format {
                path: p.clone(),
                what: format!("a sharded checkpoint manifest that does not parse: {e}"),
            })?;
        if manifest.format != MANIFEST_FORMAT || manifest.version > MANIFEST_VERSION {
            return Err(CheckpointError::Format {
                path: p,
                what: format!(
                    "format `{}` version {}, expected `{MANIFEST_FORMAT}` version {MANIFEST_VERSION} or older",
                    manifest.format, manifest.version
                ),
            });
        }
        let ck = ShardedCheckpoint {
            path: path.to_path_buf(),
            dir: shard_dir(path),
            manifest,
        };
        ck.check_consistent()?;
        Ok(Some(ck))
    }

    /// Removes the rank files this manifest names (it was replaced), and their directory once
    /// empty. Best effort: a file left behind is unreferenced, never read.
    pub fn remove_files(&self) {
        for f in &self.manifest.files {
            let _ = std::fs::remove_file(self.dir.join(&f.file));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }

    fn mismatch(&self, what: String) -> CheckpointError {
        CheckpointError::Mismatch {
            path: self.path.display().to_string(),
            what,
        }
    }

    /// The manifest agrees with itself: one file per rank, every bucket splits evenly, every
    /// sharded parameter inside its bucket.
    fn check_consistent(&self) -> Result<(), CheckpointError> {
        let m = &self.manifest;
        let ranks: Vec<usize> = m.files.iter().map(|f| f.rank).collect();
        if m.world_size == 0 || ranks != (0..m.world_size).collect::<Vec<_>>() {
            return Err(self.mismatch(format!(
                "the manifest lists files for ranks {ranks:?}, but world size {}",
                m.world_size
            )));
        }
        for b in &m.buckets {
            if b.shard_numel * m.world_size != b.numel + b.padding {
                return Err(self.mismatch(format!(
                    "bucket {}: shards of {} elements on {} ranks do not make {} + {}",
                    b.name, b.shard_numel, m.world_size, b.numel, b.padding
                )));
            }
        }
        for p in &m.params {
            if let Some(bi) = p.bucket {
                let numel: usize = p.shape.iter().product();
                match m.buckets.get(bi) {
                    Some(b) if p.offset + numel <= b.numel => {}
                    _ => {
                        return Err(self.mismatch(format!(
                            "parameter `{}` lies outside its bucket {bi}",
                            p.name
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// Refuses a model whose parameters differ from the manifest's (names, shapes, dtypes) or
    /// an optimizer of another kind.
    pub fn check_model(
        &self,
        names: &[String],
        shapes: &[Vec<usize>],
        dtypes: Option<&[DType]>,
        kind: OptimizerKind,
    ) -> Result<(), CheckpointError> {
        let m = &self.manifest;
        if m.optimizer != kind_name(kind) {
            return Err(self.mismatch(format!(
                "saved by {}, but this run uses {}",
                m.optimizer,
                kind_name(kind)
            )));
        }
        let saved: Vec<&str> = m.params.iter().map(|p| p.name.as_str()).collect();
        if saved != names.iter().map(String::as_str).collect::<Vec<_>>() {
            let missing: Vec<&String> = names
                .iter()
                .filter(|n| !saved.contains(&n.as_str()))
                .collect();
            return Err(self.mismatch(format!(
                "its parameters are not the model's (the model has {} and the checkpoint {}; not in the checkpoint: {missing:?})",
                names.len(),
                saved.len()
            )));
        }
        for (j, (p, shape)) in m.params.iter().zip(shapes).enumerate() {
            let dtype = dtypes.and_then(|d| d.get(j)).copied().unwrap_or(p.dtype);
            if &p.shape != shape || p.dtype != dtype {
                return Err(self.mismatch(format!(
                    "parameter `{}` is {} {:?} but the model's is {dtype} {shape:?}",
                    p.name, p.dtype, p.shape
                )));
            }
        }
        Ok(())
    }

    /// Rank `rank`'s file, checked against the manifest and every tensor against its CRC-32.
    fn load_file(&self, rank: usize) -> Result<TensorFile, CheckpointError> {
        let entry = &self.manifest.files[rank];
        let path = self.dir.join(&entry.file);
        let p = path.display().to_string();
        if !path.exists() {
            return Err(CheckpointError::MissingShard {
                path: p,
                rank,
                manifest: self.path.display().to_string(),
            });
        }
        let f = TensorFile::load(&path)?;
        let meta = |k: &str| f.metadata.get(k).map(String::as_str);
        if meta("format") != Some(SHARD_FORMAT)
            || meta("save_id") != Some(self.manifest.save_id.as_str())
            || meta("rank") != Some(rank.to_string().as_str())
        {
            return Err(CheckpointError::Mismatch {
                path: p,
                what: format!(
                    "not rank {rank}'s file of save {} that the manifest {} names",
                    self.manifest.save_id,
                    self.path.display()
                ),
            });
        }
        let names: Vec<&String> = f.tensors.keys().collect();
        if names != entry.crc32.keys().collect::<Vec<_>>() {
            return Err(CheckpointError::Mismatch {
                path: p,
                what: format!(
                    "holds tensors {names:?}, the manifest {:?}",
                    entry.crc32.keys().collect::<Vec<_>>()
                ),
            });
        }
        for (name, t) in &f.tensors {
            let got = format!("{:08x}", tensor_crc32(t));
            if entry.crc32.get(name) != Some(&got) || meta(&format!("crc32.{name}")) != Some(&got) {
                return Err(CheckpointError::Corrupt {
                    path: p,
                    what: format!(
                        "tensor `{name}` does not match its checksum (CRC-32 {got}, manifest {})",
                        entry.crc32.get(name).map_or("none", String::as_str)
                    ),
                });
            }
        }
        Ok(f)
    }

    /// Where elements `start..start + len` of parameter `j`'s `kind` are saved.
    fn locate(&self, j: usize, kind: Kind, start: usize, len: usize) -> Vec<Source> {
        let m = &self.manifest;
        let p = &m.params[j];
        if kind != Kind::Param && !p.state {
            return vec![Source::Zeros(len)];
        }
        let Some(bi) = p.bucket else {
            return vec![Source::Read {
                rank: 0,
                name: format!("{}.{}", kind.prefix(), p.name),
                start,
                len,
            }];
        };
        let b = &m.buckets[bi];
        let name = bucket_tensor(kind.prefix(), &b.name);
        let (mut at, end) = (p.offset + start, p.offset + start + len);
        let mut out = Vec::new();
        while at < end {
            let rank = at / b.shard_numel;
            let within = at % b.shard_numel;
            let n = (b.shard_numel - within).min(end - at);
            out.push(Source::Read {
                rank,
                name: name.clone(),
                start: within,
                len: n,
            });
            at += n;
        }
        out
    }

    /// Assembles `wants`, reading one rank file at a time (only those some piece needs).
    fn assemble(&self, wants: &[Want]) -> Result<Vec<Tensor>, CheckpointError> {
        let mut pieces: Vec<Vec<Option<Tensor>>> = wants
            .iter()
            .map(|w| (0..w.pieces.len()).map(|_| None).collect())
            .collect();
        for rank in 0..self.manifest.world_size {
            let needed = wants.iter().any(|w| {
                w.pieces
                    .iter()
                    .any(|s| matches!(s, Source::Read { rank: r, .. } if *r == rank))
            });
            if !needed {
                continue;
            }
            let f = self.load_file(rank)?;
            for (wi, w) in wants.iter().enumerate() {
                for (pi, s) in w.pieces.iter().enumerate() {
                    let Source::Read {
                        rank: r,
                        name,
                        start,
                        len,
                    } = s
                    else {
                        continue;
                    };
                    if *r != rank {
                        continue;
                    }
                    let t = f.get(name).map_err(|_| CheckpointError::Mismatch {
                        path: f.path.display().to_string(),
                        what: format!("no tensor `{name}`, which the manifest places there"),
                    })?;
                    let piece = t
                        .flat_range(*start, *len)
                        .and_then(|x| x.to_dtype(w.dtype))
                        .ok_or_else(|| CheckpointError::Mismatch {
                            path: f.path.display().to_string(),
                            what: format!(
                                "tensor `{name}` of {} {} elements has no {} elements {start}..{}",
                                t.numel(),
                                t.dtype(),
                                w.dtype,
                                start + len
                            ),
                        })?;
                    pieces[wi][pi] = Some(piece);
                }
            }
        }
        wants
            .iter()
            .zip(pieces)
            .map(|(w, ps)| {
                let parts: Vec<Tensor> = w
                    .pieces
                    .iter()
                    .zip(ps)
                    .map(|(s, p)| match (s, p) {
                        (_, Some(t)) => Some(t),
                        (Source::Zeros(n), None) => Tensor::zeros(vec![*n], w.dtype),
                        (Source::Read { .. }, None) => None,
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(|| self.mismatch("a piece of a tensor was not read".into()))?;
                let flat = if parts.is_empty() {
                    Tensor::zeros(vec![0], w.dtype)
                } else {
                    Tensor::cat_flat(&parts)
                }
                .ok_or_else(|| self.mismatch(format!("no {} tensors", w.dtype)))?;
                flat.reshape(w.shape.clone()).map_err(|e| self.mismatch(e))
            })
            .collect()
    }

    fn whole_want(&self, j: usize, kind: Kind) -> Want {
        let p = &self.manifest.params[j];
        let numel: usize = p.shape.iter().product();
        Want {
            dtype: if kind == Kind::Param {
                p.dtype
            } else {
                DType::F32
            },
            shape: if kind == Kind::Param {
                p.shape.clone()
            } else {
                vec![numel]
            },
            pieces: self.locate(j, kind, 0, numel),
        }
    }

    /// Every parameter whole, and the moments of those that keep state (empty for the
    /// others, as [`crate::train::checkpoint::load`] gives them).
    pub fn whole(&self) -> Result<State, CheckpointError> {
        let n = self.manifest.params.len();
        let no_grad = |j: usize| {
            self.manifest
                .no_gradient
                .contains(&self.manifest.params[j].name)
        };
        let mut wants: Vec<Want> = (0..n).map(|j| self.whole_want(j, Kind::Param)).collect();
        let stateful: Vec<usize> = (0..n).filter(|&j| !no_grad(j)).collect();
        for kind in [Kind::ExpAvg, Kind::ExpAvgSq] {
            wants.extend(stateful.iter().map(|&j| self.whole_want(j, kind)));
        }
        let mut got = self.assemble(&wants)?.into_iter();
        let params: Vec<Tensor> = got.by_ref().take(n).collect();
        let mut moments = [vec![Vec::new(); n], vec![Vec::new(); n]];
        for m in &mut moments {
            for &j in &stateful {
                m[j] = got.next().map(|t| t.to_f32_vec()).unwrap_or_default();
            }
        }
        let [m, v] = moments;
        Ok((params, m, v))
    }

    /// Rank `rank`'s local list under `layout` (the run's, of any world size) and its
    /// moments, read from the ranges that hold them: no rank assembles the whole model.
    /// Without `buckets`, only the unsharded parameters (the shards as empty placeholders).
    pub fn local(
        &self,
        layout: &ShardLayout,
        rank: usize,
        buckets: bool,
    ) -> Result<State, CheckpointError> {
        let n = layout.place.len();
        let mut wants: Vec<Want> = Vec::new();
        let mut moment_wants: Vec<(usize, Kind, Want)> = Vec::new();
        for j in 0..n {
            match layout.place[j] {
                None => {
                    wants.push(self.whole_want(j, Kind::Param));
                    for kind in [Kind::ExpAvg, Kind::ExpAvgSq] {
                        moment_wants.push((j, kind, self.whole_want(j, kind)));
                    }
                }
                Some(_) => wants.push(Want {
                    dtype: layout.dtypes[j],
                    shape: vec![0],
                    pieces: Vec::new(),
                }),
            }
        }
        if buckets {
            for (bi, b) in layout.buckets.iter().enumerate() {
                let sn = b.shard_numel(layout.world_size);
                let (lo, hi) = (rank * sn, (rank + 1) * sn);
                let segs = |kind: Kind| {
                    let mut pieces = Vec::new();
                    let mut at = lo;
                    for &(i, off, numel) in &b.members {
                        let (a, e) = (off.max(at), (off + numel).min(hi));
                        if a >= e {
                            continue;
                        }
                        if a > at {
                            pieces.push(Source::Zeros(a - at));
                        }
                        pieces.extend(self.locate(i, kind, a - off, e - a));
                        at = e;
                    }
                    if at < hi {
                        pieces.push(Source::Zeros(hi - at));
                    }
                    pieces
                };
                wants.push(Want {
                    dtype: b.dtype,
                    shape: vec![sn],
                    pieces: segs(Kind::Param),
                });
                for kind in [Kind::ExpAvg, Kind::ExpAvgSq] {
                    moment_wants.push((
                        n + bi,
                        kind,
                        Want {
                            dtype: DType::F32,
                            shape: vec![sn],
                            pieces: segs(kind),
                        },
                    ));
                }
            }
        }
        let total = n + if buckets { layout.buckets.len() } else { 0 };
        let n_params = wants.len();
        let (keys, mw): (Vec<(usize, Kind)>, Vec<Want>) = moment_wants
            .into_iter()
            .map(|(i, k, w)| ((i, k), w))
            .unzip();
        wants.extend(mw);
        let mut got = self.assemble(&wants)?.into_iter();
        let params: Vec<Tensor> = got.by_ref().take(n_params).collect();
        let (mut m, mut v) = (vec![Vec::new(); total], vec![Vec::new(); total]);
        for ((i, kind), t) in keys.into_iter().zip(got) {
            let into = if kind == Kind::ExpAvg { &mut m } else { &mut v };
            into[i] = t.to_f32_vec();
        }
        Ok((params, m, v))
    }
}
