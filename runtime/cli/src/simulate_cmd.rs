//! `tracepass simulate`: predicted step time, overlap and exposed communication of a backward
//! on a modelled device and network, and the best bucket size (`--sweep-bucket-mb`).

use crate::input::{load_input, out};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use tracepass_ir::{OpRegistry, Program};
use tracepass_passes::{parse_pipeline, DdpOptions, PassManager, PassRegistry, PassSpec};
use tracepass_runtime::sim::{
    cpu_model, parse_link, predicted_memory, simulate, DeviceModel, SimOptions, SimReport,
};

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// Backward trace (or program file) to simulate.
    pub input: PathBuf,
    /// The forward a lone backward belongs to.
    #[arg(long)]
    pub forward: Option<PathBuf>,
    /// Rewrite before simulating, e.g. `ddp(world_size=8,bucket_mb=25),sort-waits`.
    #[arg(long)]
    pub passes: Option<String>,
    /// Ranks to model (must match any ddp(world_size=...) in --passes).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::numbers::count_from_1)]
    pub world_size: usize,
    /// Device: h100, h200, a100, l40s, or cpu (measured on this machine).
    #[arg(long, default_value = "h100")]
    pub gpu: String,
    /// Interconnect: nvlink, nvlink3, pcie5, ib-400g, ib-200g, eth-100g, or LATENCY_US,BANDWIDTH_GBPS.
    #[arg(long, default_value = "nvlink", allow_hyphen_values = true)]
    pub link: String,
    /// Simulate `ddp(world_size=N,bucket_mb=B),sort-waits` for a range of B and report the best.
    #[arg(long)]
    pub sweep_bucket_mb: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

fn rewrite(p: &Program, pipeline: &[PassSpec]) -> Result<Program> {
    let mut q = p.clone();
    PassManager::from_specs(PassRegistry::builtin(), pipeline)?
        .run(&mut q, OpRegistry::builtin())?;
    Ok(q)
}

fn options(args: &SimulateArgs) -> Result<SimOptions> {
    if args.world_size == 0 {
        bail!("--world-size must be at least 1");
    }
    let device = match args.gpu.as_str() {
        "cpu" => cpu_model(args.world_size),
        g => DeviceModel::named(g).with_context(|| {
            format!(
                "--gpu {g}: unknown device (valid: {})",
                DeviceModel::NAMES.join(", ")
            )
        })?,
    };
    let link = parse_link(&args.link)
        .map_err(anyhow::Error::msg)
        .context("--link")?;
    Ok(SimOptions {
        world_size: args.world_size,
        host_reduction: args.gpu == "cpu",
        device,
        link,
    })
}

/// Bytes as MiB.
fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// Milliseconds, with a negative zero (or a rounding residue below zero) shown as 0.
fn ms(s: f64) -> f64 {
    (s * 1e3).max(0.0)
}

fn summary(r: &SimReport) -> String {
    if r.buckets.is_empty() {
        return format!(
            "step {:.3} ms | compute {:.3} ms | no communication | {} ops, 0 all-reduces",
            ms(r.step_s),
            ms(r.compute_s),
            r.ops
        );
    }
    format!(
        "step {:.3} ms | compute {:.3} ms | comm {:.3} ms | overlap {:.3} ms ({:.1}%) | exposed comm {:.3} ms | {} ops, {} all-reduces",
        ms(r.step_s),
        ms(r.compute_s),
        ms(r.comm_s),
        ms(r.overlap_s),
        r.overlap_pct,
        ms(r.exposed_comm_s),
        r.ops,
        r.buckets.len()
    )
}

/// Bucket sizes the sweep tries (MiB; 0 = one all-reduce per gradient).
pub const SWEEP_MB: &[f64] = &[0.0, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0];

