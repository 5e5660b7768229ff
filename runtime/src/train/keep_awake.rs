//! Keeps a rank's pool threads looking for work while the rank trains, instead of letting
//! them fall asleep between its parallel kernels. A rank's step alternates parallel kernels
//! (products, large regions, sums) with short serial ones; rayon puts an idle worker to sleep
//! after a few microseconds, and waking it again costs far more than the kernel it is woken
//! for: on the project's 2-core VM a sum of 200k floats took 16 us back to back on two threads
//! and 46-71 us after 2 ms of serial work (25 us on one thread). A helper here spins in
//! `rayon::yield_now`, which steals and runs the rank's jobs as soon as they are queued, and
//! gives its core to any other thread that wants it in between. (OpenMP's threads, which PyTorch
//! uses, likewise spin for a while after a parallel region before they sleep.)
//!
//! Only where the rank's threads have cores to themselves (ranks x threads <= CPUs): a
//! spinning helper on a shared core would take time from the thread doing the work. Which
//! thread runs a job never changes its bits: kernels cut their work the same way whoever
//! runs the pieces.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Default)]
struct State {
    stop: AtomicBool,
    spinning: AtomicUsize,
}

/// While alive, every other thread of the current rayon pool spins for work.
pub(crate) struct KeepAwake {
    state: Arc<State>,
}

impl KeepAwake {
    /// Starts the helpers from inside the rank's pool (its `install`), or nothing outside
    /// one. Returns once every helper spins, so that no helper job is left queued for this
    /// thread to pick up while it waits in a join (it would spin there until its own drop).
    pub(crate) fn start() -> KeepAwake {
        let state = Arc::new(State::default());
        let Some(me) = rayon::current_thread_index() else {
            return KeepAwake { state };
        };
        let helpers = rayon::current_num_threads().saturating_sub(1);
        let shared = state.clone();
        rayon::spawn_broadcast(move |ctx| {
            if ctx.index() == me {
                return;
            }
            shared.spinning.fetch_add(1, Ordering::AcqRel);
            while !shared.stop.load(Ordering::Acquire) {
                if rayon::yield_now() != Some(rayon::Yield::Executed) {
                    // the OS's yield, not a CPU pause: a thread of this process that has work
                    // (a communication worker) gets this core at once
                    std::thread::yield_now();
                }
            }
            shared.spinning.fetch_sub(1, Ordering::AcqRel);
        });
        while state.spinning.load(Ordering::Acquire) < helpers {
            std::thread::yield_now();
        }
        KeepAwake { state }
    }

    /// Whether a rank's pool of `threads` should be kept awake in a run of `ranks` ranks.
    pub(crate) fn worth_it(ranks: usize, threads: usize) -> bool {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        threads > 1 && ranks * threads <= cpus
    }
}

impl Drop for KeepAwake {
    /// Stops the helpers and waits until they have left their loops.
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        while self.state.spinning.load(Ordering::Acquire) > 0 {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn helpers_spin_take_the_pools_work_and_stop() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap_or_else(|e| panic!("a pool: {e}"));
        let (sum, workers) = pool.install(|| {
            let awake = KeepAwake::start();
            assert_eq!(awake.state.spinning.load(Ordering::Acquire), 2);
            // the work still runs, on the pool, with the same result
            let v: Vec<u64> = (0..1_000_000).collect();
            let sum: u64 = v.par_chunks(1000).map(|c| c.iter().sum::<u64>()).sum();
            let workers: std::collections::BTreeSet<usize> = (0..64)
                .into_par_iter()
                .map(|_| {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    rayon::current_thread_index().unwrap_or(usize::MAX)
                })
                .collect();
            let state = awake.state.clone();
            drop(awake);
            assert_eq!(state.spinning.load(Ordering::Acquire), 0);
            (sum, workers)
        });
        assert_eq!(sum, 999_999 * 1_000_000 / 2);
        // the helpers, spinning in their loops, ran pieces of it
        assert!(workers.len() >= 2, "{workers:?}");
    }

    #[test]
    fn outside_a_pool_it_starts_nothing() {
        let awake = KeepAwake::start();
        assert_eq!(awake.state.spinning.load(Ordering::Acquire), 0);
    }
}
