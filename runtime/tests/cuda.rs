//! GPU tests (feature `cuda`). On a machine without a CUDA GPU each test prints why it skips
//! (`TRACEPASS_REQUIRE_GPU=1`, set by `cargo xtask gpu-check`, makes that a failure).
//! On a GPU: every kernel against the CPU backend on the same inputs (per-dtype tolerances),
//! block-level reductions and softmax over long rows, zero-size and broadcast GEMMs, bucket
//! packing, the seed model's 10 steps against the CPU run (no NCCL for one GPU), and with two
//! GPUs and NCCL, an all-reduce and the watchdog ending a collective a peer never joins.
#![cfg(feature = "cuda")]

use tracepass_ir::DType;
use tracepass_runtime::comm::Communicator;
use tracepass_runtime::comm::DistEnv;
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::cuda::{CudaBackend, NcclComm};
use tracepass_runtime::exec::{Backend, Input};
use tracepass_runtime::exec::{BinaryOp, Kernel, ReduceOp, Side, UnaryOp};
use tracepass_runtime::tensor::Tensor;
use tracepass_runtime::train::{train, TrainConfig};

fn required() -> bool {
    std::env::var("TRACEPASS_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

fn skip(why: &str) {
    assert!(!required(), "TRACEPASS_REQUIRE_GPU=1 but {why}");
    // straight to stderr: the test harness does not capture this, so the reason shows
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "skipping GPU test: {why}");
}

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            skip(&e.to_string());
            None
        }
    }
}

