//! `cargo xtask bench gemm`: single-precision GEMM FLOP/s of `matrixmultiply` and the `gemm`
//! crate (the one faer and candle use) on the shapes the mid-size models produce, one thread,
//! with the operand layouts the runtime passes (a linear layer's weight is read transposed, in
//! place). PyTorch's `torch.mm` on the same shapes and layouts is timed too when the pinned venv
//! is there (`TRACEPASS_PYTHON`, default `python3`).

use anyhow::Result;
use std::time::Instant;
use tracepass_runtime::Tensor;

/// One product: `[m, k] @ [k, n]`, `b_t`: B is the transpose of a row-major `[n, k]` (a linear
/// layer's weight), `a_t`: A is the transpose of a row-major `[k, m]` (a weight gradient).
struct Shape {
    what: &'static str,
    m: usize,
    k: usize,
    n: usize,
    a_t: bool,
    b_t: bool,
}

const fn sh(what: &'static str, m: usize, k: usize, n: usize, a_t: bool, b_t: bool) -> Shape {
    Shape {
        what,
        m,
        k,
        n,
        a_t,
        b_t,
    }
}

/// nanoGPT-mid (batch 4 x block 128 = 512 rows, n_embd 384, 6 heads of 64, vocab 512).
const SHAPES: &[Shape] = &[
    sh("qkv fwd", 512, 384, 1152, false, true),
    sh("fc fwd", 512, 384, 1536, false, true),
    sh("proj fwd", 512, 1536, 384, false, true),
    sh("lm_head fwd", 512, 384, 512, false, true),
    sh("qkv dX", 512, 1152, 384, false, false),
    sh("fc dW", 1536, 512, 384, true, false),
    sh("attn q@kT", 128, 64, 128, false, true),
    sh("attn p@v", 128, 128, 64, false, false),
    // ResNet-18-64's weight gradients as Thunder writes them (a convolution unfolded by
    // windows: the unfolded matrix is read transposed)
    sh("conv dW 64", 64, 2048, 513, false, true),
    sh("conv dW 128", 128, 512, 513, false, true),
];

fn strides(rows: usize, cols: usize, transposed: bool) -> (isize, isize) {
    if transposed {
        (1, rows as isize)
    } else {
        (cols as isize, 1)
    }
}

/// This thread's CPU seconds: on a shared machine a descheduled thread's wait does not count.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec that we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Best seconds of `reps` calls, after one warm-up: this thread's CPU time for one thread
/// (robust to other jobs on the machine), wall time for more.
fn best(reps: usize, cpu_time: bool, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            if cpu_time {
                let t = thread_cpu_s();
                f();
                thread_cpu_s() - t
            } else {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            }
        })
        .fold(f64::INFINITY, f64::min)
}

fn fill(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * seed).sin()).collect()
}

/// `C = A @ B` with `matrixmultiply`.
fn mm_matrixmultiply(s: &Shape, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (rsa, csa) = strides(s.m, s.k, s.a_t);
    let (rsb, csb) = strides(s.k, s.n, s.b_t);
    // SAFETY: a, b, c hold m*k, k*n and m*n elements, addressed by these strides.
    unsafe {
        matrixmultiply::sgemm(
            s.m,
            s.k,
            s.n,
            1.0,
            a.as_ptr(),
            rsa,
            csa,
            b.as_ptr(),
            rsb,
            csb,
            0.0,
            c.as_mut_ptr(),
            s.n as isize,
            1,
        )
    }
}

