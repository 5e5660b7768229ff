//! Collective communication between ranks: the [`Communicator`] interface the executor and
//! trainer use, the [`ThreadComm`] that joins thread ranks of one process, and the
//! torchrun-style [`DistEnv`] with the TCP rendezvous of process ranks.

pub(crate) mod reduction;
pub(crate) mod rendezvous;
pub(crate) mod thread;

pub use rendezvous::{exchange, DistEnv, RendezvousError};
pub use thread::{CommOptions, Completion, ThreadComm, ThreadGroup, ThreadHandle};

use std::time::{Duration, Instant};

/// How an all-reduce combines the ranks' buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

impl ReduceOp {
    /// Reads Thunder's `_DistributedReduceOps_SUM_0` member name or our `'sum'`.
    pub fn parse(s: &str) -> Option<ReduceOp> {
        match s.to_ascii_lowercase().as_str() {
            "sum" => Some(ReduceOp::Sum),
            "max" => Some(ReduceOp::Max),
            _ => None,
        }
    }
}

/// When a collective happened on one rank (for overlap metrics and timelines).
#[derive(Clone, Copy, Debug)]
pub struct CommTiming {
    /// The rank handed the buffer over (`all_reduce_async` returned right after).
    pub launched: Instant,
    /// The transfer started: the communication worker had finished this rank's earlier
    /// collectives and every rank had arrived.
    pub started: Instant,
    /// The result was ready on this rank.
    pub finished: Instant,
}

impl CommTiming {
    pub fn busy(&self) -> Duration {
        self.finished.saturating_duration_since(self.started)
    }
}

/// Why a collective failed. Every variant names the rank(s) and the collective concerned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    #[error("rank {rank}: collective #{seq} ({label}) timed out after {secs:.1} s waiting for rank(s) {missing:?}")]
    Timeout {
        rank: usize,
        seq: u64,
        label: String,
        secs: f64,
        missing: Vec<usize>,
    },
    #[error("rank {rank}: stopped because rank {failed} failed: {reason}")]
    PeerFailed {
        rank: usize,
        failed: usize,
        reason: String,
    },
    #[error("collective #{seq} differs between ranks: rank {a} issued {what_a}, rank {b} issued {what_b}")]
    Mismatch {
        seq: u64,
        a: usize,
        what_a: String,
        b: usize,
        what_b: String,
    },
    #[error("rank {rank}: {message}")]
    Invalid { rank: usize, message: String },
    #[error("rank {rank}: the communication worker is gone")]
    WorkerGone { rank: usize },
}

/// A ring network for the alpha-beta cost model: per-hop latency and link bandwidth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkModel {
    pub latency_us: f64,
    pub bandwidth_gbps: f64,
}

impl LinkModel {
    /// The largest per-hop latency a link may have: 1000 s.
    pub const MAX_LATENCY_US: f64 = 1e9;
    /// The smallest bandwidth a link may have: 1 bit/s. Below it every time overflows.
    pub const MIN_BANDWIDTH_GBPS: f64 = 1e-9;

    /// Parses `latency_us,bandwidth_gbps` (gigabits per second: `5,100` is 5 us and 100 Gb/s).
    pub fn parse(s: &str) -> Result<LinkModel, String> {
        let (l, b) = s
            .split_once(',')
            .ok_or_else(|| format!("link '{s}': expected LATENCY_US,BANDWIDTH_GBPS"))?;
        let latency_us: f64 = l
            .trim()
            .parse()
            .map_err(|_| format!("link '{s}': latency '{l}' is not a number"))?;
        let bandwidth_gbps: f64 = b
            .trim()
            .parse()
            .map_err(|_| format!("link '{s}': bandwidth '{b}' is not a number"))?;
        if !(latency_us.is_finite() && (0.0..=Self::MAX_LATENCY_US).contains(&latency_us)) {
            return Err(format!(
                "link '{s}': latency must be between 0 and {:e} us",
                Self::MAX_LATENCY_US
            ));
        }
        if !(bandwidth_gbps.is_finite() && bandwidth_gbps >= Self::MIN_BANDWIDTH_GBPS) {
            return Err(format!(
                "link '{s}': bandwidth must be a finite number of at least {:e} Gb/s",
                Self::MIN_BANDWIDTH_GBPS
            ));
        }
        Ok(LinkModel {
            latency_us,
            bandwidth_gbps,
        })
    }
    /// Ring all-reduce time: `2(n-1)` latency hops plus `2(n-1)/n * bytes / bandwidth`;
    /// [`Duration::MAX`] where that is longer than a `Duration` holds.
    pub fn all_reduce_time(&self, bytes: usize, world: usize) -> Duration {
        if world <= 1 {
            return Duration::ZERO;
        }
        let n = world as f64;
        let bytes_per_s = self.bandwidth_gbps * 1e9 / 8.0;
        let secs = 2.0 * (n - 1.0) * self.latency_us * 1e-6
            + 2.0 * (n - 1.0) / n * bytes as f64 / bytes_per_s;
        Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
    }
    /// Ring all-gather or reduce-scatter of a buffer of `bytes` (the gathered whole, or the
    /// whole being scattered): half an all-reduce, `(n-1)` latency hops plus
    /// `(n-1)/n * bytes / bandwidth`.
    pub fn all_gather_time(&self, bytes: usize, world: usize) -> Duration {
        if world <= 1 {
            return Duration::ZERO;
        }
        let n = world as f64;
        let bytes_per_s = self.bandwidth_gbps * 1e9 / 8.0;
        let secs = (n - 1.0) * self.latency_us * 1e-6 + (n - 1.0) / n * bytes as f64 / bytes_per_s;
        Duration::from_secs_f64(secs)
    }
    /// Ring reduce-scatter of `bytes`: the same traffic as an all-gather of them.
    pub fn reduce_scatter_time(&self, bytes: usize, world: usize) -> Duration {
        self.all_gather_time(bytes, world)
    }
}

