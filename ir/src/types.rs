//! Element types, devices and value types, with their Thunder spellings.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor. Short names follow Thunder's printer (`f32`, `bf16`, `b8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    /// 64-bit float (`f64`, `float64`).
    F64,
    /// 32-bit float (`f32`, `float32`).
    F32,
    /// IEEE half precision (`f16`, `float16`).
    F16,
    /// bfloat16: float32's exponent, 8 bits of mantissa (`bf16`, `bfloat16`).
    BF16,
    /// 8-bit float, 4 exponent and 3 mantissa bits, finite only (`f8_e4m3fn`, `float8_e4m3fn`).
    F8E4M3,
    /// 8-bit float, 5 exponent and 2 mantissa bits (`f8_e5m2`, `float8_e5m2`).
    F8E5M2,
    /// Like [`DType::F8E4M3`], with no negative zero and another exponent bias (AMD's;
    /// `float8_e4m3fnuz`).
    F8E4M3Fnuz,
    /// Like [`DType::F8E5M2`] but finite, with no negative zero and another exponent bias
    /// (AMD's; `float8_e5m2fnuz`).
    F8E5M2Fnuz,
    /// 64-bit signed integer (`i64`, `int64`).
    I64,
    /// 32-bit signed integer (`i32`, `int32`).
    I32,
    /// 16-bit signed integer (`i16`, `int16`).
    I16,
    /// 8-bit signed integer (`i8`, `int8`).
    I8,
    /// 8-bit unsigned integer (`u8`, `uint8`).
    U8,
    /// Boolean, one byte an element (`b8`; Thunder's `bool8`, PyTorch's `bool`).
    Bool,
}

/// (dtype, short name, Thunder `dtypes.` name, torch name)
const DTYPE_NAMES: &[(DType, &str, &str, &str)] = &[
    (DType::F64, "f64", "float64", "float64"),
    (DType::F32, "f32", "float32", "float32"),
    (DType::F16, "f16", "float16", "float16"),
    (DType::BF16, "bf16", "bfloat16", "bfloat16"),
    (DType::F8E4M3, "f8_e4m3fn", "float8_e4m3fn", "float8_e4m3fn"),
    (DType::F8E5M2, "f8_e5m2", "float8_e5m2", "float8_e5m2"),
    (
        DType::F8E4M3Fnuz,
        "f8_e4m3fnuz",
        "float8_e4m3fnuz",
        "float8_e4m3fnuz",
    ),
    (
        DType::F8E5M2Fnuz,
        "f8_e5m2fnuz",
        "float8_e5m2fnuz",
        "float8_e5m2fnuz",
    ),
    (DType::I64, "i64", "int64", "int64"),
    (DType::I32, "i32", "int32", "int32"),
    (DType::I16, "i16", "int16", "int16"),
    (DType::I8, "i8", "int8", "int8"),
    (DType::U8, "u8", "uint8", "uint8"),
    (DType::Bool, "b8", "bool8", "bool"),
];

