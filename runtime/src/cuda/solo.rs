//! The communicator of a world of one: every collective returns its input. One GPU trains
//! without NCCL (which need not be installed), as `torch.distributed` is not needed for one.

use crate::comm::{CommError, CommTiming, Communicator, ReduceOp};
use std::time::Instant;

pub struct SoloComm<T> {
    _tensor: std::marker::PhantomData<fn() -> T>,
}

impl<T> Default for SoloComm<T> {
    fn default() -> Self {
        SoloComm {
            _tensor: std::marker::PhantomData,
        }
    }
}

pub struct SoloHandle<T> {
    tensor: T,
    launched: Instant,
}

impl<T: Send + 'static> Communicator for SoloComm<T> {
    type Tensor = T;
    type Handle = SoloHandle<T>;

    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_async(
        &mut self,
        t: T,
        _op: ReduceOp,
        _label: &str,
    ) -> Result<SoloHandle<T>, CommError> {
        Ok(SoloHandle {
            tensor: t,
            launched: Instant::now(),
        })
    }
    fn all_gather_async(&mut self, t: T, _label: &str) -> Result<SoloHandle<T>, CommError> {
        Ok(SoloHandle {
            tensor: t,
            launched: Instant::now(),
        })
    }
    fn reduce_scatter_async(
        &mut self,
        t: T,
        _op: ReduceOp,
        _label: &str,
    ) -> Result<SoloHandle<T>, CommError> {
        Ok(SoloHandle {
            tensor: t,
            launched: Instant::now(),
        })
    }
    fn wait(&mut self, h: SoloHandle<T>) -> Result<(T, CommTiming), CommError> {
        Ok((
            h.tensor,
            CommTiming {
                launched: h.launched,
                started: h.launched,
                finished: h.launched,
            },
        ))
    }
    fn broadcast(&mut self, t: T, root: usize) -> Result<T, CommError> {
        if root != 0 {
            return Err(CommError::Invalid {
                rank: 0,
                message: format!("broadcast root {root} is not a rank of a world of 1"),
            });
        }
        Ok(t)
    }
    fn barrier(&mut self) -> Result<(), CommError> {
        Ok(())
    }
    fn abort(&self, _reason: &str) {}
    fn failure(&self) -> Option<(usize, String)> {
        // nothing can fail between ranks when there is one
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_world_of_one_returns_its_input() {
        let mut c: SoloComm<Vec<f32>> = SoloComm::default();
        assert_eq!((c.rank(), c.world_size()), (0, 1));
        let h = c
            .all_reduce_async(vec![1.0, 2.0], ReduceOp::Sum, "b0")
            .unwrap();
        let (t, timing) = c.wait(h).unwrap();
        assert_eq!(t, vec![1.0, 2.0]);
        assert_eq!(timing.busy(), std::time::Duration::ZERO);
        // a world of one gathers and scatters its own buffer whole
        let h = c.all_gather_async(vec![4.0], "g").unwrap();
        assert_eq!(c.wait(h).unwrap().0, vec![4.0]);
        let h = c
            .reduce_scatter_async(vec![5.0], ReduceOp::Sum, "s")
            .unwrap();
        assert_eq!(c.wait(h).unwrap().0, vec![5.0]);
        assert_eq!(c.broadcast(vec![3.0], 0).unwrap(), vec![3.0]);
        assert!(c.broadcast(vec![3.0], 1).is_err());
        c.barrier().unwrap();
        assert!(c.failure().is_none());
    }
}
