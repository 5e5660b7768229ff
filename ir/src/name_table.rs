//! The parser's table from value names to values. Names Thunder generates are a short prefix
//! and a counter (`t17`, `ft3`, `C0`), and a statement mostly reads values defined a few lines
//! above it; a hash table scatters those names, so in a million-line trace nearly every lookup
//! misses the cache. Numbered names therefore go in a dense array per prefix, indexed by their
//! number (neighbouring names are neighbours in memory); any other name (or a number far
//! beyond the trace's size) goes in a hash map.

use crate::trace::{split_numbered, NAME_PREFIXES};
use crate::value::ValueId;
use rustc_hash::FxHashMap;

/// What a name is bound to: the value and the line defining it.
pub(crate) type Binding = (ValueId, usize);

pub(crate) struct NameTable {
    /// `(value id, line)`, 8 bytes an entry so that a million names stay cache-sized;
    /// `EMPTY` where no name has that number.
    numbered: Vec<Vec<(u32, u32)>>,
    /// Names in each array: an array grows only to about twice that (plus a little), so a file
    /// with sparse or huge numbers cannot make it big; such names go to `other`.
    counts: Vec<usize>,
    other: FxHashMap<String, Binding>,
}

const EMPTY: (u32, u32) = (u32::MAX, u32::MAX);

/// `(prefix index, number)` for `<prefix><decimal>` with a known prefix and no leading zero.
fn numbered(name: &str) -> Option<(usize, u64)> {
    let (k, digits) = split_numbered(name)?;
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    Some((k, digits.parse().ok()?))
}

impl NameTable {
    pub(crate) fn new() -> NameTable {
        NameTable {
            numbered: vec![Vec::new(); NAME_PREFIXES.len()],
            counts: vec![0; NAME_PREFIXES.len()],
            other: FxHashMap::default(),
        }
    }
    pub(crate) fn get(&self, name: &str) -> Option<Binding> {
        if let Some((k, n)) = numbered(name) {
            if let Some(&(id, line)) = usize::try_from(n)
                .ok()
                .and_then(|n| self.numbered[k].get(n))
            {
                if (id, line) != EMPTY {
                    return Some((ValueId(id), line as usize));
                }
            }
        }
        // (an empty map answers without hashing)
        self.other.get(name).copied()
    }
    pub(crate) fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
    /// Binds a name that is not bound yet.
    pub(crate) fn insert(&mut self, name: &str, b: Binding) {
        if let Some((k, n)) = numbered(name) {
            let dense_enough = n < 2 * self.counts[k] as u64 + 1024;
            let packed = (b.0 .0, u32::try_from(b.1));
            if let (true, Ok(n), (id, Ok(line))) = (dense_enough, usize::try_from(n), packed) {
                if (id, line) != EMPTY {
                    let row = &mut self.numbered[k];
                    if row.len() <= n {
                        row.resize(n + 1, EMPTY);
                    }
                    row[n] = (id, line);
                    self.counts[k] += 1;
                    return;
                }
            }
        }
        self.other.insert(name.to_string(), b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_and_other_names_are_found_and_kept_apart() {
        let mut t = NameTable::new();
        let names = [
            "t0",
            "t7",
            "ft7",
            "t07",
            "t_fc1_weight",
            "C3",
            "x9y",
            "t99999999999",
        ];
        for (i, n) in names.iter().enumerate() {
            assert!(!t.contains_key(n), "{n}");
            t.insert(n, (ValueId(i as u32), i));
        }
        for (i, n) in names.iter().enumerate() {
            assert_eq!(t.get(n), Some((ValueId(i as u32), i)), "{n}");
        }
        assert!(t.get("t1").is_none() && t.get("ft0").is_none() && t.get("t").is_none());
        // a huge number does not size the arrays by it
        assert!(t.numbered.iter().all(|r| r.len() < 100));
        // numbers far ahead of the names seen so far go to the map; found all the same
        t.insert("t5000", (ValueId(50), 50));
        assert!(t.numbered[0].len() < 100);
        assert_eq!(t.get("t5000"), Some((ValueId(50), 50)));
    }
}
