//! Passes declared once: each pass states its name, help and typed options (type, default,
//! range, help) in a [`PassDecl`]; parsing, validation (on the Rust path as on the string
//! path), printing, `--help` text and the pipeline spelling all come from it. A
//! [`PassRegistry`] maps names to declarations and builders; users register their own passes,
//! which then work in pipeline strings like the built-in ones.

use crate::pass::{Pass, PassError, TracePass};
use crate::pipeline::PassSpec;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// The type and range of an option's values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptionKind {
    /// A whole number in `min..=max`.
    Int {
        /// Smallest value allowed.
        min: u64,
        /// Largest value allowed.
        max: u64,
    },
    /// A finite number above `min` (or equal to it when `min_inclusive`); NaN and infinities
    /// are refused.
    Float {
        /// Lower bound (`f64::NEG_INFINITY`: none).
        min: f64,
        /// Whether `min` itself is allowed.
        min_inclusive: bool,
    },
    /// One of the listed words.
    Choice(&'static [&'static str]),
    /// A word: no spaces and none of `,()=`.
    Word,
}

/// What an option is when it is not given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptionDefault {
    /// It must be given.
    Required,
    /// It is absent (a `None` in the typed options).
    Absent,
    /// This value, spelled as in a pipeline.
    Value(&'static str),
}

/// Whether the pipeline spelling of a pass prints an option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    /// Always (when it has a value).
    Always,
    /// Only when it differs from its default.
    IfChanged,
}

/// One option of a pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OptionDecl {
    /// The key in a pipeline (`world_size`).
    pub name: &'static str,
    /// Its type and range.
    pub kind: OptionKind,
    /// Its value when not given.
    pub default: OptionDefault,
    /// One line for `--help`.
    pub help: &'static str,
    /// When the pipeline spelling prints it.
    pub show: Show,
}

/// Whether a pass rewrites one trace at a time or the whole program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassLevel {
    /// One trace at a time; anchored in pipelines (`forward(cse)`), or on every trace.
    Trace,
    /// The whole program (forward, backward, parameters).
    Program,
}

/// A pass's declaration: everything about it but the code.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassDecl {
    /// The name pipelines use (`ddp`, `sort-waits`).
    pub name: &'static str,
    /// One line for `--help`.
    pub help: &'static str,
    /// Trace-level or program-level.
    pub level: PassLevel,
    /// Its options, in printing order.
    pub options: &'static [OptionDecl],
}

/// A typed option value.
#[derive(Clone, Debug, PartialEq)]
pub enum OptionValue {
    /// An [`OptionKind::Int`].
    Int(u64),
    /// An [`OptionKind::Float`].
    Float(f64),
    /// An [`OptionKind::Choice`] or [`OptionKind::Word`].
    Word(String),
}

impl fmt::Display for OptionValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionValue::Int(i) => write!(f, "{i}"),
            OptionValue::Float(x) => write!(f, "{x}"),
            OptionValue::Word(w) => f.write_str(w),
        }
    }
}

/// A pass's option values, one per declared option (`None`: absent), in declaration order.
#[derive(Clone, Debug, PartialEq)]
pub struct OptionValues {
    decl: &'static PassDecl,
    values: Vec<Option<OptionValue>>,
}