impl DType {
    fn entry(self) -> &'static (DType, &'static str, &'static str, &'static str) {
        DTYPE_NAMES
            .iter()
            .find(|e| e.0 == self)
            .expect("every dtype has a row in DTYPE_NAMES")
    }
    /// Thunder's short name in type strings: `f32`.
    pub fn short_name(self) -> &'static str {
        self.entry().1
    }
    /// Name after `dtypes.` in Thunder (`float32`).
    pub fn thunder_name(self) -> &'static str {
        self.entry().2
    }
    /// Name after `torch.` (`float32`).
    pub fn torch_name(self) -> &'static str {
        self.entry().3
    }
    /// The dtype of a short spelling (`f32`, `bf16`).
    pub fn from_short(s: &str) -> Option<DType> {
        DTYPE_NAMES.iter().find(|e| e.1 == s).map(|e| e.0)
    }
    /// The dtype of a Thunder spelling (`dtypes.float32`).
    pub fn from_thunder(s: &str) -> Option<DType> {
        // `float32_` is Thunder's strong variant of `float32` (weak dtypes only matter for
        // promotion while tracing; a trace's dtypes are concrete)
        let s = s.strip_suffix('_').unwrap_or(s);
        DTYPE_NAMES
            .iter()
            .find(|e| e.2 == s || (s == "bool" && e.0 == DType::Bool))
            .map(|e| e.0)
    }
    /// The dtype of a PyTorch spelling (`torch.float32`).
    pub fn from_torch(s: &str) -> Option<DType> {
        DTYPE_NAMES.iter().find(|e| e.3 == s).map(|e| e.0)
    }
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            _ => 1,
        }
    }
    /// Whether it is a floating-point dtype.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F64
                | DType::F32
                | DType::F16
                | DType::BF16
                | DType::F8E4M3
                | DType::F8E5M2
                | DType::F8E4M3Fnuz
                | DType::F8E5M2Fnuz
        )
    }
    /// Rank for type promotion between float types (higher wins).
    pub(crate) fn promotion_rank(self) -> u8 {
        match self {
            DType::Bool => 0,
            DType::U8 | DType::I8 => 1,
            DType::I16 => 2,
            DType::I32 => 3,
            DType::I64 => 4,
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3Fnuz | DType::F8E5M2Fnuz => 5,
            DType::F16 | DType::BF16 => 6,
            DType::F32 => 7,
            DType::F64 => 8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// Kind of device a tensor lives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeviceKind {
    /// The host (`cpu`).
    Cpu,
    /// An NVIDIA GPU (`cuda`, `cuda:0`).
    Cuda,
    /// PyTorch's `meta` device: shapes and dtypes, no data.
    Meta,
}

/// A device: `cpu`, `cuda:0`, `meta`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Device {
    /// CPU or CUDA.
    pub kind: DeviceKind,
    /// The device index (`cuda:1`), if any.
    pub index: Option<u32>,
}

impl Device {
    /// The CPU.
    pub const CPU: Device = Device {
        kind: DeviceKind::Cpu,
        index: None,
    };
    /// The CUDA device `index`.
    pub fn cuda(index: u32) -> Device {
        Device {
            kind: DeviceKind::Cuda,
            index: Some(index),
        }
    }
    fn kind_name(self) -> &'static str {
        match self.kind {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Meta => "meta",
        }
    }
    /// Parses `cpu`, `cuda`, `cuda:3`, `meta`.
    pub fn parse(s: &str) -> Option<Device> {
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => (k, Some(i.parse::<u32>().ok()?)),
            None => (s, None),
        };
        let kind = match kind {
            "cpu" => DeviceKind::Cpu,
            "cuda" => DeviceKind::Cuda,
            "meta" => DeviceKind::Meta,
            _ => return None,
        };
        Some(Device { kind, index })
    }
    /// Thunder's repr inside a FUTURE type: `thunder.devices.Device(type='cuda', index=0)`.
    pub fn thunder_repr(self) -> String {
        match self.index {
            Some(i) => format!(
                "thunder.devices.Device(type='{}', index={i})",
                self.kind_name()
            ),
            None => format!("thunder.devices.Device(type='{}')", self.kind_name()),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}:{i}", self.kind_name()),
            None => f.write_str(self.kind_name()),
        }
    }
}

/// A tensor's dimensions. Up to four sit inline (traces are mostly matrices and vectors), so a
/// value's type allocates nothing: building or copying a million-value table makes no heap
/// blocks for shapes.
pub type Shape = smallvec::SmallVec<[usize; 4]>;

/// Shape, dtype and device of a tensor.
#[derive(Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    /// Its shape.
    pub shape: Shape,
    /// Its dtype.
    pub dtype: DType,
    /// Its device.
    pub device: Device,
}

/// Copies an inline shape as one fixed-size block: the derived clone goes element by element,
/// and a copy of the shape's length calls `memcpy`. A value's type is cloned for every value a
/// trace copy or a decode makes.
impl Clone for TensorType {
    fn clone(&self) -> TensorType {
        let s = self.shape.as_slice();
        let shape = if self.shape.spilled() {
            Shape::from_slice(s)
        } else {
            let at = |i: usize| s.get(i).copied().unwrap_or(0);
            Shape::from_buf_and_len([at(0), at(1), at(2), at(3)], s.len())
        };
        TensorType {
            shape,
            dtype: self.dtype,
            device: self.device,
        }
    }
}

