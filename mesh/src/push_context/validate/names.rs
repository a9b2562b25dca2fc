//! The name rules Istio's validation applies (Istio 1.30: `pkg/config/validation/agent`,
//! `pkg/config/labels`, `pkg/config/visibility`): DNS-1123 labels, FQDNs and wildcard
//! domains, IP addresses and subnets, label keys and values, ports, header names and
//! values, Envoy durations. Each check returns the reason on failure, in our words.

use std::net::IpAddr;

use crate::api::Duration;

/// The longest DNS label, and the longest label *name* (after an optional prefix).
const MAX_LABEL: usize = 63;
/// The longest domain name Istio accepts (it counts bytes, not labels).
const MAX_DOMAIN: usize = 255;
/// The longest DNS prefix of a label key (`example.com/` in `example.com/name`).
const MAX_LABEL_KEY_PREFIX: usize = 253;

/// `[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?`, at most 63 bytes: Istio's DNS-1123 label
/// (upper case allowed, unlike Kubernetes object names).
pub fn is_dns1123_label(label: &str) -> bool {
    label.len() <= MAX_LABEL && dns1123_label_shape(label)
}

fn dns1123_label_shape(label: &str) -> bool {
    let bytes = label.as_bytes();
    let Some((&first, rest)) = bytes.split_first() else {
        return false;
    };
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    if !alnum(first) {
        return false;
    }
    match rest.split_last() {
        None => true,
        Some((&last, middle)) => alnum(last) && middle.iter().all(|&b| alnum(b) || b == b'-'),
    }
}

/// A first label that may be a wildcard: `*`, or a DNS-1123 label optionally preceded by
/// `*` or `*-` (`*foo`, `*-foo`), at most 63 bytes.
pub fn is_wildcard_dns1123_label(label: &str) -> bool {
    if label.len() > MAX_LABEL {
        return false;
    }
    if label == "*" {
        return true;
    }
    let rest = label
        .strip_prefix("*-")
        .or_else(|| label.strip_prefix('*'))
        .unwrap_or(label);
    dns1123_label_shape(rest)
}

fn domain_preconditions(name: &str) -> Result<(), String> {
    if name.len() > MAX_DOMAIN {
        return Err(format!(
            "domain name {name:?} is longer than {MAX_DOMAIN} characters"
        ));
    }
    if name.is_empty() {
        return Err("domain name must not be empty".to_string());
    }
    Ok(())
}

/// Dot-separated DNS-1123 labels; the top-level label may not be all digits and the name
/// may end with a dot (`istio.io.`).
fn check_dns1123_labels(domain: &str) -> Result<(), String> {
    let labels: Vec<&str> = domain.split('.').collect();
    let top = labels.last().copied().unwrap_or_default();
    if !top.is_empty() && top.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "domain name {domain:?}: the top-level label {top:?} must not be all digits"
        ));
    }
    for (i, label) in labels.iter().enumerate() {
        if i + 1 == labels.len() && label.is_empty() {
            return Ok(());
        }
        if !is_dns1123_label(label) {
            return Err(format!(
                "domain name {domain:?}: label {label:?} is not a DNS-1123 label"
            ));
        }
    }
    Ok(())
}

/// A fully-qualified domain name (no wildcard).
pub fn check_fqdn(name: &str) -> Result<(), String> {
    domain_preconditions(name)?;
    check_dns1123_labels(name)
}

/// A domain name whose first label may be a wildcard (`*`, `*.example.com`, `*x.com`).
pub fn check_wildcard_domain(domain: &str) -> Result<(), String> {
    domain_preconditions(domain)?;
    let (first, rest) = match domain.split_once('.') {
        Some((first, rest)) => (first, Some(rest)),
        None => (domain, None),
    };
    if !is_wildcard_dns1123_label(first) {
        return Err(format!(
            "domain name {domain:?}: label {first:?} is not a DNS-1123 label (a leading `*` is allowed)"
        ));
    }
    match rest {
        Some(rest) => check_dns1123_labels(rest),
        None => Ok(()),
    }
}

/// A wildcard only as a whole first label: `*` or `*.example.com`, not `*x.example.com`.
pub fn check_no_partial_wildcard(host: &str) -> Result<(), String> {
    if host.contains('*') && host != "*" && !host.starts_with("*.") {
        return Err(format!(
            "partial wildcard {host:?}: a wildcard must be the whole first label (`*.example.com`)"
        ));
    }
    Ok(())
}

/// An IPv4 or IPv6 address (no prefix length).
pub fn is_ip(address: &str) -> bool {
    address.parse::<IpAddr>().is_ok()
}

