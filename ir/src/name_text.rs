//! A trace's value names, back to back in one string. A value holds the span of its name (8
//! bytes, no allocation) instead of the name itself: decoding a trace copies the names in one
//! piece and gives each value its span, and copying a trace copies one string.

/// Where a name sits in its trace's [`NameText`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NameSpan {
    at: u32,
    len: u32,
}

/// The most name text a trace holds: spans are 32-bit. A million-node trace has about 8 MB.
pub(crate) const MAX_NAME_TEXT: usize = u32::MAX as usize;

#[derive(Clone, Debug, Default)]
pub(crate) struct NameText {
    text: String,
    /// Bytes of names no value uses any more (renamed or removed values), reclaimed by
    /// [`NameText::compacted`] once they outweigh the rest.
    unused: usize,
}

impl NameText {
    /// Names already laid out back to back, as a decoder reads them.
    pub(crate) fn from_text(text: String) -> NameText {
        NameText { text, unused: 0 }
    }
    /// The span of the `len` bytes at `at`, if they are whole characters of the text.
    pub(crate) fn span(&self, at: usize, len: usize) -> Option<NameSpan> {
        let end = at.checked_add(len)?;
        self.text.get(at..end)?;
        Some(NameSpan {
            at: u32::try_from(at).ok()?,
            len: u32::try_from(len).ok()?,
        })
    }
    /// Appends `name`. `None` once the text would pass [`MAX_NAME_TEXT`] bytes.
    pub(crate) fn push(&mut self, name: &str) -> Option<NameSpan> {
        if self.text.len() + name.len() > MAX_NAME_TEXT {
            return None;
        }
        let at = self.text.len();
        self.text.push_str(name);
        self.span(at, name.len())
    }
    pub(crate) fn get(&self, s: NameSpan) -> &str {
        let at = s.at as usize;
        self.text.get(at..at + s.len as usize).unwrap_or_default()
    }
    pub(crate) fn len(&self) -> usize {
        self.text.len()
    }
    /// Notes that a name is no longer used.
    pub(crate) fn forget(&mut self, s: NameSpan) {
        self.unused += s.len as usize;
    }
    /// Whether unused names outweigh used ones (and are worth reclaiming).
    pub(crate) fn wasteful(&self) -> bool {
        self.unused > 4096 && self.unused > self.text.len() / 2
    }
    /// A copy holding only `spans`' names, and the spans' new places, in the same order.
    pub(crate) fn compacted(
        &self,
        spans: impl Iterator<Item = NameSpan>,
    ) -> (NameText, Vec<NameSpan>) {
        let mut out = NameText::from_text(String::with_capacity(
            self.text.len().saturating_sub(self.unused),
        ));
        let moved = spans
            .map(|s| out.push(self.get(s)).expect("a subset of a text that fits"))
            .collect();
        (out, moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_back_and_compaction_keeps_used_names() {
        let mut n = NameText::default();
        let a = n.push("t0").expect("fits");
        let b = n.push("grad_for_w").expect("fits");
        assert_eq!((n.get(a), n.get(b)), ("t0", "grad_for_w"));
        n.forget(a);
        let (c, moved) = n.compacted([b].into_iter());
        assert_eq!(c.len(), "grad_for_w".len());
        assert_eq!(c.get(moved[0]), "grad_for_w");
        // a span must cover whole characters
        let t = NameText::from_text("té".into());
        assert!(t.span(0, 2).is_none());
        assert_eq!(t.span(0, 3).map(|s| t.get(s)), Some("té"));
    }
}
