//! A trace's distinct types, each stored once. A million-value trace has a few dozen distinct
//! types; a value holds a 4-byte handle into this table instead of a 64-byte type, so the value
//! table is a third of the size and a value is copied, decoded or compared without touching a
//! shape.

use crate::types::Type;
use indexmap::IndexSet;

/// Handle of a type in its trace's type table (handles of different traces are unrelated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TypeId(pub(crate) u32);

/// Types no value has any more (after `set_ty`) stay: a trace has few distinct types.
#[derive(Clone, Debug, Default)]
pub(crate) struct TypeTable {
    types: IndexSet<Type>,
    /// The handles [`TypeTable::intern`] gave last, the latest first.
    recent: [u32; 4],
}

/// What [`TypeTable::get`] answers for a handle from another table, which is a caller's bug:
/// a harmless type, not a panic.
static UNKNOWN: Type = Type::Any;

impl TypeTable {
    /// The handle of `ty`, added if new. Values made one after another mostly share a few
    /// types, so the types interned last are compared before the table is hashed.
    pub(crate) fn intern(&mut self, ty: Type) -> TypeId {
        for &h in &self.recent {
            if self.types.get_index(h as usize) == Some(&ty) {
                return TypeId(h);
            }
        }
        let h = self.types.insert_full(ty).0 as u32;
        self.recent.rotate_right(1);
        self.recent[0] = h;
        TypeId(h)
    }
    pub(crate) fn get(&self, id: TypeId) -> &Type {
        self.types.get_index(id.0 as usize).unwrap_or(&UNKNOWN)
    }
    pub(crate) fn len(&self) -> usize {
        self.types.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DType, Device};

    #[test]
    fn equal_types_share_a_handle_and_read_back() {
        let mut t = TypeTable::default();
        let a = t.intern(Type::tensor([8, 1024], DType::F32, Device::CPU));
        let b = t.intern(Type::Int(None));
        let c = t.intern(Type::tensor(vec![8, 1024], DType::F32, Device::CPU));
        assert_eq!(a, c);
        assert_ne!(a, b);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(b), &Type::Int(None));
        assert_eq!(t.get(TypeId(7)), &Type::Any);
    }
}