pub fn run(args: SimulateArgs) -> Result<()> {
    let opts = options(&args)?;
    let passes = args
        .passes
        .as_deref()
        .map(parse_pipeline)
        .transpose()
        .context("--passes")?;
    if let Some(pl) = &passes {
        if args.sweep_bucket_mb {
            bail!("--passes and --sweep-bucket-mb: the sweep makes its own pipelines (ddp(world_size=N,bucket_mb=B),sort-waits); give one or the other");
        }
        tracepass_runtime::train::check_pipeline(pl, args.world_size)?;
    }
    let (program, _) = load_input(&args.input, args.forward.as_deref(), None)?;
    let mut text = format!(
        "device: {}\nlink: {} us/hop, {} Gb/s bus bandwidth; world size {}\n",
        opts.device.name, opts.link.latency_us, opts.link.bandwidth_gbps, opts.world_size
    );
    if args.sweep_bucket_mb {
        let strip = tracepass_passes::synchronizes(&program.backward);
        let mut rows = Vec::new();
        for &mb in SWEEP_MB {
            let mut pipeline: Vec<PassSpec> = strip
                .then(|| PassSpec::new("no-sync"))
                .into_iter()
                .collect();
            pipeline.push(
                DdpOptions {
                    world_size: opts.world_size,
                    bucket_mb: mb,
                    ..DdpOptions::default()
                }
                .spec(),
            );
            pipeline.push(PassSpec::new("sort-waits"));
            let p = rewrite(&program, &pipeline)?;
            let r = simulate(&p.backward, &opts)?;
            rows.push((mb, r));
        }
        if args.json {
            let v: Vec<_> = rows
                .iter()
                .map(|(mb, r)| serde_json::json!({"bucket_mb": mb, "report": r}))
                .collect();
            return out(&(serde_json::to_string_pretty(&v)? + "\n"));
        }
        text += "| bucket_mb | all-reduces | step ms | compute ms | comm ms | overlap % | exposed ms |\n|---|---|---|---|---|---|---|\n";
        for (mb, r) in &rows {
            text += &format!(
                "| {mb} | {} | {:.3} | {:.3} | {:.3} | {:.1} | {:.3} |\n",
                r.buckets.len(),
                r.step_s * 1e3,
                r.compute_s * 1e3,
                r.comm_s * 1e3,
                r.overlap_pct,
                r.exposed_comm_s * 1e3
            );
        }
        let best = rows
            .iter()
            .min_by(|a, b| a.1.step_s.total_cmp(&b.1.step_s))
            .context("no bucket size simulated")?;
        text += &format!(
            "best bucket_mb: {} ({:.3} ms per step)\n",
            best.0,
            best.1.step_s * 1e3
        );
        return out(&text);
    }
    let p = match &passes {
        Some(pl) => rewrite(&program, pl)?,
        None => program,
    };
    let mut r = simulate(&p.backward, &opts)?;
    let memory = predicted_memory(&p);
    r.memory = memory.as_ref().ok().cloned();
    if args.json {
        return out(&(serde_json::to_string_pretty(&r)? + "\n"));
    }
    if r.buckets.is_empty() {
        text += "note: the backward has no all-reduce; give --passes 'ddp(world_size=N),sort-waits' to simulate DDP\n";
    }
    text += &summary(&r);
    text.push('\n');
    text += &match &memory {
        Ok(m) => format!(
            "memory per rank: peak {:.2} MiB = inputs {:.2} + max(forward arena {:.2} + results {:.2}, saved {:.2} + backward arena {:.2} + gradients {:.2}); arena {:.2} MiB (optimizer state not included)\n",
            mib(m.peak_bytes),
            mib(m.inputs_bytes),
            mib(m.forward_arena_bytes),
            mib(m.forward_results_bytes),
            mib(m.saved_bytes),
            mib(m.backward_arena_bytes),
            mib(m.gradients_bytes),
            mib(m.arena_bytes)
        ),
        Err(e) => format!("memory per rank: not planned ({e})\n"),
    };
    out(&text)
}
