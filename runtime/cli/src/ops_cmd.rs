//! `tracepass ops`: the op table, one line per op: canonical name, how its dtype follows from
//! its operands, its effect, how the runtime runs it, and every other spelling Thunder prints.

use crate::input::{out, registry};
use anyhow::Result;
use clap::Args;
use tracepass_runtime::exec::{kernel_entry, KernelEntry};

#[derive(Args, Debug)]
pub struct OpsArgs {
    /// Only the ops the runtime refuses at plan time, each with the reason.
    #[arg(long)]
    pub unsupported: bool,
}

/// How the runtime runs an op: a kernel (`kernel`), an instruction of the plan (`plan`), or
/// not at all (`unsupported: why`; `no entry` for an op without a registration).
fn status(name: &str) -> (bool, String) {
    match kernel_entry(name) {
        Some(KernelEntry::Cpu(_)) => (true, "kernel".into()),
        Some(KernelEntry::Plan) => (true, "plan".into()),
        Some(KernelEntry::Unsupported { reason }) => (false, format!("unsupported: {reason}")),
        None => (false, "unsupported: no kernel registered".into()),
    }
}

pub fn run(args: OpsArgs) -> Result<()> {
    let mut text = String::new();
    let defs = registry().defs();
    let mut shown = 0usize;
    for d in &defs {
        let (runs, how) = status(&d.name);
        if args.unsupported {
            if !runs {
                text.push_str(&format!("{}\t{}\n", d.name, how));
                shown += 1;
            }
            continue;
        }
        let mut spellings = d.spellings.clone();
        spellings.sort();
        text.push_str(&format!(
            "{}\tdtype={:?}\teffect={:?}\t{}\t{}\n",
            d.name,
            d.dtype,
            d.effect,
            how,
            spellings.join(" ")
        ));
        shown += 1;
    }
    out(&text)?;
    eprintln!(
        "{shown} of {} ops{}",
        defs.len(),
        if args.unsupported {
            " are refused at plan time, unless the trace prints the op's decomposition \
             below it (then that runs)"
        } else {
            ""
        }
    );
    Ok(())
}
