//! Protobuf messages generated from `mesh/proto/pilotfish/snapshot/v1/snapshot.proto` by
//! `mesh/build.rs` (prost, maps as `BTreeMap` so that encoding is deterministic).

include!(concat!(env!("OUT_DIR"), "/pilotfish.snapshot.v1.rs"));
