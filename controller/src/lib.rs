//! `pilotfish-controller` as a library: the binary's modules, public so that the
//! integration tests can drive them against an in-process test API server.
//!
//! - [`k8s`]: the Kubernetes source (watchers, Lease election, status and Events);
//! - [`dir_mode`]: the `--config-dir` source;
//! - [`pipeline`]: build + encode + publish; [`debounce`]: burst merging;
//! - [`admin`]: the admin HTTP server; [`metrics`]; [`validate_cmd`]: `validate`.

pub mod admin;
pub mod debounce;
pub mod dir_mode;
pub mod k8s;
pub mod metrics;
pub mod pipeline;
pub mod validate_cmd;
