//! Checks shared by every kind: field-error collection, RE2-compatible regexes, durations,
//! percentages, `exportTo`, labels and names.

use std::collections::BTreeMap;

use regex_syntax::ast::{self, Ast, Visitor};

use crate::api::{Duration, Percent, StringMatch};
use crate::config::{ConfigError, ConfigKey};
use crate::push_context::hosts;

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
}

/// Validates a regex the way Envoy's RE2 engine would accept it. `regex-syntax` parses a
/// superset of RE2; the constructs RE2 lacks (class set operations `&&`, `--`, `~~` and the
/// `x` verbose flag) are rejected explicitly. Look-around and back-references fail to
/// parse in both.
pub fn check_re2(pattern: &str) -> Result<(), String> {
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

pub fn check_string_match(f: &mut Findings, path: &str, m: &StringMatch) {
    if let StringMatch::Regex(re) = m
        && let Err(e) = check_re2(re)
    {
        f.error(format!("{path}.regex"), e);
    }
}

pub fn check_string_match_map(f: &mut Findings, path: &str, map: &BTreeMap<String, StringMatch>) {
    for (name, m) in map {
        if name.is_empty() {
            f.error(path, "names must not be empty");
        }
        check_string_match(f, &format!("{path}[{name}]"), m);
    }
}

/// Durations below 1 ms cannot be expressed by Envoy's millisecond timers: Istio rejects them.
pub fn check_duration_min_ms(f: &mut Findings, path: &str, d: &Duration) {
    if d.as_std() < std::time::Duration::from_millis(1) {
        f.error(path, format!("duration must be at least 1ms (got {d})"));
    }
}

pub fn check_percent(f: &mut Findings, path: &str, p: &Percent) {
    if !(0.0..=100.0).contains(&p.value) || p.value.is_nan() {
        f.error(
            format!("{path}.value"),
            format!("percentage must be between 0 and 100 (got {})", p.value),
        );
    }
}

pub fn check_int_percent(f: &mut Findings, path: &str, p: i64) {
    if !(0..=100).contains(&p) {
        f.error(
            path,
            format!("percentage must be between 0 and 100 (got {p})"),
        );
    }
}

pub fn check_port(f: &mut Findings, path: &str, port: u32) {
    if !(1..=65535).contains(&port) {
        f.error(
            path,
            format!("port must be between 1 and 65535 (got {port})"),
        );
    }
}

pub fn check_non_negative(f: &mut Findings, path: &str, v: i64) {
    if v < 0 {
        f.error(path, format!("must not be negative (got {v})"));
    }
}

/// `exportTo`: `.`, `*`, `~` or namespace names; `~` alone; no duplicates.
pub fn check_export_to(f: &mut Findings, path: &str, export_to: &[String]) {
    let mut seen = std::collections::BTreeSet::new();
    for (i, e) in export_to.iter().enumerate() {
        if !seen.insert(e) {
            f.error(format!("{path}[{i}]"), format!("duplicate entry {e:?}"));
        }
        match e.as_str() {
            "." | "*" | "~" => {}
            ns => {
                if let Err(r) = check_dns1123_label(ns) {
                    f.error(
                        format!("{path}[{i}]"),
                        format!("must be \".\", \"*\", \"~\" or a namespace name: {r}"),
                    );
                }
            }
        }
    }
    if export_to.len() > 1 && export_to.iter().any(|e| e == "~") {
        f.error(
            path,
            "\"~\" (export to nobody) cannot be combined with other entries",
        );
    }
}

/// A Kubernetes namespace or subset name: lower-case DNS-1123 label.
pub fn check_dns1123_label(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err(format!("{name:?} must be 1 to 63 characters"));
    }
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok_chars || name.starts_with('-') || name.ends_with('-') {
        return Err(format!(
            "{name:?} must consist of lower-case letters, digits and '-', and start and end with a letter or digit"
        ));
    }
    Ok(())
}

/// Kubernetes label keys (`[prefix/]name`) and values.
pub fn check_labels(f: &mut Findings, path: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        if let Err(r) = check_label_key(k) {
            f.error(format!("{path}[{k}]"), r);
        }
        if let Err(r) = check_label_value(v) {
            f.error(format!("{path}[{k}]"), r);
        }
    }
}

