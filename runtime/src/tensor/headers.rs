//! Reused `Arc<Storage>` headers: every kernel output is a new tensor, and its storage's
//! reference-counted header would be a heap allocation per instruction even when the elements
//! come from the buffer pool. A tensor whose storage goes back to the pool leaves its emptied
//! header here (per thread, as the pool), and the next tensor made on that thread takes it.

use super::Storage;
use std::cell::RefCell;
use std::sync::Arc;

/// Headers kept per thread at most: more than a step of any model has alive at once is never
/// needed, since a header comes back only when its storage does.
const KEEP: usize = 1 << 14;

thread_local! {
    static SPARE: RefCell<Vec<Arc<Storage>>> = const { RefCell::new(Vec::new()) };
}

/// `data` behind a shared header, a spare one when this thread has one.
pub(super) fn wrap(data: Storage) -> Arc<Storage> {
    // a spare header is unique: `unwrap` keeps only headers it could take the storage from
    if let Some(mut header) = SPARE.try_with(|s| s.borrow_mut().pop()).ok().flatten() {
        if let Some(slot) = Arc::get_mut(&mut header) {
            *slot = data;
            return header;
        }
    }
    Arc::new(data)
}

/// The storage behind `header` when it is its last holder, keeping the emptied header for
/// [`wrap`]; the header back while others share it.
pub(super) fn unwrap(mut header: Arc<Storage>) -> Result<Storage, Arc<Storage>> {
    let Some(slot) = Arc::get_mut(&mut header) else {
        return Err(header);
    };
    let data = std::mem::replace(slot, Storage::F32(Vec::new()));
    let _ = SPARE.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < KEEP {
            s.push(header);
        }
    });
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_header_is_reused_and_a_shared_one_is_not_taken() {
        let a = wrap(Storage::F32(vec![1.0, 2.0]));
        let shared = a.clone();
        let a = unwrap(a).expect_err("shared: stays with its holders");
        assert_eq!(*a, Storage::F32(vec![1.0, 2.0]));
        drop(shared);
        let ptr = Arc::as_ptr(&a);
        assert_eq!(unwrap(a), Ok(Storage::F32(vec![1.0, 2.0])));
        // the next tensor made on this thread gets the same header, holding its own elements
        let b = wrap(Storage::I64(vec![7]));
        assert_eq!(Arc::as_ptr(&b), ptr);
        assert_eq!(*b, Storage::I64(vec![7]));
        assert_eq!(Arc::strong_count(&b), 1);
    }
}
