//! Host tensors: a shape, strides and an offset over shared, immutable storage.
//!
//! Storage is behind an `Arc`, so reshapes, transposes, bucket views and the result of an
//! all-reduce (one buffer read by every rank) cost no copy. Kernels write fresh storage.

use half::{bf16, f16};
use std::sync::Arc;
use tracepass_ir::DType;

/// The elements of a tensor, in one of the dtypes the CPU backend computes in.
#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
}

impl Storage {
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::BF16(_) => DType::BF16,
            Storage::F16(_) => DType::F16,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Storage::F32(v) => v.len(),
            Storage::F64(v) => v.len(),
            Storage::BF16(v) => v.len(),
            Storage::F16(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Zeros of a supported dtype; `None` for dtypes the CPU backend does not hold.
    pub fn zeros(dtype: DType, n: usize) -> Option<Storage> {
        Some(match dtype {
            DType::F32 => Storage::F32(vec![0.0; n]),
            DType::F64 => Storage::F64(vec![0.0; n]),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; n]),
            DType::F16 => Storage::F16(vec![f16::ZERO; n]),
            _ => return None,
        })
    }
    /// Values converted from f64 (test data, initializers).
    pub fn from_f64(dtype: DType, v: &[f64]) -> Option<Storage> {
        Some(match dtype {
            DType::F32 => Storage::F32(v.iter().map(|x| *x as f32).collect()),
            DType::F64 => Storage::F64(v.to_vec()),
            DType::BF16 => Storage::BF16(v.iter().map(|x| bf16::from_f64(*x)).collect()),
            DType::F16 => Storage::F16(v.iter().map(|x| f16::from_f64(*x)).collect()),
            _ => return None,
        })
    }
}

/// Whether the CPU backend can hold tensors of this dtype.
pub fn supported_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
}

/// A strided view of shared storage.
#[derive(Clone, Debug)]
pub struct Tensor {
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
    data: Arc<Storage>,
}

/// Row-major strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut s = 1isize;
    for i in (0..shape.len()).rev() {
        strides[i] = s;
        s *= shape[i].max(1) as isize;
    }
    strides
}

