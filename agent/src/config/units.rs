//! Sizes and durations with units, as config keys and flags take them: `32MiB`, `512KiB`,
//! `1GiB` or plain bytes; `500ms`, `10s`, `1m`, `1h`.
//!
//! Sizes are parsed by the `parse-size` crate, durations by `humantime`; this module gives
//! both one error that says what was expected, and the serde hooks the config sections
//! use (so a bad value is reported at its line, as every config error is).

use std::time::Duration;

use serde::{de, Deserializer};

/// A value that is not a size or not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// Not a size.
    #[error("{0:?} is not a size: write bytes (1048576) or a number and a unit (512KiB, 32MiB, 1GiB; KB, MB, GB are powers of 1000)")]
    Size(String),
    /// A size past what the key holds.
    #[error("{0:?} is too large (at most {1} bytes)")]
    TooLarge(String, u64),
    /// Not a duration.
    #[error("{0:?} is not a duration: write a number and a unit (500ms, 10s, 1m, 1h)")]
    Duration(String),
}

/// Bytes from `1048576`, `32MiB`, `32 MiB`, `1.5GiB`, `64KB` (powers of 1000) or `64k`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let t = text.trim();
    // parse-size takes a sign-less number only; say so in our words, not its.
    if t.is_empty() || t.starts_with(['-', '+']) {
        return Err(UnitError::Size(text.to_owned()));
    }
    parse_size::parse_size(t).map_err(|_| UnitError::Size(text.to_owned()))
}

/// A duration from `500ms`, `10s`, `1m`, `1h30m` or `0`.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    humantime::parse_duration(text.trim()).map_err(|_| UnitError::Duration(text.to_owned()))
}

/// A size key: a YAML integer (bytes, as before units) or a string with a unit, into any
/// unsigned type that holds it.
pub(crate) fn size<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    let bytes = d.deserialize_any(SizeVisitor)?;
    T::try_from(bytes).map_err(|_| {
        // The largest the key holds: its type's maximum, found without naming the type.
        let max = (0..64u32)
            .rev()
            .map(|b| (1u64 << b) | ((1u64 << b) - 1))
            .find(|m| T::try_from(*m).is_ok())
            .unwrap_or(0);
        de::Error::custom(UnitError::TooLarge(bytes.to_string(), max))
    })
}

/// A duration key: a string with a unit.
pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(DurationVisitor)
}

struct SizeVisitor;

impl de::Visitor<'_> for SizeVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a size: bytes, or a number and a unit (512KiB, 32MiB, 1GiB)")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(UnitError::Size(v.to_string())))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        parse_size(v).map_err(E::custom)
    }
}

struct DurationVisitor;

impl de::Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a duration: a number and a unit (500ms, 10s, 1m, 1h)")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
        // Only 0 needs no unit; any other bare number is ambiguous (seconds? ms?).
        if v == 0 {
            Ok(Duration::ZERO)
        } else {
            Err(E::custom(UnitError::Duration(v.to_string())))
        }
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
        Err(E::custom(UnitError::Duration(v.to_string())))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
        Err(E::custom(UnitError::Duration(v.to_string())))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        parse_duration(v).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_and_decimal_units_and_plain_bytes() {
        for (text, want) in [
            ("1048576", 1 << 20),
            ("32MiB", 32 << 20),
            ("32 MiB", 32 << 20),
            ("512KiB", 512 << 10),
            ("1GiB", 1 << 30),
            ("1.5GiB", 3 << 29),
            ("64KB", 64_000),
            ("0", 0),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for bad in ["", "-1", "+5", "32XiB", "MiB", "32 MiB extra"] {
            let err = parse_size(bad).unwrap_err().to_string();
            assert!(
                err.contains(&format!("{bad:?} is not a size")) && err.contains("32MiB"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn durations_need_units() {
        for (text, want) in [
            ("500ms", Duration::from_millis(500)),
            ("10s", Duration::from_secs(10)),
            ("1m", Duration::from_secs(60)),
            ("1h", Duration::from_secs(3600)),
            ("1m30s", Duration::from_secs(90)),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in ["", "10", "ten seconds", "5x", "-1s"] {
            let err = parse_duration(bad).unwrap_err().to_string();
            assert!(
                err.contains(&format!("{bad:?} is not a duration")) && err.contains("500ms"),
                "{bad}: {err}"
            );
        }
    }

    #[derive(serde::Deserialize, Debug)]
    struct Keys {
        #[serde(deserialize_with = "size")]
        small: u32,
        #[serde(deserialize_with = "size")]
        big: u64,
        #[serde(deserialize_with = "duration")]
        wait: Duration,
    }

    #[test]
    fn keys_take_integers_and_units_and_refuse_what_does_not_fit() {
        let k: Keys = serde_yaml::from_str("small: 4096\nbig: 1GiB\nwait: 1m\n").expect("parse");
        assert_eq!(
            (k.small, k.big, k.wait),
            (4096, 1 << 30, Duration::from_secs(60))
        );
        let k: Keys = serde_yaml::from_str("small: 1MiB\nbig: 7\nwait: 0\n").expect("parse");
        assert_eq!((k.small, k.big, k.wait), (1 << 20, 7, Duration::ZERO));
        let e = serde_yaml::from_str::<Keys>("small: 8GiB\nbig: 1\nwait: 1s\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"8589934592\" is too large (at most 4294967295 bytes)"),
            "{e}"
        );
        let e = serde_yaml::from_str::<Keys>("small: 1\nbig: -3\nwait: 1s\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"-3\" is not a size"), "{e}");
        let e = serde_yaml::from_str::<Keys>("small: 1\nbig: 1\nwait: 30\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"30\" is not a duration"), "{e}");
    }
}
