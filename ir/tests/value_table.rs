//! The value table keeps names in one text per trace and types once each in a per-trace table;
//! these tests check that what a value reads back, what a trace compares equal to, and what a
//! file holds do not depend on that bookkeeping (renames, retyped values, removed values).

use tracepass_ir::{codec, print_trace, DType, Device, Module, Trace, TraceKind, Type, ValueId};

fn f32(shape: &[usize]) -> Type {
    Type::tensor(shape, DType::F32, Device::CPU)
}

/// `n` arguments `x0..` of alternating shapes.
fn args(n: usize) -> (Trace, Vec<ValueId>) {
    let mut t = Trace::new("t", TraceKind::Forward);
    let ids = (0..n)
        .map(|i| t.push_arg(format!("x{i}"), f32(&[i % 3 + 1, 4])))
        .collect();
    (t, ids)
}

#[test]
fn values_read_back_their_names_and_types_and_equal_types_share_a_handle() {
    let (t, ids) = args(6);
    for (i, id) in ids.iter().enumerate() {
        let v = t.value(*id).expect("value exists");
        assert_eq!(v.name, format!("x{i}"));
        assert_eq!(v.ty, &f32(&[i % 3 + 1, 4]));
        assert_eq!(t.value_name(*id), Some(v.name));
    }
    let handle = |id: ValueId| {
        t.values()
            .find(|(v, _)| *v == id)
            .map(|(_, v)| v.ty as *const Type)
    };
    // x0 and x3 have the same type: one entry in the trace's type table
    assert_eq!(handle(ids[0]), handle(ids[3]));
    assert_ne!(handle(ids[0]), handle(ids[1]));
}

#[test]
fn renames_keep_every_name_right_through_reclaiming_unused_text() {
    let (mut t, ids) = args(2000);
    // enough renames that the unused names outweigh the used ones several times over
    for round in 0..5 {
        for (i, id) in ids.iter().enumerate() {
            t.set_name(*id, &format!("renamed_{round}_{i}_with_a_long_tail"));
        }
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            t.value_name(*id),
            Some(format!("renamed_4_{i}_with_a_long_tail").as_str())
        );
    }
    // the same trace built with the final names directly is equal, and prints and encodes
    // the same
    let mut fresh = Trace::new("t", TraceKind::Forward);
    for i in 0..2000 {
        fresh.push_arg(
            format!("renamed_4_{i}_with_a_long_tail"),
            f32(&[i % 3 + 1, 4]),
        );
    }
    assert!(t == fresh);
    assert_eq!(print_trace(&t), print_trace(&fresh));
    let enc = |t: &Trace| codec::encode(&Module::Trace(t.clone())).expect("encodes");
    assert_eq!(enc(&t), enc(&fresh));
}

#[test]
fn retyped_values_compare_and_encode_by_their_types_not_their_handles() {
    // `a` interns the types in one order, `b` in the other, and `a` keeps a type no value has
    let (mut a, ids) = args(3);
    a.set_ty(ids[0], Type::Int(None));
    a.set_ty(ids[0], f32(&[7]));
    let mut b = Trace::new("t", TraceKind::Forward);
    b.push_arg("x0", f32(&[7]));
    b.push_arg("x1", f32(&[2, 4]));
    b.push_arg("x2", f32(&[3, 4]));
    assert!(a == b);
    let enc = |t: &Trace| codec::encode(&Module::Trace(t.clone())).expect("encodes");
    // the file lists only the types values have, in the order values first have them
    assert_eq!(enc(&a), enc(&b));
    let back = codec::decode(&enc(&a)).expect("decodes");
    assert!(back == Module::Trace(b));
}

#[test]
fn a_value_changed_in_a_copy_leaves_the_original_alone() {
    let (t, ids) = args(3);
    let mut c = t.clone();
    c.set_name(ids[1], "changed");
    c.set_ty(ids[1], Type::Bool(None));
    assert_eq!(t.value_name(ids[1]), Some("x1"));
    assert_eq!(t.ty(ids[1]), Some(&f32(&[2, 4])));
    assert_eq!(c.value_name(ids[1]), Some("changed"));
    assert!(t != c);
}

#[test]
fn a_trace_with_gaps_in_its_value_ids_round_trips() {
    // values made and then dropped leave gaps: the decoder maps ids to slots through a table
    // instead of taking each id as its own slot
    let (mut t, ids) = args(4);
    let orphans: Vec<ValueId> = (0..5)
        .map(|i| t.new_value(format!("gone{i}"), Type::Int(None)))
        .collect();
    let y = t.new_value("y", f32(&[1, 4]));
    t.append(tracepass_ir::Node::new(
        "ltorch.add",
        vec![ids[0].into(), ids[3].into()],
        vec![y],
    ));
    t.ret = y.into();
    t.purge_undefined_values();
    assert!(orphans.iter().all(|o| t.value(*o).is_none()));
    let bytes = codec::encode(&Module::Trace(t.clone())).expect("encodes");
    let Module::Trace(back) = codec::decode(&bytes).expect("decodes") else {
        panic!("a trace was encoded");
    };
    assert!(back == t);
    assert_eq!(back.value_name(y), Some("y"));
    assert_eq!(back.ty(y), Some(&f32(&[1, 4])));
    assert_eq!(back.producer(y), t.producer(y));
}