/// `C = A @ B` with the `gemm` crate.
fn mm_gemm(s: &Shape, a: &[f32], b: &[f32], c: &mut [f32], par: gemm::Parallelism) {
    let (rsa, csa) = strides(s.m, s.k, s.a_t);
    let (rsb, csb) = strides(s.k, s.n, s.b_t);
    // SAFETY: as above.
    unsafe {
        gemm::gemm(
            s.m,
            s.n,
            s.k,
            c.as_mut_ptr(),
            1,
            s.n as isize,
            false,
            a.as_ptr(),
            csa,
            rsa,
            b.as_ptr(),
            csb,
            rsb,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// The runtime's own product (`matmul` on strided tensors), which picks the orientation the
/// `gemm` crate runs fastest in; its result tensor is dropped each time.
fn mm_runtime(a: &Tensor, b: &Tensor) {
    let c = tracepass_runtime::cpu::kernels::matmul(a, b);
    std::hint::black_box(c.is_ok());
}

/// `v` as a `[rows, cols]` tensor, or as the transpose of a row-major `[cols, rows]` one.
fn tensor(v: &[f32], rows: usize, cols: usize, transposed: bool) -> Result<Tensor> {
    Ok(if transposed {
        Tensor::from_f32(vec![cols, rows], v.to_vec())
            .permute(&[1, 0])
            .map_err(anyhow::Error::msg)?
    } else {
        Tensor::from_f32(vec![rows, cols], v.to_vec())
    })
}

/// PyTorch's GFLOP/s per shape, in SHAPES order, or `None` without the venv.
fn torch_gflops(threads: usize) -> Option<Vec<f64>> {
    let python = std::env::var("TRACEPASS_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let shapes: Vec<String> = SHAPES
        .iter()
        .map(|s| {
            format!(
                "({},{},{},{},{})",
                s.m,
                s.k,
                s.n,
                if s.a_t { "True" } else { "False" },
                if s.b_t { "True" } else { "False" }
            )
        })
        .collect();
    let script = format!(
        r#"
import time, torch
torch.set_num_threads({threads})
for m, k, n, at, bt in [{}]:
    a = torch.randn(k, m).t() if at else torch.randn(m, k)
    b = torch.randn(n, k).t() if bt else torch.randn(k, n)
    c = torch.empty(m, n)
    torch.mm(a, b, out=c)
    clock = time.thread_time if {threads} == 1 else time.perf_counter
    best = 1e9
    for _ in range(30):
        t = clock(); torch.mm(a, b, out=c); best = min(best, clock() - t)
    print(2 * m * k * n / best / 1e9)
"#,
        shapes.join(",")
    );
    let out = std::process::Command::new(python)
        .args(["-c", &script])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().parse().ok())
        .collect()
}

pub fn bench_gemm() -> Result<()> {
    const REPS: usize = 30;
    println!("gemm benchmark: f32 C = A @ B, best of {REPS} after a warm-up, GFLOP/s (1 thread: thread CPU time, 2 threads: wall time); B^T / A^T: read transposed in place; gemm: the crate into a row-major C; runtime: the runtime's matmul, which may compute C column-major and transpose it; rt/pt: runtime / torch");
    for threads in [1usize, 2] {
        let torch = torch_gflops(threads);
        println!("{threads} thread(s):");
        println!(
            "{:<12} {:>16} {:>14} {:>8} {:>8} {:>8} {:>8}",
            "shape", "m x k x n", "matrixmultiply", "gemm", "runtime", "torch", "rt/pt"
        );
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()?;
        let par = if threads == 1 {
            gemm::Parallelism::None
        } else {
            gemm::Parallelism::Rayon(threads)
        };
        for (i, s) in SHAPES.iter().enumerate() {
            let a = fill(s.m * s.k, 0.37);
            let b = fill(s.k * s.n, 0.11);
            let mut c = vec![0f32; s.m * s.n];
            let flop = 2.0 * (s.m * s.k * s.n) as f64;
            let mm = if threads == 1 {
                format!(
                    "{:.1}",
                    flop / best(REPS, threads == 1, || mm_matrixmultiply(s, &a, &b, &mut c)) / 1e9
                )
            } else {
                "-".to_string()
            };
            let g = flop / best(REPS, threads == 1, || mm_gemm(s, &a, &b, &mut c, par)) / 1e9;
            // in a pool of `threads`, as a rank with `--threads-per-rank` runs it
            let (ta, tb) = (tensor(&a, s.m, s.k, s.a_t)?, tensor(&b, s.k, s.n, s.b_t)?);
            let rt =
                pool.install(|| flop / best(REPS, threads == 1, || mm_runtime(&ta, &tb)) / 1e9);
            let (pt, ratio) = match torch.as_ref().and_then(|t| t.get(i)) {
                Some(t) => (format!("{t:.1}"), format!("{:.0}%", 100.0 * rt / t)),
                None => ("-".into(), "-".into()),
            };
            let dims = format!(
                "{}{} x {} x {}{}",
                s.m,
                if s.a_t { "^T" } else { "" },
                s.k,
                s.n,
                if s.b_t { "^T" } else { "" }
            );
            println!(
                "{:<12} {:>16} {:>14} {:>8.1} {:>8.1} {:>8} {:>8}",
                s.what, dims, mm, g, rt, pt, ratio
            );
        }
    }
    Ok(())
}
