//! Kubernetes-style YAML as mesh objects: what `kubectl get -o yaml` prints (Service,
//! EndpointSlice, Pod, Node, VirtualService, DestinationRule, ServiceEntry,
//! PeerAuthentication, Sidecar, RequestAuthentication, AuthorizationPolicy), parsed from
//! text and
//! collected into builder inputs. Pure: the folder that feeds it (standalone mode and the
//! controller's `--config-dir` mode) is `pilotfish_shared::source`.
//!
//! Each document stands alone: one that does not parse is an error naming the file, the
//! document index, the object (when it can be named) and the reason, and the others are
//! read as usual. Multi-document files and `kind: List` are unwrapped; objects without a
//! namespace go to `default`. Documents of other kinds are returned as ignored objects,
//! the kinds Istio reads but Pilotfish does not (Gateway, AuthorizationPolicy,
//! Gateway API kinds, ...) marked as such, for the caller to report. Fields of Istio
//! objects that the types do not know (a newer Istio's, or typos) do not fail the object:
//! they are kept beside it and become warnings of the build.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;

use crate::api::{IstioKind, IstioResource, YamlDocument, yaml_documents};
use crate::config::{ConfigError, ConfigKey, ConfigKind};
use crate::model::kube::namespace_of;
use crate::model::{NodeInfo, PodInfo};
use crate::push_context::BuildInputs;

/// `(kind, namespace, name)` of an object as written in a document.
pub type ObjectName = (String, String, String);

/// One object read from a file.
#[derive(Clone, Debug, PartialEq)]
pub enum MeshObject {
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    Pod(Arc<PodInfo>),
    /// A Node (cluster-scoped: no namespace), for its Pods' locality.
    Node(Arc<NodeInfo>),
    /// An Istio object and the paths of the fields Pilotfish does not know in it.
    Istio(Arc<IstioResource>, Arc<[String]>),
}

impl MeshObject {
    /// `(kind, namespace, name)`.
    pub fn key(&self) -> (&'static str, String, String) {
        let (kind, meta) = match self {
            MeshObject::Service(o) => ("Service", &o.metadata),
            MeshObject::EndpointSlice(o) => ("EndpointSlice", &o.metadata),
            MeshObject::Pod(p) => return ("Pod", p.namespace.clone(), p.name.clone()),
            MeshObject::Node(n) => return ("Node", String::new(), n.name.clone()),
            MeshObject::Istio(o, _) => (o.kind().as_str(), o.metadata()),
        };
        (
            kind,
            namespace_of(meta),
            meta.name.clone().unwrap_or_default(),
        )
    }

    /// The key as an [`ObjectName`].
    pub fn name(&self) -> ObjectName {
        let (kind, namespace, name) = self.key();
        (kind.to_string(), namespace, name)
    }
}

/// A problem reading one file or one document of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    pub file: PathBuf,
    /// 0-based document index in the file; `None` for errors about the whole file.
    pub document: Option<usize>,
    /// The object the document describes, when its kind and name could be read.
    pub object: Option<ObjectName>,
    pub message: String,
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.document {
            Some(i) => write!(
                f,
                "{}: document {}: {}",
                self.file.display(),
                i,
                self.message
            ),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

/// A document of a kind Pilotfish does not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnoredObject {
    /// `apiVersion/kind`, e.g. `networking.istio.io/v1/Gateway`.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// 0-based document index in the file.
    pub document: usize,
    /// An Istio (or Gateway API) kind that Istio reads and Pilotfish does not support yet,
    /// as opposed to a kind the mesh has no use for (a Deployment, a ConfigMap).
    pub not_supported_yet: bool,
}

/// The outcome of parsing one file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedFile {
    pub objects: Vec<MeshObject>,
    /// Documents of other kinds (skipped).
    pub ignored: Vec<IgnoredObject>,
    pub errors: Vec<SourceError>,
}

/// Parses a YAML (or JSON) stream. `file` labels errors.
pub fn parse_text(file: &std::path::Path, text: &str) -> ParsedFile {
    let mut out = ParsedFile::default();
    let documents = match yaml_documents(text) {
        Ok(d) => d,
        Err(e) => {
            out.errors.push(SourceError {
                file: file.to_path_buf(),
                document: None,
                object: None,
                message: e.to_string(),
            });
            return out;
        }
    };
    for doc in &documents {
        parse_document(file, doc, &mut out);
    }
    out
}

/// Whether Istio reads objects of this API group (its own groups and the Gateway API).
fn istio_reads(group: &str) -> bool {
    group == "istio.io"
        || group.ends_with(".istio.io")
        || group == "gateway.networking.k8s.io"
        || group == "gateway.networking.x-k8s.io"
}

