//! Pilotfish test infrastructure: the test Kubernetes API server ([`apiserver`]) and
//! helpers to find and run the real `kubectl`/`helm` binaries against it ([`tools`]).

pub mod apiserver;
pub mod tools;
