//! Runs a kernel's loop compiled for the widest vector unit this CPU has (AVX-512, AVX2 + FMA
//! or baseline), chosen once at run time: the release build targets baseline x86-64, where
//! the compiler may vectorise only with SSE2. The loop body is the same scalar Rust code,
//! inlined into a `#[target_feature]` function by `pulp`, so results are bit-for-bit those of
//! the baseline build (Rust never contracts `a * b + c` into a fused multiply-add on its own).

use std::sync::LazyLock;

static ARCH: LazyLock<pulp::Arch> = LazyLock::new(pulp::Arch::new);

/// Calls `f` in code compiled for this CPU's vector extensions. `f` and what it calls should
/// be `#[inline]` so they are compiled into the dispatched function.
#[inline(always)]
pub fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    ARCH.dispatch(f)
}
