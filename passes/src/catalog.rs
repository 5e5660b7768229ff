//! The passes known by name, built from pipeline specs.

use crate::accumulate::AccumulateGrads;
use crate::cse::Cse;
use crate::dce::Dce;
use crate::ddp::Ddp;
use crate::no_sync::NoSync;
use crate::pass::{Pass, PassError};
use crate::pipeline::{Options, PassSpec};
use crate::sort_waits::SortWaits;

/// Pass names, as pipelines spell them.
pub const PASS_NAMES: &[&str] = &[
    "ddp",
    "sort-waits",
    "no-sync",
    "accumulate-grads",
    "dce",
    "cse",
];

/// Builds a pass from its spec; unknown names and options are errors that list what is valid.
pub fn build_pass(spec: &PassSpec) -> Result<Box<dyn Pass>, PassError> {
    let no_options = |spec: &PassSpec| Options::new(spec, &[]).map(|_| ());
    Ok(match spec.name.as_str() {
        "ddp" => Box::new(Ddp::from_spec(spec)?),
        "sort-waits" => {
            no_options(spec)?;
            Box::new(SortWaits)
        }
        "no-sync" => {
            no_options(spec)?;
            Box::new(NoSync)
        }
        "accumulate-grads" => {
            no_options(spec)?;
            Box::new(AccumulateGrads)
        }
        "dce" => {
            no_options(spec)?;
            Box::new(Dce)
        }
        "cse" => {
            no_options(spec)?;
            Box::new(Cse)
        }
        other => {
            return Err(PassError::UnknownPass {
                name: other.to_string(),
                valid: PASS_NAMES.join(", "),
            })
        }
    })
}
