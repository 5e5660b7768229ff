//! Whole-number and duration options, with messages that say what is wrong with a value (clap's own says
//! `unexpected argument '-1'`).

/// A count option (`--world-size`, `--steps`, ...): a whole number, with a message that says
/// what is wrong with anything else (clap's own says `unexpected argument '-1'`).
pub fn count(s: &str) -> Result<usize, String> {
    count64(s).and_then(|n| {
        usize::try_from(n).map_err(|_| format!("{s} is too large (at most {})", usize::MAX))
    })
}

/// As [`count`], for 64-bit values (`--seed`).
pub fn count64(s: &str) -> Result<u64, String> {
    use std::num::IntErrorKind;
    s.trim().parse::<u64>().map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow => format!("{s} is too large (at most {})", u64::MAX),
        IntErrorKind::Empty => "expected a whole number, got nothing".to_string(),
        _ if s.trim().starts_with('-') && s.trim()[1..].parse::<f64>().is_ok() => {
            format!("{s} is negative; expected a whole number of at least 0")
        }
        _ => format!("{s} is not a whole number"),
    })
}

/// The longest duration option (`--collective-timeout`): 1e9 s, about 31 years. Longer ones
/// overflow a deadline (`now + timeout`) and mean "forever" in all but name.
pub const MAX_SECONDS: f64 = 1e9;

/// A duration option in seconds: a positive, finite number of at most [`MAX_SECONDS`].
pub fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s} is not a number of seconds"))?;
    check_seconds(v)
}

/// As [`seconds`], for a value already read.
pub fn check_seconds(v: f64) -> Result<f64, String> {
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("{v}: must be a positive number of seconds"));
    }
    if v > MAX_SECONDS {
        return Err(format!(
            "{v:e} is too large (at most {MAX_SECONDS:e} seconds, about 31 years)"
        ));
    }
    Ok(v)
}
