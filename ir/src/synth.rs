//! Synthetic programs shaped like Thunder's export of an MLP (the seed model, or a deep one):
//! Linear layers with the tanh GELU written out, forward returning `(outputs, (saved, ()))`,
//! backward taking `(saved_for_backward, cotangents)`. Used by benchmarks, tests and the runtime.

use crate::arg::Arg;
use crate::builder::{BuildError, TraceBuilder};
use crate::program::{arg_name_for_fqn, Program, ProgramError};
use crate::registry::ops;
use crate::trace::TraceKind;
use crate::types::{DType, Device, Type};
use crate::value::ValueId;

/// sqrt(2/pi), as Thunder prints it.
pub const GELU_C: f64 = 0.7978845608028654;
/// The tanh GELU's cubic coefficient.
pub const GELU_K: f64 = 0.044715;

/// The shape of an MLP: `dims[i] -> dims[i+1]` per layer, GELU after the layers that ask for it.
#[derive(Clone, Debug)]
pub struct MlpSpec {
    /// Rows of the input batch.
    pub batch: usize,
    /// Layer widths, input first.
    pub dims: Vec<usize>,
    /// Whether each layer is followed by a GELU.
    pub gelu: Vec<bool>,
    /// Module names of the layers (`l1`, `l2`): parameters are `<name>.weight`, `<name>.bias`.
    pub names: Vec<String>,
    /// Whether the backward also returns the input's gradient.
    pub input_grad: bool,
    /// The parameters' dtype.
    pub dtype: DType,
    /// The parameters' device.
    pub device: Device,
}

impl MlpSpec {
    /// The seed example: Linear(32, 64) -> tanh GELU -> Linear(64, 4), batch 8, x with grad.
    pub fn seed() -> MlpSpec {
        MlpSpec {
            batch: 8,
            dims: vec![32, 64, 4],
            gelu: vec![true, false],
            names: vec!["l1".into(), "l2".into()],
            input_grad: true,
            dtype: DType::F32,
            device: Device::CPU,
        }
    }
    /// `layers` x [Linear(width, width), tanh GELU].
    pub fn deep(layers: usize, width: usize, batch: usize) -> MlpSpec {
        MlpSpec {
            batch,
            dims: vec![width; layers + 1],
            gelu: vec![true; layers],
            names: (0..layers).map(|i| format!("layers.{i}")).collect(),
            input_grad: false,
            dtype: DType::F32,
            device: Device::CPU,
        }
    }
    /// A deep MLP whose backward has at least `nodes` nodes (21 per layer).
    pub fn deep_with_backward_nodes(nodes: usize, width: usize) -> MlpSpec {
        MlpSpec::deep(nodes.div_ceil(21).max(1), width, 8)
    }
    /// Number of linear layers.
    pub fn layers(&self) -> usize {
        self.dims.len() - 1
    }
}

fn tensor(spec: &MlpSpec, shape: &[usize]) -> Type {
    Type::tensor(shape, spec.dtype, spec.device)
}

struct LayerSaved {
    weight: ValueId,
    input: ValueId,
    gelu: Option<[ValueId; 4]>, // [1 + tanh, 0.5 a, tanh, a]
}