impl OptionValues {
    /// Every option at its default (required ones absent).
    pub fn defaults(decl: &'static PassDecl) -> OptionValues {
        let values = decl
            .options
            .iter()
            .map(|o| match o.default {
                OptionDefault::Value(v) => parse_value(decl, o, v).ok(),
                _ => None,
            })
            .collect();
        OptionValues { decl, values }
    }
    /// The declaration these values are for.
    pub fn decl(&self) -> &'static PassDecl {
        self.decl
    }
    fn index(&self, name: &str) -> usize {
        self.decl
            .options
            .iter()
            .position(|o| o.name == name)
            .unwrap_or_else(|| panic!("pass `{}` declares no option `{name}`", self.decl.name))
    }
    /// Sets an option (`None`: absent).
    ///
    /// # Panics
    /// If the pass declares no such option (a programming error, not user input).
    pub fn set(&mut self, name: &str, value: Option<OptionValue>) -> &mut Self {
        let i = self.index(name);
        self.values[i] = value;
        self
    }
    /// An option's value.
    ///
    /// # Panics
    /// If the pass declares no such option.
    pub fn get(&self, name: &str) -> Option<&OptionValue> {
        self.values[self.index(name)].as_ref()
    }
    /// An integer option (0 when absent or of another type: [`PassDecl::check`] rules that out).
    pub fn int(&self, name: &str) -> u64 {
        match self.get(name) {
            Some(OptionValue::Int(i)) => *i,
            _ => 0,
        }
    }
    /// A number option, `None` when absent.
    pub fn float(&self, name: &str) -> Option<f64> {
        match self.get(name) {
            Some(OptionValue::Float(x)) => Some(*x),
            Some(OptionValue::Int(i)) => Some(*i as f64),
            _ => None,
        }
    }
    /// A word or choice option, `None` when absent.
    pub fn word(&self, name: &str) -> Option<&str> {
        match self.get(name) {
            Some(OptionValue::Word(w)) => Some(w),
            _ => None,
        }
    }
}

