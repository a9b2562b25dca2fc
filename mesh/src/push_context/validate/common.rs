//! Checks every kind shares: collecting findings, RE2 regexes, string matches, `exportTo`,
//! labels and selectors, durations, percentages — each as Istio 1.30 applies it.

use std::collections::BTreeMap;

use regex_syntax::ast::{self, Ast, Visitor};

use super::names;
use crate::api::{Duration, StringMatch};
use crate::config::{ConfigError, ConfigKey};

/// Collects the findings about one object.
pub struct Findings<'k> {
    pub key: &'k ConfigKey,
    pub list: Vec<ConfigError>,
}

impl<'k> Findings<'k> {
    pub fn new(key: &'k ConfigKey) -> Self {
        Findings {
            key,
            list: Vec::new(),
        }
    }

    pub fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.list.push(ConfigError::error(self.key, path, message));
    }

    pub fn warning(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.list
            .push(ConfigError::warning(self.key, path, message));
    }

    /// Reports `result`'s reason, if any, as an error at `path`.
    pub fn check(&mut self, path: impl Into<String>, result: Result<(), String>) {
        if let Err(reason) = result {
            self.error(path, reason);
        }
    }
}

/// Istio's longest regex (an approximation of Envoy's RE2 program-size limit).
const MAX_REGEX_LEN: usize = 1024;

/// A regex as Istio checks it: at most 1024 bytes, valid RE2 (Go's `regexp`, which is
/// what Envoy's RE2 accepts). `regex-syntax` parses a superset of RE2; the constructs RE2
/// lacks (class set operations `&&`, `--`, `~~` and the `x` verbose flag) are refused
/// explicitly. Look-around and back-references fail to parse in both.
pub fn check_regex(pattern: &str) -> Result<(), String> {
    if pattern.len() > MAX_REGEX_LEN {
        return Err(format!(
            "regex is longer than {MAX_REGEX_LEN} characters ({})",
            pattern.len()
        ));
    }
    let parsed = ast::parse::Parser::new()
        .parse(pattern)
        .map_err(|e| format!("invalid regular expression {pattern:?}: {}", e.kind()))?;
    struct Re2Only;
    impl Visitor for Re2Only {
        type Output = ();
        type Err = String;
        fn finish(self) -> Result<(), String> {
            Ok(())
        }
        fn visit_pre(&mut self, node: &Ast) -> Result<(), String> {
            if let Ast::Flags(f) = node
                && f.flags.flag_state(ast::Flag::IgnoreWhitespace).is_some()
            {
                return Err("the `x` flag is not supported by RE2".to_string());
            }
            if let Ast::Group(g) = node
                && let ast::GroupKind::NonCapturing(flags) = &g.kind
                && flags.flag_state(ast::Flag::IgnoreWhitespace).is_some()
            {
                return Err("the `x` flag is not supported by RE2".to_string());
            }
            Ok(())
        }
        fn visit_class_set_binary_op_pre(
            &mut self,
            _: &ast::ClassSetBinaryOp,
        ) -> Result<(), String> {
            Err("character class set operations (&&, --, ~~) are not supported by RE2".to_string())
        }
    }
    ast::visit(&parsed, Re2Only)
        .map_err(|e| format!("invalid regular expression {pattern:?}: {e}"))?;
    // Also run the translator so semantic errors (e.g. invalid Unicode classes) surface.
    regex_syntax::hir::translate::Translator::new()
        .translate(pattern, &parsed)
        .map_err(|e| format!("invalid regular expression {pattern:?}: {}", e.kind()))?;
    Ok(())
}

/// A regex member of a string match: non-empty and valid.
pub fn check_match_regex(f: &mut Findings, path: &str, m: &StringMatch) {
    if let StringMatch::Regex(re) = m {
        if re.is_empty() {
            f.error(format!("{path}.regex"), "regex must not be empty");
        } else {
            f.check(format!("{path}.regex"), check_regex(re));
        }
    }
}

/// A string match outside `uri`: a prefix must not be empty, a regex must be valid.
/// (`exact: ""` and `{}` are accepted.)
pub fn check_string_match(f: &mut Findings, path: &str, m: &StringMatch) {
    if let StringMatch::Prefix(p) = m
        && p.is_empty()
    {
        f.error(format!("{path}.prefix"), "prefix must not be empty");
    }
    check_match_regex(f, path, m);
}

