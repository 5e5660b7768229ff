//! Reading and writing trace files by extension; every write is atomic.

use crate::codec;
use crate::error::FileError;
use crate::parse::parse_trace_with;
use crate::print::print_trace;
use crate::program::Module;
use crate::registry::OpRegistry;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// File formats, chosen by extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `.trace`: Thunder's printed form.
    Text,
    /// `.tpb`: header + bincode.
    Binary,
    /// `.json`: serde_json, for tooling.
    Json,
}

impl Format {
    /// The format a file's extension names.
    pub fn from_path(path: &Path) -> Result<Format, FileError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("trace") | Some("py") => Ok(Format::Text),
            Some("tpb") => Ok(Format::Binary),
            Some("json") => Ok(Format::Json),
            _ => Err(FileError::UnknownFormat {
                path: path.to_path_buf(),
            }),
        }
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |error| FileError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// The temporary files [`write_atomic`] has created and not yet renamed or removed. A file is
/// created and registered under this lock, and renamed and unregistered under it, so
/// [`remove_temp_files`] sees every one that exists.
static TEMP_FILES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn temp_files() -> MutexGuard<'static, Vec<PathBuf>> {
    TEMP_FILES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes the temporary files of writes still in progress, and keeps any other from starting:
/// for a handler of SIGINT or SIGTERM, which then ends the process. A write that would start
/// afterwards blocks until the process exits.
pub fn remove_temp_files() {
    let files = temp_files();
    for f in files.iter() {
        let _ = fs::remove_file(f);
    }
    // held until the process ends: no new temporary file is created meanwhile
    std::mem::forget(files);
}

/// The prefix of the temporary files of writes to `file_name`: `.NAME.tmp-PID-N`.
fn temp_prefix(file_name: &str) -> String {
    format!(".{file_name}.tmp-")
}

/// Whether the process `pid` is running; `None` where this cannot be told.
fn process_alive(pid: u32) -> Option<bool> {
    if cfg!(target_os = "linux") {
        Some(Path::new("/proc").join(pid.to_string()).exists())
    } else {
        None
    }
}

/// Removes the temporary files that writes to `dir/file_name` left when their process was
/// killed outright (SIGKILL, a power cut): those whose process no longer runs.
fn remove_stale_temp_files(dir: &Path, file_name: &str) {
    let prefix = temp_prefix(file_name);
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some(pid) = rest
            .split_once('-')
            .and_then(|(pid, n)| n.parse::<u64>().ok().and(pid.parse::<u32>().ok()))
        else {
            continue;
        };
        if pid != std::process::id() && process_alive(pid) == Some(false) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, fsync, rename,
/// fsync of the folder. A crash leaves either the old file or the new one, never a mix; the
/// temporary file is removed on failure, by [`remove_temp_files`] on a signal, and by the next
/// write to `path` when its process was killed outright.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| FileError::Io {
            path: path.to_path_buf(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"),
        })?
        .to_string_lossy()
        .into_owned();
    remove_stale_temp_files(&dir, &file_name);
    let tmp = dir.join(format!(
        "{}{}-{}",
        temp_prefix(&file_name),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let unregister = |tmp: &Path| temp_files().retain(|t| t != tmp);
    let result = (|| {
        let mut f = {
            let mut live = temp_files();
            let f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            live.push(tmp.clone());
            f
        };
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        {
            let mut live = temp_files();
            fs::rename(&tmp, path)?;
            live.retain(|t| *t != tmp);
        }
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        unregister(&tmp);
    }
    result.map_err(io_err(path))
}

/// Loads a trace or program file (by extension), or an export directory (the program it
/// holds), with the built-in registry.
pub fn load(path: &Path) -> Result<Module, FileError> {
    load_with(path, OpRegistry::builtin())
}

/// Loads a trace or program file, or an export directory, whose ops come from `reg`. A folder
/// without `export.json` is an error naming it.
pub fn load_with(path: &Path, reg: &OpRegistry) -> Result<Module, FileError> {
    if crate::export::is_export_dir(path) {
        return Ok(Module::Program(
            crate::export::load_export_with(path, reg)?.program,
        ));
    }
    if path.is_dir() {
        return Err(FileError::Io {
            path: path.to_path_buf(),
            error: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a folder without export.json, not an export directory",
            ),
        });
    }
    let format = Format::from_path(path)?;
    let bytes = fs::read(path).map_err(io_err(path))?;
    decode_as(path, format, &bytes, reg)
}

/// Decodes file contents in a given format; `path` is only for messages.
pub fn decode_as(
    path: &Path,
    format: Format,
    bytes: &[u8],
    reg: &OpRegistry,
) -> Result<Module, FileError> {
    match format {
        Format::Text => {
            let text = std::str::from_utf8(bytes).map_err(|e| FileError::Io {
                path: path.to_path_buf(),
                error: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("not UTF-8: {e}"),
                ),
            })?;
            parse_trace_with(text, reg)
                .map(Module::Trace)
                .map_err(|error| FileError::Parse {
                    path: path.to_path_buf(),
                    error,
                })
        }
        Format::Binary => codec::decode(bytes).map_err(|error| FileError::Codec {
            path: path.to_path_buf(),
            error,
        }),
        Format::Json => serde_json::from_slice(bytes).map_err(|e| FileError::Json {
            path: path.to_path_buf(),
            message: e.to_string(),
        }),
    }
}

/// The bytes a module takes in a format.
pub fn encode_as(path: &Path, format: Format, m: &Module) -> Result<Vec<u8>, FileError> {
    match (format, m) {
        (Format::Text, Module::Trace(t)) => Ok(print_trace(t).into_bytes()),
        (Format::Text, Module::Program(_)) => Err(FileError::ProgramAsText {
            path: path.to_path_buf(),
        }),
        (Format::Binary, m) => codec::encode(m).map_err(|error| FileError::Codec {
            path: path.to_path_buf(),
            error,
        }),
        (Format::Json, m) => serde_json::to_vec_pretty(m).map_err(|e| FileError::Json {
            path: path.to_path_buf(),
            message: e.to_string(),
        }),
    }
}

/// Saves atomically in the format the extension names.
pub fn save(path: &Path, m: &Module) -> Result<(), FileError> {
    let format = Format::from_path(path)?;
    let bytes = encode_as(path, format, m)?;
    write_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #27: a driver loads an export directory through the library, as the CLI does.
    #[test]
    fn load_reads_export_directories_and_refuses_other_folders() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models/mlp");
        let m = load(&dir).unwrap();
        let (p, lone) = m.into_program();
        assert!(!lone);
        assert!(!p.params.is_empty() && p.forward.node_count() > 0);
        let expected = crate::load_export(&dir).unwrap().program;
        assert!(p == expected);
        let empty = tempfile::tempdir().unwrap();
        let e = load(empty.path()).unwrap_err().to_string();
        assert!(
            e.ends_with("is a folder without export.json, not an export directory"),
            "{e}"
        );
    }
}
