//! Istio `networking.istio.io` and `security.istio.io` API types as Kubernetes custom
//! resources, their strict parser, and their CRDs.
//!
//! Public surface:
//! - Kinds [`VirtualService`], [`DestinationRule`], [`ServiceEntry`],
//!   [`PeerAuthentication`], [`RequestAuthentication`], [`Sidecar`],
//!   [`AuthorizationPolicy`] (spec types
//!   `…Spec`, status [`IstioStatus`]); every nested message is named after its Istio proto
//!   message (`HttpRoute`, `TrafficPolicy`, …) and every field is the snake_case of Istio's
//!   JSON name (`consecutive_5xx_errors` for `consecutive5xxErrors`, `r#match` for `match`).
//! - [`Duration`] for Istio/Go duration strings; [`StringMatch`] for the exact/prefix/regex
//!   oneof; [`Oneofs`] reports which members of sibling-field oneofs are set.
//! - Strict parsing of user input: [`parse_strict`], [`parse_strict_yaml`],
//!   [`yaml_documents`], [`IstioResource::parse_strict`]; errors are [`ApiParseError`].
//!   [`parse_reporting_unknown`] and [`IstioResource::parse_yaml_reporting_unknown`] set
//!   unknown fields aside ([`Parsed`]) instead of failing: Istio YAML of a newer release
//!   is served, its unknown fields reported as warnings.
//! - [`crd::crds`]: the CustomResourceDefinitions, served as `v1` (storage), `v1beta1`
//!   and (networking only) `v1alpha3` with identical schemas.
//!
//! Conventions: optional scalars and messages are `Option<T>`; repeated fields are `Vec<T>`
//! and maps `BTreeMap` (deterministic serialization), both empty when absent or `null`;
//! integers have the proto's width and sign (a negative `weight` parses, validation
//! rejects it). A proto oneof whose members sit beside other fields stays as sibling
//! `Option`s, and "at most one" is checked by validation (and by the CRD schema). Plain
//! deserialization is lenient (unknown fields ignored) so stored snapshots stay readable
//! across versions; user input must go through the strict entry points.

pub mod authorization_policy;
pub mod common;
pub mod crd;
pub mod destination_rule;
pub mod duration;
pub mod peer_authentication;
pub mod request_authentication;
pub mod service_entry;
pub mod sidecar;
pub mod status;
pub mod strict;
pub mod virtual_service;

pub use authorization_policy::{
    AuthorizationAction, AuthorizationPolicy, AuthorizationPolicySpec, Condition,
    ExtensionProvider, Operation, PolicyTargetReference, Rule, RuleFrom, RuleTo, Source,
};
pub use common::{Destination, Labels, OneofGroup, Oneofs, Percent, PortSelector, StringMatch};
pub use destination_rule::{
    ClientTlsSettings, ConnectionPoolSettings, ConsistentHashLb, DestinationRule,
    DestinationRuleSpec, Distribute, Failover, H2UpgradePolicy, HttpCookie, HttpCookieAttribute,
    HttpSettings, LoadBalancerSettings, LocalityLoadBalancerSetting, MagLev, OutlierDetection,
    PortTrafficPolicy, ProxyProtocol, ProxyProtocolVersion, RetryBudget, RingHash, SimpleLb,
    Subset, TcpKeepalive, TcpSettings, TlsMode, TrafficPolicy, TunnelSettings,
    TypeWorkloadSelector, WarmupConfiguration,
};
pub use duration::{Duration, DurationParseError};
pub use peer_authentication::{MtlsMode, MutualTls, PeerAuthentication, PeerAuthenticationSpec};
pub use request_authentication::{
    ClaimToHeader, JwtHeader, JwtRule, RequestAuthentication, RequestAuthenticationSpec,
};
pub use service_entry::{
    Location, Resolution, ServiceEntry, ServiceEntrySpec, ServicePort, WorkloadEntry,
    WorkloadSelector,
};
pub use sidecar::{
    CaptureMode, IstioEgressListener, IstioIngressListener, OutboundTrafficPolicy,
    OutboundTrafficPolicyMode, ServerTlsMode, ServerTlsSettings, Sidecar, SidecarPort, SidecarSpec,
    SidecarWorkloadSelector, TlsCertificate, TlsProtocol,
};
pub use status::{IstioCondition, IstioStatus};
pub use strict::{
    ApiParseError, FieldError, Parsed, SourceLocation, YamlDocument, parse_reporting_unknown,
    parse_strict, parse_strict_yaml, yaml_documents,
};
pub use virtual_service::{
    CorsPolicy, Delegate, GRPC_STATUS_NAMES, HeaderOperations, Headers, HttpBody,
    HttpDirectResponse, HttpFaultAbort, HttpFaultDelay, HttpFaultInjection, HttpMatchRequest,
    HttpMirrorPolicy, HttpRedirect, HttpRetry, HttpRewrite, HttpRoute, HttpRouteDestination,
    L4MatchAttributes, RedirectPortSelection, RegexRewrite, RouteDestination, TcpRoute,
    TlsMatchAttributes, TlsRoute, UnmatchedPreflights, VirtualService, VirtualServiceSpec,
    grpc_status_code,
};

