//! The ADS load benchmark behind `pilotfish-xds-load` and `make bench-load`:
//!
//! - [`mesh`]: the benchmark's mesh as a `--config-dir` folder, and its edits;
//! - [`client`]: Envoy-like SotW and delta streams and what they measure;
//! - [`null_server`]: the floor — a server that only replays captured responses;
//! - [`mod@bench`]: the run: real server and null server, the same streams, one report;
//! - [`reconnect`]: the mass-reconnect run: three replicas, one killed, its streams back;
//! - [`wire`]: light protobuf messages the client and the null server use;
//! - [`procfs`]: RSS and CPU time of the server process.

pub mod bench;
pub mod client;
pub mod mesh;
pub mod null_server;
pub mod procfs;
pub mod reconnect;
pub mod wire;
