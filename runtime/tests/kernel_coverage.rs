//! The op table and the runtime's kernel registrations held together: every op of
//! `OpRegistry::builtin()` has a CPU kernel, is compiled by the plan compiler, or carries an
//! explicit unsupported mark with its reason; every registration names an op of the table.

use std::collections::{BTreeSet, HashMap};
use tracepass_ir::{Arg, DType, Device, OpRegistry, TraceBuilder, TraceKind, Type};
use tracepass_runtime::exec::{kernel_entry, KernelEntry, KERNELS};
use tracepass_runtime::exec::{Plan, PLANNED_OPS};

#[test]
fn every_op_of_the_table_has_a_kernel_or_an_explicit_mark() {
    let missing: Vec<&str> = OpRegistry::builtin()
        .op_names()
        .into_iter()
        .filter(|op| kernel_entry(op).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "ops of the op table with neither a CPU kernel, a plan instruction nor an \
         unsupported mark (register them in runtime/src/kernel_ops.rs's KERNELS): {missing:?}"
    );
}

#[test]
fn every_registration_names_one_op_of_the_table_once() {
    let reg = OpRegistry::builtin();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (op, _) in KERNELS {
        *seen.entry(op).or_default() += 1;
    }
    let twice: Vec<&&str> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(op, _)| op)
        .collect();
    assert!(twice.is_empty(), "registered more than once: {twice:?}");
    let unknown: Vec<&str> = KERNELS
        .iter()
        .map(|(op, _)| *op)
        .filter(|op| reg.get(op).is_none())
        .collect();
    assert!(
        unknown.is_empty(),
        "registrations for names that are not canonical ops of the table: {unknown:?}"
    );
}

#[test]
fn the_plan_compiles_exactly_the_ops_marked_plan() {
    let marked: BTreeSet<&str> = KERNELS
        .iter()
        .filter(|(_, e)| matches!(e, KernelEntry::Plan))
        .map(|(op, _)| *op)
        .collect();
    let planned: BTreeSet<&str> = PLANNED_OPS.iter().copied().collect();
    assert_eq!(marked, planned);
}

#[test]
fn unsupported_marks_say_why_and_planning_repeats_it() {
    for (op, e) in KERNELS {
        if let KernelEntry::Unsupported { reason } = e {
            assert!(
                reason.len() > 20,
                "`{op}`: the reason is too short: {reason:?}"
            );
        }
    }
    // a node of an unsupported op: the plan error names the op and gives the reason
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", Type::tensor([3], DType::F32, Device::CPU));
    let y = b
        .op("ltorch.copysign", vec![x.into(), x.into()])
        .expect("copysign types");
    b.ret(Arg::Value(y));
    let t = b.finish();
    let e = Plan::compile(&t, &[Some(y)]).expect_err("copysign has no kernel");
    let Some(KernelEntry::Unsupported { reason }) = kernel_entry("ltorch.copysign") else {
        panic!("ltorch.copysign is marked unsupported");
    };
    assert!(e.message.contains("ltorch.copysign"), "{e}");
    assert!(e.message.contains(reason), "{e}");
}

#[test]
fn every_spelling_of_an_op_finds_its_registration() {
    // a node built by hand may carry a Thunder spelling instead of the canonical name
    let reg = OpRegistry::builtin();
    for def in reg.defs() {
        for spelled in std::iter::once(&def.name).chain(&def.spellings) {
            let canonical = reg.resolve(spelled).expect("a name of the table resolves");
            assert_eq!(canonical, def.name.as_str(), "{spelled}");
            assert!(
                kernel_entry(canonical).is_some(),
                "{spelled} -> {canonical}"
            );
        }
    }
}
