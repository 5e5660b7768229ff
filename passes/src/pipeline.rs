//! Pipelines as strings: `ddp(world_size=4,bucket_mb=25),sort-waits,dce`, parsed and printed back.
//! A trace-level pass can be anchored to one trace: `forward(cse),backward(dce,sort-waits)`.

use crate::pass::PassError;
use std::fmt;

/// Which trace an anchored trace-level pass runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Anchor {
    /// `forward(...)`.
    Forward,
    /// `backward(...)`.
    Backward,
}

impl Anchor {
    /// The anchor a pipeline spells `name`, if any.
    pub fn from_name(name: &str) -> Option<Anchor> {
        match name {
            "forward" => Some(Anchor::Forward),
            "backward" => Some(Anchor::Backward),
            _ => None,
        }
    }
    /// How a pipeline spells it.
    pub fn name(self) -> &'static str {
        match self {
            Anchor::Forward => "forward",
            Anchor::Backward => "backward",
        }
    }
}

/// One pass and its options as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassSpec {
    /// The pass's name.
    pub name: String,
    /// Its options, `key=value` as written, in order.
    pub options: Vec<(String, String)>,
    /// The trace it is anchored to (`forward(cse)`), if any.
    pub anchor: Option<Anchor>,
}

impl PassSpec {
    /// A pass with no options and no anchor.
    pub fn new(name: impl Into<String>) -> PassSpec {
        PassSpec {
            name: name.into(),
            options: Vec::new(),
            anchor: None,
        }
    }
    /// The spec without its anchor, printed.
    fn bare(&self) -> String {
        PassSpec {
            anchor: None,
            ..self.clone()
        }
        .to_string()
    }
}

