//! SSA values: a name and a type, defined once (a trace argument or one node output).

use crate::name_text::NameSpan;
use crate::type_table::TypeId;
use crate::types::Type;
use petgraph::stable_graph::NodeIndex;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Handle of a value in a trace's value table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Where a value is defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Def {
    /// Not defined yet (just created, or its producer was removed).
    Undefined,
    /// The i-th argument of the trace.
    Arg(u32),
    /// Output `.1` of node `.0`.
    Node(NodeIndex, u32),
}

/// A name as the API takes and gives it. Names up to 24 bytes (all that Thunder and our passes
/// generate: `t123`, `grad_for_layers_7_weight`) sit inline, with no allocation.
pub type Name = compact_str::CompactString;

/// A value as its trace stores it: where its name and type sit in the trace's name text and
/// type table, and where it is defined. 24 bytes, and `Copy`: a million-value table is written,
/// copied and read as plain memory. Read through [`crate::Trace::value`], as a [`ValueRef`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Value {
    pub(crate) name: NameSpan,
    pub(crate) ty: TypeId,
    pub(crate) def: Def,
}

/// A value read from its trace: its name, type and definition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ValueRef<'t> {
    /// Its name.
    pub name: &'t str,
    /// Its type.
    pub ty: &'t Type,
    /// What defines it.
    pub def: Def,
}

/// Hasher for [`ValueId`] keys. Ids are small consecutive integers; an ordinary hash scatters
/// them over the table, so building or walking a million-value table in id order misses the
/// cache on every value. Here the low bits of the hash (which pick the bucket) are the id
/// itself, so consecutive ids fill consecutive buckets, and the high bits (which the table
/// compares before looking at keys) are well mixed.
#[derive(Clone, Copy, Default)]
pub struct ValueIdHasher(u64);

impl std::hash::Hasher for ValueIdHasher {
    fn write_u32(&mut self, id: u32) {
        let id = u64::from(id);
        self.0 = id | (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) & 0xFFFF_FFFF_0000_0000);
    }
    /// Keys other than a `ValueId` still hash correctly, just without the ordering benefit.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// `BuildHasher` for maps keyed by [`ValueId`].
pub type ValueIdBuildHasher = std::hash::BuildHasherDefault<ValueIdHasher>;
/// A hash map keyed by [`ValueId`] (see [`ValueIdHasher`]).
pub type ValueIdMap<V> = std::collections::HashMap<ValueId, V, ValueIdBuildHasher>;
/// A hash set of [`ValueId`]s (see [`ValueIdHasher`]).
pub type ValueIdSet = std::collections::HashSet<ValueId, ValueIdBuildHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash, Hasher};

    #[test]
    fn consecutive_ids_get_consecutive_low_bits_and_mixed_high_bits() {
        let h = |id: u32| ValueIdBuildHasher::default().hash_one(ValueId(id));
        assert_eq!(h(7) & 0xFFFF_FFFF, 7);
        assert_eq!(h(8) & 0xFFFF_FFFF, 8);
        let tops: std::collections::HashSet<u64> = (0..1000).map(|i| h(i) >> 57).collect();
        assert!(tops.len() > 100, "top 7 bits poorly mixed: {}", tops.len());
        let mut other = ValueIdHasher::default();
        "x".hash(&mut other);
        assert_ne!(other.finish(), 0);
    }
}
