//! Pilotfish's xDS tier as a library; the `pilotfish-xds` binary wires it to flags.
//!
//! - [`ads`]: the ADS protocol engine — per-stream SotW and delta state machines, the
//!   tonic service and [`ads::serve`] — and its seam to the resource generators
//!   ([`ads::XdsSnapshot`], [`ads::Resource`]); also the registry of open streams
//!   (`/debug/adsz`, `/debug/syncz`) and push admission.
//! - [`node`]: Istio node id and metadata → [`pilotfish_mesh::model::Proxy`].
//! - [`identity`]: the authenticated caller of a secure-port request and Istio's rule
//!   for which node it may claim.
//! - [`secure`]: the secure port (15012): TLS with a serving certificate from the CA,
//!   authentication (service-account tokens, client certificates), Istio's CA service
//!   `CreateCertificate`, and ADS for authenticated streams.
//! - [`metrics`]: the Prometheus metrics, under Istio's names.
//! - [`feed`]: bus follower → generated snapshots → the engine, with the push history.
//! - [`audit_worker`]: the consistency audit on a thread of its own at nice 19, newest
//!   snapshot only, so it never competes with serving.
//! - [`admin`]: the admin HTTP server and its debug pages.
//! - [`generate`]: the generators (CDS/EDS/LDS/RDS from the mesh model, sidecar and proxyless)
//!   and [`generate::GeneratedSnapshot`], which implements [`ads::XdsSnapshot`]; the engine does
//!   not depend on them.

pub mod admin;
pub mod ads;
pub mod audit_worker;
pub mod feed;
pub mod generate;
pub mod identity;
pub mod metrics;
pub mod node;
pub mod secure;