/// Two GPUs with NCCL, or why not (never required: gpu-check may run on one GPU).
fn two_gpus() -> Option<(CudaBackend, CudaBackend)> {
    let why = match (CudaBackend::new(0), CudaBackend::new(1)) {
        (Ok(a), Ok(b)) => match tracepass_runtime::cuda::nccl_available() {
            Ok(()) => return Some((a, b)),
            Err(e) => e.to_string(),
        },
        (Err(e), _) | (_, Err(e)) => e.to_string(),
    };
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "skipping 2-GPU test: {why}");
    None
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
    Tensor::from_f32(shape, v).to_dtype(dtype).unwrap()
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
        // the ops defined on every real number (log, sqrt and the inverse functions are not)
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
            UnaryOp::Exp2,
            UnaryOp::Atan,
            UnaryOp::Sinh,
            UnaryOp::Cosh,
            UnaryOp::Asinh,
            UnaryOp::Floor,
            UnaryOp::Ceil,
            UnaryOp::Round,
            UnaryOp::Trunc,
            UnaryOp::Erfc,
            UnaryOp::Relu6,
            UnaryOp::Hardswish,
            UnaryOp::Hardsigmoid,
            UnaryOp::Softplus,
            UnaryOp::Mish,
            UnaryOp::Logsigmoid,
            UnaryOp::Softsign,
            UnaryOp::Tanhshrink,
            UnaryOp::Selu,
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
            for op in [
                ReduceOp::Sum,
                ReduceOp::Mean,
                ReduceOp::Amax,
                ReduceOp::Amin,
                ReduceOp::Prod,
            ] {
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
    let mut views = Vec::new();
    g.unpack(&packed, &[0, 12], &[vec![3, 4], vec![5]], &mut views)
        .unwrap();
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
    let gpu = tracepass_runtime::cuda::train(&cfg, &env, &|_, _| {}).unwrap();
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

#[test]
fn block_reductions_and_softmax_over_long_rows() {
    let Some(g) = gpu() else { return };
    for d in [DType::F32, DType::BF16] {
        // a full reduction of 1M elements (one block), rows longer than a block, short rows
        let long = random(&[3, 100_000], 11, d);
        let full = random(&[1 << 20], 12, d);
        let short = random(&[50_000, 3], 13, d);
        for op in [
            ReduceOp::Sum,
            ReduceOp::Mean,
            ReduceOp::Amax,
            ReduceOp::Amin,
        ] {
            for (x, dims) in [
                (&long, vec![1]),
                (&full, vec![0]),
                (&short, vec![1]),
                (&long, vec![0]),
            ] {
                let k = Kernel::Reduce {
                    op,
                    dims: dims.clone(),
                    keepdim: false,
                    dtype: d,
                };
                let cpu_in = [Input::Tensor(x)];
                let want = CpuBackend.run(&k, &cpu_in).unwrap();
                let dev = g.upload(x).unwrap();
                let got = g
                    .download(&g.run(&k, &[Input::Tensor(&dev)]).unwrap())
                    .unwrap();
                // sums of many terms: compare against the sum of magnitudes
                let mag = CpuBackend
                    .run(
                        &Kernel::Reduce {
                            op: ReduceOp::Sum,
                            dims,
                            keepdim: false,
                            dtype: d,
                        },
                        &[Input::Tensor(
                            &CpuBackend
                                .run(&Kernel::Unary(UnaryOp::Abs), &cpu_in)
                                .unwrap(),
                        )],
                    )
                    .unwrap();
                let scale = mag.to_f64_vec().iter().fold(1.0f64, |m, v| m.max(*v));
                let err = got
                    .to_f64_vec()
                    .iter()
                    .zip(want.to_f64_vec())
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                let tol = if matches!(op, ReduceOp::Amax | ReduceOp::Amin) {
                    tol(d)
                } else {
                    tol(d) * scale
                };
                assert!(err <= tol, "{op:?} of {:?} in {d}: error {err}", x.shape());
            }
        }
        let rows = random(&[4, 3000], 14, d);
        for (dim, log) in [(1, false), (1, true), (0, false)] {
            check(
                &g,
                &Kernel::Softmax { dim, log },
                std::slice::from_ref(&rows),
                d,
                "long softmax",
            );
        }
    }
    // NaN propagates through amax and softmax as in torch
    let mut v = vec![0.5f32; 1000];
    v[777] = f32::NAN;
    let x = g.upload(&Tensor::from_f32(vec![1000], v)).unwrap();
    let k = Kernel::Reduce {
        op: ReduceOp::Amax,
        dims: vec![0],
        keepdim: false,
        dtype: DType::F32,
    };
    let got = g
        .download(&g.run(&k, &[Input::Tensor(&x)]).unwrap())
        .unwrap();
    assert!(got.to_f64_vec()[0].is_nan());
}

#[test]
fn zero_size_and_broadcast_gemms() {
    let Some(g) = gpu() else { return };
    let d = DType::F32;
    // k = 0: the product is zeros (plus the bias); no leading dimension of 0 reaches cuBLAS
    check(
        &g,
        &Kernel::Matmul,
        &[random(&[4, 0], 1, d), random(&[0, 3], 2, d)],
        d,
        "k = 0",
    );
    check(
        &g,
        &Kernel::Linear { bias: true },
        &[
            random(&[5, 0], 3, d),
            random(&[6, 0], 4, d),
            random(&[6], 5, d),
        ],
        d,
        "linear k = 0",
    );
    check(
        &g,
        &Kernel::Matmul,
        &[random(&[0, 4], 1, d), random(&[4, 3], 2, d)],
        d,
        "m = 0",
    );
    check(
        &g,
        &Kernel::Matmul,
        &[random(&[2, 0, 4], 1, d), random(&[4, 3], 2, d)],
        d,
        "empty batch",
    );
    // batch dimensions broadcast one by one
    check(
        &g,
        &Kernel::Matmul,
        &[random(&[2, 1, 4, 5], 6, d), random(&[3, 5, 6], 7, d)],
        d,
        "broadcast",
    );
    check(
        &g,
        &Kernel::Matmul,
        &[random(&[1, 4, 5], 6, d), random(&[3, 5, 6], 7, d)],
        d,
        "left repeat",
    );
    check(
        &g,
        &Kernel::Matmul,
        &[random(&[3, 4, 5], 6, d), random(&[5], 7, d)],
        d,
        "matrix-vector",
    );
    let bad = [random(&[6, 4, 5], 1, d), random(&[2, 3, 5, 6], 2, d)];
    let dev: Vec<_> = bad.iter().map(|t| g.upload(t).unwrap()).collect();
    let e = g
        .run(
            &Kernel::Matmul,
            &[Input::Tensor(&dev[0]), Input::Tensor(&dev[1])],
        )
        .unwrap_err();
    assert!(e.0.contains("broadcast"), "{}", e.0);
}

#[test]
fn one_gpu_trains_without_nccl_and_a_second_gpu_all_reduces() {
    let Some((a, b)) = two_gpus() else { return };
    let id = tracepass_runtime::cuda::unique_id().unwrap();
    let timeout = std::time::Duration::from_secs(60);
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = [(0usize, &a), (1, &b)]
            .into_iter()
            .map(|(r, g)| {
                let id = id.clone();
                s.spawn(move || {
                    let mut c = NcclComm::new(g, r, 2, &id, timeout).unwrap();
                    let t = g
                        .upload(&Tensor::from_f32(vec![3], vec![r as f32 + 1.0; 3]))
                        .unwrap();
                    let h = c
                        .all_reduce_async(t, tracepass_runtime::comm::ReduceOp::Sum, "b0")
                        .unwrap();
                    let (t, _) = c.wait(h).unwrap();
                    g.synchronize().unwrap();
                    let timings = c.take_timings().unwrap();
                    assert_eq!(timings.len(), 1);
                    assert!(timings[0].1.finished >= timings[0].1.started);
                    g.download(&t).unwrap().to_f32_vec()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![vec![3.0; 3], vec![3.0; 3]]);
}

#[test]
fn a_collective_a_peer_never_joins_ends_with_the_rank_and_label() {
    let Some((a, b)) = two_gpus() else { return };
    let id = tracepass_runtime::cuda::unique_id().unwrap();
    let timeout = std::time::Duration::from_secs(3);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let result = std::thread::scope(|s| {
        let id1 = id.clone();
        s.spawn(move || {
            // rank 1 joins, then stops taking part (as a crashed process would)
            let c = NcclComm::new(&b, 1, 2, &id1, timeout).unwrap();
            let _ = rx.recv();
            c.abort("test: rank 1 leaves");
        });
        let mut c = NcclComm::new(&a, 0, 2, &id, timeout).unwrap();
        let t = a.upload(&Tensor::from_f32(vec![4], vec![1.0; 4])).unwrap();
        let start = std::time::Instant::now();
        let h = c
            .all_reduce_async(t, tracepass_runtime::comm::ReduceOp::Sum, "bucket 7")
            .unwrap();
        let _ = c.wait(h);
        // the host is not blocked; the next call (or the barrier) reports the watchdog's failure
        let r = c.barrier();
        let _ = tx.send(());
        (r, start.elapsed())
    });
    let (r, took) = result;
    let e = r.expect_err("the collective cannot finish").to_string();
    assert!(e.contains("rank 0") && e.contains("bucket 7"), "{e}");
    assert!(
        took < std::time::Duration::from_secs(30),
        "ended after {took:?}"
    );
}

#[test]
fn more_than_2_pow_32_elements_are_all_written() {
    let Some(g) = gpu() else { return };
    // a broadcast add makes a 65537 x 65537 f32 output (2^32 + 2^17 + 1 elements, 17 GB)
    // from two small inputs; the old `n as u32` grid covered only the first 2^17 + 1 of them
    let n = 65_537usize;
    let need = n * n * 4 + (n * 8);
    let free = g.context().mem_get_info().map(|(f, _)| f).unwrap_or(0);
    if free < need + (need / 4) {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr().lock(),
            "skipping the 2^32-element test: {} GB free, {} GB needed",
            free >> 30,
            (need + need / 4) >> 30
        );
        return;
    }
    let col = g
        .upload(&Tensor::from_f32(vec![n, 1], vec![1.0; n]))
        .unwrap();
    let row = g
        .upload(&Tensor::from_f32(vec![1, n], vec![0.0; n]))
        .unwrap();
    let add = Kernel::Binary {
        op: BinaryOp::Add,
        a: Side::Input(0),
        b: Side::Input(1),
        alpha: 1.0,
    };
    let big = g
        .run(&add, &[Input::Tensor(&col), Input::Tensor(&row)])
        .unwrap();
    assert_eq!(big.numel(), n * n);
    let sum = Kernel::Reduce {
        op: ReduceOp::Sum,
        dims: vec![1],
        keepdim: false,
        dtype: DType::F32,
    };
    let rows = g
        .download(&g.run(&sum, &[Input::Tensor(&big)]).unwrap())
        .unwrap();
    let v = rows.to_f64_vec();
    assert_eq!(v.len(), n);
    let bad: Vec<usize> = (0..n).filter(|&i| v[i] != n as f64).take(5).collect();
    assert!(
        bad.is_empty(),
        "rows {bad:?} are not all ones (first: {})",
        v[bad[0]]
    );
}