/// An IP address, or a CIDR block when the text holds exactly one `/`.
pub fn check_ip_subnet(subnet: &str) -> Result<(), String> {
    if subnet.matches('/').count() == 1 {
        let (address, bits) = subnet.split_once('/').unwrap_or_default();
        let max = match address.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => 32,
            Ok(IpAddr::V6(_)) => 128,
            Err(_) => return Err(format!("{subnet:?} is not a valid CIDR block")),
        };
        let digits =
            !bits.is_empty() && bits.len() <= 3 && bits.bytes().all(|b| b.is_ascii_digit());
        let no_leading_zero = bits == "0" || !bits.starts_with('0');
        return match bits.parse::<u8>() {
            Ok(n) if digits && no_leading_zero && n <= max => Ok(()),
            _ => Err(format!("{subnet:?} is not a valid CIDR block")),
        };
    }
    if is_ip(subnet) {
        Ok(())
    } else {
        Err(format!("{subnet:?} is not a valid IP address"))
    }
}

/// A port number in 1–65535.
pub fn check_port(port: i64) -> Result<(), String> {
    if (1..=65535).contains(&port) {
        Ok(())
    } else {
        Err(format!("port {port} is not in the range 1-65535"))
    }
}

/// `(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`: a label name or (non-empty) value.
fn is_qualified_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let Some((&last, rest)) = bytes.split_last() else {
        return false;
    };
    if !last.is_ascii_alphanumeric() {
        return false;
    }
    match rest.split_first() {
        None => true,
        Some((&first, middle)) => {
            first.is_ascii_alphanumeric()
                && middle
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
    }
}

/// A label key: `[prefix/]name`, the prefix dot-separated DNS-1123 labels of at most 253
/// bytes, the name a qualified name of at most 63 bytes.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| !p.is_empty() && p.split('.').all(dns1123_label_shape));
    if !prefix_ok || !is_qualified_name(name) {
        return Err(format!("invalid label key {key:?}"));
    }
    if prefix.is_some_and(|p| p.len() > MAX_LABEL_KEY_PREFIX) {
        return Err(format!("invalid label key {key:?}: its prefix is too long"));
    }
    if name.len() > MAX_LABEL {
        return Err(format!("invalid label key {key:?}: its name is too long"));
    }
    Ok(())
}

/// A label value: empty or a qualified name (Istio sets no length limit here).
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_qualified_name(value) {
        Ok(())
    } else {
        Err(format!("invalid label value {value:?}"))
    }
}

/// RFC 7230 token characters, which HTTP header names are made of.
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

/// The pseudo-headers a route may match on.
const PSEUDO_HEADERS: [&str; 5] = [":method", ":scheme", ":authority", ":path", ":status"];

/// The prefix of a header name that routes on a JWT claim instead of a header.
const JWT_CLAIM_PREFIX: &str = "@request.auth.claims";

/// Whether a match "header" is really a JWT claim (`@request.auth.claims.sub`,
/// `@request.auth.claims[sub]`), which only gateways can route on.
pub fn is_jwt_claim_route(name: &str) -> bool {
    if !name.to_ascii_lowercase().starts_with(JWT_CLAIM_PREFIX) {
        return false;
    }
    let rest = &name[JWT_CLAIM_PREFIX.len()..];
    (rest.starts_with('.') && rest.len() > 1)
        || (rest.starts_with('[') && rest.ends_with(']') && rest.len() > 2)
}

/// A header name in a match: a token, a pseudo-header, or a JWT claim.
pub fn check_match_header_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("header name must not be empty".to_string());
    }
    if is_jwt_claim_route(name) || PSEUDO_HEADERS.contains(&name) || is_token(name) {
        Ok(())
    } else {
        Err(format!("{name:?} is not a valid header name"))
    }
}

/// A header name in CORS `allowHeaders`/`exposeHeaders`: `*` or a token.
pub fn check_cors_header_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("header name must not be empty".to_string());
    }
    if name == "*" || is_token(name) {
        Ok(())
    } else {
        Err(format!("{name:?} is not a valid header name"))
    }
}

fn is_host_header(name: &str) -> bool {
    name.eq_ignore_ascii_case("host")
}

fn is_authority_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(":authority") || is_host_header(name)
}

/// A request header to add or set: anything but other pseudo-headers (`host` and
/// `:authority` rewrite the authority).
pub fn check_request_header_to_set(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("header name must not be empty".to_string());
    }
    if (name.starts_with(':') || is_host_header(name)) && !is_authority_header(name) {
        return Err(format!(
            "header {name:?} cannot be changed: it starts with ':'"
        ));
    }
    Ok(())
}

/// A request header to remove, or a response header to add, set or remove: not `host`
/// and not a pseudo-header.
pub fn check_header_to_change(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("header name must not be empty".to_string());
    }
    if is_host_header(name) {
        return Err(format!("header {name:?} cannot be changed here"));
    }
    if name.starts_with(':') {
        return Err(format!(
            "header {name:?} cannot be changed: it starts with ':'"
        ));
    }
    Ok(())
}

