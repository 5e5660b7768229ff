//! Whole-number and duration options, with messages that say what is wrong with a value
//! (clap's own says `unexpected argument '-1'`).

/// A count option (`--no-sync-steps`, ...): a whole number, with a message that says what is
/// wrong with anything else (clap's own says `unexpected argument '-1'`).
pub fn count(s: &str) -> Result<usize, String> {
    whole(s, 0).and_then(|n| {
        usize::try_from(n).map_err(|_| format!("{s} is too large (at most {})", usize::MAX))
    })
}

/// A count whose least value is 1 (`--world-size`, `--steps`): as [`count`], with a message
/// for a negative number that names that least value. 0 is read, and refused by the
/// subcommand with a message of its own (exit code 1, as for any value out of range).
pub fn count_from_1(s: &str) -> Result<usize, String> {
    whole(s, 1).and_then(|n| {
        usize::try_from(n).map_err(|_| format!("{s} is too large (at most {})", usize::MAX))
    })
}

/// As [`count`], for 64-bit values (`--seed`).
pub fn count64(s: &str) -> Result<u64, String> {
    whole(s, 0)
}

/// A whole number; `least` is the least value the option takes, for the message about a
/// negative one.
fn whole(s: &str, least: u64) -> Result<u64, String> {
    use std::num::IntErrorKind;
    s.trim().parse::<u64>().map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow => format!("{s} is too large (at most {})", u64::MAX),
        IntErrorKind::Empty => "expected a whole number, got nothing".to_string(),
        _ if s.trim().starts_with('-') && s.trim()[1..].parse::<f64>().is_ok() => {
            format!("{s} is negative; expected a whole number of at least {least}")
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
