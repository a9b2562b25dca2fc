//! Pilotfish's xDS tier as a library; the `pilotfish-xds` binary wires it to flags.
//!
//! - [`ads`]: the ADS protocol engine — per-stream SotW and delta state machines, the
//!   tonic service and [`ads::serve`] — and its seam to the resource generators
//!   ([`ads::XdsSnapshot`], [`ads::Resource`]).
//! - [`node`]: Istio node id and metadata → [`pilotfish_mesh::model::Proxy`].
//! - [`registry`]: open streams and their per-type state, for `/debug/adsz` and `/debug/syncz`.
//! - [`push`]: bounded push admission (full and endpoints-only pools).
//! - [`metrics`]: the Prometheus metrics, under Istio's names.
//! - [`feed`]: bus follower → generated snapshots → the engine, with the push history.
//! - [`admin`]: the admin HTTP server and its debug pages.
//! - [`gen`]: the generators (CDS/EDS/LDS/RDS from the mesh model, sidecar and proxyless)
//!   and [`gen::GeneratedSnapshot`], which implements [`ads::XdsSnapshot`]; the engine does
//!   not depend on them.

pub mod admin;
pub mod ads;
pub mod feed;
pub mod r#gen;
pub mod metrics;
pub mod node;
pub mod push;
pub mod registry;
