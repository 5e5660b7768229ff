//! The pointwise losses Thunder 0.2.6 runs as torch fallbacks (`binary_cross_entropy_with_logits`,
//! `binary_cross_entropy`, `l1_loss`, `smooth_l1_loss`, `huber_loss`, `kl_div`) and their gradients on any
//! backend, from its own elementwise kernels and a sum, as PyTorch 2.9 defines them
//! ([`PointwiseLossKind`]): the loss of each element, times `weight` (and `pos_weight` inside
//! the logits loss) broadcast to the input, then summed, averaged or kept. The gradients are
//! PyTorch's derivative formulas (`derivatives.yaml`); PyTorch differentiates no weight.

use crate::exec::backend::{Backend, Input};
use crate::exec::composer::{err, Cx, R};
use crate::exec::kernel::{
    BinaryOp, CompareOp, Kernel, LossReduction, PointwiseLossKind as K, Side, UnaryOp,
};

/// Runs [`Kernel::PointwiseLoss`] (one output) or [`Kernel::PointwiseLossVjp`] (one per
/// gradient); `None` for any other kernel.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<Vec<B::Tensor>>> {
    let c = Cx { b: backend };
    let (kind, reduction, weight, pos_weight, outputs) = match kernel {
        Kernel::PointwiseLoss {
            kind,
            reduction,
            weight,
            pos_weight,
        } => (*kind, *reduction, *weight, *pos_weight, None),
        Kernel::PointwiseLossVjp {
            kind,
            reduction,
            weight,
            pos_weight,
            outputs,
        } => (*kind, *reduction, *weight, *pos_weight, Some(*outputs)),
        _ => return None,
    };
    let ts: Vec<&B::Tensor> = inputs
        .iter()
        .filter_map(|i| match i {
            Input::Tensor(t) => Some(*t),
            Input::Scalar(_) => None,
        })
        .collect();
    let n = 2 + usize::from(weight) + usize::from(pos_weight) + usize::from(outputs.is_some());
    if ts.len() != n || inputs.len() != n {
        return Some(Err(err(
            "pointwise loss",
            format!("needs {n} tensor inputs"),
        )));
    }
    let w = weight.then(|| ts[2]);
    let pw = pos_weight.then(|| ts[2 + usize::from(weight)]);
    let ops = Operands {
        x: ts[0],
        y: ts[1],
        w,
        pw,
    };
    Some(match outputs {
        None => c.loss(kind, reduction, &ops).map(|l| vec![l]),
        Some(outputs) => c.loss_vjp(kind, reduction, &ops, ts[n - 1], outputs),
    })
}

/// A loss's tensor operands: input, target, and the optional weights.
struct Operands<'t, T> {
    x: &'t T,
    y: &'t T,
    w: Option<&'t T>,
    pw: Option<&'t T>,
}