/// The document is of a kind Istio reads and Pilotfish does not support yet: anything of
/// an Istio or Gateway API group but the kinds it parses ([`IstioKind::ALL`]; an unserved
/// version of those is an error, not this).
fn not_supported_yet(value: &Value) -> bool {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let Some((group, _)) = api_version.split_once('/') else {
        return false;
    };
    istio_reads(group)
        && !IstioKind::ALL
            .into_iter()
            .any(|k| k.group() == group && k.as_str() == kind)
}

fn ignored(value: &Value, document: usize) -> IgnoredObject {
    let (namespace, name) = namespace_and_name(value);
    IgnoredObject {
        kind: kind_of(value),
        namespace,
        name,
        document,
        not_supported_yet: not_supported_yet(value),
    }
}

fn parse_document(file: &std::path::Path, doc: &YamlDocument, out: &mut ParsedFile) {
    let value = &doc.value;
    if value.is_null() {
        return;
    }
    let err = |message: String, object: Option<ObjectName>| SourceError {
        file: file.to_path_buf(),
        document: Some(doc.index),
        object,
        message,
    };
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind == "List" || kind.ends_with("List") && value.get("items").is_some() {
        for (i, item) in value
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if not_supported_yet(item) {
                out.ignored.push(ignored(item, doc.index));
                continue;
            }
            match parse_object(item) {
                Ok(Some(o)) => out.objects.push(o),
                Ok(None) => out.ignored.push(ignored(item, doc.index)),
                Err(m) => out
                    .errors
                    .push(err(format!("items[{i}]: {m}"), object_name(item))),
            }
        }
        return;
    }
    if not_supported_yet(value) {
        out.ignored.push(ignored(value, doc.index));
        return;
    }
    match IstioResource::parse_yaml_reporting_unknown(doc) {
        Ok(Some(parsed)) => {
            let unknown: Vec<String> = parsed.unknown_fields.into_iter().map(|f| f.path).collect();
            out.objects.push(MeshObject::Istio(
                Arc::new(with_default_namespace_istio(parsed.object)),
                unknown.into(),
            ));
        }
        Err(e) => out.errors.push(err(
            format!("{kind} {}: {e}", display_name(value)),
            object_name(value),
        )),
        Ok(None) => match parse_object(value) {
            Ok(Some(o)) => out.objects.push(o),
            Ok(None) => out.ignored.push(ignored(value, doc.index)),
            Err(m) => out.errors.push(err(m, object_name(value))),
        },
    }
}

fn kind_of(v: &Value) -> String {
    format!(
        "{}/{}",
        v.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
        v.get("kind").and_then(Value::as_str).unwrap_or("")
    )
}

fn namespace_and_name(v: &Value) -> (String, String) {
    let meta = v.get("metadata");
    let get = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let ns = get("namespace");
    (
        if ns.is_empty() { "default" } else { ns }.to_string(),
        get("name").to_string(),
    )
}

fn display_name(v: &Value) -> String {
    let (namespace, name) = namespace_and_name(v);
    format!("{namespace}/{name}")
}

/// The object a document names, when it has a kind and a name.
fn object_name(v: &Value) -> Option<ObjectName> {
    let kind = v
        .get("kind")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())?;
    let (namespace, name) = namespace_and_name(v);
    (!name.is_empty()).then(|| (kind.to_string(), namespace, name))
}

/// Parses one object strictly (unknown fields of Istio objects are errors here); `Ok(None)`
/// for kinds that are not mesh objects.
pub fn parse_object(value: &Value) -> Result<Option<MeshObject>, String> {
    if let Some(r) = IstioResource::parse_strict(value).map_err(|e| e.to_string())? {
        return Ok(Some(MeshObject::Istio(
            Arc::new(with_default_namespace_istio(r)),
            Arc::from([]),
        )));
    }
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let what = || format!("{kind} {}", display_name(value));
    fn decode<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, String> {
        serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            format!("{path}: {}", e.into_inner())
        })
    }
    let obj = match (api_version, kind) {
        ("v1", "Service") => {
            let mut s: Service = decode(value).map_err(|e| format!("{}: {e}", what()))?;
            default_namespace(&mut s.metadata);
            MeshObject::Service(Arc::new(s))
        }
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            let mut s: EndpointSlice = decode(value).map_err(|e| format!("{}: {e}", what()))?;
            default_namespace(&mut s.metadata);
            MeshObject::EndpointSlice(Arc::new(s))
        }
        ("v1", "Pod") => {
            let mut p: Pod = decode(value).map_err(|e| format!("{}: {e}", what()))?;
            default_namespace(&mut p.metadata);
            MeshObject::Pod(Arc::new(PodInfo::from_k8s(&p)))
        }
        ("v1", "Node") => {
            let n: Node = decode(value).map_err(|e| format!("{}: {e}", what()))?;
            MeshObject::Node(Arc::new(NodeInfo::from_k8s(&n)))
        }
        _ => return Ok(None),
    };
    if obj.key().2.is_empty() {
        return Err(format!("{}: metadata.name is required", what()));
    }
    Ok(Some(obj))
}

