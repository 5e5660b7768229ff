//! Errors of loading and saving files.

use crate::codec::CodecError;
use crate::parse::ParseError;
use crate::program::ProgramError;
use std::path::PathBuf;

/// A file could not be read or written; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: {error}")]
    Parse { path: PathBuf, error: ParseError },
    #[error("{path}: {error}")]
    Codec { path: PathBuf, error: CodecError },
    #[error("{path}: invalid JSON trace: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: unknown file extension; use .trace (text), .tpb (binary) or .json")]
    UnknownFormat { path: PathBuf },
    #[error("{path}: a .trace file holds one trace, and this is a program (forward + backward); write .tpb or .json")]
    ProgramAsText { path: PathBuf },
    #[error("{path}: holds a single trace where a program (forward + backward) is needed; pair it with --forward")]
    NotAProgram { path: PathBuf },
    #[error("{0}")]
    Program(#[from] ProgramError),
    #[error("{path}: {error}")]
    InProgram {
        path: PathBuf,
        error: Box<ProgramError>,
    },
}
