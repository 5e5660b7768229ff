//! The README's figures about the corpus match the corpus.

use std::path::Path;

#[test]
fn the_readme_counts_the_corpus_exports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let exports = std::fs::read_dir(root.join("testdata/models"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().join("export.json").is_file())
        .count();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let claim = format!("`testdata/models/` holds {exports} real exports");
    assert!(readme.contains(&claim), "README.md should say: {claim}");
}
