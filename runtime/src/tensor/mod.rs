//! Host tensors: a shape, strides and an offset over shared, immutable storage.
//!
//! Storage is behind an `Arc`, so reshapes, transposes, bucket views and the result of an
//! all-reduce (one buffer read by every rank) cost no copy. Kernels write fresh storage.

pub(crate) mod file;
mod headers;

pub use file::{save_tensors, save_tensors_with, tensor_crc32, TensorFile, TensorFileError};

use half::{bf16, f16};
use smallvec::SmallVec;
use std::sync::Arc;
use tracepass_ir::DType;

/// Per-dimension sizes and strides, inline up to 6 dims: making, viewing or cloning a tensor
/// allocates nothing for them.
pub type Dims<T> = SmallVec<[T; 6]>;

/// The elements of a tensor, in one of the dtypes the CPU backend holds: the float types it
/// computes in and the integer and boolean types of indices, targets, counters and masks.
#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
}

/// Evaluates `$body` with `$v` bound to the storage's element vector (any variant); `$body`
/// must give a `Vec` of the same element type, which is wrapped back in that variant. For
/// dtype-generic kernels (copies, gathers, layout changes).
#[macro_export]
macro_rules! storage_map {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            $crate::tensor::Storage::F32($v) => $crate::tensor::Storage::F32($body),
            $crate::tensor::Storage::F64($v) => $crate::tensor::Storage::F64($body),
            $crate::tensor::Storage::BF16($v) => $crate::tensor::Storage::BF16($body),
            $crate::tensor::Storage::F16($v) => $crate::tensor::Storage::F16($body),
            $crate::tensor::Storage::I64($v) => $crate::tensor::Storage::I64($body),
            $crate::tensor::Storage::I32($v) => $crate::tensor::Storage::I32($body),
            $crate::tensor::Storage::Bool($v) => $crate::tensor::Storage::Bool($body),
        }
    };
}

/// Like [`storage_map!`] over two storages that must share a variant; `$mismatch` is the value
/// of the whole expression when they do not.
#[macro_export]
macro_rules! storage_map2 {
    ($a:expr, $b:expr, $x:ident, $y:ident => $body:expr, $mismatch:expr) => {
        match ($a, $b) {
            ($crate::tensor::Storage::F32($x), $crate::tensor::Storage::F32($y)) => {
                $crate::tensor::Storage::F32($body)
            }
            ($crate::tensor::Storage::F64($x), $crate::tensor::Storage::F64($y)) => {
                $crate::tensor::Storage::F64($body)
            }
            ($crate::tensor::Storage::BF16($x), $crate::tensor::Storage::BF16($y)) => {
                $crate::tensor::Storage::BF16($body)
            }
            ($crate::tensor::Storage::F16($x), $crate::tensor::Storage::F16($y)) => {
                $crate::tensor::Storage::F16($body)
            }
            ($crate::tensor::Storage::I64($x), $crate::tensor::Storage::I64($y)) => {
                $crate::tensor::Storage::I64($body)
            }
            ($crate::tensor::Storage::I32($x), $crate::tensor::Storage::I32($y)) => {
                $crate::tensor::Storage::I32($body)
            }
            ($crate::tensor::Storage::Bool($x), $crate::tensor::Storage::Bool($y)) => {
                $crate::tensor::Storage::Bool($body)
            }
            _ => $mismatch,
        }
    };
}

impl Storage {
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::BF16(_) => DType::BF16,
            Storage::F16(_) => DType::F16,
            Storage::I64(_) => DType::I64,
            Storage::I32(_) => DType::I32,
            Storage::Bool(_) => DType::Bool,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Storage::F32(v) => v.len(),
            Storage::F64(v) => v.len(),
            Storage::BF16(v) => v.len(),
            Storage::F16(v) => v.len(),
            Storage::I64(v) => v.len(),
            Storage::I32(v) => v.len(),
            Storage::Bool(v) => v.len(),
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
            DType::I64 => Storage::I64(vec![0; n]),
            DType::I32 => Storage::I32(vec![0; n]),
            DType::Bool => Storage::Bool(vec![false; n]),
            _ => return None,
        })
    }
    /// Values converted from f64 (test data, initializers); integers truncate toward zero and
    /// booleans are `x != 0`, as PyTorch's casts.
    pub fn from_f64(dtype: DType, v: &[f64]) -> Option<Storage> {
        Some(match dtype {
            DType::F32 => Storage::F32(v.iter().map(|x| *x as f32).collect()),
            DType::F64 => Storage::F64(v.to_vec()),
            DType::BF16 => Storage::BF16(v.iter().map(|x| bf16::from_f64(*x)).collect()),
            DType::F16 => Storage::F16(v.iter().map(|x| f16::from_f64(*x)).collect()),
            DType::I64 => Storage::I64(v.iter().map(|x| *x as i64).collect()),
            DType::I32 => Storage::I32(v.iter().map(|x| *x as i32).collect()),
            DType::Bool => Storage::Bool(v.iter().map(|x| *x != 0.0).collect()),
            _ => return None,
        })
    }
}