/// Whether `name` sets the authority (`host` or `:authority`).
pub fn sets_authority(name: &str) -> bool {
    is_authority_header(name)
}

/// A header value as Envoy's header formatter reads it: no control characters other
/// than tab, and every `%` either doubled (`%%`) or opening a complete `%VARIABLE%` /
/// `%VARIABLE(args)%` expression.
pub fn check_header_value(value: &str) -> Result<(), String> {
    if value
        .chars()
        .any(|c| (c <= '\u{8}') || ('\u{a}'..='\u{1f}').contains(&c) || c == '\u{7f}')
    {
        return Err(format!("header value {value:?} holds control characters"));
    }
    header_value_expressions(value).map_err(|reason| format!("header value {value:?}: {reason}"))
}

/// The states of Envoy's header-value formatter parser.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expr {
    Literal,
    VariableName,
    ArrayStart,
    ArrayString,
    InString,
    DelimiterOrEnd,
    ArgsEnd,
    VariableEnd,
}

fn header_value_expressions(value: &str) -> Result<(), &'static str> {
    let bytes = value.as_bytes();
    let mut state = Expr::Literal;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let has_next = i + 1 < bytes.len();
        state = match state {
            Expr::Literal if c != b'%' => Expr::Literal,
            Expr::Literal if !has_next => return Err("a '%' is not escaped (write %%)"),
            Expr::Literal if bytes[i + 1] == b'%' => {
                i += 1;
                Expr::Literal
            }
            Expr::Literal => Expr::VariableName,
            Expr::VariableName if c == b'%' => Expr::Literal,
            Expr::VariableName if c == b'(' => Expr::ArrayStart,
            Expr::VariableName => Expr::VariableName,
            Expr::ArrayStart if c == b'[' => Expr::ArrayString,
            Expr::ArrayStart if c != b' ' => Expr::InString,
            Expr::ArrayStart => Expr::ArrayStart,
            Expr::DelimiterOrEnd if c == b',' => Expr::ArrayString,
            Expr::DelimiterOrEnd if c == b']' => Expr::ArgsEnd,
            Expr::DelimiterOrEnd if c != b' ' => return Err("expected ',' or ']' in arguments"),
            Expr::DelimiterOrEnd => Expr::DelimiterOrEnd,
            Expr::ArrayString if c == b'"' => Expr::InString,
            Expr::ArrayString if c != b' ' => return Err("expected '\"' in arguments"),
            Expr::ArrayString => Expr::ArrayString,
            Expr::InString if c == b'\\' => {
                if !has_next {
                    return Err("a backslash ends the value");
                }
                i += 1;
                Expr::InString
            }
            Expr::InString if c == b')' => Expr::VariableEnd,
            Expr::InString if c == b'"' => Expr::DelimiterOrEnd,
            Expr::InString => Expr::InString,
            Expr::ArgsEnd if c == b')' => Expr::VariableEnd,
            Expr::ArgsEnd if c != b' ' => return Err("expected ')' after the arguments"),
            Expr::ArgsEnd => Expr::ArgsEnd,
            Expr::VariableEnd if c == b'%' => Expr::Literal,
            Expr::VariableEnd if c != b' ' => return Err("expected '%' to close the variable"),
            Expr::VariableEnd => Expr::VariableEnd,
        };
        i += 1;
    }
    if state == Expr::Literal {
        Ok(())
    } else {
        Err("a %VARIABLE% expression is not closed")
    }
}

/// A duration Envoy can hold: at least 1 ms and a whole number of milliseconds.
pub fn check_duration(d: &Duration) -> Result<(), String> {
    let nanos = d.as_nanos();
    if nanos < 1_000_000 {
        return Err(format!("duration must be at least 1ms (got {d})"));
    }
    if !nanos.is_multiple_of(1_000_000) {
        return Err(format!(
            "duration must be a whole number of milliseconds (got {d})"
        ));
    }
    Ok(())
}

/// The `duration(self) >= duration('1ms')` rule of Istio's CRDs (no precision rule).
pub fn check_duration_min(d: &Duration) -> Result<(), String> {
    if d.as_nanos() < 1_000_000 {
        return Err(format!("duration must be at least 1ms (got {d})"));
    }
    Ok(())
}

/// Istio's port-protocol names (`protocol.Parse`, any case); an empty protocol means
/// "detect".
pub fn is_istio_protocol(protocol: &str) -> bool {
    const KNOWN: [&str; 12] = [
        "tcp",
        "udp",
        "grpc",
        "grpc-web",
        "http",
        "http_proxy",
        "http2",
        "https",
        "tls",
        "mongo",
        "redis",
        "mysql",
    ];
    KNOWN.contains(&protocol.to_ascii_lowercase().as_str())
}

