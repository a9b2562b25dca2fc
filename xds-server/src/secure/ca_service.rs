//! `istio.v1.auth.IstioCertificateService/CreateCertificate`: the CSR of an
//! authenticated caller, signed for exactly the caller's identity, with the chain and
//! the root bundle. A CSR naming another SPIFFE identity is refused with
//! `PERMISSION_DENIED`; its other SANs and subject are ignored (`pilotfish_ca::issue`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use pilotfish_ca::IssuePolicy;
use pilotfish_ca::issue::{self, IssueError};
use pilotfish_ca::proto::{IstioCertificateRequest, IstioCertificateResponse};
use tonic::Status;
use tracing::{info, warn};

use super::authority::AuthorityReceiver;
use super::metrics;
use crate::identity::Caller;

/// Signs CSRs with the current authority.
#[derive(Clone)]
pub struct CaService {
    pub authorities: AuthorityReceiver,
    pub policy: IssuePolicy,
}

fn reason(e: &IssueError) -> &'static str {
    match e {
        IssueError::TtlTooLong { .. } => "ttl",
        IssueError::OtherIdentity { .. } => "identity",
        IssueError::SigningCertExpired(_) => "ca_expired",
        IssueError::Generate(_) => "internal",
        _ => "csr",
    }
}

impl CaService {
    /// Issues a certificate for `caller`'s identity.
    pub fn create_certificate(
        &self,
        caller: &Caller,
        request: &IstioCertificateRequest,
        now: SystemTime,
    ) -> Result<IstioCertificateResponse, Status> {
        metrics::CSR_COUNT.inc();
        let Some(authority) = self.authorities.borrow().clone() else {
            metrics::CSR_SIGN_ERRORS
                .with_label_values(&["ca_not_ready"])
                .inc();
            return Err(Status::unavailable("the CA is not loaded yet; retry"));
        };
        // A caller has one identity (a token) or what its certificate lists; Pilotfish
        // issues single-identity certificates, so a renewal keeps the one it has.
        let identity = &caller.identities[0];
        match issue::issue_workload(
            &authority.bundle,
            &request.csr,
            identity,
            request.validity_duration,
            &self.policy,
            now,
        ) {
            Ok(issued) => {
                metrics::CERTS_ISSUED.inc();
                info!(
                    identity = %identity,
                    via = caller.source.as_str(),
                    not_after = issued.not_after,
                    "certificate issued"
                );
                Ok(IstioCertificateResponse {
                    cert_chain: issued.response_chain,
                })
            }
            Err(e) => {
                metrics::CSR_SIGN_ERRORS
                    .with_label_values(&[reason(&e)])
                    .inc();
                warn!(identity = %identity, error = %e, "CSR refused");
                let message = format!("CSR signing error ({e})");
                Err(if matches!(e, IssueError::OtherIdentity { .. }) {
                    Status::permission_denied(message)
                } else if e.is_caller_error() {
                    Status::invalid_argument(message)
                } else {
                    Status::internal(message)
                })
            }
        }
    }
}

/// The unary gRPC method bound to one caller (tonic's server plumbing calls it).
pub(crate) struct CreateCertificate {
    pub ca: Arc<CaService>,
    pub caller: Caller,
}

impl tonic::server::UnaryService<IstioCertificateRequest> for CreateCertificate {
    type Response = IstioCertificateResponse;
    type Future = Pin<
        Box<dyn Future<Output = Result<tonic::Response<IstioCertificateResponse>, Status>> + Send>,
    >;

    fn call(&mut self, request: tonic::Request<IstioCertificateRequest>) -> Self::Future {
        let result = self
            .ca
            .create_certificate(&self.caller, request.get_ref(), SystemTime::now())
            .map(tonic::Response::new);
        Box::pin(async move { result })
    }
}