impl Tensor {
    /// A contiguous tensor over `data`; the caller guarantees `data.len() == numel(shape)`.
    pub fn new(shape: Vec<usize>, data: Storage) -> Tensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor {
            strides: contiguous_strides(&shape),
            shape,
            offset: 0,
            data: Arc::new(data),
        }
    }
    /// Like `new`, but an error (instead of a bad tensor) when the sizes disagree.
    pub fn try_new(shape: Vec<usize>, data: Storage) -> Result<Tensor, String> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(format!(
                "shape {shape:?} holds {n} elements but {} were given",
                data.len()
            ));
        }
        Ok(Tensor::new(shape, data))
    }
    pub fn from_f32(shape: Vec<usize>, v: Vec<f32>) -> Tensor {
        Tensor::new(shape, Storage::F32(v))
    }
    pub fn from_f64(shape: Vec<usize>, v: Vec<f64>) -> Tensor {
        Tensor::new(shape, Storage::F64(v))
    }
    pub fn zeros(shape: Vec<usize>, dtype: DType) -> Option<Tensor> {
        let n = shape.iter().product();
        Storage::zeros(dtype, n).map(|s| Tensor::new(shape, s))
    }
    /// A view sharing storage (used by bucket unpacking).
    pub fn view_of(base: &Tensor, offset: usize, shape: Vec<usize>) -> Tensor {
        Tensor {
            strides: contiguous_strides(&shape),
            shape,
            offset: base.offset + offset,
            data: base.data.clone(),
        }
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn storage(&self) -> &Storage {
        &self.data
    }
    pub fn storage_arc(&self) -> &Arc<Storage> {
        &self.data
    }
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype().size_bytes()
    }
    pub fn is_contiguous(&self) -> bool {
        let mut expect = 1isize;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != expect {
                return false;
            }
            expect *= self.shape[i] as isize;
        }
        true
    }
    /// The same elements with another shape. Contiguous tensors share storage; others are copied.
    pub fn reshape(&self, shape: Vec<usize>) -> Result<Tensor, String> {
        let n: usize = shape.iter().product();
        if n != self.numel() {
            return Err(format!(
                "cannot reshape {:?} ({} elements) to {shape:?}",
                self.shape,
                self.numel()
            ));
        }
        let base = self.contiguous();
        Ok(Tensor {
            strides: contiguous_strides(&shape),
            shape,
            offset: base.offset,
            data: base.data,
        })
    }
    /// A permuted view (no copy).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor, String> {
        let mut seen = vec![false; self.shape.len()];
        if perm.len() != self.shape.len() || perm.iter().any(|&p| p >= seen.len()) {
            return Err(format!(
                "permutation {perm:?} does not fit rank {}",
                self.shape.len()
            ));
        }
        for &p in perm {
            if std::mem::replace(&mut seen[p], true) {
                return Err(format!("permutation {perm:?} repeats dimension {p}"));
            }
        }
        Ok(Tensor {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
            data: self.data.clone(),
        })
    }
    /// Storage positions of the elements in row-major order.
    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.numel();
        let rank = self.shape.len();
        let mut idx = vec![0usize; rank];
        let mut pos = self.offset as isize;
        (0..n).map(move |k| {
            if k > 0 {
                for d in (0..rank).rev() {
                    idx[d] += 1;
                    pos += self.strides[d];
                    if idx[d] < self.shape[d] {
                        break;
                    }
                    pos -= self.strides[d] * self.shape[d] as isize;
                    idx[d] = 0;
                }
            }
            pos as usize
        })
    }
    /// A contiguous tensor with the same elements (shares storage when already contiguous and whole).
    pub fn contiguous(&self) -> Tensor {
        if self.is_contiguous() {
            return self.clone();
        }
        Tensor::new(self.shape.clone(), self.copied())
    }
    /// The elements in row-major order, copied into fresh storage.
    fn copied(&self) -> Storage {
        macro_rules! gather {
            ($v:expr, $variant:ident) => {
                Storage::$variant(self.positions().map(|p| $v[p]).collect())
            };
        }
        match &*self.data {
            Storage::F32(v) => gather!(v, F32),
            Storage::F64(v) => gather!(v, F64),
            Storage::BF16(v) => gather!(v, BF16),
            Storage::F16(v) => gather!(v, F16),
        }
    }
    /// The elements as a contiguous f32 slice, when they are one.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match (&*self.data, self.is_contiguous()) {
            (Storage::F32(v), true) => Some(&v[self.offset..self.offset + self.numel()]),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<&[f64]> {
        match (&*self.data, self.is_contiguous()) {
            (Storage::F64(v), true) => Some(&v[self.offset..self.offset + self.numel()]),
            _ => None,
        }
    }
    /// Whether the tensor is all of its storage, in order (no view, no stride).
    fn is_whole(&self) -> bool {
        self.offset == 0 && self.numel() == self.data.len() && self.is_contiguous()
    }
    /// The elements as owned, contiguous storage: the tensor's own storage, without a copy, when
    /// nothing else shares it and the tensor covers all of it; otherwise a contiguous copy.
    pub fn into_storage(self) -> Storage {
        let whole = self.is_whole();
        if !whole {
            return self.copied();
        }
        Arc::try_unwrap(self.data).unwrap_or_else(|shared| (*shared).clone())
    }
    /// The elements as a mutable f32 slice, for in-place updates (optimizers). The storage is
    /// copied first if it is shared, strided or a view; `None` for other dtypes.
    pub fn f32_mut(&mut self) -> Option<&mut [f32]> {
        if self.dtype() != DType::F32 {
            return None;
        }
        let whole = self.is_whole();
        if !whole {
            let c = Tensor::from_f32(self.shape.clone(), self.to_f32_vec());
            *self = c;
        }
        match Arc::make_mut(&mut self.data) {
            Storage::F32(v) => Some(v.as_mut_slice()),
            _ => None,
        }
    }
    /// Elements in row-major order, converted to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        if let Some(s) = self.as_f32() {
            return s.to_vec();
        }
        match &*self.data {
            Storage::F32(v) => self.positions().map(|p| v[p]).collect(),
            Storage::F64(v) => self.positions().map(|p| v[p] as f32).collect(),
            Storage::BF16(v) => self.positions().map(|p| v[p].to_f32()).collect(),
            Storage::F16(v) => self.positions().map(|p| v[p].to_f32()).collect(),
        }
    }
    /// Elements in row-major order, converted to f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &*self.data {
            Storage::F32(v) => self.positions().map(|p| v[p] as f64).collect(),
            Storage::F64(v) => self.positions().map(|p| v[p]).collect(),
            Storage::BF16(v) => self.positions().map(|p| v[p].to_f64()).collect(),
            Storage::F16(v) => self.positions().map(|p| v[p].to_f64()).collect(),
        }
    }
    /// Converts to another dtype (a copy, even to the same dtype when not contiguous).
    pub fn to_dtype(&self, dtype: DType) -> Option<Tensor> {
        if dtype == self.dtype() {
            return Some(self.contiguous());
        }
        let data = match dtype {
            DType::F64 => Storage::F64(self.to_f64_vec()),
            DType::F32 => Storage::F32(self.to_f32_vec()),
            DType::BF16 => {
                Storage::BF16(self.to_f32_vec().into_iter().map(bf16::from_f32).collect())
            }
            DType::F16 => Storage::F16(self.to_f32_vec().into_iter().map(f16::from_f32).collect()),
            _ => return None,
        };
        Some(Tensor::new(self.shape.clone(), data))
    }
    /// Bitwise equality of shape, dtype and elements.
    pub fn bitwise_eq(&self, other: &Tensor) -> bool {
        if self.shape != other.shape || self.dtype() != other.dtype() {
            return false;
        }
        match (&*self.data, &*other.data) {
            (Storage::F32(a), Storage::F32(b)) => self
                .positions()
                .zip(other.positions())
                .all(|(i, j)| a[i].to_bits() == b[j].to_bits()),
            _ => {
                let (a, b) = (self.to_f64_vec(), other.to_f64_vec());
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permute_and_contiguous_move_elements() {
        let t = Tensor::from_f32(vec![2, 3], vec![0., 1., 2., 3., 4., 5.]);
        let p = t.permute(&[1, 0]).expect("valid permutation");
        assert_eq!(p.shape(), &[3, 2]);
        assert!(!p.is_contiguous());
        assert_eq!(p.to_f32_vec(), vec![0., 3., 1., 4., 2., 5.]);
        assert_eq!(
            p.contiguous().as_f32().expect("contiguous"),
            &[0., 3., 1., 4., 2., 5.]
        );
        assert!(t.permute(&[0, 0]).is_err());
        assert!(t.reshape(vec![4]).is_err());
    }

    #[test]
    fn views_share_storage() {
        let t = Tensor::from_f32(vec![6], vec![0., 1., 2., 3., 4., 5.]);
        let v = Tensor::view_of(&t, 2, vec![2, 2]);
        assert_eq!(v.to_f32_vec(), vec![2., 3., 4., 5.]);
        assert!(Arc::ptr_eq(v.storage_arc(), t.storage_arc()));
        let r = v.reshape(vec![4]).expect("same count");
        assert!(Arc::ptr_eq(r.storage_arc(), t.storage_arc()));
    }

    #[test]
    fn dtype_conversion_round_trips_representable_values() {
        let t = Tensor::from_f32(vec![3], vec![0.5, -2.0, 1024.0]);
        for d in [DType::F64, DType::BF16, DType::F16] {
            let c = t.to_dtype(d).expect("supported");
            assert_eq!(c.dtype(), d);
            assert_eq!(c.to_f32_vec(), vec![0.5, -2.0, 1024.0]);
        }
        assert!(t.to_dtype(DType::I64).is_none());
    }
}