impl fmt::Display for PassSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(a) = self.anchor {
            return write!(f, "{}({})", a.name(), self.bare());
        }
        f.write_str(&self.name)?;
        if !self.options.is_empty() {
            f.write_str("(")?;
            for (i, (k, v)) in self.options.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{k}={v}")?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// Parses a pipeline string into pass specs; `forward(a,b)` gives `a` and `b` anchored to the
/// forward.
pub fn parse_pipeline(s: &str) -> Result<Vec<PassSpec>, PassError> {
    let err = |at: usize, reason: &str| PassError::Syntax {
        pipeline: s.to_string(),
        at: at + 1,
        reason: reason.to_string(),
    };
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let word = |i: &mut usize, stop: &[u8]| {
        let start = *i;
        while *i < b.len() && !stop.contains(&b[*i]) {
            *i += 1;
        }
        s[start..*i].trim().to_string()
    };
    skip_ws(&mut i);
    if i == b.len() {
        return Ok(out);
    }
    loop {
        skip_ws(&mut i);
        let at = i;
        let name = word(&mut i, b",()");
        if name.is_empty() {
            return Err(err(at, "expected a pass name"));
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(err(
                at,
                "a pass name is letters, digits, `-` and `_`; separate passes with `,`",
            ));
        }
        if let Some(anchor) = Anchor::from_name(&name) {
            // a nested pipeline of passes without anchors: `forward(cse,dce)`
            skip_ws(&mut i);
            if i >= b.len() || b[i] != b'(' {
                return Err(err(i, "expected `(` and passes after an anchor"));
            }
            let open = i;
            let mut depth = 0usize;
            let mut close = None;
            for (k, c) in b.iter().enumerate().skip(open) {
                match c {
                    b'(' => depth += 1,
                    b')' => {
                        depth -= 1;
                        if depth == 0 {
                            close = Some(k);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let Some(close) = close else {
                return Err(err(open, "unclosed `(`"));
            };
            let inner = parse_pipeline(&s[open + 1..close]).map_err(|e| match e {
                PassError::Syntax { at: k, reason, .. } => err(open + k, &reason),
                other => other,
            })?;
            if inner.is_empty() {
                return Err(err(open, "expected passes inside the anchor"));
            }
            for mut spec in inner {
                if spec.anchor.is_some() {
                    return Err(err(open, "anchors do not nest"));
                }
                spec.anchor = Some(anchor);
                out.push(spec);
            }
            i = close + 1;
            skip_ws(&mut i);
            if i == b.len() {
                break;
            }
            if b[i] != b',' {
                return Err(err(i, "expected `,` between passes"));
            }
            i += 1;
            continue;
        }
        let mut options = Vec::new();
        if i < b.len() && b[i] == b'(' {
            i += 1;
            loop {
                skip_ws(&mut i);
                if i < b.len() && b[i] == b')' {
                    i += 1;
                    break;
                }
                let at = i;
                let key = word(&mut i, b"=,()");
                if key.is_empty() || i >= b.len() || b[i] != b'=' {
                    return Err(err(at, "expected `option=value`"));
                }
                i += 1;
                let value = word(&mut i, b",()");
                if value.is_empty() {
                    return Err(err(i, "expected a value"));
                }
                options.push((key, value));
                if i < b.len() && b[i] == b',' {
                    i += 1;
                } else if i < b.len() && b[i] == b')' {
                    i += 1;
                    break;
                } else {
                    return Err(err(i, "expected `,` or `)`"));
                }
            }
        }
        out.push(PassSpec {
            name,
            options,
            anchor: None,
        });
        skip_ws(&mut i);
        if i == b.len() {
            break;
        }
        if b[i] != b',' {
            return Err(err(i, "expected `,` between passes"));
        }
        i += 1;
    }
    Ok(out)
}

/// Prints specs back as a pipeline string; neighbours with one anchor share it
/// (`forward(cse,dce)`).
pub fn print_pipeline(specs: &[PassSpec]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut k = 0;
    while k < specs.len() {
        match specs[k].anchor {
            None => {
                out.push(specs[k].to_string());
                k += 1;
            }
            Some(a) => {
                let mut group = Vec::new();
                while k < specs.len() && specs[k].anchor == Some(a) {
                    group.push(specs[k].bare());
                    k += 1;
                }
                out.push(format!("{}({})", a.name(), group.join(",")));
            }
        }
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let s = "ddp(world_size=4,bucket_mb=25),sort-waits,dce";
        let p = parse_pipeline(s).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(
            p[0].options,
            vec![
                ("world_size".into(), "4".into()),
                ("bucket_mb".into(), "25".into())
            ]
        );
        assert_eq!(print_pipeline(&p), s);
        assert_eq!(
            print_pipeline(&parse_pipeline(" ddp( world_size = 2 ) , dce ").unwrap()),
            "ddp(world_size=2),dce"
        );
        assert!(parse_pipeline("").unwrap().is_empty());
    }

    #[test]
    fn anchors_spread_over_their_passes_and_print_back_grouped() {
        let s = "forward(cse, dce),ddp(world_size=2),backward(dce)";
        let p = parse_pipeline(s).unwrap();
        let got: Vec<_> = p.iter().map(|x| (x.name.as_str(), x.anchor)).collect();
        assert_eq!(
            got,
            [
                ("cse", Some(Anchor::Forward)),
                ("dce", Some(Anchor::Forward)),
                ("ddp", None),
                ("dce", Some(Anchor::Backward)),
            ]
        );
        assert_eq!(
            print_pipeline(&p),
            "forward(cse,dce),ddp(world_size=2),backward(dce)"
        );
        assert!(matches!(
            parse_pipeline("forward(backward(dce))"),
            Err(PassError::Syntax { reason, .. }) if reason == "anchors do not nest"
        ));
        assert!(parse_pipeline("forward()").is_err());
        assert!(parse_pipeline("forward(dce").is_err());
        assert!(parse_pipeline("forward").is_err());
        assert!(parse_pipeline("forward(dce) cse").is_err());
    }

    #[test]
    fn syntax_errors_say_where() {
        let e = parse_pipeline("ddp(world_size=4").unwrap_err().to_string();
        assert_eq!(
            e,
            "bad pipeline `ddp(world_size=4` at character 17: expected `,` or `)`"
        );
        let e = parse_pipeline("ddp(4)").unwrap_err().to_string();
        assert!(e.contains("expected `option=value`"), "{e}");
        assert!(parse_pipeline("dce,,cse").is_err());
        assert!(parse_pipeline("dce cse").is_err());
    }
}
