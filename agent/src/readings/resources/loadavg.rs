//! `/proc/loadavg`: `0.20 0.18 0.12 1/80 11206` — load averages over 1, 5 and 15 minutes,
//! runnable/total scheduling entities, last pid.

use super::ParseError;

const FILE: &str = "/proc/loadavg";

/// The three load averages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadAvg {
    /// 1, 5 and 15 minutes.
    pub load: [f64; 3],
}

/// Parses the text of `/proc/loadavg`.
pub fn parse(text: &str) -> Result<LoadAvg, ParseError> {
    let f: Vec<&str> = text.split_whitespace().collect();
    if f.len() < 3 {
        return Err(ParseError::new(
            FILE,
            format!("expected 5 fields, got {text:?}"),
        ));
    }
    let mut load = [0.0; 3];
    for (l, s) in load.iter_mut().zip(&f) {
        *l = s
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| ParseError::new(FILE, format!("{s:?} is not a load average")))?;
    }
    Ok(LoadAvg { load })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert_eq!(
            parse("0.20 0.18 0.12 1/80 11206\n").expect("parses").load,
            [0.20, 0.18, 0.12]
        );
        assert!(parse("0.20 0.18\n").is_err());
        assert!(parse("0.20 x 0.12 1/80 11206\n").is_err());
        assert!(parse("NaN 1 1 1/1 1\n").is_err());
        assert!(parse("").is_err());
    }
}
