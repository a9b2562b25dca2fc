//! Leader election over a `coordination.k8s.io/v1` Lease, in two layers: [`elector`], the
//! pure state machine with its rules and their tests, and `run` ([`run()`]), the task that
//! watches and writes the Lease for it and publishes [`Leadership`] to the rest of the
//! controller.

pub mod elector;
mod run;

pub use elector::{Leadership, LeaseTimings, LeaseTimingsError};
pub use run::{LeaseConfig, LeaseError, run};
