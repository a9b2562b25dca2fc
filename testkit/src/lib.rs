//! Pilotfish test infrastructure.
//!
//! - [`redis`]: real `redis-server` processes (killable, restartable) and a cuttable TCP link.

pub mod redis;
