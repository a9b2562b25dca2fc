//! Pilotfish's domain crate: the Istio API, the mesh model and the snapshot, as pure code.
//! Everything in this library is plain data and functions over it: it reads no files,
//! opens no sockets, spawns no tasks and sets up no logging or metrics. Its dependencies
//! say so too — no tokio, redis, notify, prometheus, clap or tracing-subscriber
//! (`scripts/check-mesh-deps.sh`, run by `make lint`, fails otherwise). The I/O around it
//! lives in `pilotfish-shared` and the binaries; the one binary here,
//! `pilotfish-crdgen`, writes the generated CRDs to files.
//!
//! - [`api`]: Istio `networking.istio.io` types (VirtualService, DestinationRule,
//!   ServiceEntry) as Kubernetes custom resources, with strict parsing and CRD generation.
//! - [`model`]: the mesh model (services, endpoints, proxies) and conversions from
//!   Kubernetes objects.
//! - [`push_context`]: the immutable snapshot of the mesh and its pure builder.
//! - [`config`]: object identity and the errors reported about objects.
//! - [`mesh_config`]: the MeshConfig subset Pilotfish honours.
//! - [`codec`]: the snapshot blob format (protobuf + zstd + header).
//! - [`document`]: Kubernetes-style YAML text parsed into mesh objects and builder inputs.
//! - [`synthetic`]: generated meshes for benchmarks, load tools and tests.

pub mod api;
pub mod codec;
pub mod config;
pub mod document;
pub mod mesh_config;
pub mod model;
pub mod push_context;
pub mod synthetic;
