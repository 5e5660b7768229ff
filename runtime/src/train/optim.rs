//! Optimizers, written to follow PyTorch's single-tensor CPU implementations step for step.

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
}

impl Optimizer {
    pub fn new(kind: OptimizerKind, params: &[Tensor]) -> Optimizer {
        Optimizer {
            kind,
            step: 0,
            exp_avg: params.iter().map(|p| vec![0.0; p.numel()]).collect(),
            exp_avg_sq: params.iter().map(|p| vec![0.0; p.numel()]).collect(),
            stateless: vec![false; params.len()],
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
    pub fn step(&mut self, params: &mut [Tensor], grads: &[Option<Tensor>]) -> Result<(), String> {
        self.step += 1;
        for (i, (p, g)) in params.iter_mut().zip(grads).enumerate() {
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
            // a strided gradient (a permuted weight's, when no bucket made it contiguous) is
            // gathered into a pooled buffer, given back below
            let gv: std::borrow::Cow<'_, [f32]> = match g.elems::<f32>() {
                Some(v) => v,
                None => std::borrow::Cow::Owned(g.to_f32_vec()),
            };
            // f32 parameters are updated in place; others through an f32 copy
            let mut converted = if p.dtype() == tracepass_ir::DType::F32 {
                None
            } else {
                Some(Tensor::from_f32(p.shape().to_vec(), p.to_f32_vec()))
            };
            let target = match converted.as_mut() {
                Some(c) => c,
                None => &mut *p,
            };
            let pv = target.f32_mut().ok_or("parameter is not f32")?;
            match self.kind {
                OptimizerKind::Sgd { lr } => {
                    let lr = lr as f32;
                    for (x, d) in pv.iter_mut().zip(gv.iter()) {
                        *x -= lr * d;
                    }
                }
                OptimizerKind::AdamW {
                    lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                } => {
                    let decay = (1.0 - lr * weight_decay) as f32;
                    let w = (1.0 - beta1) as f32;
                    let b2 = beta2 as f32;
                    let one_minus_b2 = (1.0 - beta2) as f32;
                    let bc1 = 1.0 - beta1.powi(self.step as i32);
                    let bc2 = 1.0 - beta2.powi(self.step as i32);
                    let step_size = (lr / bc1) as f32;
                    let bc2_sqrt = bc2.sqrt() as f32;
                    let eps = eps as f32;
                    let (m, v) = (&mut self.exp_avg[i], &mut self.exp_avg_sq[i]);
                    // compiled for this CPU's vector unit; the same bits as a scalar loop
                    crate::cpu::simd::vectorized(
                        #[inline(always)]
                        || {
                            for (((x, &gk), mk), vk) in pv
                                .iter_mut()
                                .zip(gv.iter())
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
            crate::cpu::buffer_pool::give_cow(gv);
            if let Some(c) = converted {
                *p = c.to_dtype(p.dtype()).ok_or("unsupported parameter dtype")?;
            }
        }
        Ok(())
    }
}