impl TensorType {
    /// A tensor type.
    pub fn new(shape: impl AsRef<[usize]>, dtype: DType, device: Device) -> Self {
        TensorType {
            shape: Shape::from_slice(shape.as_ref()),
            dtype,
            device,
        }
    }
    /// Element count. Saturates for a shape too large to exist (see
    /// [`TensorType::checked_nbytes`]; the parser, the decoder and the verifier reject those).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1, |n, d| n.saturating_mul(*d))
    }
    /// Byte size; saturates like [`TensorType::numel`].
    pub fn nbytes(&self) -> usize {
        self.numel().saturating_mul(self.dtype.size_bytes())
    }
    /// Byte size, or `None` when it is over [`MAX_TENSOR_BYTES`]: a shape a file can spell
    /// (`f32[8, 3233333333333333333]`) but no tensor can have.
    pub fn checked_nbytes(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(self.dtype.size_bytes(), |n, d| n.checked_mul(*d))
            .filter(|n| *n <= MAX_TENSOR_BYTES)
    }
    /// The same type with another shape.
    pub fn with_shape(&self, shape: impl AsRef<[usize]>) -> TensorType {
        TensorType {
            shape: Shape::from_slice(shape.as_ref()),
            dtype: self.dtype,
            device: self.device,
        }
    }
    fn write_dtype_shape(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ", self.device)?;
        self.write_dtype_shape(f)
    }
}

/// The type of a value, as Thunder's type comments write it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Type {
    /// A tensor: `cpu f32[8, 64]`.
    Tensor(TensorType),
    /// Result of an asynchronous collective; `dist.wait` turns it into the tensor.
    Future(TensorType),
    /// An integer: `int`, or `int 3` when the value is known at trace time.
    Int(Option<i64>),
    /// A float: `float`, or `float 0.5` when known; compared by bits.
    Float(Option<f64>),
    /// A boolean: `bool`, or `bool True` when known.
    Bool(Option<bool>),
    /// A string (`str`).
    Str,
    /// Python's `None` (`None`, `NoneType`).
    None,
    /// A tuple, list or dict of values (`Collection`), such as `saved_for_backward`.
    Collection,
    /// Unknown (`Any`): what a type comment does not say, or says as `Any`.
    Any,
    /// Process groups, enum members and other objects the IR carries but does not look into.
    Opaque {
        /// The Python type's name (`opaque <name>` in a type comment).
        type_name: String,
    },
}

/// Equal types hash equal: floats by their bits, as [`PartialEq`] compares them.
impl std::hash::Hash for Type {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        std::mem::discriminant(self).hash(h);
        match self {
            Type::Tensor(t) | Type::Future(t) => t.hash(h),
            Type::Int(x) => x.hash(h),
            Type::Float(x) => x.map(f64::to_bits).hash(h),
            Type::Bool(x) => x.hash(h),
            Type::Opaque { type_name } => type_name.hash(h),
            Type::Str | Type::None | Type::Collection | Type::Any => {}
        }
    }
}

// bitwise float comparison is reflexive
impl Eq for Type {}

impl PartialEq for Type {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Type::Tensor(a), Type::Tensor(b)) | (Type::Future(a), Type::Future(b)) => a == b,
            (Type::Int(a), Type::Int(b)) => a == b,
            (Type::Float(a), Type::Float(b)) => a.map(f64::to_bits) == b.map(f64::to_bits),
            (Type::Bool(a), Type::Bool(b)) => a == b,
            (Type::Str, Type::Str)
            | (Type::None, Type::None)
            | (Type::Collection, Type::Collection)
            | (Type::Any, Type::Any) => true,
            (Type::Opaque { type_name: a }, Type::Opaque { type_name: b }) => a == b,
            _ => false,
        }
    }
}

/// The largest tensor a trace may declare, in bytes: PyTorch counts elements and bytes in
/// `int64`, and every size and offset computed from a shape here must fit too.
pub const MAX_TENSOR_BYTES: usize = i64::MAX as usize;

