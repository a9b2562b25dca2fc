//! VirtualService delegation: a root VirtualService's `delegate` route is replaced by the
//! delegate's routes, each match merged with the root's (the delegate may only narrow it),
//! and root route settings filling what the delegate leaves unset — Istio's semantics.

use std::collections::BTreeMap;

use crate::api::{HttpMatchRequest, HttpRoute, StringMatch, VirtualServiceSpec};

/// Why a root match and a delegate match cannot be combined.
pub type Conflict = String;

/// A finding about one field: `(path, reason)`.
pub type FieldFinding = (String, String);

/// What a root finds under a delegate's name.
pub enum Found<'a> {
    /// An accepted delegate exported to the root's namespace.
    Usable(&'a VirtualServiceSpec),
    /// An accepted delegate whose `exportTo` leaves out the root's namespace: Istio skips
    /// the delegating route (with a warning) and serves the rest.
    NotExported,
    /// No accepted VirtualService of that name.
    Missing,
}

/// Expands the delegate routes of `root`. `lookup(namespace, name)` finds an accepted
/// delegate. Returns the expanded spec, or the path and reason of the first broken
/// delegate reference. Match combinations that conflict, and routes to delegates not
/// exported to the root's namespace, are dropped and reported as warnings `(path, reason)`.
pub fn expand<'a>(
    root: &VirtualServiceSpec,
    mut lookup: impl FnMut(&str, &str) -> Found<'a>,
) -> Result<(VirtualServiceSpec, Vec<FieldFinding>), FieldFinding> {
    let mut out = root.clone();
    let mut warnings = Vec::new();
    out.http.clear();
    for (i, route) in root.http.iter().enumerate() {
        let Some(d) = &route.delegate else {
            out.http.push(route.clone());
            continue;
        };
        let name = d.name.clone().unwrap_or_default();
        let ns = d.namespace.clone().unwrap_or_default();
        let delegate = match lookup(&ns, &name) {
            Found::Usable(delegate) => delegate,
            Found::NotExported => {
                warnings.push((
                    format!("spec.http[{i}].delegate"),
                    format!(
                        "delegate VirtualService {ns}/{name} is not exported to this namespace (its exportTo); the route is skipped"
                    ),
                ));
                continue;
            }
            Found::Missing => {
                return Err((
                    format!("spec.http[{i}].delegate"),
                    format!("delegate VirtualService {ns}/{name} does not exist or is not valid"),
                ));
            }
        };
        if !delegate.hosts.is_empty() {
            return Err((
                format!("spec.http[{i}].delegate"),
                format!("VirtualService {ns}/{name} has hosts, so it cannot be a delegate"),
            ));
        }
        for (j, droute) in delegate.http.iter().enumerate() {
            match merge_route(route, droute) {
                Ok(merged) => out.http.push(merged),
                Err(reason) => warnings.push((
                    format!("spec.http[{i}].delegate"),
                    format!("route http[{j}] of delegate {ns}/{name} is dropped: {reason}"),
                )),
            }
        }
    }
    Ok((out, warnings))
}

fn merge_route(root: &HttpRoute, delegate: &HttpRoute) -> Result<HttpRoute, Conflict> {
    let mut merged = delegate.clone();
    merged.r#match = match (root.r#match.is_empty(), delegate.r#match.is_empty()) {
        (true, _) => delegate.r#match.clone(),
        (false, true) => root.r#match.clone(),
        (false, false) => {
            let mut out = Vec::new();
            let mut last_conflict = None;
            for rm in &root.r#match {
                for dm in &delegate.r#match {
                    match merge_match(rm, dm) {
                        Ok(m) => out.push(m),
                        Err(c) => last_conflict = Some(c),
                    }
                }
            }
            if out.is_empty() {
                return Err(last_conflict
                    .unwrap_or_else(|| "no match can be combined with the root's".into()));
            }
            out
        }
    };
    if merged.name.is_none() {
        merged.name = root.name.clone();
    }
    // Route settings of the root apply where the delegate sets none.
    macro_rules! inherit {
        ($($field:ident),*) => {$(
            if merged.$field.is_none() {
                merged.$field = root.$field.clone();
            }
        )*};
    }
    inherit!(
        rewrite,
        timeout,
        retries,
        fault,
        mirror,
        mirror_percentage,
        mirror_percent,
        cors_policy,
        headers
    );
    if merged.mirrors.is_empty() && merged.mirror.is_none() {
        merged.mirrors = root.mirrors.clone();
    }
    Ok(merged)
}

fn merge_match(
    root: &HttpMatchRequest,
    delegate: &HttpMatchRequest,
) -> Result<HttpMatchRequest, Conflict> {
    let mut m = delegate.clone();
    m.uri = merge_uri(&root.uri, &delegate.uri)?;
    m.scheme = same_or_either("scheme", &root.scheme, &delegate.scheme)?;
    m.method = same_or_either("method", &root.method, &delegate.method)?;
    m.authority = same_or_either("authority", &root.authority, &delegate.authority)?;
    m.port = same_or_either("port", &root.port, &delegate.port)?;
    m.source_namespace = same_or_either(
        "sourceNamespace",
        &root.source_namespace,
        &delegate.source_namespace,
    )?;
    m.headers = union("headers", &root.headers, &delegate.headers)?;
    m.without_headers = union(
        "withoutHeaders",
        &root.without_headers,
        &delegate.without_headers,
    )?;
    m.query_params = union("queryParams", &root.query_params, &delegate.query_params)?;
    m.source_labels = union("sourceLabels", &root.source_labels, &delegate.source_labels)?;
    if m.gateways.is_empty() {
        m.gateways = root.gateways.clone();
    }
    m.ignore_uri_case = match (root.ignore_uri_case, delegate.ignore_uri_case) {
        (Some(a), Some(b)) => Some(a || b),
        (a, b) => a.or(b),
    };
    if m.name.is_none() {
        m.name = root.name.clone();
    }
    Ok(m)
}

