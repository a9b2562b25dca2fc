//! Pilotfish's domain crate: everything both the controller and the xDS tier need, with
//! no Kubernetes client and no gRPC server.
//!
//! - [`api`]: Istio `networking.istio.io` types (VirtualService, DestinationRule,
//!   ServiceEntry) as Kubernetes custom resources, with strict parsing.
//! - [`model`]: the mesh model (services, endpoints, proxies) and conversions from
//!   Kubernetes objects.
//! - [`push_context`]: the immutable snapshot of the mesh and its pure builder.
//! - [`config`]: object identity and the errors reported about objects.
//! - [`logging`]: log setup shared by the binaries.
//! - [`mesh_config`]: the MeshConfig subset Pilotfish honours.
//! - [`codec`]: the snapshot blob format (protobuf + zstd + header).
//! - [`bus`]: publishing and following snapshots (in-memory and Redis).
//! - [`source`]: reading Kubernetes-style YAML from a folder.
//! - [`synthetic`]: generated meshes for benchmarks, load tools and tests.

pub mod api;
pub mod bus;
pub mod codec;
pub mod config;
pub mod logging;
pub mod mesh_config;
pub mod model;
pub mod push_context;
pub mod source;
pub mod synthetic;