impl Type {
    /// A tensor type.
    pub fn tensor(shape: impl AsRef<[usize]>, dtype: DType, device: Device) -> Type {
        Type::Tensor(TensorType::new(shape, dtype, device))
    }
    /// The tensor type, if it is one.
    pub fn as_tensor(&self) -> Option<&TensorType> {
        match self {
            Type::Tensor(t) => Some(t),
            _ => None,
        }
    }
    /// Whether it is a future.
    pub fn is_future(&self) -> bool {
        matches!(self, Type::Future(_))
    }
    /// The tensor a value of this type holds or will hold (tensors and futures).
    pub fn tensor_type(&self) -> Option<&TensorType> {
        match self {
            Type::Tensor(t) | Type::Future(t) => Some(t),
            _ => None,
        }
    }
    /// Whether a tensor or future type is too large to exist (over [`MAX_TENSOR_BYTES`]).
    pub fn is_oversized(&self) -> bool {
        self.tensor_type()
            .is_some_and(|t| t.checked_nbytes().is_none())
    }
    /// The canonical name prefix for values of this type (`t`, `ft`, `C`, `i`, `f`, `b`, `s`, `o`).
    pub fn name_prefix(&self) -> &'static str {
        match self {
            Type::Tensor(_) => "t",
            Type::Future(_) => "ft",
            Type::Collection => "C",
            Type::Int(_) => "i",
            Type::Float(_) => "f",
            Type::Bool(_) => "b",
            Type::Str => "s",
            Type::None | Type::Any | Type::Opaque { .. } => "o",
        }
    }
    /// Parses the text inside a type comment's quotes.
    pub fn parse(s: &str) -> Option<Type> {
        let s = s.trim();
        match s {
            "Collection" => return Some(Type::Collection),
            "Any" => return Some(Type::Any),
            "str" => return Some(Type::Str),
            "None" | "NoneType" => return Some(Type::None),
            // `float ?`: a number Thunder knows only at run time (`Tensor.item`)
            "int" | "int ?" => return Some(Type::Int(None)),
            "float" | "float ?" => return Some(Type::Float(None)),
            "bool" | "bool ?" => return Some(Type::Bool(None)),
            _ => {}
        }
        if let Some(rest) = s.strip_prefix("int ") {
            return rest.trim().parse().ok().map(|v| Type::Int(Some(v)));
        }
        if let Some(rest) = s.strip_prefix("float ") {
            return crate::pyfloat::parse(rest.trim()).map(|v| Type::Float(Some(v)));
        }
        if let Some(rest) = s.strip_prefix("bool ") {
            return match rest.trim() {
                "True" => Some(Type::Bool(Some(true))),
                "False" => Some(Type::Bool(Some(false))),
                _ => None,
            };
        }
        if let Some(rest) = s.strip_prefix("FUTURE ") {
            // FUTURE thunder.devices.Device(type='cpu') f32[4, 64]  or  FUTURE cpu f32[4]
            let (dev_text, tensor_text) = match rest.find(") ") {
                Some(pos) if rest.starts_with("thunder.devices.Device(") => {
                    (&rest[..pos + 1], &rest[pos + 2..])
                }
                _ => rest.split_once(' ')?,
            };
            let device = parse_device_repr(dev_text)?;
            let (dtype, shape) = parse_dtype_shape(tensor_text)?;
            return Some(Type::Future(TensorType::new(shape, dtype, device)));
        }
        if let Some(rest) = s.strip_prefix("opaque ") {
            return Some(Type::Opaque {
                type_name: rest.trim().to_string(),
            });
        }
        let (dev, rest) = s.split_once(' ')?;
        let device = Device::parse(dev)?;
        let (dtype, shape) = parse_dtype_shape(rest)?;
        Some(Type::Tensor(TensorType::new(shape, dtype, device)))
    }
}

/// `thunder.devices.Device(type='cuda', index=0)` or a plain `cuda:0`.
fn parse_device_repr(s: &str) -> Option<Device> {
    let Some(inner) = s
        .strip_prefix("thunder.devices.Device(")
        .and_then(|r| r.strip_suffix(')'))
    else {
        return Device::parse(s);
    };
    let mut kind = None;
    let mut index = None;
    for part in inner.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        match k.trim() {
            "type" => kind = Some(v.trim().trim_matches('\'').trim_matches('"').to_string()),
            "index" => index = Some(v.trim().parse::<u32>().ok()?),
            _ => return None,
        }
    }
    let mut d = Device::parse(&kind?)?;
    if index.is_some() {
        d.index = index;
    }
    Some(d)
}