/// The delegate may narrow the root's URI: a longer prefix, or an exact path under it.
fn merge_uri(
    root: &Option<StringMatch>,
    delegate: &Option<StringMatch>,
) -> Result<Option<StringMatch>, Conflict> {
    match (root, delegate) {
        (None, d) => Ok(d.clone()),
        (r, None) => Ok(r.clone()),
        (Some(r), Some(d)) if r == d => Ok(Some(d.clone())),
        (Some(StringMatch::Prefix(p)), Some(StringMatch::Prefix(q) | StringMatch::Exact(q)))
            if q.starts_with(p.as_str()) =>
        {
            Ok(delegate.clone())
        }
        (Some(r), Some(d)) => Err(format!("uri {d:?} is not within the root's uri {r:?}")),
    }
}

fn same_or_either<T: Clone + PartialEq + std::fmt::Debug>(
    field: &str,
    root: &Option<T>,
    delegate: &Option<T>,
) -> Result<Option<T>, Conflict> {
    match (root, delegate) {
        (Some(r), Some(d)) if r != d => {
            Err(format!("{field} {d:?} conflicts with the root's {r:?}"))
        }
        (r, d) => Ok(d.clone().or_else(|| r.clone())),
    }
}

fn union<V: Clone + PartialEq + std::fmt::Debug>(
    field: &str,
    root: &BTreeMap<String, V>,
    delegate: &BTreeMap<String, V>,
) -> Result<BTreeMap<String, V>, Conflict> {
    let mut out = root.clone();
    for (k, v) in delegate {
        match out.get(k) {
            Some(existing) if existing != v => {
                return Err(format!(
                    "{field}[{k}] {v:?} conflicts with the root's {existing:?}"
                ));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Delegate, Destination, HttpRouteDestination};

    fn route_to(host: &str) -> HttpRoute {
        HttpRoute {
            route: vec![HttpRouteDestination {
                destination: Destination {
                    host: host.into(),
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn prefix(p: &str) -> HttpMatchRequest {
        HttpMatchRequest {
            uri: Some(StringMatch::Prefix(p.into())),
            ..Default::default()
        }
    }

    #[test]
    fn delegate_routes_replace_the_delegate_route_in_order() {
        let root = VirtualServiceSpec {
            hosts: vec!["bookinfo.com".into()],
            http: vec![
                HttpRoute {
                    r#match: vec![prefix("/productpage")],
                    delegate: Some(Delegate {
                        name: Some("pp".into()),
                        namespace: Some("ns".into()),
                    }),
                    timeout: Some("5s".parse().unwrap()),
                    ..Default::default()
                },
                route_to("fallback"),
            ],
            ..Default::default()
        };
        let mut v2 = route_to("productpage-v2");
        v2.r#match = vec![prefix("/productpage/v2")];
        let delegate = VirtualServiceSpec {
            http: vec![v2, route_to("productpage-v1")],
            ..Default::default()
        };
        let (out, warnings) = expand(&root, |ns, name| {
            if ns == "ns" && name == "pp" {
                Found::Usable(&delegate)
            } else {
                Found::Missing
            }
        })
        .unwrap();
        assert!(warnings.is_empty());
        assert_eq!(out.http.len(), 3);
        assert_eq!(
            out.http[0].r#match[0].uri,
            Some(StringMatch::Prefix("/productpage/v2".into()))
        );
        assert_eq!(
            out.http[1].r#match[0].uri,
            Some(StringMatch::Prefix("/productpage".into()))
        );
        assert_eq!(
            out.http[1].timeout, root.http[0].timeout,
            "root settings fill the delegate's gaps"
        );
        assert_eq!(out.http[2].route[0].destination.host, "fallback");
    }

    #[test]
    fn conflicting_delegate_match_is_dropped_and_missing_delegate_is_an_error() {
        let root = VirtualServiceSpec {
            hosts: vec!["a.com".into()],
            http: vec![HttpRoute {
                r#match: vec![prefix("/a")],
                delegate: Some(Delegate {
                    name: Some("d".into()),
                    namespace: Some("ns".into()),
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut outside = route_to("x");
        outside.r#match = vec![prefix("/b")];
        let delegate = VirtualServiceSpec {
            http: vec![outside, route_to("y")],
            ..Default::default()
        };
        let (out, warnings) = expand(&root, |_, _| Found::Usable(&delegate)).unwrap();
        assert_eq!(out.http.len(), 1);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].1.contains("not within"), "{warnings:?}");
        let err = expand(&root, |_, _| Found::Missing).unwrap_err();
        assert_eq!(err.0, "spec.http[0].delegate");
        let (out, warnings) = expand(&root, |_, _| Found::NotExported).unwrap();
        assert!(out.http.is_empty(), "the delegating route is skipped");
        assert!(warnings[0].1.contains("not exported"), "{warnings:?}");
    }
}
