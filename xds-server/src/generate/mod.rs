//! The xDS resource generators: CDS, EDS, LDS and RDS for Envoy sidecars and proxyless
//! gRPC clients, as pure functions of (PushContext, proxy scope), plus the snapshot that
//! serves them to the ADS engine.
//!
//! Public surface:
//! - [`GeneratedSnapshot`]: implements [`crate::ads::XdsSnapshot`]; generates on demand and
//!   caches each part per scope for the snapshot's lifetime. [`change_kind`] tells the
//!   publisher whether a new PushContext needs a full push or EDS only.
//! - [`config_dump`], [`resources_json`]: what a proxy receives, as proto JSON.
//! - [`check_snapshot`] / [`check_view`] / [`Auditor`]: the cross-reference audit
//!   (`Consistent()`); an [`Auditor`] decodes only content it has not seen.
//! - [`metrics::register_all`]: the generators' metrics.
//!
//! Layout: [`scope`] (what a proxy's output depends on), [`plan`] (the outbound clusters
//! every type is derived from), [`policy`] (DestinationRule merge), [`cds`], [`eds`],
//! [`lds`] with [`inbound_mtls`] (PeerAuthentication's inbound chains), [`jwt_authn`]
//! (RequestAuthentication's filter),
//! [`proxyless_inbound`] (a proxyless gRPC server's listeners, named by the address it
//! binds, so asked for by name only), [`rds`] with
//! [`route`] (VirtualService translation, then the proxyless pass) and [`tls`], [`names`] (Istio's resource names and domains), [`util`], [`json`];
//! [`sanitize`] replaces a broken reference in a generated part, [`audit`] (above the
//! snapshot) checks whole snapshots. The generators do no telemetry: they return
//! [`findings`], which the snapshot logs and counts once per generated part.

pub mod audit;
pub mod auto_mtls;
pub mod canonical;
pub mod cds;
pub mod descriptors;
pub mod eds;
pub mod findings;
pub mod identities;
pub mod inbound_mtls;
pub mod inbound_tls;
pub mod json;
pub mod jwt_authn;
pub mod l4;
pub mod lds;
pub mod metrics;
pub mod names;
pub mod plan;
pub mod policy;
pub mod proxyless_inbound;
pub mod rbac;
pub mod rds;
pub mod route;
pub mod sanitize;
pub mod scope;
pub mod snapshot;
pub mod tls;
pub mod upstream;
pub mod util;

pub use audit::{Auditor, BrokenReference, View, check_snapshot, check_view, view_of};
pub use json::{JsonError, config_dump, resource_json, resources_json, to_json};
pub use scope::{Flavor, Scope};
pub use snapshot::{GeneratedSnapshot, ResourceMap, change_kind};
