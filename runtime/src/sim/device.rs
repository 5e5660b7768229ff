//! Device and network models for the step-time simulator. Every constant says where it is from.

use crate::comm::LinkModel;
use tracepass_ir::DType;

/// What an accelerator (or this CPU) can do per second.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceModel {
    pub name: String,
    /// Peak dense FLOP/s for f32 GEMMs (CUDA cores: PyTorch leaves TF32 off for matmuls by default).
    pub f32_flops: f64,
    /// Peak dense FLOP/s for bf16/f16 GEMMs (tensor cores).
    pub half_flops: f64,
    /// Memory bandwidth, bytes/s.
    pub mem_bw: f64,
    /// Fixed cost per kernel (launch latency on a GPU, dispatch overhead on the CPU), seconds.
    pub op_overhead_s: f64,
    /// Fraction of peak FLOP/s a GEMM reaches.
    pub gemm_efficiency: f64,
    /// Fraction of peak bandwidth a memory-bound kernel reaches.
    pub bw_efficiency: f64,
    /// Ranks sharing one compute unit (CPU threads oversubscribing cores): compute slows by this.
    pub sharing: f64,
}

/// Assumed achieved fractions of peak on GPUs: large GEMMs reach about 70% of the dense peak and
/// streaming kernels about 80% of HBM bandwidth in published cuBLAS / STREAM-like measurements;
/// a CUDA kernel launch costs about 4 us of host time.
const GPU_GEMM_EFFICIENCY: f64 = 0.7;
const GPU_BW_EFFICIENCY: f64 = 0.8;
const GPU_LAUNCH_S: f64 = 4e-6;

impl DeviceModel {
    fn gpu(name: &str, f32_tflops: f64, half_tflops: f64, tb_per_s: f64) -> DeviceModel {
        DeviceModel {
            name: name.to_string(),
            f32_flops: f32_tflops * 1e12,
            half_flops: half_tflops * 1e12,
            mem_bw: tb_per_s * 1e12,
            op_overhead_s: GPU_LAUNCH_S,
            gemm_efficiency: GPU_GEMM_EFFICIENCY,
            bw_efficiency: GPU_BW_EFFICIENCY,
            sharing: 1.0,
        }
    }

    /// Datasheet figures (dense, no sparsity):
    /// - h100: NVIDIA H100 SXM5 datasheet: FP32 67 TFLOP/s, BF16 989 TFLOP/s, HBM3 3.35 TB/s.
    /// - h200: NVIDIA H200 SXM datasheet: same compute as H100 SXM, HBM3e 4.8 TB/s.
    /// - a100: NVIDIA A100 SXM4 80GB datasheet: FP32 19.5 TFLOP/s, BF16 312 TFLOP/s, 2.039 TB/s.
    /// - l40s: NVIDIA L40S datasheet: FP32 91.6 TFLOP/s, BF16 362 TFLOP/s, GDDR6 864 GB/s.
    pub fn named(name: &str) -> Option<DeviceModel> {
        Some(match name {
            "h100" => Self::gpu("h100", 67.0, 989.0, 3.35),
            "h200" => Self::gpu("h200", 67.0, 989.0, 4.8),
            "a100" => Self::gpu("a100", 19.5, 312.0, 2.039),
            "l40s" => Self::gpu("l40s", 91.6, 362.0, 0.864),
            _ => return None,
        })
    }

    pub const NAMES: &'static [&'static str] = &["h100", "h200", "a100", "l40s", "cpu"];

    /// Peak FLOP/s for GEMMs in `dtype`.
    pub fn flops_for(&self, dtype: DType) -> f64 {
        match dtype {
            DType::BF16 | DType::F16 => self.half_flops,
            DType::F64 => self.f32_flops / 2.0,
            _ => self.f32_flops,
        }
    }
}

/// A named interconnect: NCCL all-reduce bus bandwidth (what `nccl-tests` reports as busbw at
/// large sizes) and per-hop latency. Typical busbw at large messages, as published for
/// nccl-tests runs (e.g. NVIDIA's nccl-tests; "NCCL-tests in practice", docs.alayanew.com 2026):
/// - nvlink: 8 x H100 SXM5, NVLink 4 + NVSwitch: 460-480 GB/s (450 GB/s per direction per GPU). 450.
/// - nvlink3: 8 x A100 SXM4, NVLink 3: 230-250 GB/s. 230.
/// - pcie5: H100 PCIe without NVSwitch: 35-45 GB/s. 40.
/// - ib-400g: NDR InfiniBand, one 400 Gb/s NIC per GPU (50 GB/s line rate): about 45 GB/s.
/// - ib-200g: HDR InfiniBand, 200 Gb/s per GPU (25 GB/s line rate): about 22 GB/s.
/// - eth-100g: 100 Gb/s RoCE/Ethernet (12.5 GB/s line rate): about 10 GB/s.
///
/// Latency per ring hop: about 2 us inside an NVLink domain, 5 us over InfiniBand, 10 us over
/// Ethernet (NCCL's small-message all-reduce times divided by the 2(n-1) ring steps).
pub fn named_link(name: &str) -> Option<LinkModel> {
    let (latency_us, gbytes) = match name {
        "nvlink" | "nvlink4" => (2.0, 450.0),
        "nvlink3" => (2.0, 230.0),
        "pcie5" => (3.0, 40.0),
        "ib-400g" => (5.0, 45.0),
        "ib-200g" => (5.0, 22.0),
        "eth-100g" => (10.0, 10.0),
        _ => return None,
    };
    Some(LinkModel {
        latency_us,
        bandwidth_gbps: gbytes * 8.0,
    })
}

pub const LINK_NAMES: &[&str] = &[
    "nvlink", "nvlink3", "pcie5", "ib-400g", "ib-200g", "eth-100g",
];

/// A link by name, or `LATENCY_US,BANDWIDTH_GBPS`.
pub fn parse_link(s: &str) -> Result<LinkModel, String> {
    named_link(s).map_or_else(
        || LinkModel::parse(s).map_err(|e| format!("{e} (or one of: {})", LINK_NAMES.join(", "))),
        Ok,
    )
}