/// The protocol families Istio's ServiceEntry rules ask about.
pub fn protocol_is_http(protocol: &str) -> bool {
    matches!(
        protocol.to_ascii_lowercase().as_str(),
        "http" | "http2" | "http_proxy" | "grpc" | "grpc-web"
    )
}

pub fn protocol_is_tls(protocol: &str) -> bool {
    matches!(protocol.to_ascii_lowercase().as_str(), "https" | "tls")
}

pub fn protocol_is_tcp(protocol: &str) -> bool {
    matches!(
        protocol.to_ascii_lowercase().as_str(),
        "tcp" | "https" | "tls" | "mongo" | "redis" | "mysql"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_and_domains() {
        assert!(is_dns1123_label("Reviews-v1"));
        assert!(!is_dns1123_label("-a") && !is_dns1123_label("a_b") && !is_dns1123_label(""));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        for ok in [
            "*",
            "*x",
            "*-x",
            "x",
            "*.example.com",
            "*x.example.com",
            "istio.io.",
        ] {
            assert!(check_wildcard_domain(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "a.*.com", "**.com", "x*.com", "a..b", "10.0.0.1", "a.123",
        ] {
            assert!(check_wildcard_domain(bad).is_err(), "{bad}");
        }
        assert!(check_fqdn("*.example.com").is_err());
        assert!(check_fqdn("api.example.com").is_ok());
        assert!(check_no_partial_wildcard("*x.com").is_err());
        assert!(
            check_no_partial_wildcard("*.x.com").is_ok() && check_no_partial_wildcard("*").is_ok()
        );
    }

    #[test]
    fn addresses_subnets_and_ports() {
        assert!(check_ip_subnet("10.0.0.0/8").is_ok());
        assert!(check_ip_subnet("2001:db8::/32").is_ok());
        assert!(check_ip_subnet("10.0.0.1").is_ok());
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.0/08",
            "a/8",
            "1.2.3.4/8/9",
            "example.com",
        ] {
            assert!(check_ip_subnet(bad).is_err(), "{bad}");
        }
        assert!(check_port(1).is_ok() && check_port(65535).is_ok());
        assert!(check_port(0).is_err() && check_port(65536).is_err());
    }

    #[test]
    fn label_keys_and_values() {
        assert!(check_label_key("app.kubernetes.io/name").is_ok());
        assert!(check_label_key("version").is_ok());
        assert!(check_label_key("a/b/c").is_err());
        assert!(check_label_key("/x").is_err());
        assert!(check_label_key(&"a".repeat(64)).is_err());
        assert!(check_label_value("").is_ok() && check_label_value("v1.2_x").is_ok());
        assert!(check_label_value("bad value").is_err() && check_label_value("-x").is_err());
        assert!(
            check_label_value(&"a".repeat(100)).is_ok(),
            "no length limit"
        );
    }

    #[test]
    fn header_names_and_values() {
        assert!(check_match_header_name(":authority").is_ok());
        assert!(check_match_header_name("@request.auth.claims.sub").is_ok());
        assert!(check_match_header_name("bad header").is_err());
        assert!(is_jwt_claim_route("@request.auth.claims[a][b]"));
        assert!(!is_jwt_claim_route("@request.auth.claims."));
        assert!(check_request_header_to_set("Host").is_ok());
        assert!(check_request_header_to_set(":authority").is_ok());
        assert!(check_request_header_to_set(":path").is_err());
        assert!(check_header_to_change("host").is_err());
        assert!(check_header_to_change("x-anything goes").is_ok());
        for ok in [
            "foo",
            "%HOSTNAME%",
            "100%%",
            "a %START_TIME(%s)% b",
            "%REQ(x-a)%",
        ] {
            assert!(check_header_value(ok).is_ok(), "{ok}");
        }
        for bad in ["abc%123", "%START_TIME%%", "a\u{1}b", "%VAR"] {
            assert!(check_header_value(bad).is_err(), "{bad}");
        }
        assert!(check_header_value("tab\tok").is_ok());
    }

    #[test]
    fn durations_and_protocols() {
        let d = |s: &str| s.parse::<Duration>().unwrap();
        assert!(check_duration(&d("1ms")).is_ok());
        assert!(check_duration(&d("0s")).is_err());
        assert!(check_duration(&d("1500us")).is_err());
        assert!(check_duration_min(&d("1500us")).is_ok());
        assert!(is_istio_protocol("HTTP_PROXY") && is_istio_protocol("grpc-web"));
        assert!(
            !is_istio_protocol("http1") && !is_istio_protocol("QUIC") && !is_istio_protocol("")
        );
    }
}