/// Durations of the API (Envoy's millisecond timers): at least 1 ms, whole milliseconds.
pub fn check_duration(f: &mut Findings, path: &str, d: &Duration) {
    f.check(path, names::check_duration(d));
}

/// Durations the CRD schema bounds (`duration(self) >= duration('1ms')`) and the webhook
/// does not otherwise check.
pub fn check_duration_min(f: &mut Findings, path: &str, d: &Duration) {
    f.check(path, names::check_duration_min(d));
}

/// A fractional percentage of faults: 0, or 0.0001–100.
pub fn check_fault_percentage(f: &mut Findings, path: &str, value: f64) {
    let ok = value == 0.0 || (0.0001..=100.0).contains(&value);
    if !ok || value.is_nan() {
        f.error(
            format!("{path}.value"),
            format!("percentage must be 0 or between 0.0001 and 100 (got {value})"),
        );
    }
}

/// An integer percentage: 0–100.
pub fn check_int_percent(f: &mut Findings, path: &str, p: i64) {
    if !(0..=100).contains(&p) {
        f.error(
            path,
            format!("percentage must be between 0 and 100 (got {p})"),
        );
    }
}

/// What `exportTo` may hold for this kind.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ExportToOf {
    /// VirtualService, DestinationRule without a workload selector.
    Config,
    /// DestinationRule with a workload selector: its own namespace only.
    SelectorRule,
    /// ServiceEntry: `~` (nobody) is allowed too.
    ServiceEntry,
}

/// `exportTo` as Istio checks it: `.`, `*`, namespace names (and `~` for ServiceEntries),
/// no duplicates (`.` and the own namespace count as the same), `*` and `~` alone.
pub fn check_export_to(
    f: &mut Findings,
    path: &str,
    namespace: &str,
    export_to: &[String],
    of: ExportToOf,
) {
    if export_to.is_empty() {
        return;
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, entry) in export_to.iter().enumerate() {
        let item = format!("{path}[{i}]");
        let key = if entry == "." {
            namespace
        } else {
            entry.as_str()
        };
        if seen.contains(key) {
            if key != entry {
                f.error(
                    &item,
                    format!("duplicate entry: \".\" is the own namespace {namespace:?}"),
                );
            } else {
                f.error(&item, format!("duplicate entry {entry:?}"));
            }
            continue;
        }
        match key {
            "*" => {}
            "~" if of == ExportToOf::ServiceEntry => {}
            "~" => f.error(&item, "\"~\" (nobody) is allowed only for ServiceEntries"),
            name if names::is_dns1123_label(name) => {}
            _ => {
                f.error(
                    &item,
                    format!("{entry:?} must be \".\", \"*\" or a namespace name"),
                );
                continue;
            }
        }
        seen.insert(key);
    }
    if of == ExportToOf::SelectorRule && !seen.is_empty() {
        if !seen.contains(namespace) {
            f.error(
                path,
                "a DestinationRule with a workload selector can only be exported to its own namespace",
            );
        } else if seen.len() > 1 {
            f.error(
                path,
                "a DestinationRule with a workload selector can only be exported to its own namespace (one entry)",
            );
        }
    }
    if seen.contains("*") && export_to.len() > 1 {
        f.error(path, "\"*\" cannot be combined with other entries");
    }
    if seen.contains("~") && export_to.len() > 1 {
        f.error(path, "\"~\" (nobody) cannot be combined with other entries");
    }
}

/// Labels as Istio checks them (`sourceLabels`, subset and endpoint labels).
pub fn check_labels(f: &mut Findings, path: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        let item = format!("{path}[{k}]");
        f.check(&item, names::check_label_key(k));
        f.check(&item, names::check_label_value(v));
    }
}

/// A workload selector's labels: no empty key, no `*`; none at all is only a warning
/// (the selector then matches every workload of the namespace).
pub fn check_selector_labels(f: &mut Findings, path: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        let item = format!("{path}[{k}]");
        if k.is_empty() {
            f.error(&item, "a selector label key must not be empty");
        }
        if k.contains('*') || v.contains('*') {
            f.error(&item, "wildcards are not supported in selectors");
        }
    }
}

