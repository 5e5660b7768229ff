//! Named tensors in safetensors files: parameters, data batches, saved gradients.

use crate::tensor::{Storage, Tensor};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TensorFileError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: not a valid safetensors file: {message}")]
    Format { path: PathBuf, message: String },
    #[error(
        "{path}: tensor `{name}` has dtype {dtype}, which is not supported (f32, f64, bf16, f16, i64, i32, bool)"
    )]
    Dtype {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    #[error("{path}: no tensor named `{name}` (it has: {available})")]
    Missing {
        path: PathBuf,
        name: String,
        available: String,
    },
    #[error("{message}")]
    TooLarge { message: String },
    #[error("{path}: could not write: {message}")]
    Write { path: PathBuf, message: String },
}

/// All tensors of a safetensors file, by name.
#[derive(Debug, Clone)]
pub struct TensorFile {
    pub path: PathBuf,
    pub tensors: BTreeMap<String, Tensor>,
    /// The file's `__metadata__` strings.
    pub metadata: BTreeMap<String, String>,
}

fn le_chunks<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    b.chunks_exact(N).map(|c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    })
}

impl TensorFile {
    /// Reads every tensor of a safetensors file. The file is mapped, not read whole, and the
    /// tensors' sizes (as the header declares them) are checked against the memory available
    /// before any is copied out, so a file too large for the machine is an error, not an OOM kill.
    pub fn load(path: &Path) -> Result<TensorFile, TensorFileError> {
        let io = |error| TensorFileError::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is only read, and lives until the tensors are copied out below. Files
        // this crate writes are replaced by rename, never changed in place, so a mapped one
        // keeps its contents; another program truncating it meanwhile is outside our control,
        // as it is for every reader of a mapped file (safetensors' own loaders included).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let bytes: &[u8] = &map;
        let st = SafeTensors::deserialize(bytes).map_err(|e| TensorFileError::Format {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let declared = st
            .tensors()
            .iter()
            .try_fold(0u64, |n, (_, v)| n.checked_add(v.data().len() as u64));
        crate::train::memory::check_fits(&format!("{}: its tensors", path.display()), declared)
            .map_err(|message| TensorFileError::TooLarge { message })?;
        let metadata = SafeTensors::read_metadata(bytes)
            .ok()
            .and_then(|(_, m)| m.metadata().clone())
            .map(|m| m.into_iter().collect())
            .unwrap_or_default();
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let d = view.data();
            let storage = match view.dtype() {
                Dtype::F32 => Storage::F32(le_chunks::<4>(d).map(f32::from_le_bytes).collect()),
                Dtype::F64 => Storage::F64(le_chunks::<8>(d).map(f64::from_le_bytes).collect()),
                Dtype::BF16 => Storage::BF16(
                    le_chunks::<2>(d)
                        .map(|b| bf16::from_bits(u16::from_le_bytes(b)))
                        .collect(),
                ),
                Dtype::F16 => Storage::F16(
                    le_chunks::<2>(d)
                        .map(|b| f16::from_bits(u16::from_le_bytes(b)))
                        .collect(),
                ),
                Dtype::I64 => Storage::I64(le_chunks::<8>(d).map(i64::from_le_bytes).collect()),
                Dtype::I32 => Storage::I32(le_chunks::<4>(d).map(i32::from_le_bytes).collect()),
                Dtype::BOOL => Storage::Bool(d.iter().map(|&b| b != 0).collect()),
                other => {
                    return Err(TensorFileError::Dtype {
                        path: path.to_path_buf(),
                        name,
                        dtype: format!("{other:?}"),
                    })
                }
            };
            let t = Tensor::try_new(view.shape(), storage).map_err(|message| {
                TensorFileError::Format {
                    path: path.to_path_buf(),
                    message: format!("tensor `{name}`: {message}"),
                }
            })?;
            tensors.insert(name, t);
        }
        Ok(TensorFile {
            path: path.to_path_buf(),
            tensors,
            metadata,
        })
    }

    pub fn get(&self, name: &str) -> Result<&Tensor, TensorFileError> {
        self.tensors.get(name).ok_or_else(|| {
            let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
            if names.len() > 12 {
                names.truncate(12);
                names.push("...");
            }
            TensorFileError::Missing {
                path: self.path.clone(),
                name: name.to_string(),
                available: names.join(", "),
            }
        })
    }
}

/// Little-endian bytes of a tensor's elements in row-major order, and the safetensors dtype.
fn to_bytes(t: &Tensor) -> (Dtype, Vec<u8>) {
    let t = t.contiguous();
    let n = t.numel();
    let o = t.offset();
    match t.storage() {
        Storage::F32(v) => (
            Dtype::F32,
            v[o..o + n].iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        Storage::F64(v) => (
            Dtype::F64,
            v[o..o + n].iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        Storage::BF16(v) => (
            Dtype::BF16,
            v[o..o + n]
                .iter()
                .flat_map(|x| x.to_bits().to_le_bytes())
                .collect(),
        ),
        Storage::F16(v) => (
            Dtype::F16,
            v[o..o + n]
                .iter()
                .flat_map(|x| x.to_bits().to_le_bytes())
                .collect(),
        ),
        Storage::I64(v) => (
            Dtype::I64,
            v[o..o + n].iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        Storage::I32(v) => (
            Dtype::I32,
            v[o..o + n].iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        Storage::Bool(v) => (
            Dtype::BOOL,
            v[o..o + n].iter().map(|&x| u8::from(x)).collect(),
        ),
    }
}

/// The `__metadata__` strings of a safetensors file, read from its header alone (the tensors
/// are not copied out).
pub fn read_metadata(path: &Path) -> Result<BTreeMap<String, String>, TensorFileError> {
    let io = |error| TensorFileError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: as in `TensorFile::load`: only the header is read, from a file replaced by
    // rename, never changed in place
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    let (_, m) = SafeTensors::read_metadata(&map).map_err(|e| TensorFileError::Format {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(m.metadata()
        .clone()
        .map(|m| m.into_iter().collect())
        .unwrap_or_default())
}

/// CRC-32 of a tensor's elements as a safetensors file stores them (little-endian, row-major):
/// what a checkpoint records per tensor to notice a flipped bit.
pub fn tensor_crc32(t: &Tensor) -> u32 {
    crc32fast::hash(&to_bytes(t).1)
}

/// Writes named tensors to a safetensors file atomically (temp file, fsync, rename).
pub fn save_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), TensorFileError> {
    save_tensors_with(path, tensors, &BTreeMap::new())
}

/// Like [`save_tensors`], with `__metadata__` strings.
pub fn save_tensors_with(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<(), TensorFileError> {
    let bytes: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            let (d, b) = to_bytes(t);
            (n.clone(), d, t.shape().to_vec(), b)
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(n, d, s, b)| {
            safetensors::tensor::TensorView::new(*d, s.clone(), b).map(|v| (n.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TensorFileError::Write {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    let meta = if metadata.is_empty() {
        None
    } else {
        Some(
            metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    };
    let out = safetensors::serialize(views, &meta).map_err(|e| TensorFileError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    tracepass_ir::fsio::write_atomic(path, &out).map_err(|e| TensorFileError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_bits_and_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t.safetensors");
        let a = Tensor::from_f32(vec![2, 2], vec![1.5, -0.25, 3.0, f32::MIN_POSITIVE]);
        let b = Tensor::from_f64(vec![3], vec![0.1, 0.2, 0.3])
            .permute(&[0])
            .expect("1-d");
        let h = a.to_dtype(tracepass_ir::DType::BF16).expect("bf16");
        let i = Tensor::from_i64(vec![2, 2], vec![-1, i64::MAX, 7, 0])
            .permute(&[1, 0])
            .expect("2-d");
        let j = Tensor::from_i64(vec![3], vec![-3, 1 << 20, 9])
            .to_dtype(tracepass_ir::DType::I32)
            .expect("i32");
        let m = Tensor::from_bool(vec![3], vec![true, false, true]);
        save_tensors(
            &p,
            &[
                ("a".into(), a.clone()),
                ("b".into(), b.clone()),
                ("h".into(), h.clone()),
                ("i".into(), i.clone()),
                ("j".into(), j.clone()),
                ("m".into(), m.clone()),
            ],
        )
        .expect("save");
        let f = TensorFile::load(&p).expect("load");
        assert!(f.get("a").expect("a").bitwise_eq(&a));
        assert!(f.get("b").expect("b").bitwise_eq(&b));
        assert!(f.get("h").expect("h").bitwise_eq(&h));
        let fi = f.get("i").expect("i");
        assert_eq!(fi.dtype(), tracepass_ir::DType::I64);
        assert_eq!(fi.to_i64_vec(), vec![-1, 7, i64::MAX, 0]);
        assert!(f.get("j").expect("j").bitwise_eq(&j));
        assert_eq!(
            f.get("m").expect("m").as_bool(),
            Some(&[true, false, true][..])
        );
        let e = f.get("zz").expect_err("missing");
        assert!(
            e.to_string().contains("no tensor named `zz`") && e.to_string().contains("a, b, h, i")
        );
        std::fs::write(&p, b"garbage").expect("write");
        assert!(matches!(
            TensorFile::load(&p),
            Err(TensorFileError::Format { .. })
        ));
    }
}
