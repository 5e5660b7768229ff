//! A model of this CPU, measured: what the simulator needs to predict a thread-rank run.

use super::device::DeviceModel;
use crate::cpu::{self, CpuBackend};
use crate::exec::backend::{Backend, Input};
use crate::exec::kernel::{BinaryOp, Kernel, Side};
use crate::tensor::Tensor;
use std::time::Instant;

/// Mean seconds per call of `f(i)` over `calls` calls after a warm-up round.
fn mean_time(calls: usize, mut f: impl FnMut(usize)) -> f64 {
    for i in 0..calls.min(4) {
        f(i);
    }
    let t = Instant::now();
    for i in 0..calls {
        f(i);
    }
    t.elapsed().as_secs_f64() / calls as f64
}

/// (GEMM FLOP/s, bytes/s, seconds per op) measured on the calling thread. Operands rotate
/// through 48 MiB of distinct matrices, so they come from memory, not cache, as a training
/// step's weights and gradients do.
fn measure() -> (f64, f64, f64) {
    const SETS: usize = 12;
    let mut rates = Vec::new();
    for (m, k, n) in [
        (8usize, 1024usize, 1024usize),
        (1024, 8, 1024),
        (256, 256, 256),
    ] {
        let a: Vec<Tensor> = (0..SETS)
            .map(|i| Tensor::from_f32(vec![m, k], vec![0.5 + i as f32; m * k]))
            .collect();
        let b: Vec<Tensor> = (0..SETS)
            .map(|i| Tensor::from_f32(vec![k, n], vec![0.25 + i as f32; k * n]))
            .collect();
        let t = mean_time(2 * SETS, |i| {
            std::hint::black_box(cpu::matmul(&a[i % SETS], &b[i % SETS]).ok());
        });
        rates.push(2.0 * (m * k * n) as f64 / t);
    }
    rates.sort_by(f64::total_cmp);
    let add = Kernel::Binary {
        op: BinaryOp::Add,
        a: Side::Input(0),
        b: Side::Input(1),
        alpha: 1.0,
    };
    let n = 1 << 20;
    let xs: Vec<Tensor> = (0..SETS)
        .map(|i| Tensor::from_f32(vec![n], vec![i as f32; n]))
        .collect();
    let t = mean_time(2 * SETS, |i| {
        let x = &xs[i % SETS];
        std::hint::black_box(
            CpuBackend
                .run(&add, &[Input::Tensor(x), Input::Tensor(x)])
                .ok(),
        );
    });
    let small = Tensor::from_f32(vec![8], vec![1.0; 8]);
    let overhead = mean_time(2000, |_| {
        std::hint::black_box(
            CpuBackend
                .run(&add, &[Input::Tensor(&small), Input::Tensor(&small)])
                .ok(),
        );
    });
    (rates[1], 3.0 * 4.0 * n as f64 / t, overhead)
}

/// Measures GEMM FLOP/s (median of a square and two batch-8 shapes), streaming bandwidth (a
/// 4M-element add) and per-op overhead (an 8-element add) on `ranks` threads at once, so the
/// figures include what the ranks share: cores and memory bandwidth.
pub fn cpu_model(ranks: usize) -> DeviceModel {
    let ranks = ranks.max(1);
    let start = std::sync::Barrier::new(ranks);
    let per_thread: Vec<(f64, f64, f64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..ranks)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    measure()
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let n = per_thread.len().max(1) as f64;
    let gemm = per_thread.iter().map(|m| m.0).sum::<f64>() / n;
    let bw = per_thread.iter().map(|m| m.1).sum::<f64>() / n;
    let overhead = per_thread.iter().map(|m| m.2).sum::<f64>() / n;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    DeviceModel {
        name: format!(
            "cpu (measured per rank with {ranks} ranks on {cores} cores: {:.1} GFLOP/s GEMM, {:.1} GB/s, {:.2} us/op)",
            gemm / 1e9,
            bw / 1e9,
            overhead * 1e6
        ),
        f32_flops: gemm,
        half_flops: gemm,
        mem_bw: bw,
        op_overhead_s: overhead,
        gemm_efficiency: 1.0,
        bw_efficiency: 1.0,
        sharing: 1.0,
    }
}