fn bad(pass: &str, option: &str, value: &str, reason: impl Into<String>) -> PassError {
    PassError::BadValue {
        pass: pass.to_string(),
        option: option.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Parses one option value as its declaration says, range included.
fn parse_value(decl: &PassDecl, o: &OptionDecl, raw: &str) -> Result<OptionValue, PassError> {
    let v = match o.kind {
        OptionKind::Int { .. } => {
            OptionValue::Int(raw.parse::<u64>().map_err(|e| match e.kind() {
                std::num::IntErrorKind::PosOverflow => bad(
                    decl.name,
                    o.name,
                    raw,
                    format!("too large (at most {})", u64::MAX),
                ),
                _ => bad(decl.name, o.name, raw, "not a non-negative integer"),
            })?)
        }
        OptionKind::Float { .. } => match raw.parse::<f64>() {
            Ok(x) => OptionValue::Float(x),
            Err(_) => return Err(bad(decl.name, o.name, raw, "not a number")),
        },
        OptionKind::Choice(_) | OptionKind::Word => OptionValue::Word(raw.to_string()),
    };
    check_value(decl, o, &v)?;
    Ok(v)
}

/// Checks one value against its option's type and range.
fn check_value(decl: &PassDecl, o: &OptionDecl, v: &OptionValue) -> Result<(), PassError> {
    let shown = v.to_string();
    let fail = |reason: String| Err(bad(decl.name, o.name, &shown, reason));
    match (o.kind, v) {
        (OptionKind::Int { min, max }, OptionValue::Int(i)) => {
            if *i < min {
                return fail(format!("must be at least {min}"));
            }
            if *i > max {
                return fail(format!("must be at most {max}"));
            }
        }
        (OptionKind::Float { min, min_inclusive }, OptionValue::Float(x)) => {
            if !x.is_finite() {
                return fail("must be a finite number".into());
            }
            if *x < min || (!min_inclusive && *x == min) {
                return fail(if min == 0.0 && !min_inclusive {
                    "must be positive".into()
                } else {
                    format!(
                        "must be {} {min}",
                        if min_inclusive { "at least" } else { "above" }
                    )
                });
            }
        }
        (OptionKind::Choice(choices), OptionValue::Word(w)) => {
            if !choices.contains(&w.as_str()) {
                return fail(format!("expected one of {}", choices.join(", ")));
            }
        }
        (OptionKind::Word, OptionValue::Word(w)) => {
            if w.is_empty()
                || w.chars()
                    .any(|c| c.is_whitespace() || matches!(c, ',' | '(' | ')' | '='))
            {
                return fail("must be a word: no spaces and none of `,()=`".into());
            }
        }
        (kind, _) => return fail(format!("wrong type for {}", kind_name(kind))),
    }
    Ok(())
}

fn kind_name(k: OptionKind) -> String {
    match k {
        OptionKind::Int { min, max } if max == u64::MAX => format!("integer >= {min}"),
        OptionKind::Int { min, max } => format!("integer in {min}..={max}"),
        OptionKind::Float { min, .. } if min == f64::NEG_INFINITY => "number".into(),
        OptionKind::Float { min, min_inclusive } => {
            format!("number {} {min}", if min_inclusive { ">=" } else { ">" })
        }
        OptionKind::Choice(c) => c.join("|"),
        OptionKind::Word => "word".into(),
    }
}

impl PassDecl {
    /// The option named `name`.
    pub fn option(&self, name: &str) -> Option<&OptionDecl> {
        self.options.iter().find(|o| o.name == name)
    }
    fn valid_options(&self) -> String {
        if self.options.is_empty() {
            "(none)".into()
        } else {
            self.options
                .iter()
                .map(|o| o.name)
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
    /// Parses options as written in a pipeline: unknown keys, repeats, bad values, values out
    /// of range and missing required options are errors naming the pass and the option.
    pub fn parse(&'static self, given: &[(String, String)]) -> Result<OptionValues, PassError> {
        let mut values = OptionValues::defaults(self);
        let mut seen = vec![false; self.options.len()];
        for (k, raw) in given {
            let Some(i) = self.options.iter().position(|o| o.name == k) else {
                return Err(PassError::UnknownOption {
                    pass: self.name.to_string(),
                    option: k.clone(),
                    valid: self.valid_options(),
                });
            };
            if std::mem::replace(&mut seen[i], true) {
                return Err(bad(self.name, k, raw, "given twice"));
            }
            values.values[i] = Some(parse_value(self, &self.options[i], raw)?);
        }
        self.check(&values)?;
        Ok(values)
    }
    /// Checks values made in Rust as parsing would: types, ranges, required options.
    pub fn check(&self, values: &OptionValues) -> Result<(), PassError> {
        if values.decl.name != self.name || values.values.len() != self.options.len() {
            return Err(PassError::Failed {
                pass: self.name.to_string(),
                message: format!("options of pass `{}` given to it", values.decl.name),
            });
        }
        for (o, v) in self.options.iter().zip(&values.values) {
            match v {
                Some(v) => check_value(self, o, v)?,
                None if o.default == OptionDefault::Required => {
                    return Err(PassError::MissingOption {
                        pass: self.name.to_string(),
                        option: o.name.to_string(),
                    })
                }
                None => {}
            }
        }
        Ok(())
    }
    /// The pass as a pipeline spells it: options shown per their [`Show`].
    pub fn spell(&self, values: &OptionValues) -> String {
        self.spec(values).to_string()
    }
    /// The pass as a pipeline value, options shown per their [`Show`] (what [`Self::spell`]
    /// prints), so that callers build pipelines from typed options instead of strings.
    pub fn spec(&self, values: &OptionValues) -> PassSpec {
        let mut spec = PassSpec::new(self.name);
        for (o, v) in self.options.iter().zip(&values.values) {
            let Some(v) = v else { continue };
            let shown = match (o.show, o.default) {
                (Show::Always, _) | (_, OptionDefault::Required | OptionDefault::Absent) => true,
                (Show::IfChanged, OptionDefault::Value(d)) => {
                    parse_value(self, o, d).ok().as_ref() != Some(v)
                }
            };
            if shown {
                spec.options.push((o.name.to_string(), v.to_string()));
            }
        }
        spec
    }
    /// The `--help` text of the pass: its line, then one line per option.
    pub fn help_text(&self) -> String {
        let level = level_name(self.level);
        let mut s = format!("  {:<18} {} [{level}]\n", self.name, self.help);
        for o in self.options {
            let default = match o.default {
                OptionDefault::Required => "required".to_string(),
                OptionDefault::Absent => "optional".to_string(),
                OptionDefault::Value(v) => format!("default {v}"),
            };
            s += &format!(
                "      {:<16} {} ({}; {default})\n",
                o.name,
                o.help,
                kind_name(o.kind)
            );
        }
        s
    }
}

/// A pass built from a pipeline: program-level, or trace-level (run on the anchored traces).
pub enum BuiltPass {
    /// Runs on the program.
    Program(Box<dyn Pass>),
    /// Runs on one trace at a time.
    Trace(Box<dyn TracePass>),
}

type Builder = dyn Fn(&OptionValues) -> Result<BuiltPass, PassError> + Send + Sync;

/// One registered pass.
#[derive(Clone)]
pub struct PassEntry {
    /// What it is and takes.
    pub decl: &'static PassDecl,
    build: Arc<Builder>,
}

/// The passes pipelines can name: the built-in ones ([`PassRegistry::builtin`]) and any a
/// user registers.
///
/// ```
/// use tracepass_ir::Trace;
/// use tracepass_passes::{
///     Changed, PassContext, PassDecl, PassError, PassLevel, PassManager, PassRegistry,
///     TracePass,
/// };
/// struct CountNodes;
/// impl TracePass for CountNodes {
///     fn name(&self) -> &str {
///         "count-nodes"
///     }
///     fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
///         cx.stat("count-nodes", t.node_count() as u64);
///         Ok(Changed::No)
///     }
/// }
/// static COUNT_NODES: PassDecl = PassDecl {
///     name: "count-nodes",
///     help: "reports how many nodes each trace has",
///     level: PassLevel::Trace,
///     options: &[],
/// };
/// let mut reg = PassRegistry::with_builtins();
/// reg.register_trace_pass(&COUNT_NODES, |_| Ok(CountNodes)).unwrap();
/// let pm = PassManager::parse_with(&reg, "dce,backward(count-nodes)").unwrap();
/// assert_eq!(pm.pipeline(), "dce,backward(count-nodes)");
/// // the built-in registry does not know it
/// assert!(PassManager::parse("count-nodes").is_err());
/// ```
#[derive(Clone, Default)]
pub struct PassRegistry {
    entries: Vec<PassEntry>,
}

impl PassRegistry {
    /// A registry with no passes.
    pub fn new() -> PassRegistry {
        PassRegistry::default()
    }
    /// The built-in passes.
    pub fn builtin() -> &'static PassRegistry {
        static REG: OnceLock<PassRegistry> = OnceLock::new();
        REG.get_or_init(crate::catalog::builtin_registry)
    }
    /// A copy of the built-in registry, to extend.
    pub fn with_builtins() -> PassRegistry {
        PassRegistry::builtin().clone()
    }
    /// Registers a pass under its declaration's name; the builder gets validated options.
    /// A name already registered is an error.
    pub fn register(
        &mut self,
        decl: &'static PassDecl,
        build: impl Fn(&OptionValues) -> Result<BuiltPass, PassError> + Send + Sync + 'static,
    ) -> Result<&mut Self, PassError> {
        if self.get(decl.name).is_some() {
            return Err(PassError::Duplicate {
                name: decl.name.to_string(),
            });
        }
        if decl.name.is_empty()
            || !decl
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            || crate::pipeline::Anchor::from_name(decl.name).is_some()
        {
            return Err(PassError::BadPassName {
                name: decl.name.to_string(),
            });
        }
        self.entries.push(PassEntry {
            decl,
            build: Arc::new(build),
        });
        Ok(self)
    }
    /// Registers a program-level pass; its declaration must say [`PassLevel::Program`].
    pub fn register_pass<P: Pass + 'static>(
        &mut self,
        decl: &'static PassDecl,
        build: impl Fn(&OptionValues) -> Result<P, PassError> + Send + Sync + 'static,
    ) -> Result<&mut Self, PassError> {
        check_level(decl, PassLevel::Program)?;
        self.register(decl, move |o| Ok(BuiltPass::Program(Box::new(build(o)?))))
    }
    /// Registers a trace-level pass; its declaration must say [`PassLevel::Trace`].
    pub fn register_trace_pass<P: TracePass + 'static>(
        &mut self,
        decl: &'static PassDecl,
        build: impl Fn(&OptionValues) -> Result<P, PassError> + Send + Sync + 'static,
    ) -> Result<&mut Self, PassError> {
        check_level(decl, PassLevel::Trace)?;
        self.register(decl, move |o| Ok(BuiltPass::Trace(Box::new(build(o)?))))
    }
    /// The declaration of the pass named `name`.
    pub fn get(&self, name: &str) -> Option<&'static PassDecl> {
        self.entries
            .iter()
            .find(|e| e.decl.name == name)
            .map(|e| e.decl)
    }
    /// The registered names, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.decl.name).collect()
    }
    /// Builds a pass from a spec: unknown names and options are errors listing what is valid.
    pub fn build(&self, spec: &PassSpec) -> Result<BuiltPass, PassError> {
        let Some(e) = self.entries.iter().find(|e| e.decl.name == spec.name) else {
            return Err(PassError::UnknownPass {
                name: spec.name.clone(),
                valid: self.names().join(", "),
            });
        };
        let values = e.decl.parse(&spec.options)?;
        // printed back as the declaration spells the options, whatever the pass's own `spec`
        // says (its default is the bare name): provenance and reproducers name the pipeline
        // that ran
        let spelled = e.decl.spell(&values);
        Ok(match (e.build)(&values)? {
            BuiltPass::Program(pass) => BuiltPass::Program(Box::new(Spelled { pass, spelled })),
            BuiltPass::Trace(pass) => BuiltPass::Trace(Box::new(Spelled { pass, spelled })),
        })
    }
    /// The `--help` text: every pass, its options, and how to anchor trace-level ones.
    pub fn help(&self) -> String {
        let mut s = String::from(
            "Passes (trace-level ones run on every trace, or on one: `forward(cse)`, `backward(dce)`):\n",
        );
        for e in &self.entries {
            s += &e.decl.help_text();
        }
        s
    }
}

