//! Training checkpoints: parameters, optimizer state and the step, in one safetensors file,
//! written atomically, so a run resumes exactly where it stopped. Each tensor's CRC-32 is in
//! the metadata (`crc32.<tensor>`), so a flipped bit is refused instead of resumed.

use crate::tensor::file::{save_tensors_with, tensor_crc32, TensorFile};
use crate::tensor::Tensor;
use crate::train::optim::{Optimizer, OptimizerKind};
use crate::train::sharded_checkpoint::ShardedCheckpoint;
use std::collections::BTreeMap;
use std::path::Path;

const FORMAT: &str = "tracepass-checkpoint-2";
/// Checkpoints written before checksums: read without an integrity check.
const FORMAT_WITHOUT_CHECKSUMS: &str = "tracepass-checkpoint-1";
/// The metadata key of a tensor's CRC-32 (8 hex digits).
fn crc_key(tensor: &str) -> String {
    format!("crc32.{tensor}")
}
/// Metadata key of the parameters that had no gradient (comma-separated names): they have no
/// optimizer state in the file.
pub const NO_GRADIENT: &str = "no_gradient";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{0}")]
    File(#[from] crate::tensor::file::TensorFileError),
    #[error("{path}: not a tracepass checkpoint ({what})")]
    Format { path: String, what: String },
    #[error("{path}: {what}")]
    Mismatch { path: String, what: String },
    /// A rank file a sharded checkpoint's manifest names is not there.
    #[error("{path}: rank {rank}'s file of the sharded checkpoint {manifest} is missing; the checkpoint cannot be loaded without it")]
    MissingShard {
        path: String,
        rank: usize,
        manifest: String,
    },
    /// A file or directory of a checkpoint that cannot be read or written.
    #[error("{path}: {what}")]
    Io { path: String, what: String },
    /// A tensor whose bytes changed since it was saved (a flipped bit, a partial copy).
    #[error("{path}: the checkpoint is damaged: {what}; resume from another copy")]
    Corrupt { path: String, what: String },
}

/// What a checkpoint restores.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Optimizer steps completed: the run resumes with this step.
    pub step: usize,
    pub params: Vec<Tensor>,
    pub optimizer_step: u64,
    pub exp_avg: Vec<Vec<f32>>,
    pub exp_avg_sq: Vec<Vec<f32>>,
    /// The number of ranks that trained it (`None`: not recorded, as in older checkpoints).
    pub world_size: Option<usize>,
    /// Groups of parameter names that are one tensor, the one the others are tied to first
    /// (empty: none, or not recorded, as in older checkpoints). Readers outside the runtime
    /// (`tracepass.load_checkpoint`) need it to give PyTorch one shared tensor per group.
    pub tied: Vec<Vec<String>>,
    /// A sharded checkpoint this was read from: a sharded run reads its own shards from it
    /// ([`ShardedCheckpoint::local`]) instead of cutting them from `params`.
    pub sharded: Option<ShardedCheckpoint>,
}

fn kind_name(k: OptimizerKind) -> &'static str {
    match k {
        OptimizerKind::AdamW { .. } => "adamw",
        OptimizerKind::Sgd { .. } => "sgd",
    }
}

/// Writes `params` (named `names`), `opt`'s state and `step` to `path`.
pub fn save(
    path: &Path,
    step: usize,
    names: &[String],
    params: &[Tensor],
    opt: &Optimizer,
) -> Result<(), CheckpointError> {
    save_for(path, step, names, params, opt, None)
}

/// As [`save`], recording the world size that trained it (a resume must use the same).
pub fn save_for(
    path: &Path,
    step: usize,
    names: &[String],
    params: &[Tensor],
    opt: &Optimizer,
    world_size: Option<usize>,
) -> Result<(), CheckpointError> {
    save_tied(path, step, names, params, opt, world_size, &[])
}

