//! Failure handling for a communicator whose collectives run on the device (NCCL), in the way
//! of PyTorch's NCCL watchdog: a thread polls each outstanding collective and the
//! communicator's asynchronous error; a collective that is not done within the timeout, or an
//! asynchronous error, aborts the communicator and records a failure naming the rank and the
//! collective, which the rank's next communication call returns. Nothing here touches CUDA:
//! the communicator and the collectives' completion are traits, so the logic is tested on the
//! CPU with fakes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The operations on one communicator that failure handling needs.
pub trait RawComm: Send + Sync + 'static {
    /// `ncclCommGetAsyncError`: `Err` with the error once the communicator has one.
    fn async_error(&self) -> Result<(), String>;
    /// `ncclCommAbort`: frees the communicator and makes its pending operations return.
    fn abort(&self);
    /// `ncclCommDestroy`: frees a communicator that was not aborted.
    fn destroy(&self);
}

/// Completion of one collective (an event recorded after it on the communication stream).
pub trait Work: Send + 'static {
    /// `Ok(true)` once done; `Err` when querying failed (the device reported an error).
    fn done(&self) -> Result<bool, String>;
}

const LIVE: u8 = 0;
const ABORTED: u8 = 1;

/// How long `abort` waits for a communication call in progress to return before aborting
/// under it (a call stuck in NCCL, e.g. connecting to a dead peer, is what abort unblocks).
pub const ABORT_GRACE: Duration = Duration::from_millis(200);

/// Owns a communicator: it is aborted at most once, and destroyed on drop only if it was not
/// aborted (`ncclCommAbort` already freed it). Calls go through [`Guard::call`], which
/// refuses them once the communicator is aborted.
pub struct Guard<C: RawComm> {
    comm: C,
    state: AtomicU8,
    calls: Mutex<()>,
}

