//! What generating a part noticed that operators should hear about, as data: features
//! left out for proxyless clients, route destinations without a cluster, endpoints that
//! cannot be sent, references the sanitizer had to replace. The generators only collect
//! [`Finding`]s; the snapshot logs and counts them, once per generated part (the way
//! ztunnel gathers its `RejectedConfig`s), so translation stays free of telemetry.

use std::borrow::Cow;

/// A configured feature left out (or replaced) for proxyless gRPC clients, because gRPC's
/// xDS client lacks it and would reject the resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Downgrade {
    /// What was left out, as the metric labels it (`hash_policy`, `cors`, …).
    pub feature: &'static str,
    /// The resource or namespace concerned (a cluster name, a proxy namespace, `route`).
    pub resource: String,
    /// What gRPC does not support, in words, for the log line.
    pub what: Cow<'static, str>,
}

impl Downgrade {
    pub fn new(
        feature: &'static str,
        resource: impl Into<String>,
        what: impl Into<Cow<'static, str>>,
    ) -> Self {
        Downgrade {
            feature,
            resource: resource.into(),
            what: what.into(),
        }
    }
}

/// The kind of route whose destination did not resolve (the metric's label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteKind {
    /// An HTTP route (or its mirror): it answers 503 for that share.
    Http,
    /// A TCP route: its connections go to `BlackHoleCluster`.
    Tcp,
}

impl RouteKind {
    pub fn label(self) -> &'static str {
        match self {
            RouteKind::Http => "http",
            RouteKind::Tcp => "tcp",
        }
    }
}

/// One thing a generator noticed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// A feature left out or replaced for proxyless clients.
    Downgrade(Downgrade),
    /// A route destination naming a host or port the proxy has no cluster for.
    UnresolvedDestination {
        kind: RouteKind,
        cluster: String,
        /// The proxy's namespace (HTTP routes log it).
        namespace: String,
    },
    /// A header operation on a pseudo-header, which Envoy cannot do; skipped.
    PseudoHeader { header: String },
    /// An endpoint whose address is not an IP; left out of EDS.
    NonIpEndpoint { cluster: String, address: String },
    /// A generated reference that did not resolve (a bug), replaced before sending.
    /// `kind` labels the metric: `rds`, `lds`, or `snapshot` for the audit.
    InconsistentReference {
        reference: String,
        kind: &'static str,
    },
    /// A virtual host left out of a route configuration because its name or every domain
    /// was already taken (a debug-level note).
    VirtualHostSkipped { vhost: String, reason: &'static str },
}

impl From<Downgrade> for Finding {
    fn from(d: Downgrade) -> Self {
        Finding::Downgrade(d)
    }
}