fn default_namespace(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    if meta.namespace.as_deref().unwrap_or("").is_empty() {
        meta.namespace = Some("default".to_string());
    }
}

fn with_default_namespace_istio(mut r: IstioResource) -> IstioResource {
    match &mut r {
        IstioResource::VirtualService(o) => default_namespace(&mut o.metadata),
        IstioResource::DestinationRule(o) => default_namespace(&mut o.metadata),
        IstioResource::ServiceEntry(o) => default_namespace(&mut o.metadata),
        IstioResource::PeerAuthentication(o) => default_namespace(&mut o.metadata),
        IstioResource::Sidecar(o) => default_namespace(&mut o.metadata),
        IstioResource::RequestAuthentication(o) => default_namespace(&mut o.metadata),
        IstioResource::AuthorizationPolicy(o) => default_namespace(&mut o.metadata),
    }
    r
}

/// The warning about a field of an Istio object that Pilotfish does not know.
pub fn unknown_field_warning(key: &ConfigKey, path: &str) -> ConfigError {
    ConfigError::warning(
        key,
        path,
        "unknown field: not part of the Istio 1.30 API Pilotfish knows (a newer Istio's field, or a typo), so it is ignored",
    )
}

/// The [`ConfigKind`] of an Istio kind.
pub fn config_kind(kind: IstioKind) -> ConfigKind {
    match kind {
        IstioKind::VirtualService => ConfigKind::VirtualService,
        IstioKind::DestinationRule => ConfigKind::DestinationRule,
        IstioKind::ServiceEntry => ConfigKind::ServiceEntry,
        IstioKind::PeerAuthentication => ConfigKind::PeerAuthentication,
        IstioKind::Sidecar => ConfigKind::Sidecar,
        IstioKind::RequestAuthentication => ConfigKind::RequestAuthentication,
        IstioKind::AuthorizationPolicy => ConfigKind::AuthorizationPolicy,
    }
}

