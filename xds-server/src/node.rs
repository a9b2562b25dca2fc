//! Turns the `Node` of a stream's first request into a [`Proxy`], following Istio's
//! conventions: id `sidecar~<ip>~<pod>.<ns>~<ns>.svc.cluster.local` (or `router~…`),
//! metadata `NAMESPACE`, `LABELS`, `CLUSTER_ID`, `ISTIO_VERSION`, `INSTANCE_IPS`,
//! `SERVICE_ACCOUNT` and `GENERATOR` (`grpc` selects proxyless output). A gRPC client is also recognised by its
//! `user_agent_name` (`gRPC …`) or its `xds.config.resource-in-sotw` client feature.
//! Where metadata and id both say something, metadata wins. A node id that does not
//! follow the conventions is accepted with defaults (namespace `default`, no labels);
//! only a missing node or an empty id is an error. A gateway (`router~…`) is logged and
//! counted here, once per stream: it gets an empty configuration.

use std::collections::BTreeMap;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use pilotfish_mesh::model::{Locality, Proxy, ProxyGenerator, ProxyType};

use crate::generate::snapshot::note_unsupported_proxy;

/// Why a node cannot identify a proxy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeError {
    #[error("the first request of an ADS stream must carry `node` (with an `id`)")]
    MissingNode,
    #[error(
        "`node.id` of the first request is empty; set the proxy's node id (Istio: sidecar~<ip>~<pod>.<ns>~<ns>.svc.cluster.local)"
    )]
    EmptyId,
}

impl NodeError {
    /// The gRPC status that ends the stream.
    pub fn into_status(self) -> tonic::Status {
        tonic::Status::invalid_argument(self.to_string())
    }
}

/// A parsed node: the proxy, and why its id did not follow Istio's conventions (if so),
/// for the one log line such a node gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedNode {
    pub proxy: Proxy,
    pub unconventional_id: Option<String>,
}

/// Builds the proxy identity of a stream from its first request's node.
pub fn parse_node(node: Option<&Node>) -> Result<ParsedNode, NodeError> {
    let node = node.ok_or(NodeError::MissingNode)?;
    if node.id.is_empty() {
        return Err(NodeError::EmptyId);
    }
    let (mut proxy, unconventional_id) = match parse_istio_id(&node.id) {
        Ok(proxy) => (proxy, None),
        Err(why) => (Proxy::with_defaults(node.id.clone()), Some(why)),
    };
    if is_grpc_client(node) {
        proxy.generator = ProxyGenerator::Grpc;
    }
    if let Some(metadata) = &node.metadata {
        apply_metadata(&mut proxy, metadata);
    }
    // Istio reads a proxy's locality from the node (set from its host's topology labels).
    if let Some(l) = &node.locality
        && !(l.region.is_empty() && l.zone.is_empty() && l.sub_zone.is_empty())
    {
        proxy.locality = Some(Locality {
            region: l.region.clone(),
            zone: l.zone.clone(),
            subzone: l.sub_zone.clone(),
        });
    }
    note_unsupported_proxy(&proxy);
    Ok(ParsedNode {
        proxy,
        unconventional_id,
    })
}

/// Parses `<type>~<ip>~<pod>.<ns>~<domain>`; the error says which part is off.
fn parse_istio_id(id: &str) -> Result<Proxy, String> {
    let parts: Vec<&str> = id.split('~').collect();
    let [kind, ip, workload, domain] = parts[..] else {
        return Err(format!(
            "expected 4 `~`-separated parts, found {}",
            parts.len()
        ));
    };
    let proxy_type = match kind {
        "sidecar" => ProxyType::Sidecar,
        "router" => ProxyType::Router,
        other => {
            return Err(format!(
                "unknown proxy type {other:?} (expected sidecar or router)"
            ));
        }
    };
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("{ip:?} is not an IP address"))?;
    // Namespaces are DNS labels (no dots) while pod names may contain dots: split at the last one.
    let (pod, namespace) = workload
        .rsplit_once('.')
        .filter(|(pod, ns)| !pod.is_empty() && !ns.is_empty())
        .ok_or_else(|| format!("{workload:?} is not <pod>.<namespace>"))?;
    Ok(Proxy {
        id: id.to_string(),
        proxy_type,
        ips: vec![ip],
        pod_name: Some(pod.to_string()),
        namespace: namespace.to_string(),
        dns_domain: (!domain.is_empty()).then(|| domain.to_string()),
        ..Proxy::default()
    })
}

