//! The binary format: a fixed header (magic, format version, payload length, CRC-32) in front of
//! a bincode 2 payload of the serde form. The codec is this one module, so swapping bincode for
//! another serde format touches nothing else.
//!
//! Versions: 2 and later store each trace in columns (see `columns.rs`); 1 stored it as rows
//! of nodes and values, and is still read. 3 added the parameters' buffer flag; 4 added the
//! nested left-hand side (`Lhs::Nested`), a binding no earlier file holds, so every earlier
//! file reads as it did; 5 (written) added the parameters' shard placement (`fsdp`), absent
//! (not sharded) in every earlier file.

use crate::program::Module;

/// First bytes of every `.tpb` file.
pub const MAGIC: [u8; 8] = *b"TRACEPB\0";
/// Version of the payload layout; bump on any incompatible change of the serde form.
pub const FORMAT_VERSION: u32 = 5;
/// The oldest version this build still reads.
pub const OLDEST_READ_VERSION: u32 = 1;
/// magic (8) + version (4) + crc32 (4) + payload length (8).
pub const HEADER_LEN: usize = 24;
/// Upper bound on what a decoder will allocate from length prefixes.
const DECODE_LIMIT: usize = 1 << 34;

/// Everything that can be wrong with a binary file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The file does not start with [`MAGIC`]: it is not a `.tpb` file.
    #[error("not a tracepass binary file: expected magic {expected:?}, found {found:?}")]
    BadMagic {
        /// [`MAGIC`], as text.
        expected: String,
        /// The file's first bytes (up to eight), as text.
        found: String,
    },
    /// The header's format version is one this build does not read.
    #[error("unsupported format version {found} (this build reads versions {OLDEST_READ_VERSION} to {supported})")]
    UnsupportedVersion {
        /// The version in the header.
        found: u32,
        /// The newest version this build reads ([`FORMAT_VERSION`]).
        supported: u32,
    },
    /// The payload is shorter than the header says: the file was cut off.
    #[error("truncated: the header says {expected} payload bytes, the file has {found}")]
    Truncated {
        /// Payload bytes the header announces.
        expected: u64,
        /// Payload bytes the file has.
        found: u64,
    },
    /// The file ends inside the header.
    #[error("file too short for the {HEADER_LEN}-byte header ({found} bytes)")]
    ShortHeader {
        /// The file's length in bytes.
        found: usize,
    },
    /// The file goes on after the payload the header announces.
    #[error("{extra} bytes after the payload the header announces")]
    TrailingBytes {
        /// How many bytes follow the payload.
        extra: u64,
    },
    /// The payload's CRC-32 is not the header's: the file is corrupt.
    #[error("checksum mismatch: header says {stored:#010x}, payload has {computed:#010x} (the file is corrupt)")]
    ChecksumMismatch {
        /// The checksum in the header.
        stored: u32,
        /// The checksum of the payload as read.
        computed: u32,
    },
    /// The header is sound but the payload is not a module (bincode's message, or unread bytes).
    #[error("payload does not decode: {0}")]
    Decode(String),
    /// Bincode could not encode the module (its message).
    #[error("cannot encode: {0}")]
    Encode(String),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT>()
}

/// Bincode writer appending to a vector.
struct VecWriter<'a>(&'a mut Vec<u8>);

impl bincode::enc::write::Writer for VecWriter<'_> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// A generous guess at the payload size (synthetic and Thunder traces take 50 to 70 bytes a
/// node), so the output is allocated once instead of growing by doubling, which would copy
/// everything written so far at each step.
fn payload_hint(m: &Module) -> usize {
    let size = |t: &crate::Trace| 80 * t.node_count() + 16 * t.value_count();
    4096 + match m {
        Module::Trace(t) => size(t),
        Module::Program(p) => size(&p.forward) + size(&p.backward),
    }
}

/// Header + payload, written into one buffer: the payload goes behind a header whose checksum
/// and length are filled in once it is complete.
pub fn encode(m: &Module) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload_hint(m));
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&[0; 12]); // crc32 and length, below
    bincode::serde::encode_into_writer(m, VecWriter(&mut out), config())
        .map_err(|e| CodecError::Encode(e.to_string()))?;
    let payload = &out[HEADER_LEN..];
    let crc = crc32fast::hash(payload);
    let len = payload.len() as u64;
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out[16..24].copy_from_slice(&len.to_le_bytes());
    Ok(out)
}

/// Checks the header, then decodes. Never panics on bad input.
pub fn decode(bytes: &[u8]) -> Result<Module, CodecError> {
    if bytes.len() < MAGIC.len() || bytes[..MAGIC.len()] != MAGIC {
        let n = bytes.len().min(MAGIC.len());
        return Err(CodecError::BadMagic {
            expected: String::from_utf8_lossy(&MAGIC).into_owned(),
            found: String::from_utf8_lossy(&bytes[..n]).into_owned(),
        });
    }
    if bytes.len() < HEADER_LEN {
        return Err(CodecError::ShortHeader { found: bytes.len() });
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let version = word(8);
    if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(CodecError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let stored = word(12);
    let len = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    let have = (bytes.len() - HEADER_LEN) as u64;
    if have < len {
        return Err(CodecError::Truncated {
            expected: len,
            found: have,
        });
    }
    if have > len {
        return Err(CodecError::TrailingBytes { extra: have - len });
    }
    let payload = &bytes[HEADER_LEN..];
    let computed = crc32fast::hash(payload);
    if computed != stored {
        return Err(CodecError::ChecksumMismatch { stored, computed });
    }
    let (m, used): (Module, usize) = crate::trace::decoding(payload.len(), version, || {
        bincode::serde::decode_from_slice(payload, config())
    })
    .map_err(|e| CodecError::Decode(e.to_string()))?;
    if used != payload.len() {
        return Err(CodecError::Decode(format!(
            "payload has {} unread bytes",
            payload.len() - used
        )));
    }
    Ok(m)
}