/// A workload selector (`matchLabels` at `path`) as Istio's schema and webhook judge it:
/// the labels' rules ([`check_selector_labels`]), at most `max_labels` of them, values of
/// at most 63 characters; none at all is a warning saying what the object then applies to.
pub fn check_workload_selector(
    f: &mut Findings,
    path: &str,
    labels: &BTreeMap<String, String>,
    max_labels: usize,
    applies_to_all: &str,
) {
    check_selector_labels(f, path, labels);
    if labels.is_empty() {
        f.warning(path, applies_to_all);
    }
    if labels.len() > max_labels {
        f.error(path, format!("at most {max_labels} labels are allowed"));
    }
    for (k, v) in labels {
        if v.len() > 63 {
            f.error(
                format!("{path}[{k}]"),
                "a selector label value has at most 63 characters",
            );
        }
    }
}

/// The annotations Istio refuses on every object: `istio.io/dry-run` (AuthorizationPolicy
/// only), its internal "always reject" marker and the internal parent references.
pub fn check_annotations(f: &mut Findings, annotations: Option<&BTreeMap<String, String>>) {
    let Some(annotations) = annotations else {
        return;
    };
    for (name, reason) in [
        (
            "istio.io/dry-run",
            "is supported on AuthorizationPolicies only",
        ),
        (
            "internal.istio.io/webhook-always-reject",
            "marks the object for rejection",
        ),
        (
            "internal.istio.io/parent-namespace",
            "is internal to Istio and may not be set by users",
        ),
        (
            "internal.istio.io/parents",
            "is internal to Istio and may not be set by users",
        ),
    ] {
        if annotations.contains_key(name) {
            f.error(
                format!("metadata.annotations[{name:?}]"),
                format!("annotation {name:?} {reason}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigKind;

    #[test]
    fn re2_accepts_what_envoy_accepts() {
        assert!(check_regex("^/api/v[0-9]+/.*$").is_ok());
        assert!(check_regex("(?i)jason").is_ok());
        assert!(check_regex("\\d{3}-[a-z]+").is_ok());
        assert!(check_regex("(?P<x>a)").is_ok());
    }

    #[test]
    fn re2_rejects_what_envoy_rejects() {
        assert!(
            check_regex("([a-z]+")
                .unwrap_err()
                .contains("invalid regular expression")
        );
        assert!(check_regex("(?=x)").is_err(), "look-ahead");
        assert!(check_regex("(a)\\1").is_err(), "back-reference");
        assert!(
            check_regex("[a-z&&[^aeiou]]")
                .unwrap_err()
                .contains("set operations")
        );
        assert!(check_regex("(?x) a b").unwrap_err().contains("`x` flag"));
        assert!(check_regex("*abc").is_err());
        assert!(
            check_regex(&"a".repeat(1025))
                .unwrap_err()
                .contains("longer")
        );
    }

    fn messages(export_to: &[&str], namespace: &str, of: ExportToOf) -> Vec<String> {
        let key = ConfigKey::new(ConfigKind::VirtualService, namespace, "n");
        let mut f = Findings::new(&key);
        let list: Vec<String> = export_to.iter().map(|s| s.to_string()).collect();
        check_export_to(&mut f, "spec.exportTo", namespace, &list, of);
        f.list.into_iter().map(|e| e.field_message()).collect()
    }

    #[test]
    fn export_to_follows_istio() {
        assert!(messages(&[".", "other"], "ns", ExportToOf::Config).is_empty());
        assert_eq!(messages(&[".", "ns"], "ns", ExportToOf::Config).len(), 1);
        assert_eq!(messages(&["~"], "ns", ExportToOf::Config).len(), 1);
        assert!(messages(&["~"], "ns", ExportToOf::ServiceEntry).is_empty());
        assert_eq!(
            messages(&["~", "a"], "ns", ExportToOf::ServiceEntry).len(),
            1
        );
        assert_eq!(messages(&["*", "a"], "ns", ExportToOf::Config).len(), 1);
        assert_eq!(messages(&["Bad_ns"], "ns", ExportToOf::Config).len(), 1);
        assert!(messages(&["."], "ns", ExportToOf::SelectorRule).is_empty());
        assert_eq!(messages(&["*"], "ns", ExportToOf::SelectorRule).len(), 1);
        assert_eq!(
            messages(&[".", "a"], "ns", ExportToOf::SelectorRule).len(),
            1
        );
    }
}