/// A built pass with the spelling its declaration gives its options.
struct Spelled<P: ?Sized> {
    pass: Box<P>,
    spelled: String,
}

impl Pass for Spelled<dyn Pass> {
    fn name(&self) -> &str {
        self.pass.name()
    }
    fn spec(&self) -> String {
        self.spelled.clone()
    }
    fn run(
        &self,
        p: &mut tracepass_ir::Program,
        cx: &mut crate::PassContext,
    ) -> Result<crate::Changed, PassError> {
        self.pass.run(p, cx)
    }
}

impl TracePass for Spelled<dyn TracePass> {
    fn name(&self) -> &str {
        self.pass.name()
    }
    fn spec(&self) -> String {
        self.spelled.clone()
    }
    fn run_on_trace(
        &self,
        t: &mut tracepass_ir::Trace,
        cx: &mut crate::PassContext,
    ) -> Result<crate::Changed, PassError> {
        self.pass.run_on_trace(t, cx)
    }
}

/// Refuses a declaration registered at the other level (help and anchors would be wrong).
fn check_level(decl: &PassDecl, registered: PassLevel) -> Result<(), PassError> {
    if decl.level == registered {
        return Ok(());
    }
    Err(PassError::WrongLevel {
        name: decl.name.to_string(),
        declared: level_name(decl.level),
        registered: level_name(registered),
    })
}

fn level_name(l: PassLevel) -> &'static str {
    match l {
        PassLevel::Trace => "trace",
        PassLevel::Program => "program",
    }
}

impl fmt::Debug for PassRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}