impl<B: Backend> Cx<'_, B> {
    fn un(&self, op: UnaryOp, x: &B::Tensor) -> R<B::Tensor> {
        self.k(Kernel::Unary(op), &[x])
    }

    /// `s - x`.
    fn rsub_s(&self, s: f64, x: &B::Tensor) -> R<B::Tensor> {
        self.k(
            Kernel::Binary {
                op: BinaryOp::Sub,
                a: Side::Scalar(s),
                b: Side::Input(0),
                alpha: 1.0,
            },
            &[x],
        )
    }

    /// `cond(x) ? a : b`, `cond` comparing `x` with the number `s`.
    fn select(
        &self,
        op: CompareOp,
        x: &B::Tensor,
        s: f64,
        a: &B::Tensor,
        b: &B::Tensor,
    ) -> R<B::Tensor> {
        let cond = self.k(
            Kernel::Compare {
                op,
                a: Side::Input(0),
                b: Side::Scalar(s),
            },
            &[x],
        )?;
        self.k(
            Kernel::Where {
                a: Side::Input(1),
                b: Side::Input(2),
                dtype: self.b.dtype(a),
            },
            &[&cond, a, b],
        )
    }

    /// `xlogy(y, y)`: `y log(y)`, 0 where `y` is 0.
    fn xlogy_self(&self, y: &B::Tensor) -> R<B::Tensor> {
        let yl = self.ew(BinaryOp::Mul, y, &self.un(UnaryOp::Log, y)?)?;
        let zero = self.ew_s(BinaryOp::Mul, y, 0.0)?;
        self.select(CompareOp::Eq, y, 0.0, &zero, &yl)
    }

    /// The sum's divisor of `reduction` (and `batchmean`) over `shape`, `None` for none.
    fn divisor(kind: K, reduction: LossReduction, shape: &[usize]) -> Option<f64> {
        match (reduction, kind) {
            (LossReduction::None, _) => None,
            (LossReduction::Mean, _) => Some(shape.iter().product::<usize>() as f64),
            (
                LossReduction::Sum,
                K::KlDiv {
                    batchmean: true, ..
                },
            ) => Some(shape.first().copied().unwrap_or(1) as f64),
            (LossReduction::Sum, _) => Some(1.0),
        }
    }

    /// `1 + (pos_weight - 1) y`, the logits loss's weight of `-log_sigmoid(x)`.
    fn log_weight(&self, y: &B::Tensor, pw: &B::Tensor) -> R<B::Tensor> {
        let p1 = self.ew_s(BinaryOp::Sub, pw, 1.0)?;
        self.ew_s(BinaryOp::Add, &self.ew(BinaryOp::Mul, &p1, y)?, 1.0)
    }

    /// The unweighted loss of each element.
    fn loss_each(&self, kind: K, o: &Operands<'_, B::Tensor>) -> R<B::Tensor> {
        let (x, y) = (o.x, o.y);
        match kind {
            K::BceWithLogits => {
                let ls = self.un(UnaryOp::Logsigmoid, x)?;
                let ls = match o.pw {
                    Some(pw) => self.ew(BinaryOp::Mul, &self.log_weight(y, pw)?, &ls)?,
                    None => ls,
                };
                let first = self.ew(BinaryOp::Mul, &self.rsub_s(1.0, y)?, x)?;
                self.ew(BinaryOp::Sub, &first, &ls)
            }
            K::Bce => {
                let log1m = self.un(UnaryOp::Log1p, &self.un(UnaryOp::Neg, x)?)?;
                let log1m = self.ew_s(BinaryOp::Maximum, &log1m, -100.0)?;
                let logx = self.ew_s(BinaryOp::Maximum, &self.un(UnaryOp::Log, x)?, -100.0)?;
                let a = self.ew(BinaryOp::Mul, &self.ew_s(BinaryOp::Sub, y, 1.0)?, &log1m)?;
                self.ew(BinaryOp::Sub, &a, &self.ew(BinaryOp::Mul, y, &logx)?)
            }
            K::L1 => self.un(UnaryOp::Abs, &self.ew(BinaryOp::Sub, x, y)?),
            K::SmoothL1 { beta } => {
                let d = self.un(UnaryOp::Abs, &self.ew(BinaryOp::Sub, x, y)?)?;
                if beta == 0.0 {
                    return Ok(d);
                }
                let quad =
                    self.ew_s(BinaryOp::Div, &self.ew(BinaryOp::Mul, &d, &d)?, 2.0 * beta)?;
                let lin = self.ew_s(BinaryOp::Sub, &d, 0.5 * beta)?;
                self.select(CompareOp::Lt, &d, beta, &quad, &lin)
            }
            K::KlDiv { log_target, .. } => {
                if log_target {
                    let d = self.ew(BinaryOp::Sub, y, x)?;
                    self.ew(BinaryOp::Mul, &self.un(UnaryOp::Exp, y)?, &d)
                } else {
                    let yx = self.ew(BinaryOp::Mul, y, x)?;
                    self.ew(BinaryOp::Sub, &self.xlogy_self(y)?, &yx)
                }
            }
            K::Huber { delta } => {
                let d = self.un(UnaryOp::Abs, &self.ew(BinaryOp::Sub, x, y)?)?;
                let quad = self.ew_s(BinaryOp::Mul, &self.ew(BinaryOp::Mul, &d, &d)?, 0.5)?;
                let lin = self.ew_s(
                    BinaryOp::Mul,
                    &self.ew_s(BinaryOp::Sub, &d, 0.5 * delta)?,
                    delta,
                )?;
                self.select(CompareOp::Lt, &d, delta, &quad, &lin)
            }
        }
    }

    fn check_shapes(&self, o: &Operands<'_, B::Tensor>) -> R<Vec<usize>> {
        let (sx, sy) = (self.b.shape(o.x).to_vec(), self.b.shape(o.y).to_vec());
        if sx != sy {
            return Err(err(
                "pointwise loss",
                format!("input {sx:?} and target {sy:?} must have one shape"),
            ));
        }
        for w in [o.w, o.pw].into_iter().flatten() {
            let sw = self.b.shape(w).to_vec();
            if tracepass_ir::broadcast_shapes(&sw, &sx).as_deref() != Some(&sx[..]) {
                return Err(err(
                    "pointwise loss",
                    format!("a weight of shape {sw:?} does not broadcast to the input's {sx:?}"),
                ));
            }
        }
        Ok(sx)
    }

    fn loss(&self, kind: K, reduction: LossReduction, o: &Operands<'_, B::Tensor>) -> R<B::Tensor> {
        let shape = self.check_shapes(o)?;
        let l = self.loss_each(kind, o)?;
        let l = match o.w {
            Some(w) => self.ew(BinaryOp::Mul, &l, &self.broadcast_to(w, &shape)?)?,
            None => l,
        };
        let all: Vec<usize> = (0..shape.len()).collect();
        match Self::divisor(kind, reduction, &shape) {
            None => Ok(l),
            Some(1.0) => self.sum_over(&l, all, false),
            Some(n) => self.ew_s(BinaryOp::Div, &self.sum_over(&l, all, false)?, n),
        }
    }

    /// The gradients `outputs` names (input's, target's), in that order.
    fn loss_vjp(
        &self,
        kind: K,
        reduction: LossReduction,
        o: &Operands<'_, B::Tensor>,
        g: &B::Tensor,
        outputs: [bool; 2],
    ) -> R<Vec<B::Tensor>> {
        let shape = self.check_shapes(o)?;
        let (x, y) = (o.x, o.y);
        let gshape = self.b.shape(g).to_vec();
        let want: &[usize] = match reduction {
            LossReduction::None => &shape,
            _ => &[],
        };
        if gshape != want {
            return Err(err(
                "pointwise loss vjp",
                format!("gradient {gshape:?} is not the loss's shape {want:?}"),
            ));
        }
        // the output's gradient on every element, before the weight
        let gs = match Self::divisor(kind, reduction, &shape) {
            Some(n) if n != 1.0 => self.ew_s(BinaryOp::Div, g, n)?,
            _ => self.k(Kernel::Identity, &[g])?,
        };
        let gs = self.broadcast_to(&gs, &shape)?;
        let gw = match o.w {
            Some(w) => self.ew(BinaryOp::Mul, &gs, &self.broadcast_to(w, &shape)?)?,
            None => gs,
        };
        let mut out = Vec::new();
        if outputs[0] || outputs[1] {
            // d loss / d input per element; the target's is its negative except for BCE
            let dx = match kind {
                K::BceWithLogits => {
                    let s = self.un(UnaryOp::Sigmoid, x)?;
                    match o.pw {
                        Some(pw) => {
                            let a = self.ew(BinaryOp::Mul, &self.log_weight(y, pw)?, &s)?;
                            let py = self.ew(BinaryOp::Mul, &self.broadcast_to(pw, &shape)?, y)?;
                            self.ew(BinaryOp::Sub, &a, &py)?
                        }
                        None => self.ew(BinaryOp::Sub, &s, y)?,
                    }
                }
                K::Bce => {
                    let den = self.ew(BinaryOp::Mul, &self.rsub_s(1.0, x)?, x)?;
                    // PyTorch's EPSILON is the float 1e-12, in every dtype
                    let den = self.ew_s(BinaryOp::Maximum, &den, f64::from(1e-12_f32))?;
                    self.ew(BinaryOp::Div, &self.ew(BinaryOp::Sub, x, y)?, &den)?
                }
                K::SmoothL1 { beta } if beta != 0.0 => {
                    let d = self.ew(BinaryOp::Sub, x, y)?;
                    let ad = self.un(UnaryOp::Abs, &d)?;
                    let lin = self.un(UnaryOp::Sign, &d)?;
                    let quad = self.ew_s(BinaryOp::Div, &d, beta)?;
                    self.select(CompareOp::Lt, &ad, beta, &quad, &lin)?
                }
                K::L1 | K::SmoothL1 { .. } => {
                    self.un(UnaryOp::Sign, &self.ew(BinaryOp::Sub, x, y)?)?
                }
                // -exp(y), or -y
                K::KlDiv { log_target, .. } => {
                    let e = if log_target {
                        self.un(UnaryOp::Exp, y)?
                    } else {
                        self.k(Kernel::Identity, &[y])?
                    };
                    self.un(UnaryOp::Neg, &e)?
                }
                K::Huber { delta } => {
                    let d = self.ew(BinaryOp::Sub, x, y)?;
                    let d = self.ew_s(BinaryOp::Maximum, &d, -delta)?;
                    self.ew_s(BinaryOp::Minimum, &d, delta)?
                }
            };
            if outputs[0] {
                out.push(self.ew(BinaryOp::Mul, &gw, &dx)?);
            }
            if outputs[1] {
                let dy = match kind {
                    // log_sigmoid(-x) - pos_weight log_sigmoid(x), or -x
                    K::BceWithLogits => match o.pw {
                        Some(pw) => {
                            let a = self.un(UnaryOp::Logsigmoid, &self.un(UnaryOp::Neg, x)?)?;
                            let b = self.ew(
                                BinaryOp::Mul,
                                &self.un(UnaryOp::Logsigmoid, x)?,
                                &self.broadcast_to(pw, &shape)?,
                            )?;
                            self.ew(BinaryOp::Sub, &a, &b)?
                        }
                        None => self.un(UnaryOp::Neg, x)?,
                    },
                    // -logit(x) = log1p(-x) - log(x)
                    K::Bce => {
                        let a = self.un(UnaryOp::Log1p, &self.un(UnaryOp::Neg, x)?)?;
                        self.ew(BinaryOp::Sub, &a, &self.un(UnaryOp::Log, x)?)?
                    }
                    // exp(y) (y - x + 1), or (autograd through xlogy) log(y) (0 where y
                    // is 0) + y / y - x: NaN where y is 0, as PyTorch
                    K::KlDiv { log_target, .. } => {
                        if log_target {
                            let d =
                                self.ew_s(BinaryOp::Add, &self.ew(BinaryOp::Sub, y, x)?, 1.0)?;
                            self.ew(BinaryOp::Mul, &self.un(UnaryOp::Exp, y)?, &d)?
                        } else {
                            let zero = self.ew_s(BinaryOp::Mul, y, 0.0)?;
                            let log = self.select(
                                CompareOp::Eq,
                                y,
                                0.0,
                                &zero,
                                &self.un(UnaryOp::Log, y)?,
                            )?;
                            let one = self.ew(BinaryOp::Div, y, y)?;
                            let s = self.ew(BinaryOp::Add, &log, &one)?;
                            self.ew(BinaryOp::Sub, &s, x)?
                        }
                    }
                    _ => self.un(UnaryOp::Neg, &dx)?,
                };
                out.push(self.ew(BinaryOp::Mul, &gw, &dy)?);
            }
        }
        Ok(out)
    }
}
