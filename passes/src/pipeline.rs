//! Pipelines as strings: `ddp(world_size=4,bucket_mb=25),sort-waits,dce`, parsed and printed back.

use crate::pass::PassError;
use std::fmt;

/// One pass and its options as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassSpec {
    pub name: String,
    pub options: Vec<(String, String)>,
}

impl fmt::Display for PassSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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

/// Parses a pipeline string into pass specs.
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
        out.push(PassSpec { name, options });
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

/// Prints specs back as a pipeline string.
pub fn print_pipeline(specs: &[PassSpec]) -> String {
    specs
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads a pass's options, refusing unknown keys and bad values.
pub struct Options<'a> {
    pass: &'a str,
    given: &'a [(String, String)],
    valid: &'static [&'static str],
}

impl<'a> Options<'a> {
    pub fn new(spec: &'a PassSpec, valid: &'static [&'static str]) -> Result<Self, PassError> {
        for (k, _) in &spec.options {
            if !valid.contains(&k.as_str()) {
                return Err(PassError::UnknownOption {
                    pass: spec.name.clone(),
                    option: k.clone(),
                    valid: if valid.is_empty() {
                        "(none)".into()
                    } else {
                        valid.join(", ")
                    },
                });
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (k, v) in &spec.options {
            if !seen.insert(k) {
                return Err(PassError::BadValue {
                    pass: spec.name.clone(),
                    option: k.clone(),
                    value: v.clone(),
                    reason: "given twice".into(),
                });
            }
        }
        Ok(Options {
            pass: &spec.name,
            given: &spec.options,
            valid,
        })
    }
    pub fn raw(&self, key: &str) -> Option<&'a str> {
        debug_assert!(self.valid.contains(&key));
        self.given
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
    fn bad(&self, key: &str, value: &str, reason: &str) -> PassError {
        PassError::BadValue {
            pass: self.pass.to_string(),
            option: key.to_string(),
            value: value.to_string(),
            reason: reason.to_string(),
        }
    }
    pub fn f64(&self, key: &str) -> Result<Option<f64>, PassError> {
        self.raw(key)
            .map(|v| match v.parse::<f64>() {
                Ok(x) if x.is_finite() => Ok(x),
                Ok(_) => Err(self.bad(key, v, "must be a finite number")),
                Err(_) => Err(self.bad(key, v, "not a number")),
            })
            .transpose()
    }
    pub fn usize(&self, key: &str) -> Result<Option<usize>, PassError> {
        self.raw(key)
            .map(|v| {
                v.parse::<usize>().map_err(|e| match e.kind() {
                    std::num::IntErrorKind::PosOverflow => {
                        self.bad(key, v, &format!("too large (at most {})", usize::MAX))
                    }
                    _ => self.bad(key, v, "not a non-negative integer"),
                })
            })
            .transpose()
    }
    pub fn choice(&self, key: &str, choices: &[&str]) -> Result<Option<&'a str>, PassError> {
        match self.raw(key) {
            Some(v) if !choices.contains(&v) => {
                Err(self.bad(key, v, &format!("expected one of {}", choices.join(", "))))
            }
            other => Ok(other),
        }
    }
    pub fn require<T>(&self, key: &str, v: Option<T>) -> Result<T, PassError> {
        v.ok_or_else(|| PassError::MissingOption {
            pass: self.pass.to_string(),
            option: key.to_string(),
        })
    }
    pub fn check(&self, ok: bool, key: &str, reason: &str) -> Result<(), PassError> {
        if ok {
            Ok(())
        } else {
            Err(self.bad(key, self.raw(key).unwrap_or(""), reason))
        }
    }
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
