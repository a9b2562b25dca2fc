//! Host names as Istio treats them: short names resolved against a namespace and the
//! cluster domain, and wildcard matching (`*.example.com`, `*`).

/// Resolves a host as written in a config owned by `namespace`, as Istio does: a name
/// without a dot (`reviews`) becomes `reviews.<namespace>.svc.<domain>`; anything with a
/// dot (`reviews.other.svc.cluster.local`, `httpbin.org`), an IP address and wildcards are
/// kept as written (lower-cased). Istio does not expand `name.namespace`: write the FQDN
/// for another namespace's service.
pub fn resolve_short_name(host: &str, namespace: &str, domain: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    if host.starts_with('*') || host.contains('.') || host.contains(':') {
        return host;
    }
    format!("{host}.{namespace}.svc.{domain}")
}

/// Whether `pattern` (a config host, possibly a wildcard) matches the concrete `host`.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    if pattern == "*" || pattern == host {
        return true;
    }
    match pattern.strip_prefix('*') {
        // `*.example.com` matches `a.example.com` and `a.b.example.com`, not `example.com`.
        Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
        None => {
            // A wildcard host (a ServiceEntry `*.example.com`) is matched by a config that
            // names the same or a wider wildcard only.
            false
        }
    }
}

/// How specific a matching pattern is: exact hosts beat wildcards, longer wildcards beat
/// shorter ones. Used to pick the most specific config for a host, as Istio does.
pub fn specificity(pattern: &str) -> (bool, usize) {
    (!pattern.starts_with('*'), pattern.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_resolve_like_istio() {
        assert_eq!(
            resolve_short_name("reviews", "bookinfo", "cluster.local"),
            "reviews.bookinfo.svc.cluster.local"
        );
        assert_eq!(
            resolve_short_name("reviews.other", "bookinfo", "cluster.local"),
            "reviews.other"
        );
        assert_eq!(
            resolve_short_name("httpbin.org", "bookinfo", "cluster.local"),
            "httpbin.org"
        );
        assert_eq!(
            resolve_short_name("10.0.0.1", "bookinfo", "cluster.local"),
            "10.0.0.1"
        );
        assert_eq!(
            resolve_short_name("api.example.com", "bookinfo", "cluster.local"),
            "api.example.com"
        );
        assert_eq!(
            resolve_short_name("*.example.com", "x", "cluster.local"),
            "*.example.com"
        );
        assert_eq!(
            resolve_short_name("Reviews", "b", "c.d"),
            "reviews.b.svc.c.d"
        );
        assert_eq!(resolve_short_name("*", "b", "c.d"), "*");
    }

    #[test]
    fn wildcard_matching() {
        assert!(host_matches("*", "a.b"));
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(host_matches("*.example.com", "a.b.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("a.example.com", "b.example.com"));
        assert!(host_matches("a.example.com", "a.example.com"));
        assert!(specificity("a.example.com") > specificity("*.example.com"));
        assert!(specificity("*.a.example.com") > specificity("*.example.com"));
    }
}