/// Builds forward and backward of an MLP as a `Program`.
pub fn mlp_program(spec: &MlpSpec) -> Result<Program, SynthError> {
    let b = spec.batch;
    // ---- forward ----
    let mut f = TraceBuilder::new("computation", TraceKind::Forward);
    let x = f.arg("x", tensor(spec, &[b, spec.dims[0]]));
    let mut params = Vec::new(); // (bias, weight) per layer
    for (l, name) in spec.names.iter().enumerate() {
        let (i, o) = (spec.dims[l], spec.dims[l + 1]);
        let bias = f.arg(
            &arg_name_for_fqn(&format!("{name}.bias")),
            tensor(spec, &[o]),
        );
        let weight = f.arg(
            &arg_name_for_fqn(&format!("{name}.weight")),
            tensor(spec, &[o, i]),
        );
        params.push((bias, weight));
    }
    let mut h = x;
    let mut saved_layers = Vec::new();
    for (l, &(bias, weight)) in params.iter().enumerate() {
        let a = f.op("ltorch.linear", vec![h.into(), weight.into(), bias.into()])?;
        f.spell_last("torch.nn.functional.linear");
        let mut gelu = None;
        let out = if spec.gelu[l] {
            let half = f.op("ltorch.mul", vec![0.5.into(), a.into()])?;
            let cube = f.op("ltorch.pow", vec![a.into(), 3.0.into()])?;
            let k = f.op("ltorch.mul", vec![GELU_K.into(), cube.into()])?;
            let inner = f.op_kw(
                "ltorch.add",
                vec![a.into(), k.into()],
                vec![("alpha".into(), Arg::Int(1))],
            )?;
            let scaled = f.op("ltorch.mul", vec![GELU_C.into(), inner.into()])?;
            let th = f.op("ltorch.tanh", vec![scaled.into()])?;
            let one_plus = f.op_kw(
                "ltorch.add",
                vec![1.0.into(), th.into()],
                vec![("alpha".into(), Arg::Int(1))],
            )?;
            let y = f.op("ltorch.mul", vec![half.into(), one_plus.into()])?;
            gelu = Some([one_plus, half, th, a]);
            y
        } else {
            a
        };
        saved_layers.push(LayerSaved {
            weight,
            input: h,
            gelu,
        });
        h = out;
    }
    let out = h;
    let mut saved_fwd = Vec::new();
    // Thunder's order: backward use order, so a layer's GELU values come before its weight
    for s in saved_layers.iter().rev() {
        if let Some(g) = s.gelu {
            saved_fwd.extend(g);
        }
        saved_fwd.push(s.weight);
        saved_fwd.push(s.input);
    }
    let flat_args: Vec<Arg> = f.trace().args().iter().map(|v| Arg::Value(*v)).collect();
    f.ret(Arg::Tuple(vec![
        Arg::Dict(vec![
            (Arg::Str("output".into()), Arg::Tuple(vec![out.into()])),
            (Arg::Str("flat_args".into()), Arg::List(flat_args)),
            (Arg::Str("flat_output".into()), Arg::Tuple(vec![out.into()])),
        ]),
        Arg::Tuple(vec![
            Arg::Tuple(Arg::values(saved_fwd.clone())),
            Arg::Tuple(vec![]),
        ]),
    ]));
    let forward = f.finish();

    // ---- backward ----
    let mut g = TraceBuilder::new("backward_fn", TraceKind::Backward);
    let saved_arg = g.arg("saved_for_backward", Type::Collection);
    let cot_arg = g.arg("cotangents", Type::Collection);
    let cs = g.unpack_sequence(
        saved_arg,
        vec![
            ("C0".into(), Type::Collection),
            ("C1".into(), Type::Collection),
        ],
    );
    g.effect(ops::CLEAR_COLLECTION, vec![saved_arg.into()]);
    g.spell_last("clear_mutable_collection");
    g.effect(ops::CLEAR_COLLECTION, vec![cs[1].into()]);
    g.spell_last("clear_mutable_collection");
    let out_ty = forward.ty(out).cloned().unwrap_or(Type::Any);
    let cot = g.unpack_sequence(cot_arg, vec![("t_cot".into(), out_ty)])[0];
    g.effect(ops::CLEAR_COLLECTION, vec![cot_arg.into()]);
    g.spell_last("clear_mutable_collection");
    let saved_decl: Vec<(String, Type)> = saved_fwd
        .iter()
        .map(|v| {
            let name = forward.name(*v);
            let name = if name.starts_with("t_") || name == "x" {
                name
            } else {
                format!("s_{name}")
            };
            (name, forward.ty(*v).cloned().unwrap_or(Type::Any))
        })
        .collect();
    let saved_bwd = g.unpack_sequence(cs[0], saved_decl);
    g.effect(ops::CLEAR_COLLECTION, vec![cs[0].into()]);
    g.spell_last("clear_mutable_collection");
    // map saved values back per layer (same order as saved_fwd: layers reversed)
    let mut it = saved_bwd.into_iter();
    let mut per_layer = Vec::new();
    for s in saved_layers.iter().rev() {
        let gl = s.gelu.map(|_| {
            [
                it.next().expect("saved"),
                it.next().expect("saved"),
                it.next().expect("saved"),
                it.next().expect("saved"),
            ]
        });
        let w = it.next().expect("weight saved");
        let inp = it.next().expect("input saved");
        per_layer.push((w, inp, gl));
    }
    let mut grads: Vec<Option<(ValueId, ValueId)>> = vec![None; spec.layers()]; // (gb, gw)
    let mut grad = cot;
    let mut input_grad = None;
    for (rev_l, (w, inp, gl)) in per_layer.into_iter().enumerate() {
        let l = spec.layers() - 1 - rev_l;
        let (i, o) = (spec.dims[l], spec.dims[l + 1]);
        let ga = match gl {
            Some([one_plus, half, th, a]) => {
                let t140 = g.op("ltorch.mul", vec![one_plus.into(), grad.into()])?;
                let t141 = g.op("ltorch.mul", vec![half.into(), grad.into()])?;
                let t142 = g.op("ltorch.mul", vec![th.into(), th.into()])?;
                let t143 = g.op_kw(
                    "ltorch.sub",
                    vec![1i64.into(), t142.into()],
                    vec![("alpha".into(), Arg::Int(1))],
                )?;
                let t144 = g.op("ltorch.mul", vec![t141.into(), t143.into()])?;
                let t145 = g.op("ltorch.mul", vec![GELU_C.into(), t144.into()])?;
                let t146 = g.op("ltorch.mul", vec![GELU_K.into(), t145.into()])?;
                let t147 = g.op("ltorch.mul", vec![t146.into(), 3.0.into()])?;
                let t148 = g.op("ltorch.pow", vec![a.into(), 2.0.into()])?;
                let t149 = g.op("ltorch.mul", vec![t147.into(), t148.into()])?;
                let t150 = g.op_kw(
                    "ltorch.add",
                    vec![t145.into(), t149.into()],
                    vec![("alpha".into(), Arg::Int(1))],
                )?;
                let t151 = g.op("ltorch.mul", vec![0.5.into(), t140.into()])?;
                g.op_kw(
                    "ltorch.add",
                    vec![t150.into(), t151.into()],
                    vec![("alpha".into(), Arg::Int(1))],
                )?
            }
            None => grad,
        };
        let shape2 = |n: usize| Arg::int_tuple([-1, n as i64]);
        let need_dx = l > 0 || spec.input_grad;
        let mut dx = None;
        if need_dx {
            let r = g.op("ltorch.reshape", vec![ga.into(), shape2(o)])?;
            let m = g.op("ltorch.matmul", vec![r.into(), w.into()])?;
            dx = Some(g.op(
                "ltorch.reshape",
                vec![m.into(), Arg::int_tuple([b as i64, i as i64])],
            )?);
        }
        let r2 = g.op("ltorch.reshape", vec![ga.into(), shape2(o)])?;
        let p = g.op("ltorch.permute", vec![r2.into(), Arg::int_tuple([1, 0])])?;
        let r3 = g.op("ltorch.reshape", vec![inp.into(), shape2(i)])?;
        let gw = g.op("ltorch.matmul", vec![p.into(), r3.into()])?;
        let gb = g.op_kw(
            "ltorch.sum",
            vec![ga.into(), Arg::int_tuple([0]), Arg::Bool(false)],
            vec![("dtype".into(), Arg::None)],
        )?;
        grads[l] = Some((gb, gw));
        if let Some(d) = dx {
            if l == 0 {
                input_grad = Some(d);
            } else {
                grad = d;
            }
        }
    }
    let mut ret = vec![input_grad.map_or(Arg::None, Arg::Value)];
    for (gb, gw) in grads.into_iter().flatten() {
        ret.push(gb.into());
        ret.push(gw.into());
    }
    g.ret(Arg::Tuple(ret));
    let backward = g.finish();
    Ok(Program::from_thunder(forward, backward)?)
}

/// A synthetic program could not be built (a bug in the spec, such as mismatched dims).
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// The trace could not be built.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The traces do not form a program.
    #[error(transparent)]
    Program(#[from] ProgramError),
}
