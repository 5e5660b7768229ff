//! An op's canonical name, shared instead of copied. A million-node trace names a few dozen
//! distinct ops; a `String` per node would mean a million allocations to make, free and chase.
//! Names of built-in ops point at the built-in registry's single copy; other names (ops a user
//! registers, unknown ops in a file) share one reference-counted string per creation.

use crate::registry::OpRegistry;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// An op's canonical name (`prims.div`), cheap to copy and compare.
#[derive(Clone)]
pub struct OpName(Repr);

#[derive(Clone)]
enum Repr {
    Builtin(&'static str),
    Other(Arc<str>),
}

impl OpName {
    /// The name `name`.
    pub fn new(name: &str) -> OpName {
        match OpRegistry::builtin().builtin_name(name) {
            Some(b) => OpName(Repr::Builtin(b)),
            None => OpName(Repr::Other(Arc::from(name))),
        }
    }
    /// Where this name's text is stored: equal for every node naming the same built-in op,
    /// so per-op caches can key on it instead of hashing the text. Two different addresses
    /// may still hold the same name (ops outside the built-in registry).
    pub fn addr(&self) -> usize {
        self.as_str().as_ptr() as usize
    }
    /// The name as text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Builtin(s) => s,
            Repr::Other(s) => s,
        }
    }
}

impl Deref for OpName {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for OpName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for OpName {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for OpName {
    fn eq(&self, other: &OpName) -> bool {
        match (&self.0, &other.0) {
            (Repr::Builtin(a), Repr::Builtin(b)) if std::ptr::eq(*a, *b) => true,
            _ => self.as_str() == other.as_str(),
        }
    }
}
impl Eq for OpName {}

impl PartialEq<str> for OpName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}
impl PartialEq<&str> for OpName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}
impl PartialEq<String> for OpName {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}
impl PartialEq<OpName> for str {
    fn eq(&self, other: &OpName) -> bool {
        self == other.as_str()
    }
}
impl PartialEq<OpName> for &str {
    fn eq(&self, other: &OpName) -> bool {
        *self == other.as_str()
    }
}

impl Hash for OpName {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

impl PartialOrd for OpName {
    fn partial_cmp(&self, other: &OpName) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OpName {
    fn cmp(&self, other: &OpName) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl fmt::Debug for OpName {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}
impl fmt::Display for OpName {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for OpName {
    fn from(s: &str) -> OpName {
        OpName::new(s)
    }
}
impl From<String> for OpName {
    fn from(s: String) -> OpName {
        OpName::new(&s)
    }
}
impl From<&String> for OpName {
    fn from(s: &String) -> OpName {
        OpName::new(s)
    }
}
impl From<&OpName> for OpName {
    fn from(s: &OpName) -> OpName {
        s.clone()
    }
}
impl From<OpName> for String {
    fn from(s: OpName) -> String {
        s.as_str().to_string()
    }
}

impl Serialize for OpName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for OpName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<OpName, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = OpName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an op name")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<OpName, E> {
                Ok(OpName::new(s))
            }
        }
        // borrowed from the input where the format allows: no temporary String
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_names_share_the_registry_copy_and_compare_as_strings() {
        let a = OpName::new("ltorch.mul");
        let b = OpName::from(String::from("ltorch.mul"));
        assert!(
            matches!((&a.0, &b.0), (Repr::Builtin(x), Repr::Builtin(y)) if std::ptr::eq(*x, *y))
        );
        assert_eq!(a, b);
        assert_eq!(a, "ltorch.mul");
        let c = OpName::new("my.custom_op");
        assert!(matches!(c.0, Repr::Other(_)));
        assert_eq!(c, OpName::new("my.custom_op"));
        assert_ne!(a, c);
        assert_eq!(format!("{c} {c:?}"), "my.custom_op \"my.custom_op\"");
    }
}