/// The API group of the networking kinds.
pub const GROUP: &str = "networking.istio.io";

/// The API group of the security kinds.
pub const SECURITY_GROUP: &str = "security.istio.io";

/// The versions Istio serves for the networking kinds, storage version first. The schemas
/// are identical, so an object of any of them parses into the same Rust type.
pub const SERVED_VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha3"];

/// The versions Istio serves for the security kinds, storage version first.
pub const SECURITY_SERVED_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// One Istio networking object of any supported kind, as read from user input (boxed: the
/// kinds differ a lot in size).
#[derive(Clone, Debug, PartialEq)]
pub enum IstioResource {
    VirtualService(Box<VirtualService>),
    DestinationRule(Box<DestinationRule>),
    ServiceEntry(Box<ServiceEntry>),
    PeerAuthentication(Box<PeerAuthentication>),
    Sidecar(Box<Sidecar>),
    RequestAuthentication(Box<RequestAuthentication>),
    AuthorizationPolicy(Box<AuthorizationPolicy>),
}

/// The kind of an object, read from its `apiVersion` and `kind` before parsing the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IstioKind {
    VirtualService,
    DestinationRule,
    ServiceEntry,
    PeerAuthentication,
    Sidecar,
    RequestAuthentication,
    AuthorizationPolicy,
}

impl IstioKind {
    /// Every supported kind.
    pub const ALL: [IstioKind; 7] = [
        IstioKind::VirtualService,
        IstioKind::DestinationRule,
        IstioKind::ServiceEntry,
        IstioKind::PeerAuthentication,
        IstioKind::Sidecar,
        IstioKind::RequestAuthentication,
        IstioKind::AuthorizationPolicy,
    ];

    /// The Kubernetes `kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            IstioKind::VirtualService => "VirtualService",
            IstioKind::DestinationRule => "DestinationRule",
            IstioKind::ServiceEntry => "ServiceEntry",
            IstioKind::PeerAuthentication => "PeerAuthentication",
            IstioKind::Sidecar => "Sidecar",
            IstioKind::RequestAuthentication => "RequestAuthentication",
            IstioKind::AuthorizationPolicy => "AuthorizationPolicy",
        }
    }

    /// The kind's API group.
    pub fn group(self) -> &'static str {
        match self {
            IstioKind::PeerAuthentication
            | IstioKind::RequestAuthentication
            | IstioKind::AuthorizationPolicy => SECURITY_GROUP,
            _ => GROUP,
        }
    }

    /// The versions Istio serves for the kind, storage version first.
    pub fn served_versions(self) -> &'static [&'static str] {
        match self {
            IstioKind::PeerAuthentication
            | IstioKind::RequestAuthentication
            | IstioKind::AuthorizationPolicy => &SECURITY_SERVED_VERSIONS,
            _ => &SERVED_VERSIONS,
        }
    }

    /// The resource name (lower-case plural), as in the CRD and API paths.
    pub fn plural(self) -> &'static str {
        match self {
            IstioKind::VirtualService => "virtualservices",
            IstioKind::DestinationRule => "destinationrules",
            IstioKind::ServiceEntry => "serviceentries",
            IstioKind::PeerAuthentication => "peerauthentications",
            IstioKind::Sidecar => "sidecars",
            IstioKind::RequestAuthentication => "requestauthentications",
            IstioKind::AuthorizationPolicy => "authorizationpolicies",
        }
    }

    /// Identifies an object by its `apiVersion` and `kind`. `Ok(None)`: not a
    /// `networking.istio.io` object (for example a Service), so not ours to parse. An
    /// Istio networking kind that is not supported, or an unserved version, is an error.
    pub fn of(value: &serde_json::Value) -> Result<Option<IstioKind>, ApiParseError> {
        let field = |name: &str| value.get(name).and_then(serde_json::Value::as_str);
        let fail = |path: &str, reason: String| ApiParseError {
            errors: vec![FieldError {
                path: path.to_owned(),
                reason,
                location: None,
            }],
        };
        let Some(api_version) = field("apiVersion") else {
            return Err(fail("apiVersion", "missing or not a string".to_owned()));
        };
        let Some((group, version)) = api_version.split_once('/') else {
            return Ok(None);
        };
        if group != GROUP && group != SECURITY_GROUP {
            return Ok(None);
        }
        let Some(kind_name) = field("kind") else {
            return Err(fail("kind", "missing or not a string".to_owned()));
        };
        let Some(kind) = IstioKind::ALL
            .into_iter()
            .find(|k| k.group() == group && k.as_str() == kind_name)
        else {
            return Err(fail(
                "kind",
                format!("kind {kind_name:?} of {group} is not supported"),
            ));
        };
        if !kind.served_versions().contains(&version) {
            return Err(fail(
                "apiVersion",
                format!(
                    "version {version:?} of {group} is not served (expected one of {})",
                    kind.served_versions().join(", ")
                ),
            ));
        }
        Ok(Some(kind))
    }
}

