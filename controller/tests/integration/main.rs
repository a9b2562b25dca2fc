//! The integration tests of `pilotfish-controller` (one test binary; each module is one area).

mod ca_root;
mod k8s_discovery;
mod k8s_lease;
mod k8s_mode;
mod k8s_support;
mod validate_command;
