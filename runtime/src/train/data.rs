//! Training data and initial parameters: from safetensors files, or drawn from a seed.

use crate::cpu;
use crate::tensor::file::{TensorFile, TensorFileError};
use crate::tensor::{Storage, Tensor};
use crate::train::model::{LossKind, Model};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use tracepass_ir::{DType, Param};

/// A deterministic stream per (purpose, a, b), independent of everything else.
fn rng(seed: u64, purpose: u64, a: u64, b: u64) -> StdRng {
    let mut z = seed ^ purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for x in [a, b] {
        z = (z ^ x).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z ^= z >> 31;
    }
    StdRng::seed_from_u64(z)
}

fn tensor_of(shape: &[usize], dtype: DType, v: Vec<f64>) -> Result<Tensor, String> {
    let s =
        Storage::from_f64(dtype, &v).ok_or_else(|| format!("dtype {dtype} is not supported"))?;
    Ok(Tensor::new(shape, s))
}

/// Where batches come from.
pub enum DataSource {
    /// `x = randn(x_shape)`, `y = randn(y_shape).softmax(dim=1)`, one stream per micro-batch and rank.
    Seeded { seed: u64 },
    /// Tensors `<arg>.<micro-batch>.<rank>` for every data argument, and
    /// `<targets>.<micro-batch>.<rank>`. With `wrap`, a micro-batch the file lacks uses batch
    /// `micro mod n` (n: the micro-batches present for that rank), as an export directory says.
    File { file: TensorFile, wrap: bool },
}

/// A batch's data tensors.
pub type BatchData = smallvec::SmallVec<[Tensor; 4]>;

/// One rank's inputs for one micro-batch.
#[derive(Clone, Debug)]
pub struct Batch {
    /// One tensor per data argument of the model, in its order (inline: a step's batch
    /// allocates no list).
    pub data: BatchData,
    /// What the loss compares the output with (`None` for losses that need none).
    pub targets: Option<Tensor>,
}

impl DataSource {
    /// The batch of `rank` for micro-batch `micro` (= step when there is no accumulation).
    pub fn batch(&self, micro: usize, rank: usize, model: &Model) -> Result<Batch, String> {
        let needs_targets = model.loss.needs_targets();
        match self {
            DataSource::Seeded { seed } => {
                let mut r = rng(*seed, 1, micro as u64, rank as u64);
                let mut data = BatchData::new();
                for a in &model.data_args {
                    if !a.ty.dtype.is_float() {
                        return Err(format!(
                            "data argument `{}` is {}: random data is only drawn for float inputs; give the batches (--data FILE.safetensors)",
                            a.name, a.ty.dtype
                        ));
                    }
                    let v = values_for(&format!("input `{}`", a.name), &a.ty.shape, || {
                        r.sample::<f64, _>(StandardNormal)
                    })?;
                    data.push(tensor_of(&a.ty.shape, a.ty.dtype, v)?);
                }
                let targets = match model.loss {
                    LossKind::SeedCrossEntropy => {
                        let s = model
                            .output_type()
                            .map(|t| t.shape.to_vec())
                            .ok_or("the model output is not a tensor")?;
                        let n: usize = s.iter().product();
                        let y: Vec<f64> =
                            (0..n).map(|_| r.sample::<f64, _>(StandardNormal)).collect();
                        let y = Tensor::from_f32(s, y.into_iter().map(|v| v as f32).collect());
                        Some(cpu::softmax(&y, 1, false)?)
                    }
                    _ if needs_targets => {
                        return Err(format!(
                        "the {:?} loss needs targets: give the batches (--data FILE.safetensors)",
                        model.loss
                    ))
                    }
                    _ => None,
                };
                Ok(Batch { data, targets })
            }
            DataSource::File { file, wrap } => {
                let get = |name: &str, shape: Option<&[usize]>| -> Result<Tensor, String> {
                    let key = file_key(file, name, micro, rank, *wrap)?;
                    let t = file.get(&key).map_err(|e| e.to_string())?;
                    if let Some(shape) = shape {
                        if t.shape() != shape {
                            return Err(format!(
                                "{}: `{key}` has shape {:?} but the model takes {:?}",
                                file.path.display(),
                                t.shape(),
                                shape
                            ));
                        }
                    }
                    Ok(t.clone())
                };
                // a batch of another dtype is refused, never converted: f32 bytes read as
                // integers, or indices rounded from floats, train on other numbers
                let wrong_dtype = |name: &str, t: &Tensor, want: &str| {
                    let key = file_key(file, name, micro, rank, *wrap).unwrap_or_default();
                    format!(
                        "{}: `{key}` is {}, but the model takes {want} for `{name}`; store it as {want} (tracepass does not convert data)",
                        file.path.display(),
                        t.dtype(),
                    )
                };
                let mut data = BatchData::new();
                for a in &model.data_args {
                    let t = get(&a.name, Some(&a.ty.shape))?;
                    if t.dtype() != a.ty.dtype {
                        return Err(wrong_dtype(&a.name, &t, &a.ty.dtype.to_string()));
                    }
                    data.push(t);
                }
                let targets = if needs_targets {
                    let out = model.output_type();
                    let shape = match model.loss {
                        LossKind::SeedCrossEntropy | LossKind::Mse => {
                            out.as_ref().map(|t| t.shape.to_vec())
                        }
                        _ => None,
                    };
                    let t = get(&model.targets, shape.as_deref())?;
                    match (model.loss, &out) {
                        (LossKind::CrossEntropy { .. }, _)
                            if !matches!(t.dtype(), DType::I64 | DType::I32) =>
                        {
                            return Err(wrong_dtype(
                                &model.targets,
                                &t,
                                "integer class indices (i64)",
                            ));
                        }
                        (LossKind::Mse, Some(o)) if t.dtype() != o.dtype => {
                            return Err(wrong_dtype(
                                &model.targets,
                                &t,
                                &format!("{} (the model output's dtype)", o.dtype),
                            ));
                        }
                        _ => {}
                    }
                    // cross entropy: one class index per row of the output (its last dim)
                    if let (LossKind::CrossEntropy { .. }, Some(o)) = (model.loss, &out) {
                        let rows: usize = o.shape.iter().rev().skip(1).product();
                        if !o.shape.is_empty() && t.numel() != rows {
                            let key = file_key(file, &model.targets, micro, rank, *wrap)
                                .unwrap_or_default();
                            return Err(format!(
                                "{}: `{key}` has shape {:?} ({} targets), but the model output {:?} has {rows} rows (one class index each)",
                                file.path.display(),
                                t.shape(),
                                t.numel(),
                                o.shape
                            ));
                        }
                    }
                    Some(t)
                } else {
                    None
                };
                Ok(Batch { data, targets })
            }
        }
    }
}

