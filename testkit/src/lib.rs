//! Pilotfish test infrastructure:
//!
//! - [`apiserver`]: the test Kubernetes API server;
//! - [`balancer`]: a round-robin TCP balancer standing in for a Service in front of replicas;
//! - [`tools`]: the real `kubectl`/`helm` binaries, run against it;
//! - [`redis`]: real `redis-server` processes (killable, restartable) and a cuttable TCP link;
//! - [`grpc`]: gRPC's own xDS client and backend servers (Python `grpcio`);
//! - [`mesh`]: the `reviews` mesh (Kubernetes YAML) the end-to-end tests route through;
//! - [`load`]: the ADS load benchmark (`pilotfish-xds-load`, `make bench-load`);
//! - [`process`]: Pilotfish's binaries as child processes, free ports, plain HTTP GETs;
//! - [`keys`]: the tests' snapshot signing key, as values and as files.
//! - [`secure`]: clients of the secure port — TLS channels, Istio's `CreateCertificate`,
//!   CSRs and the certificate files gRPC reads.

pub mod apiserver;
pub mod balancer;
pub mod grpc;
pub mod keys;
pub mod load;
pub mod mesh;
pub mod process;
pub mod redis;
pub mod secure;
pub mod tools;