impl<C: RawComm> Guard<C> {
    pub fn new(comm: C) -> Guard<C> {
        Guard {
            comm,
            state: AtomicU8::new(LIVE),
            calls: Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the communicator; `None` once it is aborted.
    pub fn call<R>(&self, f: impl FnOnce(&C) -> R) -> Option<R> {
        let _held = self.lock();
        (self.state.load(Ordering::Acquire) == LIVE).then(|| f(&self.comm))
    }

    /// Like `call`, but `None` at once if another call is in progress (the watchdog never
    /// waits behind a call that may be stuck).
    pub fn try_call<R>(&self, f: impl FnOnce(&C) -> R) -> Option<R> {
        let _held = match self.calls.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        (self.state.load(Ordering::Acquire) == LIVE).then(|| f(&self.comm))
    }

    /// Aborts the communicator unless it already was; `true` if this call aborted it.
    pub fn abort(&self) -> bool {
        if self
            .state
            .compare_exchange(LIVE, ABORTED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        // no new call starts now; give one in progress a moment to return
        let deadline = Instant::now() + ABORT_GRACE;
        let _held = loop {
            match self.calls.try_lock() {
                Ok(g) => break Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => break Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(std::sync::TryLockError::WouldBlock) => break None,
            }
        };
        self.comm.abort();
        true
    }

    #[cfg(test)]
    pub fn is_aborted(&self) -> bool {
        self.state.load(Ordering::Acquire) == ABORTED
    }
}

impl<C: RawComm> Drop for Guard<C> {
    fn drop(&mut self) {
        if *self.state.get_mut() == LIVE {
            self.comm.destroy();
        }
    }
}

struct Pending<W> {
    seq: u64,
    label: String,
    since: Instant,
    work: W,
}

/// Watches the collectives of one rank's communicator.
pub struct Watchdog<C: RawComm, W: Work> {
    rank: usize,
    timeout: Duration,
    guard: Arc<Guard<C>>,
    pending: Mutex<VecDeque<Pending<W>>>,
    failure: Mutex<Option<String>>,
}

impl<C: RawComm, W: Work> Watchdog<C, W> {
    pub fn new(rank: usize, timeout: Duration, guard: Arc<Guard<C>>) -> Watchdog<C, W> {
        Watchdog {
            rank,
            timeout,
            guard,
            pending: Mutex::new(VecDeque::new()),
            failure: Mutex::new(None),
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn guard(&self) -> &Arc<Guard<C>> {
        &self.guard
    }

    fn pending(&self) -> MutexGuard<'_, VecDeque<Pending<W>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts watching collective `seq` (`label`), launched at `now`.
    pub fn watch(&self, seq: u64, label: &str, work: W, now: Instant) {
        self.pending().push_back(Pending {
            seq,
            label: label.to_string(),
            since: now,
            work,
        });
    }

    /// How many collectives are not known to be done.
    #[cfg(test)]
    pub fn outstanding(&self) -> usize {
        self.pending().len()
    }

    /// The failure recorded so far (without the rank, which the caller's error adds).
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records `message` as the failure (the first one stays) and aborts the communicator.
    pub fn fail(&self, message: String) -> String {
        let msg = {
            let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
            f.get_or_insert(message).clone()
        };
        self.guard.abort();
        msg
    }

    /// One look at the communicator and the outstanding collectives, as at time `now`:
    /// drops the finished ones, and fails on an asynchronous error, an error reported by a
    /// collective's completion, or the oldest collective being older than the timeout.
    pub fn poll(&self, now: Instant) -> Option<String> {
        if let Some(f) = self.failure() {
            return Some(f);
        }
        let describe = |p: Option<&Pending<W>>| match p {
            Some(p) => format!("collective #{} ({})", p.seq, p.label),
            None => "no collective outstanding".to_string(),
        };
        if let Some(Err(e)) = self.guard.try_call(|c| c.async_error()) {
            let what = describe(self.pending().front());
            return Some(self.fail(format!(
                "NCCL reported an asynchronous error ({e}) during {what}; the communicator was aborted"
            )));
        }
        let mut error = None;
        {
            let mut pending = self.pending();
            while let Some(p) = pending.front() {
                match p.work.done() {
                    Ok(true) => {
                        pending.pop_front();
                    }
                    Ok(false) => break,
                    Err(e) => {
                        error = Some(format!(
                            "{} failed on the device ({e}); the communicator was aborted",
                            describe(Some(p))
                        ));
                        break;
                    }
                }
            }
            if error.is_none() {
                if let Some(p) = pending.front() {
                    let age = now.saturating_duration_since(p.since);
                    if age > self.timeout {
                        error = Some(format!(
                            "{} did not finish within {:.1} s (--collective-timeout); \
                             the NCCL communicator was aborted (a peer rank failed or hangs)",
                            describe(Some(p)),
                            self.timeout.as_secs_f64()
                        ));
                    }
                }
            }
        }
        error.map(|e| self.fail(e))
    }
}

/// The thread that polls a watchdog until it fails or this handle is dropped.
pub struct WatchdogThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl WatchdogThread {
    /// Polls every `every`; `setup` runs first on the thread (binding the device context).
    pub fn spawn<C: RawComm, W: Work>(
        watchdog: Arc<Watchdog<C, W>>,
        every: Duration,
        setup: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<WatchdogThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name(format!("nccl-watchdog-{}", watchdog.rank()))
            .spawn(move || {
                setup();
                while !flag.load(Ordering::Acquire) {
                    if watchdog.poll(Instant::now()).is_some() {
                        break;
                    }
                    std::thread::park_timeout(every);
                }
            })?;
        Ok(WatchdogThread {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for WatchdogThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A communicator that logs what is done to it.
    #[derive(Default)]
    struct Fake {
        log: Arc<Mutex<Vec<&'static str>>>,
        error: Arc<Mutex<Option<String>>>,
    }

    impl RawComm for Fake {
        fn async_error(&self) -> Result<(), String> {
            self.log.lock().unwrap().push("poll");
            match self.error.lock().unwrap().clone() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
        fn abort(&self) {
            self.log.lock().unwrap().push("abort");
        }
        fn destroy(&self) {
            self.log.lock().unwrap().push("destroy");
        }
    }

    /// A collective that finishes when its flag is set.
    struct FakeWork(Arc<AtomicBool>);
    impl Work for FakeWork {
        fn done(&self) -> Result<bool, String> {
            Ok(self.0.load(Ordering::Acquire))
        }
    }

    struct FailedWork;
    impl Work for FailedWork {
        fn done(&self) -> Result<bool, String> {
            Err("an illegal memory access was encountered".into())
        }
    }

    fn fake() -> (Fake, Arc<Mutex<Vec<&'static str>>>) {
        let f = Fake::default();
        let log = f.log.clone();
        (f, log)
    }

    fn lifecycle(log: &Mutex<Vec<&'static str>>) -> Vec<&'static str> {
        log.lock()
            .unwrap()
            .iter()
            .copied()
            .filter(|e| *e != "poll")
            .collect()
    }

    #[test]
    fn abort_then_drop_never_destroys_the_freed_communicator() {
        let (f, log) = fake();
        let g = Guard::new(f);
        assert!(g.abort());
        assert!(!g.abort(), "a second abort does nothing");
        assert!(g.call(|_| ()).is_none(), "no call after abort");
        drop(g);
        assert_eq!(lifecycle(&log), ["abort"]);
    }

    #[test]
    fn a_communicator_that_was_not_aborted_is_destroyed_once() {
        let (f, log) = fake();
        let g = Guard::new(f);
        assert_eq!(g.call(|_| 7), Some(7));
        drop(g);
        assert_eq!(lifecycle(&log), ["destroy"]);
    }

    #[test]
    fn abort_does_not_wait_forever_behind_a_stuck_call() {
        let (f, log) = fake();
        let g = Arc::new(Guard::new(f));
        let entered = Arc::new(AtomicBool::new(false));
        let release = Arc::new(AtomicBool::new(false));
        let (g2, e2, r2) = (g.clone(), entered.clone(), release.clone());
        let stuck = std::thread::spawn(move || {
            g2.call(|_| {
                e2.store(true, Ordering::Release);
                while !r2.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        });
        while !entered.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        assert!(g.abort());
        assert!(t.elapsed() < ABORT_GRACE + Duration::from_secs(2));
        assert_eq!(lifecycle(&log), ["abort"]);
        release.store(true, Ordering::Release);
        assert_eq!(stuck.join().unwrap(), Some(()));
        drop(g);
        assert_eq!(lifecycle(&log), ["abort"], "no destroy after the abort");
    }

    #[test]
    fn a_collective_past_the_timeout_aborts_and_names_rank_and_collective() {
        let (f, log) = fake();
        let wd: Watchdog<Fake, FakeWork> =
            Watchdog::new(3, Duration::from_secs(5), Arc::new(Guard::new(f)));
        let t0 = Instant::now();
        let first = Arc::new(AtomicBool::new(false));
        wd.watch(0, "b0", FakeWork(first.clone()), t0);
        wd.watch(1, "b1", FakeWork(Arc::new(AtomicBool::new(false))), t0);
        assert_eq!(wd.poll(t0 + Duration::from_secs(4)), None);
        first.store(true, Ordering::Release);
        assert_eq!(wd.poll(t0 + Duration::from_secs(4)), None);
        assert_eq!(wd.outstanding(), 1, "the finished collective is dropped");
        let msg = wd.poll(t0 + Duration::from_secs(6)).expect("timed out");
        assert!(msg.contains("collective #1 (b1)"), "{msg}");
        assert!(msg.contains("5.0 s"), "{msg}");
        assert_eq!(wd.failure().as_deref(), Some(msg.as_str()));
        assert!(wd.guard().is_aborted());
        assert_eq!(lifecycle(&log), ["abort"]);
        // later polls report the same failure and abort nothing more
        assert_eq!(wd.poll(t0 + Duration::from_secs(9)), Some(msg));
        assert_eq!(lifecycle(&log), ["abort"]);
        assert_eq!(wd.rank(), 3);
    }

    #[test]
    fn an_asynchronous_nccl_error_aborts_at_once() {
        let (f, log) = fake();
        let err = f.error.clone();
        let wd: Watchdog<Fake, FakeWork> =
            Watchdog::new(0, Duration::from_secs(600), Arc::new(Guard::new(f)));
        let t0 = Instant::now();
        wd.watch(4, "loss", FakeWork(Arc::new(AtomicBool::new(false))), t0);
        assert_eq!(wd.poll(t0), None);
        assert!(log.lock().unwrap().contains(&"poll"), "the error is polled");
        *err.lock().unwrap() = Some("ncclRemoteError".into());
        let msg = wd.poll(t0).expect("failed");
        assert!(
            msg.contains("ncclRemoteError") && msg.contains("#4 (loss)"),
            "{msg}"
        );
        assert_eq!(lifecycle(&log), ["abort"]);
    }

    #[test]
    fn a_device_error_on_completion_fails_the_collective() {
        let (f, _) = fake();
        let wd: Watchdog<Fake, FailedWork> =
            Watchdog::new(1, Duration::from_secs(600), Arc::new(Guard::new(f)));
        wd.watch(2, "b2", FailedWork, Instant::now());
        let msg = wd.poll(Instant::now()).expect("failed");
        assert!(
            msg.contains("#2 (b2)") && msg.contains("illegal memory"),
            "{msg}"
        );
    }

    #[test]
    fn the_rank_own_failure_is_kept_first() {
        let (f, log) = fake();
        let wd: Watchdog<Fake, FakeWork> =
            Watchdog::new(1, Duration::from_secs(1), Arc::new(Guard::new(f)));
        wd.fail("the loss is NaN".into());
        wd.watch(
            0,
            "b0",
            FakeWork(Arc::new(AtomicBool::new(false))),
            Instant::now(),
        );
        let later = Instant::now() + Duration::from_secs(5);
        assert_eq!(wd.poll(later).as_deref(), Some("the loss is NaN"));
        assert_eq!(lifecycle(&log), ["abort"]);
    }

    #[test]
    fn the_thread_ends_a_hang_within_the_timeout() {
        let (f, log) = fake();
        let wd: Arc<Watchdog<Fake, FakeWork>> = Arc::new(Watchdog::new(
            2,
            Duration::from_millis(50),
            Arc::new(Guard::new(f)),
        ));
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let thread = WatchdogThread::spawn(wd.clone(), Duration::from_millis(5), move || {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        // a collective that never finishes, as when a peer died
        wd.watch(
            9,
            "bucket 3",
            FakeWork(Arc::new(AtomicBool::new(false))),
            Instant::now(),
        );
        let t = Instant::now();
        while wd.failure().is_none() {
            assert!(t.elapsed() < Duration::from_secs(10), "the watchdog hung");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(thread);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "setup runs once on the thread"
        );
        assert!(wd.failure().unwrap().contains("#9 (bucket 3)"));
        drop(wd);
        assert_eq!(lifecycle(&log), ["abort"]);
    }

    #[test]
    fn dropping_the_thread_stops_it_and_a_healthy_comm_is_destroyed() {
        let (f, log) = fake();
        let wd: Arc<Watchdog<Fake, FakeWork>> = Arc::new(Watchdog::new(
            0,
            Duration::from_secs(60),
            Arc::new(Guard::new(f)),
        ));
        let thread = WatchdogThread::spawn(wd.clone(), Duration::from_millis(1), || {}).unwrap();
        let done = Arc::new(AtomicBool::new(true));
        wd.watch(0, "b0", FakeWork(done), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        drop(thread);
        assert_eq!(wd.outstanding(), 0);
        assert!(wd.failure().is_none());
        drop(wd);
        assert_eq!(lifecycle(&log), ["destroy"]);
    }
}
