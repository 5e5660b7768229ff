//! How the IR and passes benchmarks time their work: best of many runs, each run on warm memory
//! (no page faults), measured twice: with the caches as the previous run left them (hot), and
//! with the caches flushed first (cold).
//!
//! Why both: a 10k-node trace fits in a core's L2 cache, a 100k-node one does not, so a hot
//! small run reads its input from L2 while a hot large run reads it from L3 or memory. The
//! per-node cost then rises with size even when the work per node does not. Cold runs start
//! every size from memory, so their growth shows what the code does as traces grow.

use std::time::{Duration, Instant};

/// Best times of one piece of work.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// The input as the previous run left it in the caches.
    pub hot: Duration,
    /// The caches flushed before each run.
    pub cold: Duration,
}

impl Timing {
    pub fn hot_s(&self) -> f64 {
        self.hot.as_secs_f64()
    }
    pub fn cold_s(&self) -> f64 {
        self.cold.as_secs_f64()
    }
}

/// Reads one cache state's seconds from a [`Timing`].
pub type Seconds = fn(&Timing) -> f64;

/// Each cache state's name and its seconds, in the order the benches report them.
pub const CACHE_STATES: [(&str, Seconds); 2] = [("hot", Timing::hot_s), ("cold", Timing::cold_s)];

/// Bytes written to push everything else out of the caches: twice the largest last-level
/// cache of the machines we bench on (32 MiB).
const FLUSH_BYTES: usize = 64 << 20;

/// Evicts the caches by writing a buffer larger than all of them.
fn flush_caches() {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u64>> =
            std::cell::RefCell::new(vec![1; FLUSH_BYTES / 8]);
    }
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        let mut acc = 0u64;
        // one write per cache line is enough to own the line
        for w in b.iter_mut().step_by(8) {
            acc = acc.wrapping_add(*w);
            *w = acc;
        }
        std::hint::black_box(acc);
    });
}

/// Best of `reps` runs of `setup` (untimed) then `f` (timed), the caches flushed before each
/// run when `cold`. Each run's result is dropped before the next run starts, so later runs
/// reuse the memory the earlier ones had the OS fault in: the best run is a warm one, whose
/// time does not depend on how slowly this (virtual) machine zeroes fresh pages. Returns the
/// last run's result.
fn best_of<S, T>(
    reps: usize,
    cold: bool,
    setup: &mut impl FnMut() -> S,
    f: &mut impl FnMut(S) -> T,
) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..reps.max(1) {
        drop(out.take());
        let input = setup();
        if cold {
            flush_caches();
        }
        let s = Instant::now();
        let r = f(input);
        best = best.min(s.elapsed());
        out = Some(r);
    }
    (best, out.expect("at least one run"))
}

/// Best of `reps` hot runs and of `reps` cold runs (see [`best_of`]).
pub fn time_with<S, T>(
    reps: usize,
    mut setup: impl FnMut() -> S,
    mut f: impl FnMut(S) -> T,
) -> (Timing, T) {
    let (hot, first) = best_of(reps, false, &mut setup, &mut f);
    drop(first);
    let (cold, out) = best_of(reps, true, &mut setup, &mut f);
    (Timing { hot, cold }, out)
}

/// Best of `reps` hot runs only, for work whose inputs are small (kernels).
pub fn time_hot<T>(reps: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    best_of(reps, false, &mut || (), &mut |()| f())
}

/// [`time_with`] without setup.
pub fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> (Timing, T) {
    time_with(reps, || (), |()| f())
}

/// [`time_with`] on a fresh copy of `p` each run; the copying is not timed.
pub fn time_on_copies<E>(
    reps: usize,
    p: &tracepass_ir::Program,
    mut f: impl FnMut(&mut tracepass_ir::Program) -> Result<(), E>,
) -> (Timing, Result<tracepass_ir::Program, E>) {
    time_with(reps, || p.clone(), |mut q| f(&mut q).map(|_| q))
}

/// Runs per size: small sizes take microseconds, so their best of 3 is mostly noise; every
/// size gets at least 3 runs and about 3M nodes of work in all (per cache state).
pub fn reps_for(nodes: usize) -> usize {
    (3_000_000 / nodes.max(1)).clamp(3, 300)
}

/// 1k, 10k, ... up to `max` nodes.
pub fn sizes(max: usize) -> Vec<usize> {
    let mut v = vec![1_000];
    while *v.last().expect("non-empty") * 10 <= max {
        let n = v.last().expect("non-empty") * 10;
        v.push(n);
    }
    v
}

/// Prints how time grows per 10x nodes, with no target: for reference work.
pub fn report_growth(what: &str, rows: &[(usize, f64)]) {
    let steps: Vec<String> = rows
        .windows(2)
        .map(|w| format!("{} -> {}: {:.1}x", w[0].0, w[1].0, w[1].1 / w[0].1))
        .collect();
    println!("{what}: {}", steps.join(", "));
}

/// Prints how time grows per 10x nodes (target: <= 12x); `rows` are (nodes, seconds).
pub fn report_scaling(what: &str, rows: &[(usize, f64)]) {
    for w in rows.windows(2) {
        let (a, b) = (w[0], w[1]);
        let growth = b.1 / a.1;
        println!(
            "scaling {what}: {} -> {} nodes: {:.1}x time for {:.1}x nodes {}",
            a.0,
            b.0,
            growth,
            b.0 as f64 / a.0 as f64,
            if growth <= 12.0 {
                "(linear: ok)"
            } else {
                "(> 12x: MISSED)"
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_go_up_by_tens_to_the_limit() {
        assert_eq!(sizes(1_000), vec![1_000]);
        assert_eq!(sizes(99_999), vec![1_000, 10_000]);
        assert_eq!(sizes(1_000_000), vec![1_000, 10_000, 100_000, 1_000_000]);
    }

    #[test]
    fn every_run_gets_its_own_setup_and_the_last_result_is_returned() {
        let mut made = 0;
        let (t, last) = time_with(
            4,
            || {
                made += 1;
                made
            },
            |x| x * 10,
        );
        assert_eq!(made, 8, "4 hot and 4 cold runs");
        assert_eq!(last, 80);
        assert!(
            t.hot < Duration::MAX && t.cold < Duration::MAX,
            "both states timed"
        );
    }
}
