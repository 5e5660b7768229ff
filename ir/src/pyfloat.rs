//! Python's float repr and float literals, so printed constants match Thunder byte for byte.

/// Python `repr(float)`: shortest round-trip digits, fixed notation for exponents in [-4, 16).
pub fn repr(v: f64) -> String {
    if v.is_nan() {
        return "float('nan')".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "float('inf')"
        } else {
            "float('-inf')"
        }
        .into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's LowerExp gives the shortest digits that round-trip: "7.978845608028654e-1".
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // position of the decimal point within digits
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let mant = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits.clone()
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

/// Parses a Python float literal or spelling of a special value.
pub fn parse(s: &str) -> Option<f64> {
    match s {
        "inf" | "float('inf')" | "float(\"inf\")" | "math.inf" => Some(f64::INFINITY),
        "-inf" | "float('-inf')" | "float(\"-inf\")" | "-math.inf" => Some(f64::NEG_INFINITY),
        "nan" | "float('nan')" | "float(\"nan\")" | "math.nan" => Some(f64::NAN),
        _ => s.parse::<f64>().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_python_repr() {
        let cases = [
            (0.7978845608028654, "0.7978845608028654"),
            (2.0, "2.0"),
            (0.5, "0.5"),
            (0.044715, "0.044715"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.0, "123456789012345.0"),
            (-3.5, "-3.5"),
            (25.0, "25.0"),
            (1.5e300, "1.5e+300"),
        ];
        for (v, want) in cases {
            assert_eq!(repr(v), want);
            assert_eq!(parse(&repr(v)), Some(v));
        }
        assert!(parse(&repr(f64::NAN)).unwrap().is_nan());
        assert_eq!(parse(&repr(f64::NEG_INFINITY)), Some(f64::NEG_INFINITY));
    }
}
