//! How many thread ranks this process can start. Each rank is two threads (its own and its
//! communication worker); past the kernel's limits a new thread cannot set up its stack guard,
//! and the standard library aborts the whole process instead of returning an error, so a world
//! size beyond them is refused before the first thread starts.

/// Threads one rank runs: the rank and its communication worker.
pub const THREADS_PER_RANK: usize = 2;

/// Memory mappings one thread takes: its stack and guard page, its signal stack and guard, and
/// the allocator's per-thread segments (measured at about 4; twice that as a margin).
const MAPS_PER_THREAD: usize = 8;

/// The most ranks this process can start, from the kernel's thread limit (`threads-max`), the
/// user's process limit (`RLIMIT_NPROC`) and the mappings left (`vm.max_map_count` less those
/// in use). `None` where none of them is known.
pub fn max_ranks() -> Option<usize> {
    let read = |p: &str| -> Option<usize> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let maps_in_use = std::fs::read_to_string("/proc/self/maps")
        .ok()
        .map(|m| m.lines().count());
    let by_maps = read("/proc/sys/vm/max_map_count")
        .zip(maps_in_use)
        .map(|(max, used)| max.saturating_sub(used) / MAPS_PER_THREAD);
    let threads = [read("/proc/sys/kernel/threads-max"), nproc_limit(), by_maps]
        .into_iter()
        .flatten()
        .min()?;
    Some(threads / THREADS_PER_RANK)
}

/// The soft `RLIMIT_NPROC` (threads count as processes); `None` when unlimited or unknown.
#[cfg(target_os = "linux")]
fn nproc_limit() -> Option<usize> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `r`, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    usize::try_from(r.rlim_cur).ok()
}

#[cfg(not(target_os = "linux"))]
fn nproc_limit() -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linux_machine_has_a_limit_that_allows_a_few_ranks() {
        if cfg!(target_os = "linux") {
            let n = max_ranks().expect("linux knows its limits");
            assert!(n >= 8, "{n}");
            assert!(n < 1 << 30, "{n}");
        }
    }
}