/// Collects objects into builder inputs. Later objects with the same key replace earlier
/// ones (the caller orders them, e.g. by file name). The unknown fields of Istio objects
/// become [`BuildInputs::input_warnings`].
pub fn to_inputs<'a>(
    objects: impl IntoIterator<Item = &'a MeshObject>,
    mut base: BuildInputs,
) -> BuildInputs {
    let mut unique: BTreeMap<(&'static str, String, String), &MeshObject> = BTreeMap::new();
    for o in objects {
        unique.insert(o.key(), o);
    }
    for o in unique.into_values() {
        match o {
            MeshObject::Service(s) => base.services.push(s.clone()),
            MeshObject::EndpointSlice(s) => base.endpoint_slices.push(s.clone()),
            MeshObject::Pod(p) => base.pods.push(p.clone()),
            MeshObject::Node(n) => base.nodes.push(n.clone()),
            MeshObject::Istio(r, unknown) => {
                if !unknown.is_empty() {
                    let (_, namespace, name) = o.key();
                    let key = ConfigKey::new(config_kind(r.kind()), namespace, name);
                    base.input_warnings
                        .extend(unknown.iter().map(|path| unknown_field_warning(&key, path)));
                }
                match &**r {
                    IstioResource::VirtualService(v) => {
                        base.virtual_services.push(Arc::new((**v).clone()))
                    }
                    IstioResource::DestinationRule(d) => {
                        base.destination_rules.push(Arc::new((**d).clone()))
                    }
                    IstioResource::ServiceEntry(s) => {
                        base.service_entries.push(Arc::new((**s).clone()))
                    }
                    IstioResource::PeerAuthentication(p) => {
                        base.peer_authentications.push(Arc::new((**p).clone()))
                    }
                    IstioResource::Sidecar(s) => base.sidecars.push(Arc::new((**s).clone())),
                    IstioResource::RequestAuthentication(r) => {
                        base.request_authentications.push(Arc::new((**r).clone()))
                    }
                    IstioResource::AuthorizationPolicy(a) => {
                        base.authorization_policies.push(Arc::new((**a).clone()))
                    }
                }
            }
        }
    }
    base
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn reads_multi_document_files_and_lists() {
        let text = "\
apiVersion: v1
kind: Service
metadata: {name: reviews}
spec:
  ports: [{name: http, port: 9080}]
---
apiVersion: v1
kind: List
items:
- apiVersion: networking.istio.io/v1beta1
  kind: DestinationRule
  metadata: {name: reviews, namespace: bookinfo}
  spec: {host: reviews}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: reviews}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: x}
";
        let parsed = parse_text(Path::new("a.yaml"), text);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let keys: Vec<_> = parsed.objects.iter().map(MeshObject::key).collect();
        assert_eq!(
            keys,
            vec![
                ("Service", "default".to_string(), "reviews".to_string()),
                (
                    "DestinationRule",
                    "bookinfo".to_string(),
                    "reviews".to_string()
                ),
            ]
        );
        let ignored: Vec<(&str, bool)> = parsed
            .ignored
            .iter()
            .map(|i| (i.kind.as_str(), i.not_supported_yet))
            .collect();
        assert_eq!(
            ignored,
            [("apps/v1/Deployment", false), ("v1/ConfigMap", false)]
        );
    }

    /// Istio's usual sample layout: a Gateway, a VirtualService bound to it and to the mesh,
    /// a Sidecar and an AuthorizationPolicy in one file. Each document stands alone: the
    /// kinds Pilotfish does not support are set aside as such, the rest (the
    /// VirtualService and the Sidecar) is read.
    #[test]
    fn unsupported_istio_kinds_beside_supported_ones_do_not_fail_the_file() {
        let text = "\
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: bookinfo-gateway}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bookinfo}
spec:
  hosts: ['*']
  gateways: [bookinfo-gateway]
  http: [{route: [{destination: {host: productpage, port: {number: 9080}}}]}]
---
apiVersion: networking.istio.io/v1beta1
kind: Sidecar
metadata: {name: default, namespace: istio-system}
spec: {egress: [{hosts: ['./*']}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-all}
spec: {}
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt}
spec: {}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: mesh-default}
spec: {}
";
        let parsed = parse_text(Path::new("bookinfo-gateway.yaml"), text);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let kinds: Vec<&str> = parsed.objects.iter().map(|o| o.key().0).collect();
        assert_eq!(
            kinds,
            [
                "VirtualService",
                "Sidecar",
                "AuthorizationPolicy",
                "RequestAuthentication"
            ]
        );
        let ignored: Vec<(&str, &str, bool)> = parsed
            .ignored
            .iter()
            .map(|i| (i.kind.as_str(), i.name.as_str(), i.not_supported_yet))
            .collect();
        assert_eq!(
            ignored,
            [
                ("networking.istio.io/v1/Gateway", "bookinfo-gateway", true),
                ("telemetry.istio.io/v1/Telemetry", "mesh-default", true),
            ]
        );
    }

    /// A field Pilotfish does not know (a newer Istio's) does not drop the object: it is
    /// read, and the field becomes a warning of the build.
    #[test]
    fn unknown_fields_are_warnings_not_errors() {
        let text = "\
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo}
spec:
  host: reviews
  futureField: {enabled: true}
  trafficPolicy: {loadBalancer: {simple: RANDOM, fancyMode: x}}
";
        let parsed = parse_text(Path::new("dr.yaml"), text);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let inputs = to_inputs(&parsed.objects, BuildInputs::default());
        assert_eq!(inputs.destination_rules.len(), 1);
        let warnings: Vec<String> = inputs
            .input_warnings
            .iter()
            .map(|w| w.to_string())
            .collect();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].starts_with(
                "warning DestinationRule bookinfo/reviews: spec.futureField: unknown field"
            ),
            "{warnings:?}"
        );
        assert!(
            warnings[1].contains("spec.trafficPolicy.loadBalancer.fancyMode"),
            "{warnings:?}"
        );
    }

    #[test]
    fn errors_name_file_document_and_field() {
        let text = "\
apiVersion: v1
kind: Service
metadata: {name: ok}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews}
spec:
  hosts: [reviews]
  http:
  - route:
    - destinaton: {host: reviews}
";
        let parsed = parse_text(Path::new("dir/vs.yaml"), text);
        assert_eq!(parsed.errors.len(), 1);
        let msg = parsed.errors[0].to_string();
        assert!(
            msg.starts_with("dir/vs.yaml: document 1: VirtualService default/reviews:"),
            "{msg}"
        );
        // The misspelt field is set aside; the missing `destination` is the error.
        assert!(
            msg.contains("spec.http[0].route[0]: missing field `destination`"),
            "{msg}"
        );
        assert_eq!(
            parsed.errors[0].object,
            Some(("VirtualService".into(), "default".into(), "reviews".into()))
        );
        // The other document is read.
        assert_eq!(parsed.objects.len(), 1);
    }

    #[test]
    fn syntax_errors_fail_the_file() {
        let parsed = parse_text(Path::new("bad.yaml"), "kind: [unclosed\n");
        assert_eq!(parsed.errors.len(), 1);
        assert_eq!(parsed.errors[0].document, None);
    }
}