impl DataSource {
    /// Checks, before training, every batch `rank` reads in micro-batches `first..end`: each
    /// is there and fits the model. A file that cycles (an export's) must hold, for every data
    /// argument and the targets, the same number n of micro-batches `0..n` on every rank of
    /// the run, without holes: micro-batch `m` then reads batch `m mod n` of each name, so
    /// a rank's input and targets always come from the same step.
    pub fn check_run(
        &self,
        model: &Model,
        rank: usize,
        world_size: usize,
        first: usize,
        end: usize,
    ) -> Result<(), String> {
        let DataSource::File { file, wrap } = self else {
            // drawn data has no holes; its first batch shows what it cannot draw
            return self.batch(first, rank, model).map(|_| ());
        };
        let mut end = end;
        if *wrap {
            let mut names: Vec<&str> = model.data_args.iter().map(|a| a.name.as_str()).collect();
            if model.loss.needs_targets() {
                names.push(&model.targets);
            }
            let mut counts: Vec<(String, usize, usize)> = Vec::new();
            for r in [0, rank].into_iter().filter(|r| *r < world_size) {
                for name in &names {
                    counts.push((name.to_string(), r, cycle_len(file, name, r)?));
                }
            }
            // a rank without any batch gets its own message from `batch`
            let first_count = counts
                .first()
                .cloned()
                .filter(|_| counts.iter().all(|c| c.2 > 0));
            if let Some((name, r, n)) = first_count {
                if let Some((other, r2, n2)) = counts.iter().find(|(_, _, k)| *k != n) {
                    return Err(format!(
                        "{}: `{name}` has {n} batch(es) for rank {r} but `{other}` has {n2} for rank {r2}; every data argument and the targets need the same steps on every rank, or steps would pair one step's input with another's targets",
                        file.path.display()
                    ));
                }
                if n > 0 {
                    end = end.min(first.saturating_add(n));
                }
            }
        }
        for m in first..end {
            self.batch(m, rank, model)?;
        }
        Ok(())
    }
}

/// How many micro-batches `0..n` of `name` the file holds for `rank`; a batch after a missing
/// one is a hole, an error naming both.
fn cycle_len(file: &TensorFile, name: &str, rank: usize) -> Result<usize, String> {
    let key = |m: usize| format!("{name}.{m}.{rank}");
    let n = (0..)
        .take_while(|m| file.tensors.contains_key(&key(*m)))
        .count();
    let prefix = format!("{name}.");
    let suffix = format!(".{rank}");
    let later = file.tensors.keys().find_map(|k| {
        let m: usize = k
            .strip_prefix(&prefix)?
            .strip_suffix(&suffix)?
            .parse()
            .ok()?;
        (m > n).then_some(m)
    });
    match later {
        Some(m) => Err(format!(
            "{}: `{}` is missing, but `{}` is there; give every step's batch (a step cannot borrow another's)",
            file.path.display(),
            key(n),
            key(m)
        )),
        None => Ok(n),
    }
}