/// As [`save_for`], recording which parameters are one tensor (`ties`: index groups into
/// `names`, the primary first) in the `tied` metadata, as JSON name groups.
pub fn save_tied(
    path: &Path,
    step: usize,
    names: &[String],
    params: &[Tensor],
    opt: &Optimizer,
    world_size: Option<usize>,
    ties: &[Vec<usize>],
) -> Result<(), CheckpointError> {
    let (opt_step, m, v) = opt.state();
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let mut no_gradient: Vec<&str> = Vec::new();
    for (i, (n, p)) in names.iter().zip(params).enumerate() {
        tensors.push((format!("param.{n}"), p.clone()));
        if opt.is_stateless(i) {
            // no gradient, so no optimizer state: said in the metadata, not written as zeros
            no_gradient.push(n);
            continue;
        }
        if let (Some(m), Some(v)) = (m.get(i), v.get(i)) {
            tensors.push((
                format!("exp_avg.{n}"),
                Tensor::from_f32(vec![m.len()], m.clone()),
            ));
            tensors.push((
                format!("exp_avg_sq.{n}"),
                Tensor::from_f32(vec![v.len()], v.clone()),
            ));
        }
    }
    let meta: BTreeMap<String, String> = [
        ("format".to_string(), FORMAT.to_string()),
        ("step".to_string(), step.to_string()),
        ("optimizer".to_string(), kind_name(opt.kind()).to_string()),
        ("optimizer_step".to_string(), opt_step.to_string()),
    ]
    .into_iter()
    .chain(world_size.map(|w| ("world_size".to_string(), w.to_string())))
    .chain(tied_metadata(names, ties).map(|t| ("tied".to_string(), t)))
    .chain((!no_gradient.is_empty()).then(|| (NO_GRADIENT.to_string(), no_gradient.join(","))))
    .chain(
        tensors
            .iter()
            .map(|(n, t)| (crc_key(n), format!("{:08x}", tensor_crc32(t)))),
    )
    .collect();
    // a sharded checkpoint this replaces: its rank files go once the new file is in place
    let previous = ShardedCheckpoint::open(path).ok().flatten();
    save_tensors_with(path, &tensors, &meta)?;
    if let Some(prev) = previous {
        prev.remove_files();
    }
    Ok(())
}

/// The `tied` metadata: name groups as JSON, or `None` when nothing is tied.
fn tied_metadata(names: &[String], ties: &[Vec<usize>]) -> Option<String> {
    let groups: Vec<Vec<&str>> = ties
        .iter()
        .map(|g| {
            g.iter()
                .filter_map(|&i| names.get(i).map(String::as_str))
                .collect()
        })
        .filter(|g: &Vec<&str>| g.len() > 1)
        .collect();
    (!groups.is_empty()).then(|| serde_json::to_string(&groups).unwrap_or_default())
}

/// A checkpoint's metadata, checked.
struct Header {
    step: usize,
    optimizer: String,
    optimizer_step: u64,
    world_size: Option<usize>,
    tied: Vec<Vec<String>>,
    /// Parameters saved without optimizer state: they had no gradient.
    no_gradient: Vec<String>,
}

/// Checks the metadata and, from format 2 on, every tensor against its CRC-32.
fn header(f: &TensorFile, p: &str) -> Result<Header, CheckpointError> {
    let meta = |k: &str| {
        f.metadata
            .get(k)
            .cloned()
            .ok_or_else(|| CheckpointError::Format {
                path: p.to_string(),
                what: format!("no `{k}` in its metadata"),
            })
    };
    let format = meta("format")?;
    if format != FORMAT && format != FORMAT_WITHOUT_CHECKSUMS {
        return Err(CheckpointError::Format {
            path: p.to_string(),
            what: format!("format `{format}`, expected `{FORMAT}`"),
        });
    }
    if format == FORMAT {
        for (name, t) in &f.tensors {
            let Some(want) = f.metadata.get(&crc_key(name)) else {
                return Err(CheckpointError::Corrupt {
                    path: p.to_string(),
                    what: format!("tensor `{name}` has no checksum (`{}`)", crc_key(name)),
                });
            };
            let got = format!("{:08x}", tensor_crc32(t));
            if *want != got {
                return Err(CheckpointError::Corrupt {
                    path: p.to_string(),
                    what: format!(
                        "tensor `{name}` does not match its checksum (CRC-32 {got}, saved {want})"
                    ),
                });
            }
        }
    }
    let num = |k: &str| -> Result<u64, CheckpointError> {
        meta(k)?.parse().map_err(|_| CheckpointError::Format {
            path: p.to_string(),
            what: format!("`{k}` is not a number"),
        })
    };
    let world_size = match f.metadata.get("world_size") {
        Some(_) => Some(num("world_size")? as usize),
        None => None,
    };
    let tied = match f.metadata.get("tied") {
        Some(t) => serde_json::from_str(t).map_err(|e| CheckpointError::Format {
            path: p.to_string(),
            what: format!("`tied` is not a JSON list of name groups: {e}"),
        })?,
        None => Vec::new(),
    };
    Ok(Header {
        step: num("step")? as usize,
        optimizer: meta("optimizer")?,
        optimizer_step: num("optimizer_step")?,
        world_size,
        tied,
        no_gradient: f
            .metadata
            .get(NO_GRADIENT)
            .map_or_else(Vec::new, |s| s.split(',').map(str::to_string).collect()),
    })
}