/// An element type of [`Storage`], for dtype-generic kernels.
/// Each has a buffer pool shelf (`cpu::buffer_pool`).
pub trait Elem: Copy + PartialEq + Send + Sync + 'static + crate::cpu::buffer_pool::Pooled {
    const DTYPE: DType;
    /// The elements of `s`, when it holds this type.
    fn slice(s: &Storage) -> Option<&[Self]>;
    fn wrap(v: Vec<Self>) -> Storage;
    /// A number in this type, cast as PyTorch casts (truncation for integers, `!= 0` for bool).
    fn from_f64(x: f64) -> Self;
}

macro_rules! elem {
    ($t:ty, $variant:ident, |$x:ident| $conv:expr) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$variant;
            fn slice(s: &Storage) -> Option<&[Self]> {
                match s {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn wrap(v: Vec<Self>) -> Storage {
                Storage::$variant(v)
            }
            #[inline(always)]
            fn from_f64($x: f64) -> Self {
                $conv
            }
        }
    };
}
elem!(f32, F32, |x| x as f32);
elem!(f64, F64, |x| x);
elem!(bf16, BF16, |x| bf16::from_f64(x));
elem!(f16, F16, |x| f16::from_f64(x));
elem!(i64, I64, |x| x as i64);
elem!(i32, I32, |x| x as i32);
elem!(bool, Bool, |x| x != 0.0);

/// Evaluates `$body` with the type alias `$T` set to the element type of `$dtype`; `$other`
/// binds the dtype when the CPU backend does not hold it.
#[macro_export]
macro_rules! with_elem {
    ($dtype:expr, $T:ident => $body:expr, $other:ident => $unsupported:expr) => {
        match $dtype {
            tracepass_ir::DType::F32 => {
                type $T = f32;
                $body
            }
            tracepass_ir::DType::F64 => {
                type $T = f64;
                $body
            }
            tracepass_ir::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            tracepass_ir::DType::F16 => {
                type $T = half::f16;
                $body
            }
            tracepass_ir::DType::I64 => {
                type $T = i64;
                $body
            }
            tracepass_ir::DType::I32 => {
                type $T = i32;
                $body
            }
            tracepass_ir::DType::Bool => {
                type $T = bool;
                $body
            }
            $other => $unsupported,
        }
    };
}

/// Whether the CPU backend can hold tensors of this dtype.
pub fn supported_dtype(d: DType) -> bool {
    matches!(
        d,
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 | DType::I64 | DType::I32 | DType::Bool
    )
}

/// Whether a dtype is one of the float types the CPU backend computes in.
pub fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
}

/// A strided view of shared storage.
#[derive(Clone, Debug)]
pub struct Tensor {
    shape: Dims<usize>,
    strides: Dims<isize>,
    offset: usize,
    data: Arc<Storage>,
}

