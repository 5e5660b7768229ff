//! Canonical renumbering: the form snapshot tests compare, free of numbering noise.

use crate::arg::Arg;
use crate::trace::{split_numbered, NameGen, Trace};
use std::collections::HashMap;

/// Renames generated value names in definition order (arguments first, then the schedule) to
/// `t0, t1, ...`, `ft0, ...`, `C0, ...`; renumbers opaque counters per type in order of first
/// appearance; drops provenance timings. Names a user chose (`x`, `t_l1_weight`) stay.
pub fn canonicalize(t: &mut Trace) {
    let mut order = t.args().to_vec();
    for (_, n) in t.nodes() {
        order.extend(n.outputs.iter().copied());
    }
    // numbered from zero: the names being replaced are not counted
    let mut names = NameGen::from_zero();
    for id in order {
        let Some(v) = t.value(id) else { continue };
        // generated names (`t12`, `ft3`, `C0`, `i4`) are renumbered
        if split_numbered(v.name).is_some() {
            let name = names.fresh_for(v.ty);
            t.set_name(id, &name);
        }
    }
    let mut opaque: HashMap<(String, Option<String>, u32), u32> = HashMap::new();
    let mut per_type: HashMap<String, u32> = HashMap::new();
    let mut fix = |a: &mut Arg| renumber_opaque(a, &mut opaque, &mut per_type);
    let schedule = t.schedule().to_vec();
    for idx in schedule {
        if let Some(n) = t.node_mut(idx) {
            n.args.iter_mut().for_each(&mut fix);
            n.kwargs_mut().iter_mut().for_each(|(_, a)| fix(a));
        }
    }
    fix(&mut t.ret);
    for p in &mut t.provenance {
        p.millis = None;
    }
}

fn renumber_opaque(
    a: &mut Arg,
    seen: &mut HashMap<(String, Option<String>, u32), u32>,
    per_type: &mut HashMap<String, u32>,
) {
    match a {
        Arg::Opaque(o) => {
            let key = (o.type_name.clone(), o.member.clone(), o.counter);
            let c = *seen.entry(key).or_insert_with(|| {
                let n = per_type.entry(o.type_name.clone()).or_insert(0);
                *n += 1;
                *n - 1
            });
            o.counter = c;
        }
        Arg::Tuple(items) | Arg::List(items) => items
            .iter_mut()
            .for_each(|x| renumber_opaque(x, seen, per_type)),
        Arg::Dict(items) => items.iter_mut().for_each(|(k, v)| {
            renumber_opaque(k, seen, per_type);
            renumber_opaque(v, seen, per_type);
        }),
        _ => {}
    }
}

/// A canonical copy, printed without decompositions, source comments or `del`s.
pub fn canonical_text(t: &Trace) -> String {
    let mut c = t.clone();
    canonicalize(&mut c);
    crate::print::print_trace_with(&c, crate::print::PrintOptions::bare())
}