/// Everything a checkpoint holds, by name: for readers that do not know the model
/// (`tracepass.load_checkpoint` gives it to PyTorch).
#[derive(Debug, Clone)]
pub struct CheckpointContents {
    /// Optimizer steps completed.
    pub step: usize,
    /// `adamw` or `sgd`.
    pub optimizer: String,
    /// The optimizer's own step count.
    pub optimizer_step: u64,
    /// The number of ranks that trained it, when recorded.
    pub world_size: Option<usize>,
    /// Groups of parameter names that are one tensor, the primary first.
    pub tied: Vec<Vec<String>>,
    /// Trainable parameters that had no gradient (the loss never reaches them): no optimizer
    /// state is saved for them.
    pub no_gradient: Vec<String>,
    /// Parameters and buffers by fully qualified name.
    pub params: BTreeMap<String, Tensor>,
    /// The optimizer's first moments by parameter name (flat, as the runtime keeps them).
    pub exp_avg: BTreeMap<String, Tensor>,
    /// The optimizer's second moments by parameter name (flat).
    pub exp_avg_sq: BTreeMap<String, Tensor>,
}

/// Reads a whole checkpoint without knowing the model.
pub fn read(path: &Path) -> Result<CheckpointContents, CheckpointError> {
    if let Some(s) = ShardedCheckpoint::open(path)? {
        return read_sharded(&s);
    }
    let f = TensorFile::load(path)?;
    let h = header(&f, &path.display().to_string())?;
    let mut ck = CheckpointContents {
        step: h.step,
        optimizer: h.optimizer,
        optimizer_step: h.optimizer_step,
        world_size: h.world_size,
        tied: h.tied,
        no_gradient: h.no_gradient,
        params: BTreeMap::new(),
        exp_avg: BTreeMap::new(),
        exp_avg_sq: BTreeMap::new(),
    };
    for (name, t) in f.tensors {
        let (into, n) = if let Some(n) = name.strip_prefix("param.") {
            (&mut ck.params, n)
        } else if let Some(n) = name.strip_prefix("exp_avg_sq.") {
            (&mut ck.exp_avg_sq, n)
        } else if let Some(n) = name.strip_prefix("exp_avg.") {
            (&mut ck.exp_avg, n)
        } else {
            return Err(CheckpointError::Format {
                path: path.display().to_string(),
                what: format!("tensor `{name}` is neither a parameter nor optimizer state"),
            });
        };
        into.insert(n.to_string(), t);
    }
    Ok(ck)
}

/// A sharded checkpoint's contents as whole tensors.
fn read_sharded(s: &ShardedCheckpoint) -> Result<CheckpointContents, CheckpointError> {
    let (params, m, v) = s.whole()?;
    let man = &s.manifest;
    let mut ck = CheckpointContents {
        step: man.step,
        optimizer: man.optimizer.clone(),
        optimizer_step: man.optimizer_step,
        world_size: Some(man.world_size),
        tied: man.tied.clone(),
        no_gradient: man.no_gradient.clone(),
        params: BTreeMap::new(),
        exp_avg: BTreeMap::new(),
        exp_avg_sq: BTreeMap::new(),
    };
    for (j, (p, t)) in man.params.iter().zip(params).enumerate() {
        ck.params.insert(p.name.clone(), t);
        if !man.no_gradient.contains(&p.name) {
            for (into, x) in [(&mut ck.exp_avg, &m[j]), (&mut ck.exp_avg_sq, &v[j])] {
                into.insert(p.name.clone(), Tensor::from_f32(vec![x.len()], x.clone()));
            }
        }
    }
    Ok(ck)
}