impl IstioResource {
    /// Strictly parses an object whose `apiVersion` is `networking.istio.io/{v1,v1beta1,
    /// v1alpha3}` or `security.istio.io/{v1,v1beta1}`; `Ok(None)` when it belongs to
    /// another group.
    pub fn parse_strict(value: &serde_json::Value) -> Result<Option<Self>, ApiParseError> {
        let Some(kind) = IstioKind::of(value)? else {
            return Ok(None);
        };
        match kind {
            IstioKind::VirtualService => {
                parse_strict(value).map(|o| IstioResource::VirtualService(Box::new(o)))
            }
            IstioKind::DestinationRule => {
                parse_strict(value).map(|o| IstioResource::DestinationRule(Box::new(o)))
            }
            IstioKind::ServiceEntry => {
                parse_strict(value).map(|o| IstioResource::ServiceEntry(Box::new(o)))
            }
            IstioKind::PeerAuthentication => {
                parse_strict(value).map(|o| IstioResource::PeerAuthentication(Box::new(o)))
            }
            IstioKind::Sidecar => parse_strict(value).map(|o| IstioResource::Sidecar(Box::new(o))),
            IstioKind::RequestAuthentication => {
                parse_strict(value).map(|o| IstioResource::RequestAuthentication(Box::new(o)))
            }
            IstioKind::AuthorizationPolicy => {
                parse_strict(value).map(|o| IstioResource::AuthorizationPolicy(Box::new(o)))
            }
        }
        .map(Some)
    }

    /// Like [`IstioResource::parse_strict`], with line/column in the errors.
    pub fn parse_strict_yaml(document: &YamlDocument) -> Result<Option<Self>, ApiParseError> {
        let Some(parsed) = Self::parse_yaml_reporting_unknown(document)? else {
            return Ok(None);
        };
        if parsed.unknown_fields.is_empty() {
            Ok(Some(parsed.object))
        } else {
            Err(ApiParseError {
                errors: parsed.unknown_fields,
            })
        }
    }

    /// Parses a YAML document like [`IstioResource::parse_strict_yaml`], except that fields
    /// the types do not know are returned beside the object instead of failing it: Istio
    /// YAML may carry fields of a newer Istio, which Pilotfish ignores with a warning.
    pub fn parse_yaml_reporting_unknown(
        document: &YamlDocument,
    ) -> Result<Option<Parsed<Self>>, ApiParseError> {
        let kind = IstioKind::of(&document.value).map_err(|mut e| {
            for error in &mut e.errors {
                error.location = document.location_of_field(&error.path);
            }
            e
        })?;
        let Some(kind) = kind else {
            return Ok(None);
        };
        fn boxed<T>(parsed: Parsed<T>, wrap: fn(Box<T>) -> IstioResource) -> Parsed<IstioResource> {
            Parsed {
                object: wrap(Box::new(parsed.object)),
                unknown_fields: parsed.unknown_fields,
            }
        }
        match kind {
            IstioKind::VirtualService => document
                .parse_reporting_unknown()
                .map(|p| boxed(p, IstioResource::VirtualService)),
            IstioKind::DestinationRule => document
                .parse_reporting_unknown()
                .map(|p| boxed(p, IstioResource::DestinationRule)),
            IstioKind::ServiceEntry => document
                .parse_reporting_unknown()
                .map(|p| boxed(p, IstioResource::ServiceEntry)),
            IstioKind::PeerAuthentication => document
                .parse_reporting_unknown()
                .map(|p| boxed(p, IstioResource::PeerAuthentication)),
            IstioKind::Sidecar => document
                .parse_reporting_unknown()
                .map(|p| boxed(p, IstioResource::Sidecar)),
            IstioKind::RequestAuthentication => document
                .parse_reporting_unknown()
                .map(|p| boxed(p, IstioResource::RequestAuthentication)),
            IstioKind::AuthorizationPolicy => document
                .parse_reporting_unknown()
                .map(|p| boxed(p, IstioResource::AuthorizationPolicy)),
        }
        .map(Some)
    }

    /// The object's kind.
    pub fn kind(&self) -> IstioKind {
        match self {
            IstioResource::VirtualService(_) => IstioKind::VirtualService,
            IstioResource::DestinationRule(_) => IstioKind::DestinationRule,
            IstioResource::ServiceEntry(_) => IstioKind::ServiceEntry,
            IstioResource::PeerAuthentication(_) => IstioKind::PeerAuthentication,
            IstioResource::Sidecar(_) => IstioKind::Sidecar,
            IstioResource::RequestAuthentication(_) => IstioKind::RequestAuthentication,
            IstioResource::AuthorizationPolicy(_) => IstioKind::AuthorizationPolicy,
        }
    }

    /// The object's metadata.
    pub fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            IstioResource::VirtualService(o) => &o.metadata,
            IstioResource::DestinationRule(o) => &o.metadata,
            IstioResource::ServiceEntry(o) => &o.metadata,
            IstioResource::PeerAuthentication(o) => &o.metadata,
            IstioResource::Sidecar(o) => &o.metadata,
            IstioResource::RequestAuthentication(o) => &o.metadata,
            IstioResource::AuthorizationPolicy(o) => &o.metadata,
        }
    }
}
