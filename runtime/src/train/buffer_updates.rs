//! What a forward writes in place, and so what the trainer must carry to the next step.
//!
//! Thunder keeps PyTorch's in-place updates in the forward: BatchNorm's running statistics and
//! its step counter are written by `copy_(new, buffer)`, often through a view made by
//! `update_aliases((buffer,))`, and the forward's `flat_args` return says what each argument
//! holds afterwards. The executor runs SSA values, so `copy_` yields the new value as its own
//! result; this module finds, per buffer, the value it holds when the forward ends, and refuses
//! a forward whose meaning would depend on the write happening in place (a later read of an
//! older alias of the written tensor, or a write into a parameter or a data input).

use std::collections::HashMap;
use tracepass_ir::{ops, print_node_line, Arg, OpRegistry, Program, ValueId};

/// A buffer the forward updates: after each forward, parameter `param` (a buffer) becomes the
/// forward's value `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferUpdate {
    /// Index into `Program::params`.
    pub param: usize,
    /// The value the buffer holds when the forward returns.
    pub value: ValueId,
}

/// The buffers `p`'s forward updates, in parameter order; an error names the statement whose
/// in-place meaning this runtime cannot reproduce.
pub fn buffer_updates(p: &Program) -> Result<Vec<BufferUpdate>, String> {
    let t = &p.forward;
    let reg = OpRegistry::builtin();
    // alias -> the tensor whose storage it shares
    let mut root: HashMap<ValueId, ValueId> = HashMap::new();
    let root_of = |root: &HashMap<ValueId, ValueId>, v: ValueId| *root.get(&v).unwrap_or(&v);
    // storage -> the value it holds after its latest write
    let mut latest: HashMap<ValueId, ValueId> = HashMap::new();
    // storage -> how many writes it has had; value -> after how many writes of its storage it
    // was read out (`update_aliases` of the latest value is as fresh as it is)
    let mut writes: HashMap<ValueId, u32> = HashMap::new();
    let mut version: HashMap<ValueId, u32> = HashMap::new();
    let stale = |root: &HashMap<ValueId, ValueId>,
                 writes: &HashMap<ValueId, u32>,
                 version: &HashMap<ValueId, u32>,
                 v| {
        let r = root_of(root, v);
        version.get(&v).copied().unwrap_or(0) < writes.get(&r).copied().unwrap_or(0)
    };
    for &idx in t.schedule() {
        let Some(node) = t.node(idx) else { continue };
        let op = reg.resolve(node.op.as_str()).unwrap_or(node.op.as_str());
        let line = || print_node_line(t, idx);
        if op == ops::COPY {
            let (Some(src), Some(dst)) = (
                node.args().first().and_then(Arg::as_value),
                node.args().get(1).and_then(Arg::as_value),
            ) else {
                return Err(format!(
                    "`{}`: copy_ needs a source and a destination tensor",
                    line()
                ));
            };
            if stale(&root, &writes, &version, src) || stale(&root, &writes, &version, dst) {
                return Err(format!(
                    "`{}` reads a tensor after an earlier copy_ wrote into it: the result depends on the write happening in place, which this runtime does not model",
                    line()
                ));
            }
            let r = root_of(&root, dst);
            let w = writes.get(&r).copied().unwrap_or(0) + 1;
            writes.insert(r, w);
            if let Some(&out) = node.outputs().first() {
                root.insert(out, r);
                version.insert(out, w);
                latest.insert(r, out);
            }
            continue;
        }
        let mut bad = None;
        node.for_each_operand(&mut |v| {
            if bad.is_none() && stale(&root, &writes, &version, v) {
                bad = Some(v);
            }
        });
        if let Some(v) = bad {
            return Err(format!(
                "`{}` reads `{}` after a copy_ wrote into it: the result depends on the write happening in place, which this runtime does not model",
                line(),
                t.name(v)
            ));
        }
        if op == ops::UPDATE_ALIASES {
            let mut inputs = Vec::new();
            if let Some(a) = node.args().first() {
                a.for_each_value(&mut |v| inputs.push(v));
            }
            if inputs.len() != node.outputs().len() {
                return Err(format!(
                    "`{}`: update_aliases gives {} values for {} tensors",
                    line(),
                    node.outputs().len(),
                    inputs.len()
                ));
            }
            for (&out, &inp) in node.outputs().iter().zip(&inputs) {
                let r = root_of(&root, inp);
                root.insert(out, r);
                version.insert(out, version.get(&inp).copied().unwrap_or(0));
            }
        }
    }
    // what every argument holds afterwards, as Thunder's `flat_args` return lists it
    let flat_args = flat_args(&t.ret);
    let mut saved_reads = Vec::new();
    if let Arg::Tuple(items) = &t.ret {
        for (i, item) in items.iter().enumerate() {
            match item {
                Arg::Dict(entries) if i == 0 => {
                    for (k, v) in entries {
                        if k.as_str() != Some("flat_args") {
                            v.for_each_value(&mut |x| saved_reads.push(x));
                        }
                    }
                }
                other => other.for_each_value(&mut |x| saved_reads.push(x)),
            }
        }
    }
    if let Some(v) = saved_reads
        .into_iter()
        .find(|&v| stale(&root, &writes, &version, v))
    {
        return Err(format!(
            "the forward returns `{}` after a copy_ wrote into it: the result depends on the write happening in place, which this runtime does not model",
            t.name(v)
        ));
    }
    let args = t.args();
    if let Some(flat) = &flat_args {
        for (i, a) in flat.iter().enumerate() {
            let (Some(v), Some(&arg)) = (a.as_value(), args.get(i)) else {
                continue;
            };
            if root_of(&root, v) != arg {
                return Err(format!(
                    "the forward's flat_args[{i}] is `{}`, which is not argument `{}` or a view of it",
                    t.name(v),
                    t.name(arg)
                ));
            }
        }
    }
    let mut updates = Vec::new();
    for (pos, &arg) in args.iter().enumerate() {
        let Some(&now) = latest.get(&arg) else {
            continue;
        };
        match p.params.iter().position(|q| q.forward_arg == pos) {
            Some(i) if p.params[i].buffer => updates.push(BufferUpdate {
                param: i,
                value: now,
            }),
            Some(i) => {
                return Err(format!(
                    "the forward writes into parameter `{}` in place (copy_ into `{}`); only buffers may be updated by the forward",
                    p.params[i].fqn,
                    t.name(arg)
                ))
            }
            None => {
                return Err(format!(
                    "the forward writes into its data input `{}` in place (copy_); only buffers may be updated by the forward",
                    t.name(arg)
                ))
            }
        }
    }
    updates.sort_by_key(|u| u.param);
    Ok(updates)
}

