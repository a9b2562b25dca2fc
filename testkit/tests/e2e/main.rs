//! End-to-end tests of the testkit: the test API server driven by the real kube-rs,
//! kubectl 1.33 and helm 4 (installed by `scripts/deps/kube-tools.sh`).

mod apiserver_binary;
mod apiserver_helm;
mod apiserver_kube;
mod apiserver_kubectl;
mod support;
