//! The `reviews` mesh the end-to-end tests route through: one Service with three versions
//! (Pods and one EndpointSlice per version, each pointing at a local gRPC backend port), a
//! DestinationRule with subsets v1–v3 and a VirtualService whose split and extra routes a
//! test chooses. Written as Kubernetes YAML, so the same files serve standalone mode, the
//! controller's `--config-dir` mode and `kubectl apply`.

use std::fmt::Write;

/// The host and target gRPC clients dial.
pub const REVIEWS_HOST: &str = "reviews.default.svc.cluster.local";
pub const REVIEWS_PORT: u16 = 9080;

/// `xds:///reviews.default.svc.cluster.local:9080`.
pub fn reviews_target() -> String {
    format!("xds:///{REVIEWS_HOST}:{REVIEWS_PORT}")
}

/// Service, Pods and EndpointSlices for `reviews` versions listening on 127.0.0.1 at
/// `ports` (`(version, port)`, e.g. `("v1", 40001)`).
pub fn reviews_workloads(ports: &[(&str, u16)]) -> String {
    let mut y = String::from(
        "apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: default, labels: {app: reviews}}
spec:
  clusterIP: 10.96.0.20
  selector: {app: reviews}
  ports:
  - {name: grpc, port: 9080, targetPort: grpc, appProtocol: grpc}
",
    );
    for (version, port) in ports {
        // Pod status (podIPs) is what the mesh reads for labels and identity.
        let _ = write!(
            y,
            "---
apiVersion: v1
kind: Pod
metadata: {{name: reviews-{version}, namespace: default, labels: {{app: reviews, version: {version}}}}}
spec:
  serviceAccountName: bookinfo-reviews
  containers: [{{name: reviews, image: example/reviews:{version}}}]
status:
  podIP: 127.0.0.1
  podIPs: [{{ip: 127.0.0.1}}]
  conditions: [{{type: Ready, status: \"True\"}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: reviews-{version}
  namespace: default
  labels: {{kubernetes.io/service-name: reviews}}
addressType: IPv4
ports: [{{name: grpc, port: {port}, protocol: TCP}}]
endpoints:
- addresses: [127.0.0.1]
  conditions: {{ready: true}}
  targetRef: {{kind: Pod, name: reviews-{version}, namespace: default}}
"
        );
    }
    y
}

/// The DestinationRule with subsets v1, v2 and v3.
pub fn reviews_destination_rule() -> String {
    "apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
  - {name: v3, labels: {version: v3}}
"
    .to_string()
}

/// The VirtualService: requests with `end-user: jason` go to v3, requests with
/// `x-fault: abort` are aborted with `PERMISSION_DENIED`, the rest split `v1`/`v2`.
pub fn reviews_virtual_service(v1_weight: u32, v2_weight: u32) -> String {
    format!(
        "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews]
  http:
  - name: jason
    match:
    - headers:
        end-user: {{exact: jason}}
    route:
    - destination: {{host: reviews, subset: v3}}
  - name: fault
    match:
    - headers:
        x-fault: {{exact: abort}}
    fault:
      abort:
        grpcStatus: PERMISSION_DENIED
        percentage: {{value: 100}}
    route:
    - destination: {{host: reviews, subset: v1}}
  - name: split
    route:
    - destination: {{host: reviews, subset: v1}}
      weight: {v1_weight}
    - destination: {{host: reviews, subset: v2}}
      weight: {v2_weight}
"
    )
}
