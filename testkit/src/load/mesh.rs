//! The benchmark's mesh as a `--config-dir` folder: `mesh::synthetic` services written as
//! Kubernetes YAML (one workloads file per namespace, one file per VirtualService and per
//! DestinationRule, so an edit rewrites one small file), the sidecars that would run in it,
//! and the edits the benchmark makes (a VirtualService rewritten with a marker, a Service
//! added and removed).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use pilotfish_mesh::synthetic::{self, MeshShape};
use serde_json::{Value, json};

/// One sidecar of the mesh: a Pod of a service.
#[derive(Clone, Debug)]
pub struct Sidecar {
    pub pod: String,
    pub namespace: String,
    pub ip: String,
    pub app: String,
    pub version: String,
}

impl Sidecar {
    /// Istio's node id for it.
    pub fn node_id(&self) -> String {
        format!(
            "sidecar~{}~{}.{}~{}.svc.cluster.local",
            self.ip, self.pod, self.namespace, self.namespace
        )
    }
}

/// A written mesh.
#[derive(Debug)]
pub struct BenchMesh {
    pub dir: PathBuf,
    pub sidecars: Vec<Sidecar>,
    /// `(name, namespace)` of the services with a VirtualService, in order.
    pub routed: Vec<(String, String)>,
    vs: Vec<Value>,
}

/// The service the benchmark adds and removes.
pub const ADDED_SERVICE: &str = "bench-added";

/// Writes the mesh of `shape` into `dir` (created if needed).
pub fn write(dir: &Path, shape: MeshShape) -> Result<BenchMesh> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let inputs = synthetic::mesh(shape);
    let mut by_namespace: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    for service in &inputs.services {
        let ns = service.metadata.namespace.clone().unwrap_or_default();
        by_namespace
            .entry(ns)
            .or_default()
            .push(serde_json::to_value(service.as_ref())?);
    }
    for slice in &inputs.endpoint_slices {
        let ns = slice.metadata.namespace.clone().unwrap_or_default();
        by_namespace
            .entry(ns)
            .or_default()
            .push(serde_json::to_value(slice.as_ref())?);
    }
    let mut sidecars = Vec::new();
    for pod in &inputs.pods {
        by_namespace
            .entry(pod.namespace.clone())
            .or_default()
            .push(pod_json(
                &pod.name,
                &pod.namespace,
                &pod.labels,
                &pod.ips[0],
                pod.service_account.as_deref().unwrap_or("default"),
            ));
        sidecars.push(Sidecar {
            pod: pod.name.clone(),
            namespace: pod.namespace.clone(),
            ip: pod.ips[0].clone(),
            app: pod.labels.get("app").cloned().unwrap_or_default(),
            version: pod.labels.get("version").cloned().unwrap_or_default(),
        });
    }
    for (ns, docs) in &by_namespace {
        write_docs(&dir.join(format!("workloads-{ns}.yaml")), docs)?;
    }
    for dr in &inputs.destination_rules {
        let value = serde_json::to_value(dr.as_ref())?;
        let name = dr.metadata.name.clone().unwrap_or_default();
        write_docs(&dir.join(format!("dr-{name}.yaml")), &[value])?;
    }
    let mut routed = Vec::new();
    let mut vs = Vec::new();
    for v in &inputs.virtual_services {
        let value = serde_json::to_value(v.as_ref())?;
        let name = v.metadata.name.clone().unwrap_or_default();
        let ns = v.metadata.namespace.clone().unwrap_or_default();
        write_docs(
            &dir.join(format!("vs-{name}.yaml")),
            std::slice::from_ref(&value),
        )?;
        routed.push((name, ns));
        vs.push(value);
    }
    Ok(BenchMesh {
        dir: dir.to_path_buf(),
        sidecars,
        routed,
        vs,
    })
}

impl BenchMesh {
    /// Rewrites the `i`-th VirtualService (modulo their number) so its header route
    /// matches `marker`: a change that shows up, as `marker`, in that service's routes.
    pub fn edit_virtual_service(&self, i: usize, marker: &str) -> Result<()> {
        let i = i % self.vs.len();
        let mut value = self.vs[i].clone();
        value["spec"]["http"][0]["match"][0]["headers"]["end-user"]["exact"] = json!(marker);
        let (name, _) = &self.routed[i];
        write_docs(&self.dir.join(format!("vs-{name}.yaml")), &[value])
    }