/// `f32[8, 64]` → (F32, [8, 64]).
fn parse_dtype_shape(s: &str) -> Option<(DType, Vec<usize>)> {
    let open = s.find('[')?;
    let dtype = DType::from_short(&s[..open])?;
    let inner = s[open + 1..].strip_suffix(']')?;
    let shape = if inner.trim().is_empty() {
        Vec::new()
    } else {
        inner
            .split(',')
            .map(|d| d.trim().parse::<usize>().ok())
            .collect::<Option<Vec<_>>>()?
    };
    Some((dtype, shape))
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Tensor(t) => write!(f, "{t}"),
            Type::Future(t) => {
                write!(f, "FUTURE {} ", t.device.thunder_repr())?;
                t.write_dtype_shape(f)
            }
            Type::Int(None) => f.write_str("int"),
            Type::Int(Some(v)) => write!(f, "int {v}"),
            Type::Float(None) => f.write_str("float"),
            Type::Float(Some(v)) => write!(f, "float {}", crate::pyfloat::repr(*v)),
            Type::Bool(None) => f.write_str("bool"),
            Type::Bool(Some(v)) => f.write_str(if *v { "bool True" } else { "bool False" }),
            Type::Str => f.write_str("str"),
            Type::None => f.write_str("None"),
            Type::Collection => f.write_str("Collection"),
            Type::Any => f.write_str("Any"),
            Type::Opaque { type_name } => write!(f, "opaque {type_name}"),
        }
    }
}

/// NumPy broadcasting of two shapes (aligned at the right, 1s stretch); `None` if they clash.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    broadcast_shapes_in::<[usize; 0]>(a, b).map(smallvec::SmallVec::into_vec)
}

/// [`broadcast_shapes`] into a `SmallVec` of the caller's inline size (a runtime kernel's
/// output shape, made without a heap allocation).
pub fn broadcast_shapes_in<A: smallvec::Array<Item = usize>>(
    a: &[usize],
    b: &[usize],
) -> Option<smallvec::SmallVec<A>> {
    let n = a.len().max(b.len());
    let mut out = smallvec::SmallVec::<A>::from_elem(0, n);
    for i in 0..n {
        let x = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let y = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = if x == y || y == 1 {
            x
        } else if x == 1 {
            y
        } else {
            return None;
        };
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_equal_the_original_inline_or_spilled() {
        for rank in 0..=6 {
            let shape: Vec<usize> = (1..=rank).collect();
            let t = TensorType::new(&shape, DType::F32, Device::cuda(1));
            let c = t.clone();
            assert_eq!(c, t);
            assert_eq!(c.shape.as_slice(), shape.as_slice());
            assert_eq!(c.shape.spilled(), rank > 4);
        }
    }

    #[test]
    fn a_number_known_only_at_run_time_has_no_value() {
        // `f4 = Tensor.item(t_0)  # f4: "float ?"`
        assert_eq!(Type::parse("float ?"), Some(Type::Float(None)));
        assert_eq!(Type::parse("int ?"), Some(Type::Int(None)));
        assert_eq!(Type::parse("bool ?"), Some(Type::Bool(None)));
        assert_eq!(Type::parse("float ??"), None);
    }

    #[test]
    fn type_strings_round_trip() {
        for s in [
            "cpu f32[8, 64]",
            "cuda:0 bf16[2]",
            "cpu f32[]",
            "cpu b8[4, 64]",
            "FUTURE thunder.devices.Device(type='cpu') f32[4, 64]",
            "FUTURE thunder.devices.Device(type='cuda', index=1) f16[3]",
            "Collection",
            "int 32",
            "bool True",
            "float 25.0",
            "str",
        ] {
            let t = Type::parse(s).unwrap_or_else(|| panic!("parse {s}"));
            assert_eq!(t.to_string(), s);
        }
        assert_eq!(Type::parse("cpu q7[1]"), None);
        assert_eq!(Type::parse("gpu f32[1]"), None);
    }
}
