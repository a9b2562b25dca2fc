//! [`Duration`]: the Istio/Go duration strings of the API (`"1.5s"`, `"250ms"`, `"1m30s"`),
//! parsed exactly into nanoseconds and written back in one canonical spelling.
//!
//! The accepted grammar is Go's `time.ParseDuration`, which is what Istio's CRD validation
//! (`duration(self)`) and its Go clients accept: one or more `<decimal><unit>` terms, units
//! `ns`, `us`, `µs`/`μs`, `ms`, `s`, `m`, `h`, or the bare `0`. Unlike Go, negative durations are
//! rejected: no Istio field gives them a meaning.

use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NANOS_PER_MICRO: u128 = 1_000;
const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SECOND: u128 = 1_000_000_000;
const NANOS_PER_MINUTE: u128 = 60 * NANOS_PER_SECOND;
const NANOS_PER_HOUR: u128 = 60 * NANOS_PER_MINUTE;

/// Go's duration type is an `int64` of nanoseconds; nothing larger can reach an Istio proxy.
const MAX_NANOS: u128 = i64::MAX as u128;

/// Units from the largest down; the canonical form uses the largest one that divides exactly.
const UNITS: [(&str, u128); 6] = [
    ("h", NANOS_PER_HOUR),
    ("m", NANOS_PER_MINUTE),
    ("s", NANOS_PER_SECOND),
    ("ms", NANOS_PER_MILLI),
    ("us", NANOS_PER_MICRO),
    ("ns", 1),
];

/// A non-negative duration written as an Istio/Go duration string.
///
/// Serializes to a canonical string: the whole number of the largest unit that represents the
/// value exactly (`"90s"` for `"1m30s"`, `"1500ms"` for `"1.5s"`, `"1h"` for `"60m"`, `"0s"`).
/// Two spellings of the same length therefore compare and serialize equal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(std::time::Duration);

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationParseError {
    /// The string as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Duration {
    /// The zero duration.
    pub const ZERO: Duration = Duration(std::time::Duration::ZERO);

    /// The same length as a [`std::time::Duration`].
    pub fn as_std(&self) -> std::time::Duration {
        self.0
    }

    /// Builds a duration from a standard one (for tests and defaults).
    pub fn from_std(duration: std::time::Duration) -> Self {
        Duration(duration)
    }

    /// Total nanoseconds (fits in `u64`: parsing caps at Go's `int64` range).
    pub fn as_nanos(&self) -> u128 {
        self.0.as_nanos()
    }
}

impl From<std::time::Duration> for Duration {
    fn from(duration: std::time::Duration) -> Self {
        Duration(duration)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(duration: Duration) -> Self {
        duration.0
    }
}

impl FromStr for Duration {
    type Err = DurationParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let fail = |reason| DurationParseError {
            input: input.to_owned(),
            reason,
        };
        let mut rest = input;
        if let Some(stripped) = rest.strip_prefix('+') {
            rest = stripped;
        } else if rest.starts_with('-') {
            return Err(fail("negative durations are not allowed"));
        }
        if rest.is_empty() {
            return Err(fail("empty duration"));
        }
        // Go accepts a bare zero without a unit, and nothing else without one.
        if rest == "0" {
            return Ok(Duration::ZERO);
        }
        let mut total: u128 = 0;
        while !rest.is_empty() {
            let (term_nanos, after) = parse_term(rest).map_err(fail)?;
            total = total
                .checked_add(term_nanos)
                .filter(|t| *t <= MAX_NANOS)
                .ok_or_else(|| fail("duration too large"))?;
            rest = after;
        }
        Ok(Duration(nanos_to_std(total)))
    }
}

/// Parses one `<decimal><unit>` term; returns its nanoseconds and the remaining input.
fn parse_term(input: &str) -> Result<(u128, &str), &'static str> {
    let int_len = input.bytes().take_while(u8::is_ascii_digit).count();
    let (int_digits, after_int) = input.split_at(int_len);
    let (frac_digits, after_number) = match after_int.strip_prefix('.') {
        Some(after_dot) => {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            after_dot.split_at(frac_len)
        }
        None => ("", after_int),
    };
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err("expected a number");
    }
    let unit_len = after_number
        .char_indices()
        .find(|(_, c)| c.is_ascii_digit() || *c == '.')
        .map_or(after_number.len(), |(i, _)| i);
    let (unit, rest) = after_number.split_at(unit_len);
    let unit_nanos = match unit {
        "ns" => 1,
        "us" | "\u{00b5}s" | "\u{03bc}s" => NANOS_PER_MICRO,
        "ms" => NANOS_PER_MILLI,
        "s" => NANOS_PER_SECOND,
        "m" => NANOS_PER_MINUTE,
        "h" => NANOS_PER_HOUR,
        "" => return Err("missing unit (expected one of ns, us, µs, ms, s, m, h)"),
        _ => return Err("unknown unit (expected one of ns, us, µs, ms, s, m, h)"),
    };
    let too_large = "duration too large";
    let int_value: u128 = if int_digits.is_empty() {
        0
    } else {
        // More than 39 digits cannot fit a u128; the range check below catches the rest.
        int_digits.parse().map_err(|_| too_large)?
    };
    let mut nanos = int_value.checked_mul(unit_nanos).ok_or(too_large)?;
    // The fraction is exact up to nanosecond precision; finer digits are truncated, as in Go.
    let mut scale = unit_nanos;
    for digit in frac_digits.bytes() {
        if scale < 10 {
            break;
        }
        scale /= 10;
        nanos += u128::from(digit - b'0') * scale;
    }
    if nanos > MAX_NANOS {
        return Err(too_large);
    }
    Ok((nanos, rest))
}

