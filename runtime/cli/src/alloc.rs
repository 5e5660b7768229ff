//! Allocator settings for the binaries (they use mimalloc as the global allocator).

/// mimalloc's `mi_option_purge_delay` (same position in its v2 and v3 option enums).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory mapped instead of returning it to the OS 10 ms after a free (mimalloc's
/// default). A training step frees and allocates the same large buffers (gradients, buckets)
/// every step; returning them makes every step fault in and zero the pages again, which
/// doubled the time of the first deep-MLP steps. Has no effect unless mimalloc allocates.
pub fn keep_freed_memory() {
    // SAFETY: sets an integer option of mimalloc; no memory is touched.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}
