//! The `Reconciled` condition of VirtualServices, DestinationRules, ServiceEntries and
//! PeerAuthentications, Sidecars and AuthorizationPolicies, and the `InvalidConfig` Events, in two layers: [`plan`] decides what to write (pure:
//! conditions, diffs against the current status, which Events), [`writer`] is the task
//! that writes it through the API for the leader.

pub mod plan;
pub mod writer;
