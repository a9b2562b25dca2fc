//! End-to-end tests of Pilotfish: the one integration-test binary of `pilotfish-testkit`.
//! Each module starts the real processes it needs (see `pilotfish_testkit`): the test API
//! server driven by kube-rs, kubectl 1.33 and helm 4; `redis-server`; Pilotfish's binaries;
//! gRPC's own xDS client.

mod apiserver_binary;
mod apiserver_helm;
mod apiserver_kube;
mod apiserver_kubectl;
mod apiserver_rbac;
mod apiserver_tokens;
mod bus_redis;
mod config_folder;
mod controller_discovery;
mod controller_k8s;
mod helm_chart;
mod istio_crds;
mod proxyless_security;
mod redis_e2e;
mod reliability;
mod secure_xds;
mod support;
mod xds_grpc;
mod xds_lifecycle;
