//! Small builders shared by the generators: `Any` packing, protobuf well-known wrappers,
//! durations, percentages, the ADS config source, and Istio's string matchers.

use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, config_source::ConfigSourceSpecifier,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent::DenominatorType};
use envoy_types::pb::google::protobuf::{Any, BoolValue, Duration, UInt32Value};
use pilotfish_mesh::api::StringMatch;

/// Packs a message into the `Any` Envoy expects (type URL from the message's full name).
pub fn any<M: prost::Message + prost::Name>(message: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}

/// The `Any` of the resource seam (`prost_types`), which the ADS engine sends.
pub fn resource_any<M: prost::Message + prost::Name>(message: &M) -> prost_types::Any {
    prost_types::Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}

pub fn u32_value(value: u32) -> Option<UInt32Value> {
    Some(UInt32Value { value })
}

pub fn bool_value(value: bool) -> Option<BoolValue> {
    Some(BoolValue { value })
}

pub fn duration(d: std::time::Duration) -> Option<Duration> {
    Some(Duration {
        // Istio durations are capped at Go's int64 nanoseconds, far below i64 seconds.
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    })
}

pub fn api_duration(d: &pilotfish_mesh::api::Duration) -> Option<Duration> {
    duration(d.as_std())
}

/// A zero duration: Envoy's "disabled" for timeouts.
pub fn zero_duration() -> Option<Duration> {
    Some(Duration::default())
}

/// A percentage (0.0–100.0) as Envoy's `FractionalPercent` per million, as Istio writes it.
pub fn percent(value: f64) -> FractionalPercent {
    let clamped = value.clamp(0.0, 100.0);
    FractionalPercent {
        numerator: (clamped * 10_000.0).round() as u32,
        denominator: DenominatorType::Million as i32,
    }
}

/// A whole percentage per hundred (Istio's deprecated integer percent fields).
pub fn percent_hundred(value: u32) -> FractionalPercent {
    FractionalPercent {
        numerator: value.min(100),
        denominator: DenominatorType::Hundred as i32,
    }
}

/// `ads: {}` with resource API version 3: where sidecars and gRPC clients fetch RDS and EDS.
/// `initial_fetch_timeout: 0s` (Istio's choice for sidecars) keeps a listener or cluster
/// warming until its dependency arrives instead of starting with nothing.
pub fn ads_config_source(initial_fetch_timeout_zero: bool) -> ConfigSource {
    ConfigSource {
        initial_fetch_timeout: if initial_fetch_timeout_zero {
            zero_duration()
        } else {
            None
        },
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

/// Envoy's string matcher for an Istio `StringMatch`; `None` for the match-anything `{}`.
pub fn string_matcher(m: &StringMatch, ignore_case: bool) -> Option<StringMatcher> {
    let pattern = match m {
        StringMatch::Exact(s) => MatchPattern::Exact(s.clone()),
        StringMatch::Prefix(s) => MatchPattern::Prefix(s.clone()),
        StringMatch::Regex(s) => MatchPattern::SafeRegex(regex_matcher(s)),
        StringMatch::Any => return None,
    };
    Some(StringMatcher {
        ignore_case: ignore_case && !matches!(m, StringMatch::Regex(_)),
        match_pattern: Some(pattern),
    })
}

/// An RE2 regex matcher (the engine field is deprecated; RE2 is Envoy's default).
pub fn regex_matcher(regex: &str) -> RegexMatcher {
    RegexMatcher {
        regex: regex.to_string(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_are_per_million_and_clamped() {
        assert_eq!(percent(0.5).numerator, 5_000);
        assert_eq!(percent(100.0).numerator, 1_000_000);
        assert_eq!(percent(150.0).numerator, 1_000_000);
        assert_eq!(percent(-1.0).numerator, 0);
        assert_eq!(percent_hundred(120).numerator, 100);
    }

    #[test]
    fn durations_keep_subsecond_precision() {
        let d = duration(std::time::Duration::from_millis(1500)).unwrap();
        assert_eq!((d.seconds, d.nanos), (1, 500_000_000));
    }

    #[test]
    fn string_matchers_follow_istio() {
        let m = string_matcher(&StringMatch::Prefix("/a".into()), true).unwrap();
        assert!(m.ignore_case);
        assert_eq!(m.match_pattern, Some(MatchPattern::Prefix("/a".into())));
        let m = string_matcher(&StringMatch::Regex("a.*".into()), true).unwrap();
        assert!(!m.ignore_case, "case folding does not apply to regexes");
        assert!(string_matcher(&StringMatch::Any, false).is_none());
    }
}
