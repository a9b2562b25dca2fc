//! Metrics of the secure port and the CA, under istiod's names where it has them
//! (`citadel_server_*`), `pilotfish_` otherwise.

use std::sync::LazyLock;

use prometheus::{
    IntCounter, IntCounterVec, IntGauge, Opts, register_int_counter, register_int_counter_vec,
    register_int_gauge,
};

/// `citadel_server_csr_count`: CreateCertificate requests.
pub static CSR_COUNT: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "citadel_server_csr_count",
        "CreateCertificate requests received."
    )
    .expect("register citadel_server_csr_count")
});

/// `citadel_server_success_cert_issuance_count`: certificates issued.
pub static CERTS_ISSUED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "citadel_server_success_cert_issuance_count",
        "Workload certificates issued."
    )
    .expect("register citadel_server_success_cert_issuance_count")
});

/// `citadel_server_csr_sign_err_count{reason}`: CSRs refused or failed.
pub static CSR_SIGN_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "citadel_server_csr_sign_err_count",
            "CreateCertificate requests that issued nothing, by reason (csr, identity, ttl, ca_not_ready, ca_expired, internal)."
        ),
        &["reason"]
    )
    .expect("register citadel_server_csr_sign_err_count")
});

/// `citadel_server_authentication_failure_count`: secure-port requests (CSRs and ADS
/// streams alike) whose caller could not be authenticated.
pub static AUTHN_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "citadel_server_authentication_failure_count",
        "Secure-port requests refused because the caller could not be authenticated."
    )
    .expect("register citadel_server_authentication_failure_count")
});

/// `pilotfish_secure_requests_total{source,result}`: secure-port requests by how the
/// caller authenticated (`token`, `certificate`, `none`) and the outcome
/// (`authenticated`, `refused`, `unavailable`).
pub static REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_secure_requests_total",
            "Secure-port requests by credential (token, certificate, none) and result (authenticated, refused, unavailable)."
        ),
        &["source", "result"]
    )
    .expect("register pilotfish_secure_requests_total")
});

/// `pilotfish_token_reviews_total{result}`: TokenReviews sent to the API server
/// (`authenticated`, `refused`, `error`); cache hits are not counted.
pub static TOKEN_REVIEWS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_token_reviews_total",
            "TokenReviews sent to the Kubernetes API (cache misses), by result (authenticated, refused, error)."
        ),
        &["result"]
    )
    .expect("register pilotfish_token_reviews_total")
});

/// `citadel_server_root_cert_expiry_timestamp`: when the first root expires (unix s).
pub static ROOT_EXPIRY: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "citadel_server_root_cert_expiry_timestamp",
        "Unix time at which the first root certificate of the trust bundle expires."
    )
    .expect("register citadel_server_root_cert_expiry_timestamp")
});

/// `pilotfish_ca_load_errors_total`: CA folder reads that failed (the last good CA
/// stays in use).
pub static CA_LOAD_ERRORS: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "pilotfish_ca_load_errors_total",
        "Failed loads of the CA files (the last good CA stays in use)."
    )
    .expect("register pilotfish_ca_load_errors_total")
});

pub fn register_all() {
    LazyLock::force(&CSR_COUNT);
    LazyLock::force(&CERTS_ISSUED);
    LazyLock::force(&CSR_SIGN_ERRORS);
    LazyLock::force(&AUTHN_FAILURES);
    LazyLock::force(&REQUESTS);
    LazyLock::force(&TOKEN_REVIEWS);
    LazyLock::force(&ROOT_EXPIRY);
    LazyLock::force(&CA_LOAD_ERRORS);
}