fn nanos_to_std(nanos: u128) -> std::time::Duration {
    // Callers cap at i64::MAX nanoseconds, so the seconds fit in u64 and the remainder in u32.
    let secs = u64::try_from(nanos / NANOS_PER_SECOND).unwrap_or(u64::MAX);
    let subsec = u32::try_from(nanos % NANOS_PER_SECOND).unwrap_or(0);
    std::time::Duration::new(secs, subsec)
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        let (unit, size) = UNITS
            .iter()
            .find(|(_, size)| nanos.is_multiple_of(*size))
            .copied()
            .unwrap_or(("ns", 1));
        write!(f, "{}{}", nanos / size, unit)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Duration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"1.5s\", \"250ms\" or \"1m30s\"")
            }

            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<Duration, E> {
                value.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    /// Istio's CRDs bound every duration field but two from below (`>= 1ms`); those two
    /// use [`unbounded_schema`].
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut schema = unbounded_schema(generator);
        schema.insert(
            "x-kubernetes-validations".into(),
            serde_json::json!([{
                "rule": "duration(self) >= duration('1ms')",
                "message": "must be a duration of at least 1ms"
            }]),
        );
        schema
    }
}

/// The schema of a duration field without the 1 ms floor (DestinationRule's TCP
/// `idleTimeout`, where `0s` disables the timeout, and the hash cookie's `ttl`).
pub fn unbounded_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "description": "A duration such as \"1.5s\", \"250ms\" or \"1m30s\" (units ns, us, ms, s, m, h)."
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration as Std;

    fn parse(s: &str) -> Result<Std, DurationParseError> {
        s.parse::<Duration>().map(|d| d.as_std())
    }

    #[test]
    fn parses_istio_documentation_spellings() {
        assert_eq!(parse("1.5s").unwrap(), Std::from_millis(1500));
        assert_eq!(parse("250ms").unwrap(), Std::from_millis(250));
        assert_eq!(parse("1m30s").unwrap(), Std::from_secs(90));
        assert_eq!(parse("1h").unwrap(), Std::from_secs(3600));
        assert_eq!(parse("0.001s").unwrap(), Std::from_millis(1));
        assert_eq!(parse("24h").unwrap(), Std::from_secs(86_400));
        assert_eq!(parse("0").unwrap(), Std::ZERO);
        assert_eq!(parse("0s").unwrap(), Std::ZERO);
    }

    #[test]
    fn parses_every_unit_and_fraction_forms() {
        assert_eq!(parse("7ns").unwrap(), Std::from_nanos(7));
        assert_eq!(parse("3us").unwrap(), Std::from_micros(3));
        assert_eq!(parse("3µs").unwrap(), Std::from_micros(3));
        assert_eq!(parse("3μs").unwrap(), Std::from_micros(3));
        assert_eq!(parse(".5s").unwrap(), Std::from_millis(500));
        assert_eq!(parse("5.s").unwrap(), Std::from_secs(5));
        assert_eq!(parse("1h2m3s4ms5us6ns").unwrap(), Std::new(3723, 4_005_006));
        assert_eq!(parse("+2s").unwrap(), Std::from_secs(2));
        // Digits finer than a nanosecond are truncated, as Go does.
        assert_eq!(parse("1.0000000009s").unwrap(), Std::from_secs(1));
    }

    #[test]
    fn rejects_malformed_and_negative_strings_with_a_reason() {
        for (input, reason_part) in [
            ("", "empty"),
            ("-1s", "negative"),
            ("5", "missing unit"),
            ("5 s", "unknown unit"),
            ("5sec", "unknown unit"),
            ("1d", "unknown unit"),
            ("s", "expected a number"),
            (".s", "expected a number"),
            ("1.5", "missing unit"),
            ("1s-1s", "unknown unit"),
            ("9999999999h", "too large"),
            ("99999999999999999999999999999999999999999s", "too large"),
        ] {
            let err = parse(input).expect_err(input);
            assert_eq!(err.input, input);
            assert!(err.reason.contains(reason_part), "{input}: {}", err.reason);
        }
    }

    #[test]
    fn displays_in_the_largest_exact_unit() {
        let show = |s: &str| s.parse::<Duration>().unwrap().to_string();
        assert_eq!(show("1m30s"), "90s");
        assert_eq!(show("60m"), "1h");
        assert_eq!(show("1.5s"), "1500ms");
        assert_eq!(show("0.001s"), "1ms");
        assert_eq!(show("0"), "0s");
        assert_eq!(show("1500us"), "1500us");
        assert_eq!(show("1.000000001s"), "1000000001ns");
    }

    #[test]
    fn serde_round_trips_through_the_canonical_string() {
        let d: Duration = serde_json::from_value(serde_json::json!("2m")).unwrap();
        assert_eq!(serde_json::to_value(d).unwrap(), serde_json::json!("2m"));
        let err = serde_json::from_value::<Duration>(serde_json::json!(5)).unwrap_err();
        assert!(err.to_string().contains("duration string"), "{err}");
        let err = serde_json::from_value::<Duration>(serde_json::json!("5x")).unwrap_err();
        assert!(err.to_string().contains("invalid duration \"5x\""), "{err}");
    }
}
