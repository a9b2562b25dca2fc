//! Pilotfish test infrastructure: the test Kubernetes API server ([`apiserver`]), helpers
//! to find and run the real `kubectl`/`helm` binaries against it ([`tools`]), gRPC's own
//! xDS client and backend servers ([`grpc`]), and Pilotfish's binaries as child processes
//! ([`process`]).

pub mod apiserver;
pub mod grpc;
pub mod process;
pub mod tools;
