//! Thunder's prologue trace: the truth about what each argument of the computation is. It fetches
//! parameters and buffers from the module by their PyTorch names
//! (`t_x: "cpu f32[8]" = module.get_parameter('bn1.weight')`), checks each tensor's metadata,
//! the last operand of `check_tensor_metadata` saying whether it requires a gradient, and returns
//! the computation's arguments. Argument names are no guide (`t_<fqn>` folds `.` and `_`
//! together, and some parameters are printed as bare `weight`), so nothing here looks at them.

use crate::parse::{is_ident, lex, strip_comment, ParseError, Tok};

/// Where a tensor of the module comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    /// `module.get_parameter(fqn)`.
    Parameter,
    /// `module.get_buffer(fqn)`.
    Buffer,
    /// A tensor attribute of a sub-module that is neither (GPT-J's `attn.embed_positions`,
    /// read as `m1.embed_positions` after `m1 = module.get_submodule('...attn')`): a constant,
    /// never trained, handled as a buffer the forward does not update.
    Attribute,
}

/// A parameter or buffer the prologue fetches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleTensor {
    /// The name the prologue (and the computation) binds it to.
    pub name: String,
    /// Its PyTorch name (fully qualified).
    pub fqn: String,
    /// Parameter or buffer (which `module.get_*` fetches it).
    pub kind: TensorKind,
    /// From its `check_tensor_metadata` line; `None` when the prologue does not check it.
    pub requires_grad: Option<bool>,
}

/// What a prologue says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prologue {
    /// Parameters and buffers in the order the prologue fetches them, which is the module's
    /// registration order (`named_parameters()`): the first of tied names comes first.
    pub tensors: Vec<ModuleTensor>,
    /// User inputs: the name bound to `args[i]` or `kwargs['k']`, and that source.
    pub inputs: Vec<(String, String)>,
    /// The names the prologue returns for the computation, in order.
    pub returns: Vec<String>,
    /// Sub-modules it fetches (`m1 = module.get_submodule('path')`): name and path.
    pub submodules: Vec<(String, String)>,
}

impl Prologue {
    /// The module tensor bound to `name`.
    pub fn tensor(&self, name: &str) -> Option<&ModuleTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

fn err(lines: &[&str], ln: usize, col: usize, message: impl Into<String>) -> ParseError {
    ParseError {
        line: ln + 1,
        col: col + 1,
        message: message.into(),
        text: lines.get(ln).map(|s| s.to_string()).unwrap_or_default(),
    }
}

/// Reads a prologue as Thunder 0.2.6 prints it. Every statement must be one of the forms
/// Thunder prints (annotated bindings, `check_*` calls, `del`, `return`); anything else is an
/// error naming the line, so a prologue that says something new is never half-understood.
pub fn parse_prologue(text: &str) -> Result<Prologue, ParseError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut p = Prologue::default();
    let mut in_body = false;
    let mut returned = false;
    for (ln, raw) in lines.iter().enumerate() {
        let line = raw.trim_end();
        let body = line.trim_start();
        let ind = line.len() - body.len();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        if !in_body {
            if body.starts_with("import ") || body.starts_with("from ") || body.starts_with('@') {
                continue;
            }
            if body.starts_with("def ") {
                in_body = true;
                continue;
            }
            return Err(err(
                &lines,
                ln,
                0,
                "expected an import, decorator or `def` line",
            ));
        }
        if returned {
            return Err(err(&lines, ln, ind, "statement after `return`"));
        }
        if body.starts_with("del ") {
            continue;
        }
        let lx = lex(body).map_err(|(c, m)| err(&lines, ln, ind + c, m))?;
        let toks = strip_comment(&lx.toks);
        if let Some(rest) = body.strip_prefix("return ") {
            p.returns = return_names(rest);
            returned = true;
            continue;
        }
        match toks {
            // name: "type" = expr
            [(Tok::Name(name), _), (Tok::Punct(':'), _), (Tok::Str(ty), _), (Tok::Punct('='), _), rhs @ ..]
                if is_ident(name) && !rhs.is_empty() =>
            {
                binding(&mut p, name, ty, rhs).map_err(|m| err(&lines, ln, ind, m))?;
            }
            // check_xxx(...)
            [(Tok::Name(callee), _), (Tok::Punct('('), _), args @ .., (Tok::Punct(')'), _)]
                if callee.starts_with("check_") =>
            {
                if *callee == "check_tensor_metadata" {
                    check_metadata(&mut p, args).map_err(|m| err(&lines, ln, ind, m))?;
                }
            }
            _ => {
                return Err(err(
                    &lines,
                    ln,
                    ind,
                    "not a statement Thunder prints in a prologue (`name: \"type\" = ...`, `check_*(...)`, `del`, `return`)",
                ))
            }
        }
    }
    if !returned {
        return Err(err(
            &lines,
            lines.len().saturating_sub(1),
            0,
            "prologue has no `return`",
        ));
    }
    for t in &p.tensors {
        if !p.returns.contains(&t.name) {
            continue;
        }
        if t.kind == TensorKind::Parameter && t.requires_grad.is_none() {
            return Err(ParseError {
                line: 1,
                col: 1,
                message: format!(
                    "parameter `{}` (`{}`) is passed to the computation without a check_tensor_metadata line: whether it requires a gradient is unknown",
                    t.fqn, t.name
                ),
                text: String::new(),
            });
        }
    }
    Ok(p)
}

