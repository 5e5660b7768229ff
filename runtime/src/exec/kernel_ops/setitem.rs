//! Decoders of Python-level indexing: Thunder's `copy_with_setitem(a, key, value)` and `a[key]`
//! with index tensors (`exec/setitem.rs` runs both).

use super::Ops;
use crate::exec::kernel::{Kernel, KeyItem};
use tracepass_ir::{Arg, Type};

/// A key as the kernel reads it; its tensors are pushed as inputs, in order.
fn key_items(o: &mut Ops<'_>, key: &Arg) -> Result<Vec<KeyItem>, String> {
    let items: Vec<Arg> = match key {
        Arg::Tuple(items) => items.clone(),
        other => vec![other.clone()],
    };
    let mut out = Vec::with_capacity(items.len());
    let mut tensors = Vec::new();
    for item in &items {
        out.push(match item {
            Arg::Int(i) => KeyItem::Int(*i),
            Arg::Slice(s) => KeyItem::Slice(**s),
            Arg::None => KeyItem::NewAxis,
            Arg::Ellipsis => KeyItem::Ellipsis,
            Arg::Value(v) => match o.trace.ty(*v) {
                Some(Type::Tensor(_)) => {
                    tensors.push(*v);
                    KeyItem::Tensor
                }
                Some(Type::Int(Some(i))) => KeyItem::Int(*i),
                other => {
                    return Err(format!(
                        "an index `{}` of type {other:?} is not supported (ints, slices, \
                         None, ... and tensors are)",
                        o.trace.name(*v)
                    ))
                }
            },
            other => return Err(format!("indexing with {other:?} is not supported")),
        });
    }
    o.inputs.extend(tensors);
    Ok(out)
}

/// `copy_with_setitem(a, key, value)`: inputs `a`, the value (unless a number), the key's
/// tensors.
pub(super) fn copy_with_setitem(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let value = match o.raw(2, "value") {
        Some(Arg::Value(v)) => match o.trace.ty(*v) {
            Some(Type::Tensor(_)) => {
                o.inputs.push(*v);
                None
            }
            Some(Type::Int(Some(i))) => Some(*i as f64),
            Some(Type::Float(Some(f))) => Some(*f),
            other => {
                return Err(format!(
                    "copy_with_setitem: a value of type {other:?} known at run time only is \
                     not supported"
                ))
            }
        },
        Some(a) => Some(
            a.as_f64()
                .ok_or_else(|| format!("copy_with_setitem: cannot write {a:?}"))?,
        ),
        None => return Err("copy_with_setitem needs a value".into()),
    };
    let key = o
        .raw(1, "key")
        .cloned()
        .ok_or("copy_with_setitem needs a key")?;
    let key = key_items(o, &key)?;
    Ok(Kernel::SetItem { key, value })
}

/// `a[key]` where the key holds a tensor.
pub(super) fn getitem_tensor(o: &mut Ops<'_>, key: &Arg) -> Result<Kernel, String> {
    let key = key_items(o, key)?;
    Ok(Kernel::GetItemTensor { key })
}
