//! What the runtime's corpus tests share: the exports under `testdata/models/`, their names
//! and their JSON files. Each test file uses some of these, so the unused rest is allowed.
#![allow(dead_code)]

pub mod training;

use std::path::{Path, PathBuf};

/// Every export directory of the corpus, sorted.
pub fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("testdata/models")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("export.json").is_file())
        .collect();
    v.sort();
    assert!(v.len() >= 12, "the corpus has {} exports", v.len());
    v
}

/// An export's folder name (`nanogpt`).
pub fn name(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

/// A JSON file of an export.
pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("json file")).expect("json")
}

/// Numbers in [-1, 1) from a seed (xorshift), for the kernel tests' inputs.
pub fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
        })
        .collect()
}
