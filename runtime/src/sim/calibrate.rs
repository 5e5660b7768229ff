//! A model of this CPU, measured: what the simulator needs to predict a thread-rank run.

use super::device::DeviceModel;
use crate::backend::{Backend, Input};
use crate::cpu::{self, CpuBackend};
use crate::kernel::{BinaryOp, Kernel, Side};
use crate::tensor::Tensor;
use std::time::Instant;

fn best_of<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// Measures single-thread GEMM FLOP/s (median over a square and two batch-8 shapes), streaming
/// bandwidth (a 4M-element add) and per-op overhead (an 8-element add). `ranks` threads sharing
/// `cores` cores slow compute by `ranks / cores`.
pub fn cpu_model(ranks: usize) -> DeviceModel {
    let mut rates = Vec::new();
    for (m, k, n) in [(8usize, 1024usize, 1024usize), (1024, 8, 1024), (256, 256, 256)] {
        let a = Tensor::from_f32(vec![m, k], vec![0.5; m * k]);
        let b = Tensor::from_f32(vec![k, n], vec![0.25; k * n]);
        let t = best_of(5, || {
            std::hint::black_box(cpu::matmul(&a, &b).ok());
        });
        rates.push(2.0 * (m * k * n) as f64 / t);
    }
    rates.sort_by(f64::total_cmp);
    let gemm = rates[1];
    let add = Kernel::Binary {
        op: BinaryOp::Add,
        a: Side::Input(0),
        b: Side::Input(1),
        alpha: 1.0,
    };
    let n = 1 << 22;
    let x = Tensor::from_f32(vec![n], vec![1.0; n]);
    let t = best_of(5, || {
        std::hint::black_box(CpuBackend.run(&add, &[Input::Tensor(&x), Input::Tensor(&x)]).ok());
    });
    let bw = 3.0 * 4.0 * n as f64 / t;
    let small = Tensor::from_f32(vec![8], vec![1.0; 8]);
    let overhead = best_of(2000, || {
        std::hint::black_box(CpuBackend.run(&add, &[Input::Tensor(&small), Input::Tensor(&small)]).ok());
    });
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    DeviceModel {
        name: format!("cpu (measured: {:.1} GFLOP/s GEMM, {:.1} GB/s, {:.2} us/op, {cores} cores)", gemm / 1e9, bw / 1e9, overhead * 1e6),
        f32_flops: gemm,
        half_flops: gemm,
        mem_bw: bw,
        op_overhead_s: overhead,
        gemm_efficiency: 1.0,
        bw_efficiency: 1.0,
        sharing: (ranks as f64 / cores as f64).max(1.0),
    }
}
