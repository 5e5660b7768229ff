//! Before the first collective of a run, every rank checks that it will issue the same
//! collectives in the same order as rank 0. Ranks that disagree would otherwise hang (or,
//! worse, reduce unrelated buffers); instead every rank stops with an error naming the first
//! collective that differs.
//!
//! The check uses only `broadcast` and `all_reduce` of fixed-shape tensors, so it works with
//! any communicator.

use crate::comm::{CommError, Communicator, ReduceOp};
use crate::plan::CollectiveInfo;
use crate::tensor::Tensor;

/// One line per collective: op, element count, dtype, group and bucket.
pub fn describe(list: &[CollectiveInfo]) -> Vec<String> {
    list.iter()
        .map(|c| {
            format!(
                "all_reduce {:?} of {} x {} on group `{}` (bucket {})",
                c.op, c.numel, c.dtype, c.group, c.label
            )
            .to_lowercase()
        })
        .collect()
}

/// FNV-1a, 64 bits, as four exactly representable 16-bit pieces.
fn hash(lines: &[String]) -> Vec<f64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in lines.join("\n").bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (0..4).map(|i| ((h >> (16 * i)) & 0xffff) as f64).collect()
}

fn bytes_tensor(s: &str) -> Tensor {
    Tensor::from_f32(vec![s.len()], s.bytes().map(f32::from).collect())
}

/// `root`'s text, sent to every rank (length first, so every rank knows the shape).
fn broadcast_text<C: Communicator<Tensor = Tensor>>(
    comm: &mut C,
    text: &str,
    root: usize,
) -> Result<String, CommError> {
    let len = comm.broadcast(Tensor::from_f64(vec![1], vec![text.len() as f64]), root)?;
    let n = len.to_f64_vec().first().copied().unwrap_or(0.0) as usize;
    let mine = if comm.rank() == root {
        bytes_tensor(text)
    } else {
        Tensor::from_f32(vec![n], vec![0.0; n])
    };
    let got = comm.broadcast(mine, root)?;
    Ok(got
        .to_f32_vec()
        .into_iter()
        .map(|b| b as u8 as char)
        .collect())
}

/// Checks that all ranks will issue `lines` (see [`describe`]); the same error on every rank
/// when they do not.
pub fn check<C: Communicator<Tensor = Tensor>>(
    comm: &mut C,
    lines: &[String],
) -> Result<(), CommError> {
    let rank = comm.rank();
    let world = comm.world_size();
    if world == 1 {
        return Ok(());
    }
    let mine = hash(lines);
    let root = comm
        .broadcast(Tensor::from_f64(vec![4], mine.clone()), 0)?
        .to_f64_vec();
    let mut flags = vec![0.0; world];
    flags[rank] = f64::from(root != mine);
    let h = comm.all_reduce_async(
        Tensor::from_f64(vec![world], flags),
        ReduceOp::Max,
        "fingerprint",
    )?;
    let (flags, _) = comm.wait(h)?;
    let Some(bad) = flags.to_f64_vec().iter().position(|f| *f > 0.0) else {
        return Ok(());
    };
    // every rank learns rank 0's list and the first disagreeing rank's list
    let text0 = broadcast_text(comm, &lines.join("\n"), 0)?;
    let text_bad = broadcast_text(comm, &lines.join("\n"), bad)?;
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