/// Thunder's `{'output': ..., 'flat_args': [...]}` entry of the forward's return.
fn flat_args(ret: &Arg) -> Option<Vec<Arg>> {
    let first = match ret {
        Arg::Tuple(items) | Arg::List(items) => items.first()?,
        _ => return None,
    };
    let Arg::Dict(entries) = first else {
        return None;
    };
    entries.iter().find_map(|(k, v)| match v {
        Arg::List(items) | Arg::Tuple(items) if k.as_str() == Some("flat_args") => {
            Some(items.clone())
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracepass_ir::{parse_trace, DType, Device, Param};

    /// `forward(x, t_w, t_rm)`: `t_rm` is a buffer updated through an alias, as BatchNorm's
    /// running mean is; `body` is what follows the update.
    fn program(body: &str, ret: &str) -> Program {
        let text = format!(
            r#"def computation(x, t_w, t_rm):
  # x: "cpu f32[4]"
  # t_w: "cpu f32[4]"
  # t_rm: "cpu f32[4]"
  t1 = torch.mul(x, t_w)  # t1: "cpu f32[4]"
  (t2,) = update_aliases((t_rm,))
  t3 = torch.add(t2, t1, alpha=1)  # t3: "cpu f32[4]"
  t4 = copy_(t3, t2, grad_enabled=True)  # t4: "cpu f32[4]"
{body}  return {ret}
"#
        );
        let forward = parse_trace(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let mut p = Program::lone(forward.clone());
        p.forward = forward;
        let param = |fqn: &str, arg: usize, buffer: bool| Param {
            fqn: fqn.into(),
            forward_arg: arg,
            grad_output: None,
            shape: vec![4],
            dtype: DType::F32,
            device: Device::CPU,
            requires_grad: !buffer,
            tied_to: None,
            buffer,
            shard: None,
        };
        p.params = vec![param("w", 1, false), param("rm", 2, true)];
        p
    }

    #[test]
    fn a_buffer_written_through_an_alias_takes_the_copy() {
        let p = program(
            "",
            "{'output': (t1,), 'flat_args': [x, t_w, t4]}, ((x, t_w), ())",
        );
        let u = buffer_updates(&p).unwrap();
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].param, 1);
        assert_eq!(p.forward.name(u[0].value), "t4");
        // Thunder may also list the buffer itself: it holds the copy afterwards
        let p = program(
            "",
            "{'output': (t1,), 'flat_args': [x, t_w, t_rm]}, ((x, t_w), ())",
        );
        assert_eq!(p.forward.name(buffer_updates(&p).unwrap()[0].value), "t4");
    }

    #[test]
    fn reading_an_older_alias_after_the_write_is_refused() {
        // in PyTorch `t2` holds the new value after copy_; an SSA run would read the old one
        let p = program(
            "  t5 = torch.mul(t2, t1)  # t5: \"cpu f32[4]\"\n",
            "{'output': (t5,), 'flat_args': [x, t_w, t4]}, ((x, t_w), ())",
        );
        let e = buffer_updates(&p).unwrap_err();
        assert!(e.contains("t2") && e.contains("in place"), "{e}");
        // returning it for the backward is the same read
        let p = program(
            "",
            "{'output': (t1,), 'flat_args': [x, t_w, t4]}, ((x, t_rm), ())",
        );
        assert!(buffer_updates(&p).unwrap_err().contains("t_rm"));
    }

    /// An in-place op on an activation (`nn.ReLU(inplace=True)`, `out += identity`):
    /// Thunder writes with copy_ and reads on through `update_aliases` of the copy, which
    /// holds the new value, as the copy does; a second write is fine, an old alias is not.
    #[test]
    fn aliases_of_the_latest_write_are_current() {
        let body = "  (t5,) = update_aliases((t4,))\n  t6 = torch.gt(t5, 0.0)  # t6: \"cpu b8[4]\"\n  t7 = torch.where(t6, t5, 0.0)  # t7: \"cpu f32[4]\"\n  t8 = copy_(t7, t5, grad_enabled=True)  # t8: \"cpu f32[4]\"\n  t9 = torch.mul(t8, t1)  # t9: \"cpu f32[4]\"\n";
        let p = program(
            body,
            "{'output': (t9,), 'flat_args': [x, t_w, t8]}, ((t6, t8), ())",
        );
        let u = buffer_updates(&p).unwrap();
        assert_eq!(p.forward.name(u[0].value), "t8");
        // `t5` is the value of the first write, older than the second
        let p = program(
            &format!("{body}  t10 = torch.mul(t5, t1)  # t10: \"cpu f32[4]\"\n"),
            "{'output': (t10,), 'flat_args': [x, t_w, t8]}, ((x, t_w), ())",
        );
        let e = buffer_updates(&p).unwrap_err();
        assert!(e.contains("`t5`") && e.contains("in place"), "{e}");
    }

    #[test]
    fn writing_into_a_parameter_or_data_is_refused() {
        let mut p = program(
            "",
            "{'output': (t1,), 'flat_args': [x, t_w, t4]}, ((x, t_w), ())",
        );
        p.params[1].buffer = false;
        let e = buffer_updates(&p).unwrap_err();
        assert!(e.contains("parameter `rm`"), "{e}");
        p.params.pop();
        let e = buffer_updates(&p).unwrap_err();
        assert!(e.contains("data input `t_rm`"), "{e}");
    }
}
