//! Defaulting the real server does on every write, limited to what clients read back:
//! Service cluster IPs and port protocols (kept across updates, as upstream does),
//! workload replica counts and rollout settings, Namespace phase and labels, and the
//! initial status of kinds whose status the server owns.

use serde_json::{Value, json};

use super::registry::ResourceType;

/// Allocates addresses and node ports for Services, like the allocators upstream.
#[derive(Debug, Default)]
pub struct Allocator {
    next_ip: u32,
    next_node_port: u16,
}

impl Allocator {
    fn cluster_ip(&mut self) -> String {
        // 10.96.0.0/12; .0.1 is reserved for the `kubernetes` Service upstream.
        self.next_ip += 1;
        let n = self.next_ip + 1;
        format!("10.96.{}.{}", (n >> 8) & 0xff, n & 0xff)
    }

    fn node_port(&mut self) -> u16 {
        let port = 30000 + self.next_node_port % 2768;
        self.next_node_port += 1;
        port
    }
}

fn set_default(object: &mut Value, key: &str, value: Value) {
    if let Value::Object(map) = object
        && map.get(key).is_none_or(Value::is_null)
    {
        map.insert(key.to_string(), value);
    }
}

/// Applies defaults to `object` (served form) being written through `rt`; `old` is the
/// stored object an update replaces.
pub fn apply(
    rt: &ResourceType,
    object: &mut Value,
    old: Option<&Value>,
    allocator: &mut Allocator,
) {
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "Service") => service(object, old, allocator),
        ("", "Namespace") => {
            let name = object
                .pointer("/metadata/name")
                .cloned()
                .unwrap_or(Value::Null);
            set_default(&mut object["metadata"], "labels", json!({}));
            object["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
            set_default(object, "spec", json!({}));
            set_default(&mut object["spec"], "finalizers", json!(["kubernetes"]));
        }
        ("apps", "Deployment") => {
            set_default(object, "spec", json!({}));
            let spec = &mut object["spec"];
            set_default(spec, "replicas", json!(1));
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(spec, "progressDeadlineSeconds", json!(600));
            set_default(
                spec,
                "strategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
            );
        }
        ("apps", "StatefulSet" | "ReplicaSet") => {
            set_default(object, "spec", json!({}));
            set_default(&mut object["spec"], "replicas", json!(1));
        }
        _ => {}
    }
}

fn service(object: &mut Value, old: Option<&Value>, allocator: &mut Allocator) {
    set_default(object, "spec", json!({}));
    let spec = &mut object["spec"];
    set_default(spec, "type", json!("ClusterIP"));
    set_default(spec, "sessionAffinity", json!("None"));
    let service_type = spec["type"].as_str().unwrap_or("ClusterIP").to_string();
    if service_type != "ExternalName" {
        // An update that omits allocated values keeps them (upstream `patchAllocatedValues`).
        if let Some(old_spec) = old.and_then(|o| o.get("spec")) {
            for key in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                if let Some(value) = old_spec.get(key) {
                    set_default(spec, key, value.clone());
                }
            }
        }
        if spec.get("clusterIP").is_none_or(Value::is_null) {
            spec["clusterIP"] = json!(allocator.cluster_ip());
        }
        let ip = spec["clusterIP"].clone();
        set_default(spec, "clusterIPs", json!([ip]));
        set_default(spec, "ipFamilies", json!(["IPv4"]));
        set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
        set_default(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    let exposes_node_ports = matches!(service_type.as_str(), "NodePort" | "LoadBalancer");
    if exposes_node_ports {
        set_default(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    let old_ports = old
        .and_then(|o| o.pointer("/spec/ports"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(Value::Array(ports)) = spec.get_mut("ports") {
        for port in ports.iter_mut() {
            set_default(port, "protocol", json!("TCP"));
            let number = port.get("port").cloned().unwrap_or(Value::Null);
            set_default(port, "targetPort", number.clone());
            if exposes_node_ports {
                let kept = old_ports
                    .iter()
                    .find(|p| p.get("port") == Some(&number))
                    .and_then(|p| p.get("nodePort"))
                    .cloned();
                let node_port = kept.unwrap_or_else(|| json!(allocator.node_port()));
                set_default(port, "nodePort", node_port);
            }
        }
    }
}

/// Status a kind starts with, whatever the creator sent (status is the server's).
pub fn initial_status(rt: &ResourceType) -> Option<Value> {
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "Namespace") => Some(json!({"phase": "Active"})),
        ("", "Pod") => Some(json!({"phase": "Pending", "qosClass": "BestEffort"})),
        ("", "Service") => Some(json!({"loadBalancer": {}})),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;

    #[test]
    fn service_gets_ip_and_port_defaults_kept_across_updates() {
        let registry = Registry::default();
        let rt = registry.lookup("", "v1", "services").unwrap();
        let mut allocator = Allocator::default();
        let mut svc = json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}});
        apply(&rt, &mut svc, None, &mut allocator);
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        assert_eq!(
            svc["spec"]["ports"][0],
            json!({"port": 80, "protocol": "TCP", "targetPort": 80})
        );
        let ip = svc["spec"]["clusterIP"].clone();
        assert_eq!(svc["spec"]["clusterIPs"], json!([ip.clone()]));
        let mut update = json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 81}]}});
        apply(&rt, &mut update, Some(&svc), &mut allocator);
        assert_eq!(update["spec"]["clusterIP"], ip);
    }

    #[test]
    fn headless_and_node_port_services() {
        let registry = Registry::default();
        let rt = registry.lookup("", "v1", "services").unwrap();
        let mut allocator = Allocator::default();
        let mut headless = json!({"spec": {"clusterIP": "None"}});
        apply(&rt, &mut headless, None, &mut allocator);
        assert_eq!(headless["spec"]["clusterIPs"], json!(["None"]));
        let mut node_port = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        apply(&rt, &mut node_port, None, &mut allocator);
        assert!(
            node_port["spec"]["ports"][0]["nodePort"]
                .as_u64()
                .is_some_and(|p| p >= 30000)
        );
    }
}
