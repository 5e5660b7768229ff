//! GPU tests (feature `cuda`). On a machine without a CUDA GPU each test prints why it skips.
//! On a GPU: every kernel against the CPU backend on the same inputs (per-dtype tolerances),
//! bucket packing, and the seed model's 10 steps against the CPU run.
#![cfg(feature = "cuda")]

use tracepass_ir::DType;
use tracepass_runtime::backend::{Backend, Input};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::cuda::CudaBackend;
use tracepass_runtime::kernel::{BinaryOp, Kernel, ReduceOp, Side, UnaryOp};
use tracepass_runtime::rendezvous::DistEnv;
use tracepass_runtime::tensor::Tensor;
use tracepass_runtime::trainer::{train, TrainConfig};

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            // straight to stderr: the test harness does not capture this, so the reason shows
            use std::io::Write;
            let _ = writeln!(std::io::stderr().lock(), "skipping GPU test: {e}");
            None
        }
    }
}

fn tol(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-4,
        DType::F16 => 4e-3,
        _ => 3e-2,
    }
}

fn random(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_f32(shape.to_vec(), v).to_dtype(dtype).unwrap()
}

fn close(got: &Tensor, want: &Tensor, d: DType, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w.iter().fold(1e-6f64, |m, x| m.max(x.abs()));
    let err = g
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs() / scale)
        .fold(0.0, f64::max);
    assert!(err <= tol(d), "{what} in {d}: relative error {err}");
}

fn check(gpu: &CudaBackend, k: &Kernel, inputs: &[Tensor], d: DType, what: &str) {
    let cpu_in: Vec<Input<'_, Tensor>> = inputs.iter().map(Input::Tensor).collect();
    let want = CpuBackend.run(k, &cpu_in).unwrap();
    let dev: Vec<_> = inputs.iter().map(|t| gpu.upload(t).unwrap()).collect();
    let dev_in: Vec<Input<'_, _>> = dev.iter().map(Input::Tensor).collect();
    let got = gpu.download(&gpu.run(k, &dev_in).unwrap()).unwrap();
    close(&got, &want, d, what);
}

#[test]
fn every_kernel_matches_the_cpu_backend() {
    let Some(g) = gpu() else { return };
    for d in [DType::F32, DType::BF16, DType::F16] {
        let a = random(&[4, 8, 16], 1, d);
        let b = random(&[4, 8, 16], 2, d);
        let row = random(&[16], 3, d);
        for op in [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Exp,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Relu,
            UnaryOp::Sin,
            UnaryOp::Cos,
            UnaryOp::Sign,
            UnaryOp::Erf,
            UnaryOp::Gelu,
            UnaryOp::GeluTanh,
        ] {
            check(
                &g,
                &Kernel::Unary(op),
                std::slice::from_ref(&a),
                d,
                &format!("{op:?}"),
            );
        }
        let pos = CpuBackend
            .run(&Kernel::Unary(UnaryOp::Abs), &[Input::Tensor(&a)])
            .unwrap();
        for op in [UnaryOp::Sqrt, UnaryOp::Log, UnaryOp::Rsqrt] {
            check(
                &g,
                &Kernel::Unary(op),
                std::slice::from_ref(&pos),
                d,
                &format!("{op:?}"),
            );
        }
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Maximum,
            BinaryOp::Minimum,
            BinaryOp::Atan2,
        ] {
            let k = Kernel::Binary {
                op,
                a: Side::Input(0),
                b: Side::Input(1),
                alpha: 1.0,
            };
            check(&g, &k, &[a.clone(), b.clone()], d, &format!("{op:?}"));
            check(
                &g,
                &k,
                &[a.clone(), row.clone()],
                d,
                &format!("{op:?} broadcast"),
            );
            let ks = Kernel::Binary {
                op,
                a: Side::Scalar(0.5),
                b: Side::Input(0),
                alpha: 2.0,
            };
            check(
                &g,
                &ks,
                std::slice::from_ref(&a),
                d,
                &format!("{op:?} scalar"),
            );
        }
        let pow = Kernel::Binary {
            op: BinaryOp::Pow,
            a: Side::Input(0),
            b: Side::Scalar(3.0),
            alpha: 1.0,
        };
        check(&g, &pow, std::slice::from_ref(&a), d, "pow 3");
        check(
            &g,
            &Kernel::Permute(vec![2, 0, 1]),
            std::slice::from_ref(&a),
            d,
            "permute",
        );
        check(
            &g,
            &Kernel::Reshape(vec![32, 16]),
            std::slice::from_ref(&a),
            d,
            "reshape",
        );
        for (dims, keep) in [
            (vec![0], false),
            (vec![2], true),
            (vec![0, 1], false),
            (vec![1], false),
        ] {
            for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Amax] {
                let k = Kernel::Reduce {
                    op,
                    dims: dims.clone(),
                    keepdim: keep,
                    dtype: d,
                };
                check(
                    &g,
                    &k,
                    std::slice::from_ref(&a),
                    d,
                    &format!("{op:?} over {dims:?}"),
                );
            }
        }
        for log in [false, true] {
            for dim in [0, 2] {
                check(
                    &g,
                    &Kernel::Softmax { dim, log },
                    std::slice::from_ref(&a),
                    d,
                    &format!("softmax log={log} dim={dim}"),
                );
            }
        }
        let x = random(&[8, 32], 4, d);
        let w = random(&[24, 32], 5, d);
        let bias = random(&[24], 6, d);
        let m = random(&[32, 24], 7, d);
        check(&g, &Kernel::Matmul, &[x.clone(), m.clone()], d, "matmul");
        check(
            &g,
            &Kernel::Matmul,
            &[a.clone(), random(&[16, 5], 8, d)],
            d,
            "batched matmul",
        );
        check(
            &g,
            &Kernel::Matmul,
            &[random(&[4, 3, 7], 9, d), random(&[4, 7, 2], 10, d)],
            d,
            "batch x batch",
        );
        check(
            &g,
            &Kernel::Linear { bias: true },
            &[x.clone(), w.clone(), bias],
            d,
            "linear",
        );
        check(
            &g,
            &Kernel::Linear { bias: false },
            &[x.clone(), w],
            d,
            "linear without bias",
        );
        for to in [DType::F32, DType::BF16, DType::F16] {
            check(
                &g,
                &Kernel::Convert(to),
                std::slice::from_ref(&a),
                to.max_tol(d),
                &format!("convert {d} -> {to}"),
            );
        }
    }
}

