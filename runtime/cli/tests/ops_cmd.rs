//! `tracepass ops [--unsupported]`: the op table and the ops the runtime refuses.

mod common;

use common::run;
use tracepass_runtime::exec::{kernel_entry, KernelEntry};

#[test]
fn ops_lists_every_op_with_its_spellings_and_kernel_status() {
    let o = run(&["ops"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    let add = text
        .lines()
        .find(|l| l.starts_with("ltorch.add\t"))
        .expect("ltorch.add is listed");
    assert!(add.contains("\tkernel\t"), "{add}");
    assert!(add.contains("torch.add"), "{add}");
    let names: Vec<&str> = text.lines().filter_map(|l| l.split('\t').next()).collect();
    assert_eq!(
        names.len(),
        tracepass_ir::OpRegistry::builtin().defs().len()
    );
}

#[test]
fn unsupported_lists_exactly_the_refused_ops_with_their_reasons() {
    let o = run(&["ops", "--unsupported"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    let listed: Vec<&str> = text.lines().filter_map(|l| l.split('\t').next()).collect();
    let refused: Vec<String> = tracepass_ir::OpRegistry::builtin()
        .defs()
        .iter()
        .filter(|d| {
            !matches!(
                kernel_entry(&d.name),
                Some(KernelEntry::Cpu(_) | KernelEntry::Plan)
            )
        })
        .map(|d| d.name.clone())
        .collect();
    assert!(!refused.is_empty());
    assert_eq!(listed, refused);
    for l in text.lines() {
        let reason = l.split("\tunsupported: ").nth(1).unwrap_or_default();
        assert!(reason.len() > 10, "a reason for {l}");
    }
}