fn is_grpc_client(node: &Node) -> bool {
    node.user_agent_name
        .to_ascii_lowercase()
        .starts_with("grpc")
        || node
            .client_features
            .iter()
            .any(|f| f == "xds.config.resource-in-sotw")
}

fn string_value(value: &Value) -> Option<String> {
    match value.kind.as_ref()? {
        Kind::StringValue(s) => Some(s.clone()),
        Kind::BoolValue(b) => Some(b.to_string()),
        Kind::NumberValue(n) => Some(n.to_string()),
        _ => None,
    }
}

fn apply_metadata(proxy: &mut Proxy, metadata: &Struct) {
    let get = |key: &str| {
        metadata
            .fields
            .get(key)
            .and_then(string_value)
            .filter(|s| !s.is_empty())
    };
    if let Some(namespace) = get("NAMESPACE") {
        proxy.namespace = namespace;
    }
    if let Some(cluster_id) = get("CLUSTER_ID") {
        proxy.cluster_id = Some(cluster_id);
    }
    if let Some(account) = get("SERVICE_ACCOUNT") {
        proxy.service_account = Some(account);
    }
    if let Some(version) = get("ISTIO_VERSION") {
        proxy.istio_version = Some(version);
    }
    if let Some(generator) = get("GENERATOR") {
        proxy.generator = if generator.eq_ignore_ascii_case("grpc") {
            ProxyGenerator::Grpc
        } else {
            ProxyGenerator::Envoy
        };
    }
    if let Some(ips) = get("INSTANCE_IPS") {
        let parsed: Vec<IpAddr> = ips
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        if !parsed.is_empty() {
            proxy.ips = parsed;
        }
    }
    if let Some(Value {
        kind: Some(Kind::StructValue(labels)),
    }) = metadata.fields.get("LABELS")
    {
        proxy.labels = labels
            .fields
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), string_value(v)?)))
            .collect::<BTreeMap<_, _>>();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Value {
        Value {
            kind: Some(Kind::StringValue(v.into())),
        }
    }

    fn node(id: &str, meta: &[(&str, Value)]) -> Node {
        Node {
            id: id.into(),
            metadata: Some(Struct {
                fields: meta
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn istio_sidecar_id() {
        let p = parse_node(Some(&node(
            "sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local",
            &[],
        )))
        .unwrap();
        assert_eq!(p.unconventional_id, None);
        let proxy = p.proxy;
        assert_eq!(proxy.proxy_type, ProxyType::Sidecar);
        assert_eq!(proxy.ips, ["10.1.2.3".parse::<IpAddr>().unwrap()]);
        assert_eq!(proxy.pod_name.as_deref(), Some("reviews-v1-abc"));
        assert_eq!(proxy.namespace, "bookinfo");
        assert_eq!(
            proxy.dns_domain.as_deref(),
            Some("bookinfo.svc.cluster.local")
        );
        assert_eq!(proxy.generator, ProxyGenerator::Envoy);
    }

    #[test]
    fn node_locality_is_the_proxy_locality() {
        let mut n = node("sidecar~10.1.2.3~a.ns~ns.svc.cluster.local", &[]);
        let p = parse_node(Some(&n)).unwrap();
        assert_eq!(p.proxy.locality, None, "absent or empty: unknown");
        n.locality = Some(envoy_types::pb::envoy::config::core::v3::Locality {
            region: "us-east1".into(),
            zone: "us-east1-b".into(),
            sub_zone: String::new(),
        });
        let p = parse_node(Some(&n)).unwrap();
        assert_eq!(
            p.proxy.locality.map(|l| l.to_string()).as_deref(),
            Some("us-east1/us-east1-b/")
        );
    }

    #[test]
    fn router_id_with_ipv6_and_dotted_pod_name() {
        let p = parse_node(Some(&node(
            "router~fd00::1~gw.pod.name.istio-system~istio-system.svc.cluster.local",
            &[],
        )))
        .unwrap();
        assert_eq!(p.proxy.proxy_type, ProxyType::Router);
        assert_eq!(p.proxy.pod_name.as_deref(), Some("gw.pod.name"));
        assert_eq!(p.proxy.namespace, "istio-system");
    }

    #[test]
    fn metadata_wins_over_the_id() {
        let labels = Value {
            kind: Some(Kind::StructValue(Struct {
                fields: [
                    ("app".to_string(), s("reviews")),
                    ("version".to_string(), s("v1")),
                ]
                .into(),
            })),
        };
        let p = parse_node(Some(&node(
            "sidecar~10.1.2.3~pod.ns-from-id~ns-from-id.svc.cluster.local",
            &[
                ("NAMESPACE", s("ns-from-meta")),
                ("LABELS", labels),
                ("CLUSTER_ID", s("Kubernetes")),
                ("ISTIO_VERSION", s("1.24.0")),
                ("INSTANCE_IPS", s("10.9.9.9,fd00::9")),
                ("SERVICE_ACCOUNT", s("reviews")),
            ],
        )))
        .unwrap()
        .proxy;
        assert_eq!(p.namespace, "ns-from-meta");
        assert_eq!(p.labels.get("app").map(String::as_str), Some("reviews"));
        assert_eq!(p.labels.len(), 2);
        assert_eq!(p.cluster_id.as_deref(), Some("Kubernetes"));
        assert_eq!(p.istio_version.as_deref(), Some("1.24.0"));
        assert_eq!(p.ips.len(), 2);
        assert_eq!(p.service_account.as_deref(), Some("reviews"));
    }

    #[test]
    fn grpc_generator_from_metadata_user_agent_or_features() {
        let by_meta = parse_node(Some(&node(
            "sidecar~10.0.0.1~a.b~b.svc.cluster.local",
            &[("GENERATOR", s("grpc"))],
        )))
        .unwrap();
        assert!(by_meta.proxy.is_proxyless());
        let by_agent = Node {
            user_agent_name: "gRPC Python".into(),
            ..node("x", &[])
        };
        assert!(parse_node(Some(&by_agent)).unwrap().proxy.is_proxyless());
        let by_feature = Node {
            client_features: vec!["xds.config.resource-in-sotw".into()],
            ..node("x", &[])
        };
        assert!(parse_node(Some(&by_feature)).unwrap().proxy.is_proxyless());
        let envoy = Node {
            user_agent_name: "envoy".into(),
            client_features: vec!["envoy.lb.does_not_support_overprovisioning".into()],
            ..node("x", &[])
        };
        assert!(!parse_node(Some(&envoy)).unwrap().proxy.is_proxyless());
        // Metadata wins over the user agent.
        let overridden = Node {
            user_agent_name: "gRPC Go".into(),
            ..node("x", &[("GENERATOR", s("envoy"))])
        };
        assert!(!parse_node(Some(&overridden)).unwrap().proxy.is_proxyless());
    }

    #[test]
    fn unconventional_ids_get_defaults_and_a_reason() {
        for (id, why) in [
            ("my-proxy", "4 `~`-separated parts"),
            ("gateway~10.0.0.1~a.b~d", "unknown proxy type"),
            ("sidecar~not-an-ip~a.b~d", "not an IP"),
            ("sidecar~10.0.0.1~nodot~d", "not <pod>.<namespace>"),
        ] {
            let p = parse_node(Some(&node(id, &[]))).unwrap();
            assert_eq!(p.proxy.namespace, "default", "{id}");
            assert!(p.proxy.labels.is_empty());
            assert_eq!(p.proxy.id, id);
            let reason = p.unconventional_id.unwrap_or_default();
            assert!(reason.contains(why), "{id}: {reason}");
        }
        // Metadata still applies to such a node.
        let p = parse_node(Some(&node("my-proxy", &[("NAMESPACE", s("prod"))]))).unwrap();
        assert_eq!(p.proxy.namespace, "prod");
    }

    #[test]
    fn missing_node_or_id_is_invalid_argument() {
        assert_eq!(parse_node(None), Err(NodeError::MissingNode));
        assert_eq!(parse_node(Some(&node("", &[]))), Err(NodeError::EmptyId));
        assert_eq!(
            NodeError::EmptyId.into_status().code(),
            tonic::Code::InvalidArgument
        );
    }
}
