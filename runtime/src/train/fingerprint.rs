//! Before the first collective of a run, every rank checks that it will issue the same
//! collectives in the same order as rank 0. Ranks that disagree would otherwise hang (or,
//! worse, reduce unrelated buffers); instead every rank stops with an error naming the first
//! collective that differs.
//!
//! The check uses only `broadcast` and `all_reduce` of fixed-shape tensors, so it works with
//! any communicator.

use crate::comm::{CommError, Communicator, ReduceOp};
use crate::exec::backend::Backend;
use crate::exec::plan::CollectiveInfo;
use crate::tensor::Tensor;

/// One line per collective: op, element count, dtype, group and bucket.
pub fn describe(list: &[CollectiveInfo]) -> Vec<String> {
    list.iter()
        .map(|c| {
            format!(
                "{} {:?} of {} x {} on group `{}` (bucket {})",
                c.kind.name(),
                c.op,
                c.numel,
                c.dtype,
                c.group,
                c.label
            )
            .to_lowercase()
        })
        .collect()
}

/// FNV-1a, 64 bits, as four 16-bit pieces (exact in f32, which every backend holds).
fn hash(lines: &[String]) -> Vec<f32> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in lines.join("\n").bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (0..4).map(|i| ((h >> (16 * i)) & 0xffff) as f32).collect()
}

/// Host <-> device moves for the exchange; a backend failure is reported as the rank's.
struct Io<'a, B: Backend> {
    backend: &'a B,
    rank: usize,
}

impl<B: Backend> Io<'_, B> {
    fn up(&self, v: Vec<f32>) -> Result<B::Tensor, CommError> {
        self.backend
            .upload(&Tensor::from_f32(vec![v.len()], v))
            .map_err(|e| CommError::Invalid {
                rank: self.rank,
                message: format!("fingerprint: {e}"),
            })
    }
    fn down(&self, t: &B::Tensor) -> Result<Vec<f32>, CommError> {
        self.backend
            .download(t)
            .map(|t| t.to_f32_vec())
            .map_err(|e| CommError::Invalid {
                rank: self.rank,
                message: format!("fingerprint: {e}"),
            })
    }
}

/// `root`'s text, sent to every rank (length first, so every rank knows the shape).
fn broadcast_text<B: Backend, C: Communicator<Tensor = B::Tensor>>(
    io: &Io<B>,
    comm: &mut C,
    text: &str,
    root: usize,
) -> Result<String, CommError> {
    let len = comm.broadcast(io.up(vec![text.len() as f32])?, root)?;
    let n = io.down(&len)?.first().copied().unwrap_or(0.0) as usize;
    let mine = if comm.rank() == root {
        text.bytes().map(f32::from).collect()
    } else {
        vec![0.0; n]
    };
    let got = comm.broadcast(io.up(mine)?, root)?;
    Ok(io
        .down(&got)?
        .into_iter()
        .map(|b| b as u8 as char)
        .collect())
}

/// Checks that all ranks will issue `lines` (see [`describe`]); the same error on every rank
/// when they do not.
pub fn check<B: Backend, C: Communicator<Tensor = B::Tensor>>(
    comm: &mut C,
    backend: &B,
    lines: &[String],
) -> Result<(), CommError> {
    let rank = comm.rank();
    let world = comm.world_size();
    if world == 1 {
        return Ok(());
    }
    let io = Io { backend, rank };
    let mine = hash(lines);
    let root_hash = comm.broadcast(io.up(mine.clone())?, 0)?;
    let root = io.down(&root_hash)?;
    let mut flags = vec![0.0f32; world];
    flags[rank] = f32::from(u8::from(root != mine));
    let h = comm.all_reduce_async(io.up(flags)?, ReduceOp::Max, "fingerprint")?;
    let (flags, _) = comm.wait(h)?;
    let Some(bad) = io.down(&flags)?.iter().position(|f| *f > 0.0) else {
        return Ok(());
    };
    // every rank learns rank 0's list and the first disagreeing rank's list
    let text0 = broadcast_text(&io, comm, &lines.join("\n"), 0)?;
    let text_bad = broadcast_text(&io, comm, &lines.join("\n"), bad)?;
    let a: Vec<&str> = text0.split('\n').filter(|l| !l.is_empty()).collect();
    let b: Vec<&str> = text_bad.split('\n').filter(|l| !l.is_empty()).collect();
    let i = (0..a.len().max(b.len()))
        .find(|&i| a.get(i) != b.get(i))
        .unwrap_or(0);
    let what = |l: &[&str]| {
        l.get(i)
            .map_or("nothing (its list ends there)".to_string(), |s| {
                s.to_string()
            })
    };
    Err(CommError::Mismatch {
        seq: i as u64,
        a: 0,
        what_a: what(&a),
        b: bad,
        what_b: what(&b),
    })
}
