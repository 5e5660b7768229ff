//! The two ways Thunder users apply DDP, in Rust.
//!
//! Thunder 0.2.6 offers `thunder.distributed.ddp(model, *, broadcast_from=0, bucket_size_in_mb=25.0)`
//! and the plugin `thunder.plugins.DDP(bucket_size_in_mb=25.0, broadcast_from=None,
//! process_group=None)`. Note the different `broadcast_from` defaults, kept here.

use crate::ddp::{Ddp, DdpOptions};
use crate::manager::{PassManager, RunError};
use crate::pass::{OnTraces, Pass, PassError};
use crate::sort_waits::SortWaits;
use tracepass_ir::{OpRegistry, Program};

/// Applies DDP to a program like `thunder.distributed.ddp`: rewrites the backward with
/// `ddp(bucket_mb=bucket_size_in_mb)` and `sort-waits`, and records `broadcast_from` (default
/// `Some(0)`) for the runtime, which broadcasts parameters from that rank before the first step.
///
/// ```
/// use tracepass_ir::synth::{mlp_program, MlpSpec};
/// let mut program = mlp_program(&MlpSpec::seed()).unwrap();
/// tracepass_passes::api::ddp(&mut program, 4, tracepass_passes::api::DdpArgs::default()).unwrap();
/// assert_eq!(program.broadcast_from, Some(0));
/// ```
pub fn ddp(program: &mut Program, world_size: usize, args: DdpArgs) -> Result<(), RunError> {
    let mut pm = PassManager::new();
    let pass = Ddp::new(DdpOptions {
        world_size,
        bucket_mb: args.bucket_size_in_mb,
        ..DdpOptions::default()
    })
    .map_err(RunError::new)?;
    pm.add(pass);
    pm.add_trace_pass(SortWaits);
    pm.run(program, OpRegistry::builtin())?;
    program.broadcast_from = args.broadcast_from;
    Ok(())
}

/// Keyword arguments of [`ddp`], with Thunder's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct DdpArgs {
    /// The rank whose initial parameters every rank starts from (`None`: no broadcast).
    pub broadcast_from: Option<usize>,
    /// Bucket cap in MiB.
    pub bucket_size_in_mb: f64,
}

impl Default for DdpArgs {
    fn default() -> Self {
        DdpArgs {
            broadcast_from: Some(0),
            bucket_size_in_mb: 25.0,
        }
    }
}

/// The plugin form: holds the settings and hands out the passes to run.
///
/// ```
/// use tracepass_passes::api::DdpPlugin;
/// let plugin = DdpPlugin::default();
/// assert_eq!(plugin.broadcast_from, None);
/// let names: Vec<String> = plugin.setup_transforms(8).unwrap().iter().map(|p| p.spec()).collect();
/// assert_eq!(names, ["ddp(world_size=8,bucket_mb=25)", "sort-waits"]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct DdpPlugin {
    /// Bucket cap in MiB.
    pub bucket_size_in_mb: f64,
    /// The rank whose initial parameters every rank starts from (`None`: no broadcast).
    pub broadcast_from: Option<usize>,
    /// Process group name; `None` is the default group (`world`).
    pub process_group: Option<String>,
}

impl Default for DdpPlugin {
    fn default() -> Self {
        DdpPlugin {
            bucket_size_in_mb: 25.0,
            broadcast_from: None,
            process_group: None,
        }
    }
}

impl DdpPlugin {
    /// The passes this plugin contributes, for a job of `world_size` ranks (a world size of
    /// 0 or a bucket size that is not a finite number is an error).
    pub fn setup_transforms(&self, world_size: usize) -> Result<Vec<Box<dyn Pass>>, PassError> {
        Ok(vec![
            Box::new(Ddp::new(DdpOptions {
                world_size,
                bucket_mb: self.bucket_size_in_mb,
                group: self.process_group.clone().unwrap_or_else(|| "world".into()),
                ..DdpOptions::default()
            })?),
            Box::new(OnTraces::new(SortWaits, None)),
        ])
    }
    /// Runs the transforms on a program and records `broadcast_from`.
    pub fn apply(&self, program: &mut Program, world_size: usize) -> Result<(), RunError> {
        let mut pm = PassManager::new();
        let passes = self.setup_transforms(world_size).map_err(RunError::new)?;
        for p in passes {
            pm.add_boxed(p);
        }
        pm.run(program, OpRegistry::builtin())?;
        program.broadcast_from = self.broadcast_from;
        Ok(())
    }
}