fn check_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        hosts::check_host(p, false).map_err(|r| format!("label key prefix: {r}"))?;
    }
    check_label_value(name)
        .and_then(|()| {
            if name.is_empty() {
                Err("label key name must not be empty".into())
            } else {
                Ok(())
            }
        })
        .map_err(|r| format!("label key {k:?}: {r}"))
}

fn check_label_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err(format!("label value {v:?} is longer than 63 characters"));
    }
    if v.is_empty() {
        return Ok(());
    }
    let ok = v
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let edges = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !ok || !edges(v.chars().next()) || !edges(v.chars().last()) {
        return Err(format!(
            "label value {v:?} must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// HTTP header names as Envoy accepts them for manipulation: RFC 7230 tokens; pseudo
/// headers (`:path`) cannot be changed this way.
pub fn check_header_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("header name must not be empty".to_string());
    }
    if name.starts_with(':') {
        return Err(format!("pseudo-header {name:?} cannot be manipulated"));
    }
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if !name.chars().all(token) {
        return Err(format!("{name:?} is not a valid HTTP header name"));
    }
    Ok(())
}

/// An IP address or CIDR block.
pub fn check_ip_or_cidr(s: &str) -> Result<(), String> {
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let ip: std::net::IpAddr = addr
        .parse()
        .map_err(|_| format!("{s:?} is not an IP address or CIDR block"))?;
    if let Some(p) = prefix {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        match p.parse::<u8>() {
            Ok(bits) if bits <= max => {}
            _ => return Err(format!("{s:?} has an invalid prefix length")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn re2_accepts_what_envoy_accepts() {
        assert!(check_re2("^/api/v[0-9]+/.*$").is_ok());
        assert!(check_re2("(?i)jason").is_ok());
        assert!(check_re2("\\d{3}-[a-z]+").is_ok());
        assert!(check_re2("(?P<x>a)").is_ok());
    }

    #[test]
    fn re2_rejects_what_envoy_rejects() {
        assert!(
            check_re2("([a-z]+")
                .unwrap_err()
                .contains("invalid regular expression")
        );
        assert!(check_re2("(?=x)").is_err(), "look-ahead");
        assert!(check_re2("(a)\\1").is_err(), "back-reference");
        assert!(
            check_re2("[a-z&&[^aeiou]]")
                .unwrap_err()
                .contains("set operations")
        );
        assert!(check_re2("(?x) a b").unwrap_err().contains("`x` flag"));
        assert!(check_re2("*abc").is_err());
    }

    #[test]
    fn names_and_labels() {
        assert!(check_dns1123_label("v1").is_ok());
        assert!(check_dns1123_label("V1").is_err());
        assert!(check_dns1123_label("-a").is_err());
        let key = ConfigKey::new(crate::config::ConfigKind::DestinationRule, "ns", "n");
        let mut f = Findings::new(&key);
        check_labels(
            &mut f,
            "spec.subsets[0].labels",
            &[
                ("app.kubernetes.io/name".to_string(), "x".to_string()),
                ("version".to_string(), "bad value".to_string()),
            ]
            .into(),
        );
        assert_eq!(f.list.len(), 1);
        assert_eq!(f.list[0].path, "spec.subsets[0].labels[version]");
    }

    #[test]
    fn header_names_ip_and_export_to() {
        assert!(check_header_name("x-request-id").is_ok());
        assert!(check_header_name(":path").is_err());
        assert!(check_header_name("bad header").is_err());
        assert!(check_ip_or_cidr("10.0.0.0/8").is_ok());
        assert!(check_ip_or_cidr("2001:db8::/32").is_ok());
        assert!(check_ip_or_cidr("10.0.0.0/33").is_err());
        assert!(check_ip_or_cidr("example.com").is_err());
        let key = ConfigKey::new(crate::config::ConfigKind::VirtualService, "ns", "n");
        let mut f = Findings::new(&key);
        check_export_to(
            &mut f,
            "spec.exportTo",
            &["~".into(), "a".into(), "a".into(), "Bad".into()],
        );
        let msgs: Vec<_> = f.list.iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
    }
}
