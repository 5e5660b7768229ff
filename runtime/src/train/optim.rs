//! Optimizers, written to follow PyTorch's single-tensor CPU implementations step for step.

use crate::exec::executor::relabel;
use crate::tensor::Tensor;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimizerKind {
    /// `torch.optim.AdamW` (decoupled weight decay, bias-corrected moments).
    AdamW {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
    /// Plain SGD: `p -= lr * g`.
    Sgd { lr: f64 },
}

impl OptimizerKind {
    /// PyTorch's AdamW defaults.
    pub fn adamw() -> OptimizerKind {
        OptimizerKind::AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

/// Optimizer state for a list of parameters (moments kept in f32, like the parameters).
pub struct Optimizer {
    kind: OptimizerKind,
    step: u64,
    exp_avg: Vec<Vec<f32>>,
    exp_avg_sq: Vec<Vec<f32>>,
    /// Per parameter: no state, no update (it never gets a gradient).
    stateless: Vec<bool>,
    /// A step's lists, kept (empty) for the next step: a steady step allocates none.
    scratch: Scratch,
}

/// [`Optimizer::step`]'s lists between steps.
#[derive(Default)]
struct Scratch {
    /// Per parameter: its gradient gathered into a pooled buffer (strided or not f32).
    gathered: Vec<Option<Vec<f32>>>,
    /// Per parameter: the f32 copy a parameter of another dtype is updated through.
    converted: Vec<Option<Tensor>>,
    /// The update's pieces (empty; relabelled to each step's borrows).
    work: Vec<Chunk<'static>>,
}

impl Optimizer {
    pub fn new(kind: OptimizerKind, params: &[Tensor]) -> Optimizer {
        Optimizer {
            kind,
            step: 0,
            exp_avg: params.iter().map(|p| vec![0.0; p.numel()]).collect(),
            exp_avg_sq: params.iter().map(|p| vec![0.0; p.numel()]).collect(),
            stateless: vec![false; params.len()],
            scratch: Scratch::default(),
        }
    }

    /// Drops the state of the parameters marked `true`: those the backward never gives a
    /// gradient (the loss does not reach them). As PyTorch's optimizers skip a `None` grad and
    /// keep no state for it, their moments stay empty and [`Optimizer::step`] refuses a
    /// gradient for them.
    pub fn without_state_for(mut self, stateless: &[bool]) -> Optimizer {
        for (i, _) in stateless.iter().enumerate().filter(|(_, s)| **s) {
            if let (Some(m), Some(v)) = (self.exp_avg.get_mut(i), self.exp_avg_sq.get_mut(i)) {
                *m = Vec::new();
                *v = Vec::new();
            }
        }
        self.stateless = stateless.to_vec();
        self
    }

    /// Whether parameter `i` has no optimizer state (see [`Optimizer::without_state_for`]).
    pub fn is_stateless(&self, i: usize) -> bool {
        self.stateless.get(i).copied().unwrap_or(false)
    }

    /// Steps taken, and the first and second moments (empty vectors for SGD's unused state).
    pub fn state(&self) -> (u64, &[Vec<f32>], &[Vec<f32>]) {
        (self.step, &self.exp_avg, &self.exp_avg_sq)
    }

    /// Restores a saved state; the moments must match the parameters' sizes.
    pub fn restore(
        &mut self,
        step: u64,
        exp_avg: Vec<Vec<f32>>,
        exp_avg_sq: Vec<Vec<f32>>,
    ) -> Result<(), String> {
        let (mut exp_avg, mut exp_avg_sq) = (exp_avg, exp_avg_sq);
        // a stateless parameter keeps no state, whatever an older checkpoint holds for it
        for (i, _) in self.stateless.iter().enumerate().filter(|(_, s)| **s) {
            if let (Some(m), Some(v)) = (exp_avg.get_mut(i), exp_avg_sq.get_mut(i)) {
                *m = Vec::new();
                *v = Vec::new();
            }
        }
        let fits = |v: &[Vec<f32>]| {
            v.len() == self.exp_avg.len()
                && v.iter().zip(&self.exp_avg).all(|(a, b)| a.len() == b.len())
        };
        if !fits(&exp_avg) || !fits(&exp_avg_sq) {
            return Err("the optimizer state does not match the parameters".into());
        }
        self.step = step;
        self.exp_avg = exp_avg;
        self.exp_avg_sq = exp_avg_sq;
        Ok(())
    }

    /// Bytes of optimizer state held (the f32 moments).
    pub fn state_bytes(&self) -> usize {
        self.exp_avg
            .iter()
            .chain(&self.exp_avg_sq)
            .map(|m| m.len() * std::mem::size_of::<f32>())
            .sum()
    }

    pub fn kind(&self) -> OptimizerKind {
        self.kind
    }

    /// Updates `params` in place with `grads` (`None`: a frozen parameter, left as it is).
    /// Every gradient is checked before any parameter changes; the update itself runs in
    /// chunks shared among the rank's threads (each element is updated the same way, so the
    /// result does not depend on the thread count).
    pub fn step(&mut self, params: &mut [Tensor], grads: &[Option<Tensor>]) -> Result<(), String> {
        use rayon::prelude::*;
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let Some(g) = g else { continue };
            if self.is_stateless(i) {
                return Err(format!(
                    "parameter {i}: a gradient for a parameter the backward was planned to give none"
                ));
            }
            if g.numel() != p.numel() {
                return Err(format!(
                    "parameter {i}: gradient {:?} does not match parameter {:?}",
                    g.shape(),
                    p.shape()
                ));
            }
            let moments = [&self.exp_avg, &self.exp_avg_sq].map(|s| s.get(i).map(Vec::len));
            if matches!(self.kind, OptimizerKind::AdamW { .. }) && moments != [Some(p.numel()); 2] {
                return Err(format!(
                    "parameter {i}: optimizer moments of {moments:?} elements for a parameter of {}",
                    p.numel()
                ));
            }
        }
        self.step += 1;
        let rule = Rule::of(self.kind, self.step);
        let Optimizer {
            exp_avg,
            exp_avg_sq,
            scratch,
            ..
        } = self;
        // a strided gradient (a permuted weight's, when no bucket made it contiguous) is
        // gathered into a pooled buffer, given back below
        let gathered = &mut scratch.gathered;
        gathered.clear();
        gathered.extend(grads.iter().map(|g| {
            let g = g.as_ref()?;
            if g.as_f32().is_some() {
                return None;
            }
            Some(match g.elems::<f32>() {
                Some(c) => c.into_owned(),
                None => g.to_f32_vec(),
            })
        }));
        // f32 parameters are updated in place; others through an f32 copy
        let converted = &mut scratch.converted;
        converted.clear();
        converted.extend(params.iter().zip(grads).map(|(p, g)| {
            (g.is_some() && p.dtype() != tracepass_ir::DType::F32)
                .then(|| Tensor::from_f32(p.shape(), p.to_f32_vec()))
        }));
        let mut work: Vec<Chunk<'_>> = relabel(std::mem::take(&mut scratch.work));
        for (((((p, c), g), gathered), m), v) in params
            .iter_mut()
            .zip(converted.iter_mut())
            .zip(grads)
            .zip(gathered.iter())
            .zip(exp_avg.iter_mut())
            .zip(exp_avg_sq.iter_mut())
        {
            let Some(g) = gathered
                .as_deref()
                .or_else(|| g.as_ref().and_then(Tensor::as_f32))
            else {
                continue;
            };
            let target = match c.as_mut() {
                Some(c) => c,
                None => p,
            };
            let x = target.f32_mut().ok_or("parameter is not f32")?;
            // AdamW's moments have the parameter's length (checked above); SGD reads none
            let (mut ms, mut vs) = (m.chunks_mut(UPDATE_CHUNK), v.chunks_mut(UPDATE_CHUNK));
            for (x, g) in x.chunks_mut(UPDATE_CHUNK).zip(g.chunks(UPDATE_CHUNK)) {
                let (m, v) = (ms.next().unwrap_or_default(), vs.next().unwrap_or_default());
                work.push(Chunk { x, g, m, v });
            }
        }
        // a rank of one thread updates on that thread: outside its own pool, rayon would run the
        // chunks on the process's global pool, on other ranks' cores (and allocate a block of
        // its injector queue every 63 calls)
        if crate::cpu::pool_threads() > 1 {
            work.par_drain(..).for_each(|c| rule.apply(c));
        } else {
            work.drain(..).for_each(|c| rule.apply(c));
        }
        scratch.work = relabel(work);
        for (p, c) in params.iter_mut().zip(scratch.converted.drain(..)) {
            if let Some(c) = c {
                *p = c.to_dtype(p.dtype()).ok_or("unsupported parameter dtype")?;
            }
        }
        scratch
            .gathered
            .drain(..)
            .flatten()
            .for_each(crate::cpu::buffer_pool::give);
        Ok(())
    }
}

/// Elements per piece of work of an update.
const UPDATE_CHUNK: usize = 1 << 15;

/// A piece of one parameter's update: its elements, gradient and moments (unread by SGD).
struct Chunk<'a> {
    x: &'a mut [f32],
    g: &'a [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
}

/// One step's update rule with its constants worked out.
#[derive(Clone, Copy)]
enum Rule {
    Sgd {
        lr: f32,
    },
    AdamW {
        decay: f32,
        w: f32,
        b2: f32,
        one_minus_b2: f32,
        step_size: f32,
        bc2_sqrt: f32,
        eps: f32,
    },
}

impl Rule {
    fn of(kind: OptimizerKind, step: u64) -> Rule {
        match kind {
            OptimizerKind::Sgd { lr } => Rule::Sgd { lr: lr as f32 },
            OptimizerKind::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let bc1 = 1.0 - beta1.powi(step as i32);
                let bc2 = 1.0 - beta2.powi(step as i32);
                Rule::AdamW {
                    decay: (1.0 - lr * weight_decay) as f32,
                    w: (1.0 - beta1) as f32,
                    b2: beta2 as f32,
                    one_minus_b2: (1.0 - beta2) as f32,
                    step_size: (lr / bc1) as f32,
                    bc2_sqrt: bc2.sqrt() as f32,
                    eps: eps as f32,
                }
            }
        }
    }

    fn apply(self, c: Chunk<'_>) {
        match self {
            Rule::Sgd { lr } => {
                for (x, d) in c.x.iter_mut().zip(c.g) {
                    *x -= lr * d;
                }
            }
            Rule::AdamW {
                decay,
                w,
                b2,
                one_minus_b2,
                step_size,
                bc2_sqrt,
                eps,
            } => {
                let Chunk { x, g, m, v } = c;
                // compiled for this CPU's vector unit; the same bits as a scalar loop
                crate::cpu::simd::vectorized(
                    #[inline(always)]
                    || {
                        for (((x, &gk), mk), vk) in x
                            .iter_mut()
                            .zip(g.iter())
                            .zip(m.iter_mut())
                            .zip(v.iter_mut())
                        {
                            *x *= decay;
                            // lerp(m, g, w) with w < 0.5: m + w * (g - m)
                            *mk += w * (gk - *mk);
                            *vk = *vk * b2 + one_minus_b2 * gk * gk;
                            let denom = vk.sqrt() / bc2_sqrt + eps;
                            *x += -step_size * (*mk / denom);
                        }
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
            .collect()
    }

    /// Three steps of AdamW on two parameters, one of several chunks: the same bits alone
    /// and on three threads, and the bits of PyTorch's formula written as one scalar loop.
    #[test]
    fn adamw_in_chunks_on_threads_is_the_scalar_update() {
        let sizes = [3 * UPDATE_CHUNK + 17, 5];
        let run = || {
            let mut params: Vec<Tensor> = sizes
                .iter()
                .map(|&n| Tensor::from_f32(vec![n], values(n, 1)))
                .collect();
            let mut opt = Optimizer::new(OptimizerKind::adamw(), &params);
            for step in 0..3u32 {
                let grads: Vec<Option<Tensor>> = sizes
                    .iter()
                    .map(|&n| Some(Tensor::from_f32(vec![n], values(n, 7 + step))))
                    .collect();
                opt.step(&mut params, &grads).expect("a step");
            }
            params.iter().map(Tensor::to_f32_vec).collect::<Vec<_>>()
        };
        let (alone, threaded) = crate::cpu::alone_and_in_three_threads(run);
        let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
            v.iter()
                .map(|p| p.iter().map(|x| x.to_bits()).collect())
                .collect()
        };
        assert_eq!(bits(&alone), bits(&threaded));
        // the reference: PyTorch's single-tensor AdamW, element by element
        let (lr, b1, b2, eps, wd) = (1e-3f64, 0.9f64, 0.999f64, 1e-8f64, 1e-2f64);
        for (k, &n) in sizes.iter().enumerate() {
            let mut x = values(n, 1);
            let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
            for step in 1..=3u32 {
                let g = values(n, 7 + step - 1);
                let bc1 = 1.0 - b1.powi(step as i32);
                let bc2 = 1.0 - b2.powi(step as i32);
                for i in 0..n {
                    x[i] *= (1.0 - lr * wd) as f32;
                    m[i] += (1.0 - b1) as f32 * (g[i] - m[i]);
                    v[i] = v[i] * b2 as f32 + (1.0 - b2) as f32 * g[i] * g[i];
                    let denom = v[i].sqrt() / bc2.sqrt() as f32 + eps as f32;
                    x[i] += -((lr / bc1) as f32) * (m[i] / denom);
                }
            }
            assert_eq!(bits(&alone)[k], bits(&[x])[0], "parameter {k}");
        }
    }

    /// A bad gradient anywhere leaves every parameter and the step count as they were.
    #[test]
    fn a_bad_gradient_updates_nothing() {
        let mut params = vec![
            Tensor::from_f32(vec![4], vec![1.0; 4]),
            Tensor::from_f32(vec![3], vec![1.0; 3]),
        ];
        let mut opt = Optimizer::new(OptimizerKind::adamw(), &params);
        let grads = vec![
            Some(Tensor::from_f32(vec![4], vec![0.5; 4])),
            Some(Tensor::from_f32(vec![2], vec![0.5; 2])),
        ];
        let e = opt.step(&mut params, &grads).expect_err("a wrong size");
        assert!(e.contains("parameter 1"), "{e}");
        assert_eq!(params[0].to_f32_vec(), vec![1.0; 4]);
        assert_eq!(opt.state().0, 0);
    }
}