/// The key of `name`'s batch for (`micro`, `rank`): `<name>.<micro>.<rank>`, or with `wrap`
/// that of micro-batch `micro mod n` when the file has only n of them for this rank. (Inline
/// strings: every step looks its batches up, and a short key allocates nothing.)
fn file_key(
    file: &TensorFile,
    name: &str,
    micro: usize,
    rank: usize,
    wrap: bool,
) -> Result<compact_str::CompactString, String> {
    let key = |m: usize| compact_str::format_compact!("{name}.{m}.{rank}");
    let exact = key(micro);
    if !wrap || file.tensors.contains_key(exact.as_str()) {
        return Ok(exact);
    }
    let n = (0..)
        .take_while(|m| file.tensors.contains_key(key(*m).as_str()))
        .count();
    if n == 0 {
        let ranks = (0..)
            .take_while(|r| file.tensors.contains_key(&format!("{name}.0.{r}")))
            .count();
        return Err(if ranks > 0 && rank >= ranks {
            format!(
                "{}: has batches of `{name}` for {ranks} rank(s) (`{name}.<step>.<rank>`), none for rank {rank}; train on at most {ranks} ranks or export more",
                file.path.display()
            )
        } else {
            format!(
                "{}: no batch `{}` (data arguments are stored as `<arg>.<step>.<rank>`)",
                file.path.display(),
                key(0)
            )
        });
    }
    Ok(key(micro % n))
}

/// The elements of `shape`, drawn from `next` in order, or an error naming `what` when they
/// cannot be counted or allocated (a failed allocation would abort the process).
fn values_for(
    what: &str,
    shape: &[usize],
    mut next: impl FnMut() -> f64,
) -> Result<Vec<f64>, String> {
    let n = shape
        .iter()
        .try_fold(1usize, |n, d| n.checked_mul(*d))
        .ok_or_else(|| format!("{what}: shape {shape:?} has too many elements to count"))?;
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|e| format!("{what}: cannot allocate {n} values of shape {shape:?} ({e})"))?;
    v.extend((0..n).map(|_| next()));
    Ok(v)
}

/// Initial parameters like `nn.Linear`'s default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the
/// weight and the bias, fan_in taken from the layer's weight. The same on every rank.
pub fn seeded_params(params: &[Param], seed: u64) -> Result<Vec<Tensor>, String> {
    let by_fqn: std::collections::HashMap<&str, &Param> =
        params.iter().map(|q| (q.fqn.as_str(), q)).collect();
    params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let fan_in = if p.shape.len() >= 2 {
                p.shape[1..].iter().product::<usize>()
            } else {
                let weight = p.fqn.strip_suffix("bias").map(|m| format!("{m}weight"));
                weight
                    .and_then(|w| by_fqn.get(w.as_str()).copied())
                    .map(|w| w.shape[1..].iter().product::<usize>())
                    .unwrap_or(p.shape.iter().product())
            };
            let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
            let mut r = rng(seed, 2, i as u64, 0);
            let v = values_for(&format!("parameter `{}`", p.fqn), &p.shape, || {
                r.gen_range(-bound..bound)
            })?;
            tensor_of(&p.shape, p.dtype, v)
        })
        .collect()
}

/// Parameters by module path from a safetensors file, checked against the model's.
pub fn file_params(params: &[Param], file: &TensorFile) -> Result<Vec<Tensor>, String> {
    params
        .iter()
        .map(|p| {
            let t = file
                .get(&p.fqn)
                .map_err(|e: TensorFileError| e.to_string())?;
            if t.shape() != p.shape.as_slice() {
                return Err(format!(
                    "{}: parameter `{}` has shape {:?} but the model's is {:?}",
                    file.path.display(),
                    p.fqn,
                    t.shape(),
                    p.shape
                ));
            }
            // another dtype is refused, never converted: f32 bytes labelled i32 would become
            // integers, and a rounding conversion trains a different model than the trace's
            if t.dtype() != p.dtype {
                return Err(format!(
                    "{}: {} `{}` is stored as {}, but the trace's is {}; store it as {} (tracepass does not convert parameters)",
                    file.path.display(),
                    if p.buffer { "buffer" } else { "parameter" },
                    p.fqn,
                    t.dtype(),
                    p.dtype,
                    p.dtype
                ));
            }
            Ok(t.clone())
        })
        .collect()
}
