//! Kubernetes-style YAML as mesh objects: what `kubectl get -o yaml` prints (Service,
//! EndpointSlice, Pod, VirtualService, DestinationRule, ServiceEntry), parsed from text and
//! collected into builder inputs. Pure: the folder that feeds it (standalone mode and the
//! controller's `--config-dir` mode) is `pilotfish_shared::source`.
//!
//! Multi-document files and `kind: List` are unwrapped; objects without a namespace go to
//! `default`; documents of other kinds are returned as unknown kinds, for the caller to
//! report. Errors name the file, the document index and the reason.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;

use crate::api::{IstioResource, YamlDocument, yaml_documents};
use crate::model::PodInfo;
use crate::model::kube::namespace_of;
use crate::push_context::BuildInputs;

/// One object read from a file.
#[derive(Clone, Debug, PartialEq)]
pub enum MeshObject {
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    Pod(Arc<PodInfo>),
    Istio(Arc<IstioResource>),
}

impl MeshObject {
    /// `(kind, namespace, name)`.
    pub fn key(&self) -> (&'static str, String, String) {
        let (kind, meta) = match self {
            MeshObject::Service(o) => ("Service", &o.metadata),
            MeshObject::EndpointSlice(o) => ("EndpointSlice", &o.metadata),
            MeshObject::Pod(p) => return ("Pod", p.namespace.clone(), p.name.clone()),
            MeshObject::Istio(o) => (o.kind().as_str(), o.metadata()),
        };
        (
            kind,
            namespace_of(meta),
            meta.name.clone().unwrap_or_default(),
        )
    }
}

/// A problem reading one file or one document of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    pub file: PathBuf,
    /// 0-based document index in the file; `None` for errors about the whole file.
    pub document: Option<usize>,
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

/// The outcome of parsing one file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedFile {
    pub objects: Vec<MeshObject>,
    /// `apiVersion/kind` of documents that are not mesh objects (ignored).
    pub unknown_kinds: Vec<String>,
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

fn parse_document(file: &std::path::Path, doc: &YamlDocument, out: &mut ParsedFile) {
    let err = |message: String| SourceError {
        file: file.to_path_buf(),
        document: Some(doc.index),
        message,
    };
    let value = &doc.value;
    if value.is_null() {
        return;
    }
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind == "List" || kind.ends_with("List") && value.get("items").is_some() {
        for (i, item) in value
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            match parse_object(item) {
                Ok(Some(o)) => out.objects.push(o),
                Ok(None) => out.unknown_kinds.push(kind_of(item)),
                Err(m) => out.errors.push(err(format!("items[{i}]: {m}"))),
            }
        }
        return;
    }
    match IstioResource::parse_strict_yaml(doc) {
        Ok(Some(r)) => out
            .objects
            .push(MeshObject::Istio(Arc::new(with_default_namespace_istio(r)))),
        Err(e) => out
            .errors
            .push(err(format!("{kind} {}: {e}", name_of(value)))),
        Ok(None) => match parse_object(value) {
            Ok(Some(o)) => out.objects.push(o),
            Ok(None) => out.unknown_kinds.push(format!("{api_version}/{kind}")),
            Err(m) => out.errors.push(err(m)),
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

fn name_of(v: &Value) -> String {
    let meta = v.get("metadata");
    let get = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let ns = get("namespace");
    format!(
        "{}/{}",
        if ns.is_empty() { "default" } else { ns },
        get("name")
    )
}

/// Parses one object; `Ok(None)` for kinds that are not mesh objects.
pub fn parse_object(value: &Value) -> Result<Option<MeshObject>, String> {
    if let Some(r) = IstioResource::parse_strict(value).map_err(|e| e.to_string())? {
        return Ok(Some(MeshObject::Istio(Arc::new(
            with_default_namespace_istio(r),
        ))));
    }
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let what = || format!("{kind} {}", name_of(value));
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
    }
    r
}

/// Collects objects into builder inputs. Later objects with the same key replace earlier
/// ones (the caller orders them, e.g. by file name).
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
            MeshObject::Istio(r) => match &**r {
                IstioResource::VirtualService(v) => {
                    base.virtual_services.push(Arc::new((**v).clone()))
                }
                IstioResource::DestinationRule(d) => {
                    base.destination_rules.push(Arc::new((**d).clone()))
                }
                IstioResource::ServiceEntry(s) => {
                    base.service_entries.push(Arc::new((**s).clone()))
                }
            },
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
        assert_eq!(
            parsed.unknown_kinds,
            vec!["apps/v1/Deployment".to_string(), "v1/ConfigMap".to_string()]
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
        assert!(msg.contains("spec.http[0].route[0].destinaton"), "{msg}");
    }

    #[test]
    fn syntax_errors_fail_the_file() {
        let parsed = parse_text(Path::new("bad.yaml"), "kind: [unclosed\n");
        assert_eq!(parsed.errors.len(), 1);
        assert_eq!(parsed.errors[0].document, None);
    }
}
