//! Pilotfish's domain crate: everything both the controller and the xDS tier need, with
//! no Kubernetes client and no gRPC server.
//!
//! - [`api`]: Istio `networking.istio.io` types (VirtualService, DestinationRule,
//!   ServiceEntry) as Kubernetes custom resources, with strict parsing.
//! - [`model`]: the mesh model (services, endpoints, proxies) and conversions from
//!   Kubernetes objects.
//! - [`push_context`]: the immutable snapshot of the mesh and its pure builder.
//! - [`cli`]: command-line pieces both binaries share.
//! - [`config`]: object identity and the errors reported about objects.
//! - [`mesh_config`]: the MeshConfig subset Pilotfish honours.
//! - [`codec`]: the snapshot blob format (protobuf + zstd + header).
//! - [`bus`]: publishing and following snapshots (in-memory and Redis).
//! - [`source`]: reading Kubernetes-style YAML from a folder.
//! - [`pipeline`]: inputs → build → encode → publish, with debounce and the folder loop.
//! - [`retry`]: backoff, retry counting and deadlines, and the timer loops sleep on.
//! - [`telemetry`]: log setup and the metrics page shared by the binaries.
//! - [`supervise`]: task supervision, signals and the runtime for the binaries.
//! - [`synthetic`]: generated meshes for benchmarks, load tools and tests.

pub mod api;
pub mod bus;
pub mod cli;
pub mod codec;
pub mod config;
pub mod mesh_config;
pub mod model;
pub mod pipeline;
pub mod push_context;
pub mod retry;
pub mod source;
pub mod supervise;
pub mod synthetic;
pub mod telemetry;