/// `module.get_parameter('fqn')`, `module.get_buffer('fqn')`, `args[i]`, `kwargs['k']`;
/// other right-hand sides (attribute reads, sub-modules, cache info) bind guards only.
fn binding(p: &mut Prologue, name: &str, ty: &str, rhs: &[(Tok<'_>, usize)]) -> Result<(), String> {
    let kind = match rhs {
        // `module.get_parameter('fqn')` and its kin
        [(Tok::Name(f), _), (Tok::Punct('('), _), (Tok::Str(fqn), _), (Tok::Punct(')'), _)] => {
            match *f {
                "module.get_parameter" => Some((TensorKind::Parameter, fqn.clone())),
                "module.get_buffer" => Some((TensorKind::Buffer, fqn.clone())),
                "module.get_submodule" => {
                    p.submodules.push((name.to_string(), fqn.clone()));
                    return Ok(());
                }
                _ => None,
            }
        }
        // `m1.attr`, a tensor attribute of a sub-module fetched above
        [(Tok::Name(read), _)] if is_tensor_type(ty) => read
            .split_once('.')
            .filter(|(_, attr)| !attr.contains('.'))
            .and_then(|(m, attr)| {
                let (_, path) = p.submodules.iter().find(|(n, _)| n == m)?;
                let fqn = match path.is_empty() {
                    true => attr.to_string(),
                    false => format!("{path}.{attr}"),
                };
                Some((TensorKind::Attribute, fqn))
            }),
        _ => None,
    };
    if let Some((kind, fqn)) = kind {
        if p.tensors.iter().any(|t| t.name == name) {
            return Err(format!("`{name}` is bound twice"));
        }
        p.tensors.push(ModuleTensor {
            name: name.to_string(),
            fqn,
            kind,
            requires_grad: None,
        });
        return Ok(());
    }
    if let [(Tok::Name(src @ ("args" | "kwargs")), _), (Tok::Punct('['), _), key, (Tok::Punct(']'), _)] =
        rhs
    {
        let key = match &key.0 {
            Tok::Int(i) => i.to_string(),
            Tok::Str(s) => format!("'{s}'"),
            other => return Err(format!("unexpected index {other:?}")),
        };
        p.inputs.push((name.to_string(), format!("{src}[{key}]")));
    }
    Ok(())
}

/// Whether a binding's type comment is a tensor's (`cpu f32[32, 4]`), not `Any` or a number.
fn is_tensor_type(ty: &str) -> bool {
    matches!(
        crate::types::Type::parse(ty),
        Some(crate::types::Type::Tensor(_))
    )
}

/// `check_tensor_metadata(name, shape, device, dtype, requires_grad)`.
fn check_metadata(p: &mut Prologue, args: &[(Tok<'_>, usize)]) -> Result<(), String> {
    let Some((Tok::Name(name), _)) = args.first() else {
        return Err("check_tensor_metadata: expected a name first".into());
    };
    let requires_grad = match args.last() {
        Some((Tok::Name("True"), _)) => true,
        Some((Tok::Name("False"), _)) => false,
        _ => return Err("check_tensor_metadata: expected True or False last".into()),
    };
    if let Some(t) = p.tensors.iter_mut().find(|t| t.name == *name) {
        t.requires_grad = Some(requires_grad);
    }
    Ok(())
}

/// The names in `return ((a, b, ...), ())`, flattened in order.
fn return_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty() && is_ident(w) && w != &"None")
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRO: &str = r#"import torch

@torch.no_grad()
def prologue(*args, **kwargs):
  # args: "Any"
  check_len(args, 1)
    # prims.check_len(args, 1)
  x: "cpu f32[4, 3]" = args[0]
  module: "Any" = thunder.core.module.get_thunder_module(module0)
  weight: "cpu f32[8, 3]" = module.get_parameter('conv1.weight')
  t_bn1_running_mean: "cpu f32[8]" = module.get_buffer('bn1.running_mean')
  t_fc_weight: "cpu f32[8]" = module.get_parameter('fc.weight')
  check_tensor_metadata(x, (4, 3), 'cpu', torch.float32, False)
  check_tensor_metadata(weight, (8, 3), 'cpu', torch.float32, True)
  check_tensor_metadata(t_fc_weight, (8,), 'cpu', torch.float32, False)
  i0: "bool True" = module.training
  return ((x, t_bn1_running_mean, weight, t_fc_weight), ())
"#;

    #[test]
    fn tensor_attributes_of_sub_modules_are_constants_under_their_fqn() {
        let text = PRO.replace(
            "  i0: \"bool True\" = module.training\n",
            "  m1: \"Any\" = module.get_submodule('h.0.attn')\n  \
             pos: \"cpu f32[32, 4]\" = m1.embed_positions\n  \
             i0: \"bool True\" = m1.training\n",
        );
        let p = parse_prologue(&text).unwrap();
        let pos = p.tensor("pos").unwrap();
        assert_eq!(pos.fqn, "h.0.attn.embed_positions");
        assert_eq!(pos.kind, TensorKind::Attribute);
        // a number attribute binds a guard only
        assert!(p.tensor("i0").is_none());
    }

    #[test]
    fn reads_parameters_buffers_and_inputs() {
        let p = parse_prologue(PRO).unwrap();
        assert_eq!(
            p.returns,
            ["x", "t_bn1_running_mean", "weight", "t_fc_weight"]
        );
        assert_eq!(p.inputs, [("x".to_string(), "args[0]".to_string())]);
        let w = p.tensor("weight").unwrap();
        assert_eq!(
            (w.fqn.as_str(), w.kind, w.requires_grad),
            ("conv1.weight", TensorKind::Parameter, Some(true))
        );
        let f = p.tensor("t_fc_weight").unwrap();
        assert_eq!(f.requires_grad, Some(false));
        assert_eq!(
            p.tensor("t_bn1_running_mean").unwrap().kind,
            TensorKind::Buffer
        );
    }

    #[test]
    fn unknown_statements_and_unchecked_parameters_are_errors() {
        let e = parse_prologue(&PRO.replace(
            "  i0: \"bool True\" = module.training\n",
            "  frobnicate = 3\n",
        ))
        .unwrap_err();
        assert_eq!(e.line, 16);
        let e = parse_prologue(&PRO.replace(
            "  check_tensor_metadata(weight, (8, 3), 'cpu', torch.float32, True)\n",
            "",
        ))
        .unwrap_err();
        assert!(e.message.contains("conv1.weight"), "{}", e.message);
    }
}