    /// Adds Service [`ADDED_SERVICE`] in the first namespace, with two Pods.
    pub fn add_service(&self) -> Result<()> {
        let ns = self
            .sidecars
            .first()
            .map_or("default".to_string(), |s| s.namespace.clone());
        let labels: std::collections::BTreeMap<String, String> = [
            ("app".to_string(), ADDED_SERVICE.to_string()),
            ("version".to_string(), "v1".to_string()),
        ]
        .into();
        let ips = ["10.250.0.1", "10.250.0.2"];
        let mut docs = vec![json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": ADDED_SERVICE, "namespace": ns, "labels": {"app": ADDED_SERVICE}},
            "spec": {"clusterIP": "10.95.255.1", "selector": {"app": ADDED_SERVICE},
                     "ports": [{"name": "http", "port": 8080}]}
        })];
        let mut endpoints = Vec::new();
        for (i, ip) in ips.iter().enumerate() {
            let pod = format!("{ADDED_SERVICE}-{i}");
            docs.push(pod_json(&pod, &ns, &labels, ip, ADDED_SERVICE));
            endpoints.push(json!({
                "addresses": [ip], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": ns}
            }));
        }
        docs.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{ADDED_SERVICE}-slice"), "namespace": ns,
                         "labels": {"kubernetes.io/service-name": ADDED_SERVICE}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": endpoints
        }));
        write_docs(&self.added_file(), &docs)
    }

    /// Removes what [`BenchMesh::add_service`] added.
    pub fn remove_service(&self) -> Result<()> {
        std::fs::remove_file(self.added_file()).context("remove the added service")
    }

    fn added_file(&self) -> PathBuf {
        self.dir.join(format!("{ADDED_SERVICE}.yaml"))
    }
}

fn pod_json(
    name: &str,
    ns: &str,
    labels: &std::collections::BTreeMap<String, String>,
    ip: &str,
    service_account: &str,
) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"serviceAccountName": service_account, "containers": [{"name": "app", "image": "example/app"}]},
        "status": {"podIP": ip, "podIPs": [{"ip": ip}], "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// Writes JSON documents (JSON is YAML) as one multi-document file, atomically: the
/// folder source never reads a half-written file.
/// Writes one Sidecar per namespace of `mesh` importing `./*` and `istio-system/*` (the
/// scoping Istio's load tests use), into `sidecars.yaml`.
pub fn write_namespace_sidecars(mesh: &BenchMesh) -> Result<()> {
    let namespaces: std::collections::BTreeSet<&str> =
        mesh.sidecars.iter().map(|s| s.namespace.as_str()).collect();
    let docs: Vec<Value> = namespaces
        .into_iter()
        .map(|ns| {
            json!({
                "apiVersion": "networking.istio.io/v1",
                "kind": "Sidecar",
                "metadata": {"name": "default", "namespace": ns},
                "spec": {"egress": [{"hosts": ["./*", "istio-system/*"]}]},
            })
        })
        .collect();
    write_docs(&mesh.dir.join("sidecars.yaml"), &docs)
}

fn write_docs(path: &Path, docs: &[Value]) -> Result<()> {
    let mut text = String::new();
    for doc in docs {
        text.push_str("---\n");
        text.push_str(&serde_json::to_string(doc)?);
        text.push('\n');
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .context("file name")?;
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::document;

    #[test]
    fn the_written_mesh_reads_back_whole_and_edits_stay_valid() {
        let dir = tempfile::tempdir().unwrap();
        let shape = MeshShape {
            services: 30,
            endpoints_per_service: 2,
            routed_every: 10,
            namespaces: 3,
        };
        let mesh = write(dir.path(), shape).unwrap();
        assert_eq!(mesh.sidecars.len(), 60);
        assert_eq!(mesh.routed.len(), 3);
        mesh.edit_virtual_service(1, "marker-1").unwrap();
        mesh.add_service().unwrap();
        let mut kinds = std::collections::BTreeMap::<String, usize>::new();
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let parsed = document::parse_text(&path, &text);
            assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
            assert!(parsed.ignored.is_empty(), "{:?}", parsed.ignored);
            for object in parsed.objects {
                *kinds.entry(object.key().0.to_string()).or_default() += 1;
            }
        }
        assert_eq!(kinds["Service"], 31);
        assert_eq!(kinds["Pod"], 62);
        assert_eq!(kinds["EndpointSlice"], 31);
        assert_eq!(kinds["VirtualService"], 3);
        assert_eq!(kinds["DestinationRule"], 3);
        let edited = std::fs::read_to_string(dir.path().join("vs-svc-10.yaml")).unwrap();
        assert!(edited.contains("marker-1"));
        mesh.remove_service().unwrap();
    }
}