trait Tol {
    fn max_tol(self, other: DType) -> DType;
}
impl Tol for DType {
    /// The looser of two dtypes' tolerances.
    fn max_tol(self, other: DType) -> DType {
        if tol(self) >= tol(other) {
            self
        } else {
            other
        }
    }
}

#[test]
fn buckets_pack_and_unpack() {
    let Some(g) = gpu() else { return };
    let parts = [random(&[3, 4], 1, DType::F32), random(&[5], 2, DType::F32)];
    let dev: Vec<_> = parts.iter().map(|t| g.upload(t).unwrap()).collect();
    let refs: Vec<_> = dev.iter().collect();
    let packed = g.pack(&refs).unwrap();
    let views = g.unpack(&packed, &[0, 12], &[vec![3, 4], vec![5]]).unwrap();
    for (v, p) in views.iter().zip(&parts) {
        assert!(g.download(v).unwrap().bitwise_eq(p));
    }
}

#[test]
fn seed_model_trains_like_the_cpu() {
    let Some(_) = gpu() else { return };
    let cfg = TrainConfig {
        world_size: 1,
        ..TrainConfig::default()
    };
    let cpu = train(&cfg, &|_, _| {}).unwrap();
    let env = DistEnv::from_lookup(|_| None).unwrap();
    let gpu = tracepass_runtime::cuda::train::train(&cfg, &env, &|_, _| {}).unwrap();
    assert_eq!(gpu.losses.len(), 10);
    for (i, (a, b)) in gpu.losses.iter().zip(&cpu.losses).enumerate() {
        assert!(
            (a - b).abs() < 1e-4 * b.abs().max(1.0),
            "step {i}: gpu {a} vs cpu {b}"
        );
    }
}

#[test]
fn without_a_gpu_the_error_is_clear() {
    if let Err(e) = CudaBackend::new(0) {
        let m = e.to_string();
        assert!(
            m.contains("CUDA") || m.contains("cuBLAS") || m.contains("NVRTC"),
            "{m}"
        );
    }
    // an index past the last GPU is named
    if let Err(e) = CudaBackend::new(999) {
        assert!(!e.to_string().is_empty());
    }
}
