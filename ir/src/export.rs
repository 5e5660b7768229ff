//! The export directory a user hands over (docs/EXPORT_FORMAT.md): Thunder's forward, backward
//! and prologue traces, `export.json`, and the tensors (read by the runtime). This module turns
//! the traces and the JSON into a [`Program`]; the prologue decides what is a parameter.

use crate::error::FileError;
use crate::fsio::io_err;
use crate::parse::parse_trace_with;
use crate::program::Program;
use crate::prologue::parse_prologue;
use crate::registry::OpRegistry;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `export.json`: how to train the exported model. An unknown key is an error: a misspelt
/// `world_size` or `tied` would otherwise train another model than the one exported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportInfo {
    /// The version of the export format ([`EXPORT_FORMAT`] is the one this build reads).
    pub format: u32,
    /// The model's name (`nanogpt`), for messages and reports.
    pub model: String,
    /// `cross_entropy`, `mse`, `sum` or `output`.
    pub loss: String,
    /// Which of the forward's model outputs feeds the loss.
    #[serde(default)]
    pub output: usize,
    /// The name of the targets in `data.safetensors`.
    #[serde(default = "default_targets")]
    pub targets: String,
    /// Groups of parameter names that are one tensor.
    #[serde(default)]
    pub tied: Vec<Vec<String>>,
    /// `None` for a plain export; N when the backward already holds Thunder's DDP for N ranks.
    #[serde(default)]
    pub world_size: Option<usize>,
    /// The Thunder version that made the traces (`0.2.6`), when recorded.
    #[serde(default)]
    pub thunder: Option<String>,
    /// The PyTorch version it ran with (`2.9.0`), when recorded.
    #[serde(default)]
    pub torch: Option<String>,
}

fn default_targets() -> String {
    "targets".into()
}

/// The export formats this build reads.
pub const EXPORT_FORMAT: u32 = 1;

/// An export directory, read.
#[derive(Clone, Debug)]
pub struct Export {
    /// The directory, where the tensors are read from later.
    pub dir: PathBuf,
    /// Its `export.json`.
    pub info: ExportInfo,
    /// Forward and backward, paired by the prologue, with ties applied.
    pub program: Program,
}

impl Export {
    /// A file of the directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Whether `path` is an export directory (a directory holding `export.json`).
pub fn is_export_dir(path: &Path) -> bool {
    path.is_dir() && path.join("export.json").is_file()
}

fn read(path: &Path) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(io_err(path))
}

/// Reads an export directory with the built-in op registry.
pub fn load_export(dir: &Path) -> Result<Export, FileError> {
    load_export_with(dir, OpRegistry::builtin())
}

/// Reads `forward.trace`, `backward.trace`, `prologue.trace` and `export.json`; every error names
/// the file it is about.
pub fn load_export_with(dir: &Path, reg: &OpRegistry) -> Result<Export, FileError> {
    if !dir.is_dir() {
        return Err(FileError::Io {
            path: dir.to_path_buf(),
            error: std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
        });
    }
    let json_path = dir.join("export.json");
    let info: ExportInfo =
        serde_json::from_str(&read(&json_path)?).map_err(|e| FileError::ExportInfo {
            path: json_path.clone(),
            message: e.to_string(),
        })?;
    if info.format != EXPORT_FORMAT {
        return Err(FileError::ExportInfo {
            path: json_path,
            message: format!(
                "export format {} (this build reads format {EXPORT_FORMAT})",
                info.format
            ),
        });
    }
    if info.world_size == Some(0) {
        return Err(FileError::ExportInfo {
            path: json_path,
            message: "`world_size` 0: give the number of ranks Thunder's DDP was traced for (at least 1), or null for a plain export".into(),
        });
    }
    let trace = |name: &str| -> Result<crate::Trace, FileError> {
        let path = dir.join(name);
        parse_trace_with(&read(&path)?, reg).map_err(|error| FileError::Parse { path, error })
    };
    let forward = trace("forward.trace")?;
    let backward = trace("backward.trace")?;
    let pro_path = dir.join("prologue.trace");
    let prologue = parse_prologue(&read(&pro_path)?).map_err(|error| FileError::Parse {
        path: pro_path.clone(),
        error,
    })?;
    let program =
        Program::from_prologue(forward, backward, &prologue, &info.tied).map_err(|error| {
            FileError::InProgram {
                path: dir.to_path_buf(),
                error: Box::new(error),
            }
        })?;
    Ok(Export {
        dir: dir.to_path_buf(),
        info,
        program,
    })
}
