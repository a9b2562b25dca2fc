//! Test Kubernetes API server binary.
fn main() {}