/// Reads a checkpoint of either form for a model with parameters `names` of shapes `shapes`
/// (and dtypes `dtypes`, checked against a sharded one), trained by `kind`. With `layout` (a
/// sharded run's), a sharded checkpoint is not assembled: `params` holds the unsharded
/// parameters whole and empty placeholders for the sharded ones, and each rank reads its own
/// shards from [`Checkpoint::sharded`].
pub fn load_any(
    path: &Path,
    names: &[String],
    shapes: &[Vec<usize>],
    dtypes: Option<&[tracepass_ir::DType]>,
    kind: OptimizerKind,
    layout: Option<&crate::train::shard::ShardLayout>,
) -> Result<Checkpoint, CheckpointError> {
    match ShardedCheckpoint::open(path)? {
        Some(s) => from_sharded(s, names, shapes, dtypes, kind, layout),
        None => load(path, names, shapes, kind),
    }
}

fn from_sharded(
    s: ShardedCheckpoint,
    names: &[String],
    shapes: &[Vec<usize>],
    dtypes: Option<&[tracepass_ir::DType]>,
    kind: OptimizerKind,
    layout: Option<&crate::train::shard::ShardLayout>,
) -> Result<Checkpoint, CheckpointError> {
    s.check_model(names, shapes, dtypes, kind)?;
    let (params, exp_avg, exp_avg_sq) = match layout {
        Some(l) => (s.local(l, 0, false)?.0, Vec::new(), Vec::new()),
        None => s.whole()?,
    };
    let man = s.manifest.clone();
    Ok(Checkpoint {
        step: man.step,
        params,
        optimizer_step: man.optimizer_step,
        exp_avg,
        exp_avg_sq,
        world_size: Some(man.world_size),
        tied: man.tied.clone(),
        sharded: layout.is_some().then_some(s),
    })
}

/// Reads a checkpoint for a model with parameters `names` of shapes `shapes`, trained by `kind`.
pub fn load(
    path: &Path,
    names: &[String],
    shapes: &[Vec<usize>],
    kind: OptimizerKind,
) -> Result<Checkpoint, CheckpointError> {
    if let Some(s) = ShardedCheckpoint::open(path)? {
        return from_sharded(s, names, shapes, None, kind, None);
    }
    let f = TensorFile::load(path)?;
    let p = path.display().to_string();
    let h = header(&f, &p)?;
    if h.optimizer != kind_name(kind) {
        return Err(CheckpointError::Mismatch {
            path: p.clone(),
            what: format!(
                "saved by {}, but this run uses {}",
                h.optimizer,
                kind_name(kind)
            ),
        });
    }
    let mut ck = Checkpoint {
        step: h.step,
        params: Vec::new(),
        optimizer_step: h.optimizer_step,
        exp_avg: Vec::new(),
        exp_avg_sq: Vec::new(),
        world_size: h.world_size,
        tied: h.tied,
        sharded: None,
    };
    for (n, shape) in names.iter().zip(shapes) {
        let t = f.get(&format!("param.{n}"))?;
        if t.shape() != shape.as_slice() {
            return Err(CheckpointError::Mismatch {
                path: p.clone(),
                what: format!(
                    "parameter `{n}` has shape {:?} but the model's is {shape:?}",
                    t.shape()
                ),
            });
        }
        ck.params.push(t.clone());
        let numel: usize = shape.iter().product();
        if h.no_gradient.contains(n) {
            ck.exp_avg.push(Vec::new());
            ck.exp_avg_sq.push(Vec::new());
            continue;
        }
        for (key, into) in [
            ("exp_avg", &mut ck.exp_avg),
            ("exp_avg_sq", &mut ck.exp_avg_sq),
        ] {
            let m = f.get(&format!("{key}.{n}"))?.to_f32_vec();
            if m.len() != numel {
                return Err(CheckpointError::Mismatch {
                    path: p.clone(),
                    what: format!(
                        "`{key}.{n}` has {} elements, the parameter {numel}",
                        m.len()
                    ),
                });
            }
            into.push(m);
        }
    }
    Ok(ck)
}
