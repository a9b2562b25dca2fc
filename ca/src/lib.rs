//! Pilotfish's certificate authority, as Istio's CA behaves: the signing bundle in
//! Istio's Secret layouts (the self-signed `istio-ca-secret` or a plugged-in `cacerts`
//! intermediate), workload certificates that carry exactly the caller's SPIFFE identity,
//! serving certificates for the secure xDS port, and the `istio.v1.auth`
//! `IstioCertificateService` messages.
//!
//! Pure: no files, sockets or clocks — callers pass bytes and `now`.
//!
//! - [`bundle`]: [`CaFiles`] (Istio's file names) → a verified [`CaBundle`]; a new
//!   self-signed root ([`bundle::generate_self_signed`]).
//! - [`issue`]: [`issue::issue_workload`] (CSR in, chain out; a CSR naming another
//!   identity is refused, the certificate carries only the caller's) and [`issue::issue_serving`].
//! - [`pem`]: certificate and key PEM handling, URI SANs of a certificate.
//! - [`proto`]: `IstioCertificateRequest` / `IstioCertificateResponse`.

pub mod bundle;
pub mod issue;
pub mod pem;
pub mod proto;

pub use bundle::{CaBundle, CaError, CaFiles};
pub use issue::{IssueError, IssuePolicy, Issued};
