//! Errors of loading and saving files.

use crate::codec::CodecError;
use crate::parse::ParseError;
use crate::program::ProgramError;
use std::path::PathBuf;

/// A file could not be read or written; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Reading or writing failed (missing file, permissions, text that is not UTF-8).
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system (or the UTF-8 check) said.
        error: std::io::Error,
    },
    /// A text trace (or prologue) does not parse.
    #[error("{path}: {error}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why, by line and column.
        error: ParseError,
    },
    /// A binary file is damaged, of another version, or not a `.tpb` file at all.
    #[error("{path}: {error}")]
    Codec {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        error: CodecError,
    },
    /// A JSON file (a trace, a program, `export.json`) does not read or write.
    #[error("{path}: invalid JSON trace: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// serde_json's message, or why the content is refused.
        message: String,
    },
    /// `export.json` reads but says something an export cannot mean.
    #[error("{path}: {message}")]
    ExportInfo {
        /// The `export.json` file.
        path: PathBuf,
        /// What is wrong and how to put it right.
        message: String,
    },
    /// The file's extension names no format (the format is chosen by extension).
    #[error("{path}: unknown file extension; use .trace (text), .tpb (binary) or .json")]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// A program was to be written as text, which holds a single trace.
    #[error("{path}: a .trace file holds one trace, and this is a program (forward + backward); write .tpb or .json")]
    ProgramAsText {
        /// The file.
        path: PathBuf,
    },
    /// A file holds one trace where a program is needed.
    #[error("{path}: holds a single trace where a program (forward + backward) is needed; pair it with --forward")]
    NotAProgram {
        /// The file.
        path: PathBuf,
    },
    /// The traces read do not make a program; the error names the traces, not a file.
    #[error("{0}")]
    Program(#[from] ProgramError),
    /// The traces of a file or directory (an export) do not make a program.
    #[error("{path}: {error}")]
    InProgram {
        /// The file or export directory.
        path: PathBuf,
        /// Why they do not pair (boxed: it is large, and rare).
        error: Box<ProgramError>,
    },
}
