//! `pilotfish-controller` as a library: the binary's modules, public so that the
//! integration tests can drive them against an in-process test API server.
//!
//! - [`k8s`]: the Kubernetes source (watchers, Lease election, status and Events);
//! - [`admin`]: the admin HTTP server; [`metrics`]; [`validate_cmd`]: `validate`.
//!
//! The snapshot pipeline, the debounce and the `--config-dir` loop are shared with the
//! standalone xDS server (`pilotfish_shared::pipeline`).

pub mod admin;
pub mod k8s;
pub mod metrics;
pub mod validate_cmd;