/// The strides of `new` as a view of a tensor of shape `old` and strides `strides`, or `None`
/// when no view has that shape (PyTorch's `computeStride`): walking the old dimensions from
/// the last, each run of dimensions that are contiguous with each other (a chunk) must be
/// split exactly into new dimensions.
/// The memory plan asks the same question, so that it knows which reshapes copy.
pub(crate) fn reshape_view_strides(
    old: &[usize],
    strides: &[isize],
    new: &[usize],
) -> Option<Dims<isize>> {
    if old.contains(&0) || old.is_empty() {
        return None;
    }
    let mut out: Dims<isize> = SmallVec::from_elem(0, new.len());
    let mut view_d = new.len() as isize - 1;
    let mut chunk_base = *strides.last()?;
    let (mut tensor_numel, mut view_numel) = (1isize, 1isize);
    for d in (0..old.len()).rev() {
        tensor_numel *= old[d] as isize;
        let chunk_ends = d == 0 || (old[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base);
        if chunk_ends {
            while view_d >= 0 && (view_numel < tensor_numel || new[view_d as usize] == 1) {
                out[view_d as usize] = view_numel * chunk_base;
                view_numel *= new[view_d as usize] as isize;
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if d > 0 {
                chunk_base = strides[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

/// Row-major strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Dims<isize> {
    let mut strides: Dims<isize> = SmallVec::from_elem(0, shape.len());
    let mut s = 1isize;
    for i in (0..shape.len()).rev() {
        strides[i] = s;
        s *= shape[i].max(1) as isize;
    }
    strides
}

impl Tensor {
    /// A contiguous tensor over `data`; the caller guarantees `data.len() == numel(shape)`.
    pub fn new(shape: impl AsRef<[usize]>, data: Storage) -> Tensor {
        let shape = Dims::from_slice(shape.as_ref());
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor {
            strides: contiguous_strides(&shape),
            shape,
            offset: 0,
            data: headers::wrap(data),
        }
    }
    /// Like `new`, but an error (instead of a bad tensor) when the sizes disagree.
    pub fn try_new(shape: impl AsRef<[usize]>, data: Storage) -> Result<Tensor, String> {
        let shape = Dims::from_slice(shape.as_ref());
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(format!(
                "shape {shape:?} holds {n} elements but {} were given",
                data.len()
            ));
        }
        Ok(Tensor::new(shape, data))
    }
    pub fn from_f32(shape: impl AsRef<[usize]>, v: Vec<f32>) -> Tensor {
        Tensor::new(shape, Storage::F32(v))
    }
    pub fn from_f64(shape: impl AsRef<[usize]>, v: Vec<f64>) -> Tensor {
        Tensor::new(shape, Storage::F64(v))
    }
    pub fn from_i64(shape: impl AsRef<[usize]>, v: Vec<i64>) -> Tensor {
        Tensor::new(shape, Storage::I64(v))
    }
    pub fn from_bool(shape: impl AsRef<[usize]>, v: Vec<bool>) -> Tensor {
        Tensor::new(shape, Storage::Bool(v))
    }
    pub fn zeros(shape: impl AsRef<[usize]>, dtype: DType) -> Option<Tensor> {
        let shape = Dims::from_slice(shape.as_ref());
        let n = shape.iter().product();
        Storage::zeros(dtype, n).map(|s| Tensor::new(shape, s))
    }
    /// A view sharing storage (used by bucket unpacking).
    pub fn view_of(base: &Tensor, offset: usize, shape: impl AsRef<[usize]>) -> Tensor {
        let shape = Dims::from_slice(shape.as_ref());
        Tensor {
            strides: contiguous_strides(&shape),
            shape,
            offset: base.offset + offset,
            data: base.data.clone(),
        }
    }
    /// A view of this tensor's storage with any shape, strides and offset (expand, slice,
    /// squeeze); an error if some addressed element lies outside the storage.
    pub fn view(
        &self,
        shape: impl AsRef<[usize]>,
        strides: impl AsRef<[isize]>,
        offset: usize,
    ) -> Result<Tensor, String> {
        let (shape, strides) = (
            Dims::from_slice(shape.as_ref()),
            Dims::from_slice(strides.as_ref()),
        );
        if shape.len() != strides.len() {
            return Err(format!(
                "view shape {shape:?} and strides {strides:?} differ in rank"
            ));
        }
        if shape.iter().all(|&d| d > 0) {
            let (mut lo, mut hi) = (offset as isize, offset as isize);
            for (&d, &s) in shape.iter().zip(&strides) {
                let span = (d as isize - 1) * s;
                if span < 0 {
                    lo += span;
                } else {
                    hi += span;
                }
            }
            if lo < 0 || hi >= self.data.len() as isize {
                return Err(format!(
                    "view {shape:?} with strides {strides:?} at offset {offset} leaves a storage of {} elements",
                    self.data.len()
                ));
            }
        }
        Ok(Tensor {
            shape,
            strides,
            offset,
            data: self.data.clone(),
        })
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
    /// The same elements with another shape: a view sharing the storage where the strides
    /// allow one (as `torch.reshape`: always for a contiguous tensor, and for a strided one
    /// when the new dimensions split or merge only runs of dimensions that are contiguous
    /// with each other, e.g. inserting or dropping a size-1 dimension of a permuted
    /// weight); otherwise a contiguous copy.
    pub fn reshape(&self, shape: impl AsRef<[usize]>) -> Result<Tensor, String> {
        let shape = Dims::from_slice(shape.as_ref());
        let n: usize = shape.iter().product();
        if n != self.numel() {
            return Err(format!(
                "cannot reshape {:?} ({} elements) to {shape:?}",
                self.shape,
                self.numel()
            ));
        }
        if !self.is_contiguous() {
            if let Some(strides) = reshape_view_strides(&self.shape, &self.strides, &shape) {
                return Ok(Tensor {
                    shape,
                    strides,
                    offset: self.offset,
                    data: self.data.clone(),
                });
            }
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
        let mut seen: Dims<bool> = SmallVec::from_elem(false, self.shape.len());
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
        let mut idx: Dims<usize> = SmallVec::from_elem(0, rank);
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
        storage_map!(&*self.data, v => self.gather(v))
    }
    /// The elements of `v` (this tensor's storage, of any element type) in row-major order;
    /// a run along a unit-stride last dimension is copied as a block.
    pub(crate) fn gather<T: Copy + Send + Sync + crate::cpu::buffer_pool::Pooled>(
        &self,
        v: &[T],
    ) -> Vec<T> {
        let n = self.numel();
        let rank = self.shape.len();
        if rank == 0 || n == 0 {
            return if n == 0 {
                Vec::new()
            } else {
                // (recycled, as the copies below: an integer scalar's operand, every step)
                crate::cpu::buffer_pool::collect(1, std::iter::once(v[self.offset]))
            };
        }
        if self.is_contiguous() {
            // a recycled buffer: `contiguous()` copies are kernel outputs and operands
            let mut out = crate::cpu::buffer_pool::take(n);
            out.extend_from_slice(&v[self.offset..self.offset + n]);
            return out;
        }
        // dims the view steps through as one are merged, so each run is as long as it can be;
        // the strided walk fills a recycled buffer run by run, shared among the rank's threads
        // when it is large
        let (shape, strides) = crate::cpu::strided::coalesce(&self.shape, &[&self.strides]);
        let step = strides[0][shape.len() - 1];
        let run = |p: isize, dst: &mut [std::mem::MaybeUninit<T>]| {
            let (p, m) = (p as usize, dst.len());
            match step {
                1 => crate::cpu::strided::copy_run(dst, &v[p..p + m]),
                0 => dst.iter_mut().for_each(|d| {
                    d.write(v[p]);
                }),
                // a flipped run (`torch.flip` of the last dimensions)
                -1 => dst
                    .iter_mut()
                    .zip(v[p + 1 - m..=p].iter().rev())
                    .for_each(|(d, &x)| {
                        d.write(x);
                    }),
                s => dst.iter_mut().enumerate().for_each(|(j, d)| {
                    d.write(v[(p as isize + j as isize * s) as usize]);
                }),
            }
        };
        let offset = self.offset as isize;
        crate::cpu::strided::fill_transposed(&shape, &strides[0], offset, run).unwrap_or_else(
            || crate::cpu::strided::fill(&shape, &strides, [offset], |[p], dst| run(p, dst)),
        )
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
    /// The elements in row-major order as `T` (borrowed when contiguous); `None` when the
    /// tensor's dtype is not `T`'s.
    pub fn elems<T: Elem>(&self) -> Option<std::borrow::Cow<'_, [T]>> {
        let v = T::slice(&self.data)?;
        Some(if self.is_contiguous() {
            std::borrow::Cow::Borrowed(&v[self.offset..self.offset + self.numel()])
        } else {
            std::borrow::Cow::Owned(self.gather(v))
        })
    }
    pub fn as_i64(&self) -> Option<&[i64]> {
        match (&*self.data, self.is_contiguous()) {
            (Storage::I64(v), true) => Some(&v[self.offset..self.offset + self.numel()]),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<&[bool]> {
        match (&*self.data, self.is_contiguous()) {
            (Storage::Bool(v), true) => Some(&v[self.offset..self.offset + self.numel()]),
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
        headers::unwrap(self.data).unwrap_or_else(|shared| (*shared).clone())
    }
    /// The storage itself when this tensor is its last holder (any view or stride): what the
    /// executor hands back to the buffer pool after a value's last use. `None` while another
    /// tensor still shares it.
    pub(crate) fn storage_id(&self) -> usize {
        Arc::as_ptr(&self.data) as usize
    }
    pub fn into_unshared_storage(self) -> Option<Storage> {
        headers::unwrap(self.data).ok()
    }
    /// The storage, to write in place: made whole and unshared first (a contiguous copy)
    /// when the tensor is a view, strided, or shares it.
    pub(crate) fn storage_mut(&mut self) -> &mut Storage {
        self.make_writable();
        Arc::make_mut(&mut self.data)
    }
    /// Makes the tensor whole and the only holder of its storage, by a contiguous copy (into a
    /// pooled buffer, on this thread) when it is a view, strided, or shares it; for a buffer
    /// that another thread will write in place (a collective's).
    pub(crate) fn make_writable(&mut self) {
        if !self.is_whole()
            || Arc::strong_count(&self.data) != 1
            || Arc::weak_count(&self.data) != 0
        {
            *self = Tensor::new(self.shape.clone(), self.copied());
        }
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
        if let Storage::F32(v) = &*self.data {
            return self.gather(v);
        }
        self.f32_into(Vec::with_capacity(self.numel()))
    }
    /// [`Tensor::to_f32_vec`] in a recycled buffer (a kernel's operand or output).
    pub(crate) fn to_f32_pooled(&self) -> Vec<f32> {
        if let Storage::F32(v) = &*self.data {
            return self.gather(v);
        }
        self.f32_into(crate::cpu::buffer_pool::take(self.numel()))
    }
    /// Appends the elements, converted to f32, to `out`.
    fn f32_into(&self, mut out: Vec<f32>) -> Vec<f32> {
        match &*self.data {
            Storage::F32(v) => out.extend(self.positions().map(|p| v[p])),
            Storage::F64(v) => out.extend(self.positions().map(|p| v[p] as f32)),
            Storage::BF16(v) => out.extend(self.positions().map(|p| v[p].to_f32())),
            Storage::F16(v) => out.extend(self.positions().map(|p| v[p].to_f32())),
            Storage::I64(v) => out.extend(self.positions().map(|p| v[p] as f32)),
            Storage::I32(v) => out.extend(self.positions().map(|p| v[p] as f32)),
            Storage::Bool(v) => out.extend(self.positions().map(|p| f32::from(u8::from(v[p])))),
        }
        out
    }
    /// The first element (in row-major order) converted to f64, without a copy of the rest
    /// (a loss, a scalar); `None` when the tensor has no elements.
    pub fn first_f64(&self) -> Option<f64> {
        if self.numel() == 0 {
            return None;
        }
        let at = self.offset;
        Some(match &*self.data {
            Storage::F32(v) => f64::from(*v.get(at)?),
            Storage::F64(v) => *v.get(at)?,
            Storage::BF16(v) => v.get(at)?.to_f64(),
            Storage::F16(v) => v.get(at)?.to_f64(),
            Storage::I64(v) => *v.get(at)? as f64,
            Storage::I32(v) => f64::from(*v.get(at)?),
            Storage::Bool(v) => f64::from(u8::from(*v.get(at)?)),
        })
    }
    /// Elements in row-major order, converted to f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.f64_into(Vec::with_capacity(self.numel()))
    }
    /// [`Tensor::to_f64_vec`] in a recycled buffer (a kernel's operand or output).
    pub(crate) fn to_f64_pooled(&self) -> Vec<f64> {
        self.f64_into(crate::cpu::buffer_pool::take(self.numel()))
    }
    /// Appends the elements, converted to f64, to `out`.
    fn f64_into(&self, mut out: Vec<f64>) -> Vec<f64> {
        match &*self.data {
            Storage::F32(v) => out.extend(self.positions().map(|p| v[p] as f64)),
            Storage::F64(v) => out.extend(self.positions().map(|p| v[p])),
            Storage::BF16(v) => out.extend(self.positions().map(|p| v[p].to_f64())),
            Storage::F16(v) => out.extend(self.positions().map(|p| v[p].to_f64())),
            Storage::I64(v) => out.extend(self.positions().map(|p| v[p] as f64)),
            Storage::I32(v) => out.extend(self.positions().map(|p| v[p] as f64)),
            Storage::Bool(v) => out.extend(self.positions().map(|p| f64::from(u8::from(v[p])))),
        }
        out
    }
    /// Elements in row-major order, converted to i64 (floats truncate toward zero, saturating).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        if let Storage::I64(v) = &*self.data {
            return self.gather(v);
        }
        self.i64_into(Vec::with_capacity(self.numel()))
    }
    /// [`Tensor::to_i64_vec`] in a recycled buffer (a kernel's output).
    fn to_i64_pooled(&self) -> Vec<i64> {
        if let Storage::I64(v) = &*self.data {
            return self.gather(v);
        }
        self.i64_into(crate::cpu::buffer_pool::take(self.numel()))
    }
    /// Appends the elements, converted to i64, to `out`.
    fn i64_into(&self, mut out: Vec<i64>) -> Vec<i64> {
        match &*self.data {
            Storage::F32(v) => out.extend(self.positions().map(|p| v[p] as i64)),
            Storage::F64(v) => out.extend(self.positions().map(|p| v[p] as i64)),
            Storage::BF16(v) => out.extend(self.positions().map(|p| v[p].to_f32() as i64)),
            Storage::F16(v) => out.extend(self.positions().map(|p| v[p].to_f32() as i64)),
            Storage::I64(v) => out.extend(self.positions().map(|p| v[p])),
            Storage::I32(v) => out.extend(self.positions().map(|p| i64::from(v[p]))),
            Storage::Bool(v) => out.extend(self.positions().map(|p| i64::from(v[p]))),
        }
        out
    }
    /// Elements in row-major order as booleans (`x != 0`; NaN is true, as in PyTorch).
    pub fn to_bool_vec(&self) -> Vec<bool> {
        if let Storage::Bool(v) = &*self.data {
            return self.gather(v);
        }
        self.bool_into(Vec::with_capacity(self.numel()))
    }
    /// [`Tensor::to_bool_vec`] in a recycled buffer (a kernel's output).
    fn to_bool_pooled(&self) -> Vec<bool> {
        if let Storage::Bool(v) = &*self.data {
            return self.gather(v);
        }
        self.bool_into(crate::cpu::buffer_pool::take(self.numel()))
    }
    /// Appends the elements as booleans to `out`.
    fn bool_into(&self, mut out: Vec<bool>) -> Vec<bool> {
        match &*self.data {
            Storage::F32(v) => out.extend(self.positions().map(|p| v[p] != 0.0)),
            Storage::F64(v) => out.extend(self.positions().map(|p| v[p] != 0.0)),
            Storage::BF16(v) => out.extend(self.positions().map(|p| v[p].to_f32() != 0.0)),
            Storage::F16(v) => out.extend(self.positions().map(|p| v[p].to_f32() != 0.0)),
            Storage::I64(v) => out.extend(self.positions().map(|p| v[p] != 0)),
            Storage::I32(v) => out.extend(self.positions().map(|p| v[p] != 0)),
            Storage::Bool(v) => out.extend(self.positions().map(|p| v[p])),
        }
        out
    }
    /// Converts to another dtype (a copy, even to the same dtype when not contiguous); to f32,
    /// f64, i64 and bool in a recycled buffer, as a kernel's output.
    pub fn to_dtype(&self, dtype: DType) -> Option<Tensor> {
        if dtype == self.dtype() {
            return Some(self.contiguous());
        }
        let data = match dtype {
            DType::F64 => Storage::F64(self.to_f64_pooled()),
            DType::F32 => Storage::F32(self.to_f32_pooled()),
            DType::BF16 => {
                Storage::BF16(self.to_f32_vec().into_iter().map(bf16::from_f32).collect())
            }
            DType::F16 => Storage::F16(self.to_f32_vec().into_iter().map(f16::from_f32).collect()),
            DType::I64 => Storage::I64(self.to_i64_pooled()),
            // i64 -> i32 wraps, as PyTorch's cast does
            DType::I32 => Storage::I32(self.to_i64_vec().into_iter().map(|x| x as i32).collect()),
            DType::Bool => Storage::Bool(self.to_bool_pooled()),
            _ => return None,
        };
        Some(Tensor::new(self.shape.clone(), data))
    }
    /// The elements of `parts`, each flattened, one after another as one 1-D tensor (a
    /// bucket's members, the shards of an all-gather), in a buffer from the pool; `None` when
    /// they differ in dtype or there are none.
    pub fn cat_flat(parts: &[Tensor]) -> Option<Tensor> {
        fn cat<T: Elem + crate::cpu::buffer_pool::Pooled>(
            parts: &[Tensor],
            total: usize,
        ) -> Option<Storage> {
            let mut out: Vec<T> = crate::cpu::buffer_pool::take(total);
            for p in parts {
                out.extend_from_slice(&p.elems::<T>()?);
            }
            Some(T::wrap(out))
        }
        let total: usize = parts.iter().map(Tensor::numel).sum();
        let data = match parts.first()?.dtype() {
            DType::F32 => cat::<f32>(parts, total),
            DType::F64 => cat::<f64>(parts, total),
            DType::BF16 => cat::<bf16>(parts, total),
            DType::F16 => cat::<f16>(parts, total),
            DType::I64 => cat::<i64>(parts, total),
            DType::I32 => cat::<i32>(parts, total),
            DType::Bool => cat::<bool>(parts, total),
            _ => None,
        }?;
        Some(Tensor::new([total], data))
    }
    /// Elements `start .. start + len` of the flattened tensor, copied into storage of their
    /// own (a rank's shard: it keeps nothing else of the whole alive), from the buffer pool.
    pub fn flat_range(&self, start: usize, len: usize) -> Option<Tensor> {
        if start.checked_add(len)? > self.numel() {
            return None;
        }
        let whole = self.contiguous();
        Tensor::cat_flat(&[Tensor::view_of(&whole, start, [len])])
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
            (Storage::I64(_) | Storage::I32(_), _) => self.to_i64_vec() == other.to_i64_vec(),
            (Storage::Bool(_), _) => self.to_bool_vec() == other.to_bool_vec(),
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
        assert!(t.reshape([4]).is_err());
    }

    /// A strided tensor reshapes to a view where PyTorch's would be one (the permuted
    /// weight of Thunder's convolution backward gaining and losing a size-1 dimension), to a
    /// copy where not, and always to the elements of the contiguous tensor's reshape.
    #[test]
    fn reshape_of_a_strided_tensor_is_a_view_where_the_strides_allow() {
        let w = Tensor::from_f32(vec![4, 3, 2, 2], (0..48).map(|x| x as f32).collect());
        let shares = |a: &Tensor, b: &Tensor| Arc::ptr_eq(&a.data, &b.data);
        let p = w.permute(&[1, 0, 2, 3]).expect("perm");
        let v = p.reshape([3, 1, 4, 2, 2]).expect("reshape");
        assert!(shares(&v, &w));
        let back = v
            .permute(&[1, 0, 2, 3, 4])
            .and_then(|x| x.reshape([3, 4, 2, 2]))
            .expect("reshape");
        assert!(shares(&back, &w));
        assert_eq!(back.to_f32_vec(), p.to_f32_vec());
        // merging the trailing 2x2 of the permuted tensor is a view too; merging across the
        // permuted dimensions is not
        assert!(shares(&p.reshape([3, 4, 4]).expect("reshape"), &w));
        let c = p.reshape([12, 4]).expect("reshape");
        assert!(!shares(&c, &w));
        // every reshape of every permutation of a [2, 3, 4] tensor: the contiguous elements
        let t = Tensor::from_f32(vec![2, 3, 4], (0..24).map(|x| x as f32).collect());
        let perms = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        let shapes: [&[usize]; 8] = [
            &[24],
            &[2, 12],
            &[6, 4],
            &[4, 6],
            &[3, 2, 4],
            &[1, 24, 1],
            &[2, 1, 3, 1, 4],
            &[4, 3, 2],
        ];
        for perm in perms {
            let p = t.permute(&perm).expect("perm");
            for shape in shapes {
                let got = p.reshape(shape).expect("reshape");
                let want = p.contiguous().reshape(shape).expect("reshape");
                assert_eq!(got.shape(), shape);
                assert_eq!(got.to_f32_vec(), want.to_f32_vec(), "{perm:?} -> {shape:?}");
            }
        }
    }

    /// A large strided copy is shared among a pool's threads by blocks of the first
    /// dimension: the same elements as on one thread, for a transpose, a flip and a
    /// broadcast, and for batches of transposes (the tiled copy).
    #[test]
    fn a_large_gather_on_threads_gives_the_one_thread_elements() {
        let t = Tensor::from_f32(
            vec![96, 80, 3, 3],
            (0..96 * 720).map(|x| x as f32).collect(),
        );
        let n = 3 * 67 * 71 * 10;
        let u = Tensor::from_f32(vec![n], (0..n).map(|x| x as f32).collect());
        let views = [
            t.permute(&[1, 0, 2, 3]).expect("perm"),
            // the permuted weight with its 3x3 taps reversed, as `flip` reads it
            t.view(vec![80, 96, 3, 3], vec![9, 720, -3, -1], 8)
                .expect("flipped view"),
            t.view(vec![96, 4, 720], vec![720, 0, 1], 0)
                .expect("broadcast"),
            // a batch of transposes whose row count is no multiple of the tile, with runs of
            // every step kind: +1, -1, and 2
            u.view(vec![3, 67, 71, 5], vec![67 * 71 * 5, 5, 67 * 5, 1], 0)
                .expect("batched transpose"),
            u.view(vec![3, 67, 71, 5], vec![67 * 71 * 5, 5, 67 * 5, -1], 4)
                .expect("batched flipped transpose"),
            u.view(vec![3, 67, 71, 5], vec![67 * 71 * 10, 10, 67 * 10, 2], 0)
                .expect("batched transpose with a step"),
        ];
        // the transposes with short rows go through the tiled copy
        let tiled = |v: &Tensor| {
            let (shape, strides) = crate::cpu::strided::coalesce(v.shape(), &[v.strides()]);
            let run = |_: isize, d: &mut [std::mem::MaybeUninit<f32>]| {
                d.iter_mut().for_each(|x| {
                    x.write(0.0);
                })
            };
            crate::cpu::strided::fill_transposed(&shape, &strides[0], v.offset as isize, run)
                .is_some()
        };
        let kinds: Vec<bool> = views.iter().map(tiled).collect();
        assert_eq!(kinds, [true, true, false, true, true, true]);
        for v in &views {
            assert!(v.numel() >= crate::cpu::strided::PARALLEL_MIN);
            let run = || v.contiguous().to_f32_vec();
            let (one, three) = crate::cpu::alone_and_in_three_threads(run);
            // the storage holds each element's own index
            let want: Vec<f32> = v.positions().map(|p| p as f32).collect();
            let first_difference =
                |got: &[f32]| (0..want.len()).find(|&i| got.get(i) != want.get(i));
            assert_eq!(one.len(), want.len());
            assert_eq!(first_difference(&one), None, "{:?} alone", v.strides());
            assert_eq!(
                first_difference(&three),
                None,
                "{:?} on threads",
                v.strides()
            );
        }
    }

    #[test]
    fn views_share_storage() {
        let t = Tensor::from_f32(vec![6], vec![0., 1., 2., 3., 4., 5.]);
        let v = Tensor::view_of(&t, 2, vec![2, 2]);
        assert_eq!(v.to_f32_vec(), vec![2., 3., 4., 5.]);
        assert!(Arc::ptr_eq(v.storage_arc(), t.storage_arc()));
        let r = v.reshape([4]).expect("same count");
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
        assert!(t.to_dtype(DType::U8).is_none());
    }

    #[test]
    fn integer_and_bool_casts_follow_pytorch() {
        let t = Tensor::from_f32(vec![5], vec![-1.7, -0.2, 0.0, 2.9, f32::NAN]);
        let i = t.to_dtype(DType::I64).expect("i64");
        assert_eq!(i.dtype(), DType::I64);
        assert_eq!(i.as_i64().expect("contiguous"), &[-1, 0, 0, 2, 0]);
        let b = t.to_dtype(DType::Bool).expect("bool");
        assert_eq!(
            b.as_bool().expect("contiguous"),
            &[true, true, false, true, true]
        );
        assert_eq!(b.to_f32_vec(), vec![1., 1., 0., 1., 1.]);
        let big = Tensor::from_i64(vec![2], vec![(1 << 40) + 3, -5]);
        assert_eq!(
            big.to_dtype(DType::I32).expect("i32").to_i64_vec(),
            vec![3, -5]
        );
        assert_eq!(
            big.to_dtype(DType::F64).expect("f64").to_f64_vec(),
            vec![(1u64 << 40) as f64 + 3.0, -5.0]
        );
        // an integer tensor round-trips through a transposed copy
        let m = Tensor::from_i64(vec![2, 3], vec![0, 1, 2, 3, 4, 5]);
        let p = m.permute(&[1, 0]).expect("2-d").contiguous();
        assert_eq!(p.as_i64().expect("contiguous"), &[0, 3, 1, 4, 2, 5]);
        assert!(m.bitwise_eq(&p.permute(&[1, 0]).expect("2-d")));
        assert!(!m.bitwise_eq(&p));
    }

    #[test]
    fn views_are_bounds_checked_and_gather_by_rows() {
        let t = Tensor::from_f32(vec![6], vec![0., 1., 2., 3., 4., 5.]);
        // broadcast row: stride 0 on the outer dim
        let e = t.view(vec![2, 3], vec![0, 1], 1).expect("inside");
        assert_eq!(e.to_f32_vec(), vec![1., 2., 3., 1., 2., 3.]);
        // stride 0 on the inner dim, stride 2 on the outer
        let r = t.view(vec![3, 2], vec![2, 0], 0).expect("inside");
        assert_eq!(r.to_f32_vec(), vec![0., 0., 2., 2., 4., 4.]);
        // negative stride (a flip) reads backwards
        let f = t.view(vec![3], vec![-2], 5).expect("inside");
        assert_eq!(f.to_f32_vec(), vec![5., 3., 1.]);
        assert!(t.view(vec![2, 3], vec![3, 1], 1).is_err());
        assert!(t.view(vec![3], vec![-2], 3).is_err());
        assert!(t.view(vec![3], vec![1, 1], 0).is_err());
    }
}
