//! [`Decoded<K>`]: a Kubernetes object as our watchers read it — the typed object, or,
//! when it does not fit the type, its metadata and the reason. A watcher over a plain
//! type fails a whole list (and so retries it forever) when one object does not
//! deserialize; over `Decoded<K>` the bad object is reported and skipped, and its watch
//! goes on.
//!
//! Istio objects may carry fields Pilotfish does not know: the cluster's CRDs may be
//! Istio's own, of a newer release. Such an object is read all the same, and the paths of
//! those fields come with it, for the builder to report as warnings (log, status
//! condition `AcceptedWithWarnings`).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Why an object could not be read: the field path (`spec.http[0].timeout`) and the
/// reason, as serde reported them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeFailure {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for DecodeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() || self.path == "." {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// What is kept of an object that does not decode.
#[derive(Clone, Debug)]
pub struct Undecodable {
    pub metadata: ObjectMeta,
    /// The object's `status`, kept as JSON: the status writer compares with it.
    pub status: Option<Value>,
    pub failure: DecodeFailure,
}

/// A watched object, typed when possible.
#[derive(Clone, Debug)]
pub enum Decoded<K> {
    /// The object, and the paths of the fields its type does not know (Istio kinds only;
    /// empty for the others).
    Ok(K, Vec<String>),
    /// Boxed: rare, and it keeps the common variant's size.
    Invalid(Box<Undecodable>),
}

/// The group of the Istio kinds, whose unknown fields are reported.
const ISTIO_GROUP: &str = pilotfish_mesh::api::GROUP;

impl<K: DeserializeOwned + Resource<DynamicType = ()>> Decoded<K> {
    /// Reads `value` as `K`, or keeps what can be read of it.
    pub fn from_value(value: Value) -> Result<Self, serde_json::Error> {
        let read = if K::group(&()) == ISTIO_GROUP {
            pilotfish_mesh::api::parse_reporting_unknown::<K>(&value)
                .map(|parsed| {
                    let unknown = parsed.unknown_fields.into_iter().map(|f| f.path).collect();
                    (parsed.object, unknown)
                })
                .map_err(|e| {
                    // The type error is the last entry (unknown fields found before it
                    // come first).
                    let last = e.errors.last();
                    DecodeFailure {
                        path: last.map(|f| f.path.clone()).unwrap_or_default(),
                        message: last.map(|f| f.reason.clone()).unwrap_or_default(),
                    }
                })
        } else {
            serde_path_to_error::deserialize::<_, K>(&value)
                .map(|object| (object, Vec::new()))
                .map_err(|e| DecodeFailure {
                    path: e.path().to_string(),
                    message: e.inner().to_string(),
                })
        };
        match read {
            Ok((object, unknown)) => Ok(Decoded::Ok(object, unknown)),
            Err(failure) => {
                // Without readable metadata the object cannot even be named: only then
                // is it an error for the whole response.
                let metadata =
                    ObjectMeta::deserialize(value.get("metadata").unwrap_or(&Value::Null))?;
                Ok(Decoded::Invalid(Box::new(Undecodable {
                    metadata,
                    status: value.get("status").cloned(),
                    failure,
                })))
            }
        }
    }
}

impl<'de, K: DeserializeOwned + Resource<DynamicType = ()>> Deserialize<'de> for Decoded<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Decoded::from_value(value).map_err(serde::de::Error::custom)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Decoded<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(_: &()) -> Cow<'_, str> {
        K::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        K::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        K::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        K::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Decoded::Ok(k, _) => k.meta(),
            Decoded::Invalid(u) => &u.metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Decoded::Ok(k, _) => k.meta_mut(),
            Decoded::Invalid(u) => &mut u.metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::api::VirtualService;
    use serde_json::json;

    #[test]
    fn a_good_object_is_typed() {
        let d: Decoded<VirtualService> = serde_json::from_value(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "r", "namespace": "default"},
            "spec": {"hosts": ["reviews"]}
        }))
        .unwrap();
        assert!(
            matches!(d, Decoded::Ok(vs, unknown) if vs.spec.hosts == ["reviews"] && unknown.is_empty())
        );
    }

    /// An Istio object with fields a newer Istio defines is read, those fields named.
    #[test]
    fn unknown_fields_of_an_istio_object_come_with_it() {
        let d: Decoded<VirtualService> = serde_json::from_value(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "r", "namespace": "default"},
            "spec": {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}], "futureRetryPolicy": {"x": 1}}]},
            "status": {"someController": {"state": "ok"}}
        }))
        .unwrap();
        let Decoded::Ok(vs, unknown) = d else {
            panic!("expected the object");
        };
        assert_eq!(vs.spec.http.len(), 1);
        assert_eq!(unknown, ["spec.http[0].futureRetryPolicy"]);
    }

    #[test]
    fn a_bad_field_keeps_the_metadata_and_names_the_field() {
        let d: Decoded<VirtualService> = serde_json::from_value(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "r", "namespace": "default", "generation": 3},
            "spec": {"hosts": ["reviews"], "http": [{"timeout": "soon"}]},
            "status": {"observedGeneration": 2}
        }))
        .unwrap();
        let Decoded::Invalid(u) = d else {
            panic!("expected a decode failure");
        };
        let Undecodable {
            metadata,
            status,
            failure,
        } = *u;
        assert_eq!(metadata.name.as_deref(), Some("r"));
        assert_eq!(metadata.generation, Some(3));
        assert_eq!(failure.path, "spec.http[0].timeout");
        assert!(
            failure.to_string().starts_with("spec.http[0].timeout: "),
            "{failure}"
        );
        assert_eq!(status, Some(json!({"observedGeneration": 2})));
    }

    #[test]
    fn a_list_with_one_bad_item_still_decodes() {
        let list: Vec<Decoded<VirtualService>> = serde_json::from_value(json!([
            {"metadata": {"name": "bad"}, "spec": {"hosts": "not-a-list"}},
            {"metadata": {"name": "good"}, "spec": {"hosts": ["a"]}}
        ]))
        .unwrap();
        assert!(matches!(&list[0], Decoded::Invalid(_)));
        assert!(matches!(&list[1], Decoded::Ok(..)));
    }

    #[test]
    fn unreadable_metadata_is_an_error() {
        let r = serde_json::from_value::<Decoded<VirtualService>>(json!({
            "metadata": {"name": 7}, "spec": {"hosts": 1}
        }));
        assert!(r.is_err());
    }
}
