//! A command's outputs, checked against its inputs and each other before any work: writing an
//! output onto an input (a file of an input export directory included) destroys what the
//! command was reading, and two outputs that are one file lose one of them. Files are compared
//! after resolving links (and, on Unix, by device and inode, so hard links count too).

use crate::input::check_output;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// Folders below an input directory that are searched for its files (`reference/` of an
/// export is one level down).
const MAX_DEPTH: usize = 4;

/// One path a command reads, with the option that named it.
struct Input {
    what: String,
    path: PathBuf,
    /// Set for a folder: its file is shown relative to it in messages.
    dir: Option<PathBuf>,
    /// The output option allowed to replace this input (`train --resume C --save C`: the
    /// checkpoint is read whole before the first step and replaced atomically after it).
    replaced_by: Option<&'static str>,
}

/// The inputs and outputs of one command line.
#[derive(Default)]
pub struct Files {
    inputs: Vec<Input>,
    outputs: Vec<(String, PathBuf)>,
}

impl Files {
    pub fn new() -> Files {
        Files::default()
    }

    /// A file or folder the command reads (`what`: its option, empty for the positional
    /// input; a folder: every file in it, an export directory's
    /// included). A path that does not exist is left to the reader to report.
    pub fn input(mut self, what: &str, path: Option<&Path>) -> Files {
        if let Some(p) = path {
            self.add_input(what, p, None);
        }
        self
    }

    /// An input that the output option `by` may replace on purpose.
    pub fn input_replaced_by(mut self, what: &str, path: Option<&Path>, by: &'static str) -> Files {
        if let Some(p) = path {
            self.add_input(what, p, Some(by));
        }
        self
    }

    fn add_input(&mut self, what: &str, path: &Path, replaced_by: Option<&'static str>) {
        if path.is_dir() {
            let mut files = Vec::new();
            files_under(path, MAX_DEPTH, &mut files);
            for f in files {
                self.inputs.push(Input {
                    what: what.to_string(),
                    path: f,
                    dir: Some(path.to_path_buf()),
                    replaced_by,
                });
            }
        } else {
            self.inputs.push(Input {
                what: what.to_string(),
                path: path.to_path_buf(),
                dir: None,
                replaced_by,
            });
        }
    }

    /// A file the command writes.
    pub fn output(mut self, what: &str, path: Option<&Path>) -> Files {
        if let Some(p) = path {
            self.outputs.push((what.to_string(), p.to_path_buf()));
        }
        self
    }

    /// Every output can be written ([`check_output`]), is none of the inputs, and is no
    /// other output.
    pub fn check(&self) -> Result<()> {
        for (what, out) in &self.outputs {
            check_output(out, what)?;
            for i in &self.inputs {
                if i.replaced_by == Some(what.as_str()) || !same_file(out, &i.path) {
                    continue;
                }
                // a positional input has no option name
                let what_in = if i.what.is_empty() {
                    String::new()
                } else {
                    format!("{} ", i.what)
                };
                let input = match &i.dir {
                    Some(d) => format!(
                        "{} of the input {what_in}{}",
                        i.path.strip_prefix(d).unwrap_or(&i.path).display(),
                        d.display()
                    ),
                    None => format!("the input {what_in}{}", i.path.display()),
                };
                bail!(
                    "{what} {}: is {input}; writing it would destroy what this command reads (write elsewhere)",
                    out.display()
                );
            }
        }
        for (k, (what, out)) in self.outputs.iter().enumerate() {
            for (other, o) in &self.outputs[k + 1..] {
                if same_file(out, o) {
                    bail!(
                        "{what} {} and {other} {}: are the same file; one would overwrite the other",
                        out.display(),
                        o.display()
                    );
                }
            }
        }
        Ok(())
    }
}

/// Every file below `dir`, at most `depth` folders down.
fn files_under(dir: &Path, depth: usize, into: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if depth > 0 {
                files_under(&p, depth - 1, into);
            }
        } else {
            into.push(p);
        }
    }
}

/// `path` with its folder's links resolved: a file that need not exist yet, named the way
/// every other spelling of the same place is named.
fn resolved(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Some(p);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(dir.canonicalize().ok()?.join(path.file_name()?))
}

/// Whether `a` and `b` name one file: the same device and inode where both exist, else the
/// same resolved path.
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    match (resolved(a), resolved(b)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_spellings_of_one_file_are_the_same_file() {
        let d = tempfile::tempdir().expect("tempdir");
        let a = d.path().join("a.trace");
        std::fs::write(&a, "x").expect("write");
        let dotted = d.path().join(".").join("a.trace");
        assert!(same_file(&a, &dotted));
        #[cfg(unix)]
        {
            let l = d.path().join("l.trace");
            std::os::unix::fs::symlink(&a, &l).expect("symlink");
            assert!(same_file(&a, &l));
            let h = d.path().join("h.trace");
            std::fs::hard_link(&a, &h).expect("hard link");
            assert!(same_file(&a, &h));
        }
        let new = d.path().join("new.trace");
        assert!(same_file(&new, &d.path().join(".").join("new.trace")));
        assert!(!same_file(&a, &new));
    }
}