/// Collectives of one rank. Calls must be made in the same order on every rank.
pub trait Communicator: Send {
    type Tensor: Send;
    type Handle: Send;

    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Starts an all-reduce of `t` and returns at once; the result comes from `wait`.
    fn all_reduce_async(
        &mut self,
        t: Self::Tensor,
        op: ReduceOp,
        label: &str,
    ) -> Result<Self::Handle, CommError>;
    /// Starts an all-gather of `t`: the result (from `wait`) is every rank's `t`, flattened
    /// and concatenated in rank order (`world_size` times its elements). All ranks bring
    /// tensors of one size and dtype.
    fn all_gather_async(&mut self, t: Self::Tensor, label: &str)
        -> Result<Self::Handle, CommError>;
    /// Starts a reduce-scatter of `t` (a flat buffer whose length the world size divides): the
    /// ranks' buffers are combined as an all-reduce combines them, and rank `r` gets elements
    /// `r * n / world .. (r + 1) * n / world` of the result.
    fn reduce_scatter_async(
        &mut self,
        t: Self::Tensor,
        op: ReduceOp,
        label: &str,
    ) -> Result<Self::Handle, CommError>;
    /// Blocks until the collective is done; the result and when it ran.
    fn wait(&mut self, h: Self::Handle) -> Result<(Self::Tensor, CommTiming), CommError>;
    /// Every rank gets `root`'s tensor (others pass theirs as a template of shape and dtype).
    fn broadcast(&mut self, t: Self::Tensor, root: usize) -> Result<Self::Tensor, CommError>;
    fn barrier(&mut self) -> Result<(), CommError>;
    /// Tells the other ranks this one failed, so they stop instead of waiting for it.
    fn abort(&self, reason: &str);
    /// The failure of some rank, if one was reported.
    fn failure(&self) -> Option<(usize, String)>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_model_is_the_ring_formula() {
        let l = LinkModel::parse("10,80").expect("valid");
        // 4 ranks, 10 MB: 6 hops of 10 us + 1.5 * 1e7 B / 1e10 B/s = 60 us + 1.5 ms
        let t = l.all_reduce_time(10_000_000, 4).as_secs_f64();
        assert!((t - 0.00156).abs() < 1e-9, "{t}");
        assert_eq!(l.all_reduce_time(1000, 1), Duration::ZERO);
        assert!(LinkModel::parse("10").is_err());
        assert!(LinkModel::parse("1,0").is_err());
        assert!(LinkModel::parse("-1,5").is_err());
        // extreme values are refused by name, and a time too long for a Duration saturates
        assert!(LinkModel::parse("1,1e-300").is_err());
        assert!(LinkModel::parse("1e300,1").is_err());
        let slow = LinkModel {
            latency_us: 1.0,
            bandwidth_gbps: 1e-300,
        };
        assert_eq!(slow.all_reduce_time(1 << 20, 2), Duration::MAX);
    }

    #[test]
    fn all_gather_and_reduce_scatter_are_half_an_all_reduce() {
        let l = LinkModel::parse("10,80").expect("valid");
        // 4 ranks, 10 MB gathered: 3 hops of 10 us + 0.75 * 1e7 B / 1e10 B/s = 30 us + 0.75 ms
        let t = l.all_gather_time(10_000_000, 4).as_secs_f64();
        assert!((t - 0.00078).abs() < 1e-9, "{t}");
        assert_eq!(
            l.reduce_scatter_time(10_000_000, 4),
            l.all_gather_time(10_000_000, 4)
        );
        assert_eq!(l.all_gather_time(1000, 1), Duration::ZERO);
    }
}
