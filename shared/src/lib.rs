//! Pilotfish's runtime crate: the I/O both binaries share around the pure domain
//! (`pilotfish-mesh`) — moving snapshots, watching files, supervising tasks, logs, metrics
//! and flags. No Kubernetes client and no gRPC server.
//!
//! - [`bus`]: publishing and following snapshots (in-memory and Redis), and the adapters
//!   between the snapshot codec and the bus.
//! - [`source`]: a folder of Kubernetes-style YAML files, re-read on change.
//! - [`pipeline`]: inputs → build → encode → publish, with debounce and the folder loop.
//! - [`jwks`]: the control plane's JWKS resolver (key sets of RequestAuthentication rules).
//! - [`retry`]: backoff, retry counting and deadlines, and the timer loops sleep on.
//! - [`telemetry`]: log setup and the metrics page shared by the binaries.
//! - [`supervise`]: task supervision, signals and the runtime for the binaries.
//! - [`admin`]: the admin HTTP server (public pages for anyone, `/debug/*` for loopback
//!   peers only unless `--expose-debug-pages`).
//! - [`cli`]: command-line pieces both binaries share (Redis flags, replica name, the
//!   `--mesh-config` file).

pub mod admin;
pub mod bus;
pub mod cli;
pub mod jwks;
pub mod pipeline;
pub mod retry;
pub mod source;
pub mod supervise;
pub mod telemetry;
