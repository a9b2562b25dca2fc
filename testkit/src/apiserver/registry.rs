//! The table of served resource types: built-in kinds derived from `k8s-openapi`'s
//! resource metadata (group, version, kind, plural, scope, list kind), plus the kinds
//! that CustomResourceDefinitions add at run time. Discovery, OpenAPI and routing all
//! read this one table, so a kind served anywhere is served everywhere.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::{
    admissionregistration::v1 as admission, apps::v1 as apps, autoscaling::v2 as autoscaling,
    batch::v1 as batch, coordination::v1 as coordination, core::v1 as core,
    discovery::v1 as discovery, events::v1 as events, networking::v1 as networking,
    policy::v1 as policy, rbac::v1 as rbac, scheduling::v1 as scheduling, storage::v1 as storage,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
use k8s_openapi::{ClusterResourceScope, ListableResource, NamespaceResourceScope};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::{ApiError, Cause};

/// Where objects of a resource live in the store: one bucket per group and plural,
/// shared by every version that serves it (CRD versions, core and `events.k8s.io` Events).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageKey {
    pub group: String,
    pub resource: String,
}

/// How a served version's objects map to the stored form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// Same fields; only `apiVersion` differs (built-ins, CRDs with strategy `None`).
    Identity,
    /// `events.k8s.io/v1` Event over the stored core `v1` Event (renamed fields).
    EventsV1,
}

/// What kind of type this is, and what that brings.
#[derive(Debug, Clone)]
pub enum Shape {
    /// A compiled-in Kubernetes kind; `round_trip` decodes an object into its Rust type
    /// and encodes it again, which checks types and drops every field the kind lacks.
    BuiltIn {
        round_trip: fn(&Value) -> Result<Value, String>,
    },
    /// A kind added by the CRD `crd`; `schema` is the version's `openAPIV3Schema`.
    Custom {
        crd: String,
        schema: Option<Arc<Value>>,
    },
}

/// Where a kind keeps what its `/scale` subresource shows, as JSON pointers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    /// A label selector: a string, or a `LabelSelector` object (built-in workloads).
    pub label_selector: Option<String>,
}

impl ScalePaths {
    fn workload() -> Self {
        ScalePaths {
            spec_replicas: "/spec/replicas".into(),
            status_replicas: "/status/replicas".into(),
            label_selector: Some("/spec/selector".into()),
        }
    }
}

/// `.spec.replicas` (CRD notation) as a JSON pointer.
fn pointer_of(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |acc, part| format!("{acc}/{part}"))
}

/// One served group/version/resource.
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// `/status` is served, and main-resource writes leave `status` untouched.
    pub status_subresource: bool,
    /// `/scale` is served (Deployments, StatefulSets, ReplicaSets, CRDs that ask).
    pub scale: Option<ScalePaths>,
    /// `metadata.generation` is kept and bumped on spec changes.
    pub tracks_generation: bool,
    pub storage: StorageKey,
    /// `apiVersion` of the stored form.
    pub storage_api_version: String,
    pub conversion: Conversion,
    pub shape: Shape,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        api_version(&self.group, &self.version)
    }

    pub fn is_custom(&self) -> bool {
        matches!(self.shape, Shape::Custom { .. })
    }

    /// The CR schema, when this is a custom kind that has one.
    pub fn schema(&self) -> Option<&Value> {
        match &self.shape {
            Shape::Custom { schema, .. } => schema.as_deref(),
            Shape::BuiltIn { .. } => None,
        }
    }
}

pub fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// Scope of a `k8s-openapi` resource, read from its `Scope` type.
trait ScopeInfo {
    const NAMESPACED: bool;
}
impl ScopeInfo for NamespaceResourceScope {
    const NAMESPACED: bool = true;
}
impl ScopeInfo for ClusterResourceScope {
    const NAMESPACED: bool = false;
}

fn round_trip_as<T: DeserializeOwned + Serialize>(value: &Value) -> Result<Value, String> {
    let typed = T::deserialize(value).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// Per-kind facts that `k8s-openapi` does not carry.
#[derive(Clone, Copy)]
struct Extra {
    short_names: &'static [&'static str],
    status: bool,
    generation: bool,
    in_all: bool,
}

const PLAIN: Extra = Extra {
    short_names: &[],
    status: false,
    generation: false,
    in_all: false,
};

/// A kind whose spec is reconciled by a controller: `/status` and `generation`.
const fn workload(short_names: &'static [&'static str], in_all: bool) -> Extra {
    Extra {
        short_names,
        status: true,
        generation: true,
        in_all,
    }
}

const fn short(short_names: &'static [&'static str]) -> Extra {
    Extra {
        short_names,
        ..PLAIN
    }
}

fn builtin<T>(extra: Extra) -> ResourceType
where
    T: ListableResource + DeserializeOwned + Serialize,
    T::Scope: ScopeInfo,
{
    ResourceType {
        group: T::GROUP.to_string(),
        version: T::VERSION.to_string(),
        kind: T::KIND.to_string(),
        list_kind: T::LIST_KIND.to_string(),
        plural: T::URL_PATH_SEGMENT.to_string(),
        singular: T::KIND.to_lowercase(),
        namespaced: <T::Scope as ScopeInfo>::NAMESPACED,
        short_names: extra.short_names.iter().map(|s| s.to_string()).collect(),
        categories: if extra.in_all {
            vec!["all".to_string()]
        } else {
            vec![]
        },
        status_subresource: extra.status,
        scale: None,
        tracks_generation: extra.generation,
        storage: StorageKey {
            group: T::GROUP.to_string(),
            resource: T::URL_PATH_SEGMENT.to_string(),
        },
        storage_api_version: T::API_VERSION.to_string(),
        conversion: Conversion::Identity,
        shape: Shape::BuiltIn {
            round_trip: round_trip_as::<T>,
        },
    }
}

/// Every built-in kind the project's flows (kube-rs controller, kubectl, helm) touch.
fn builtins() -> Vec<ResourceType> {
    let mut events_v1 = builtin::<events::Event>(PLAIN);
    events_v1.short_names = vec!["ev".to_string()];
    events_v1.storage = StorageKey {
        group: String::new(),
        resource: "events".to_string(),
    };
    events_v1.storage_api_version = "v1".to_string();
    events_v1.conversion = Conversion::EventsV1;

    let mut pod = builtin::<core::Pod>(workload(&["po"], true));
    // Pods have a status subresource but their spec is mostly immutable; upstream does
    // not bump generation for them in the versions our clients target.
    pod.tracks_generation = false;
    let mut namespace = builtin::<core::Namespace>(short(&["ns"]));
    namespace.status_subresource = true;
    let mut service = builtin::<core::Service>(short(&["svc"]));
    service.status_subresource = true;
    service.categories = vec!["all".to_string()];

    let mut scalable: Vec<ResourceType> = vec![
        builtin::<apps::Deployment>(workload(&["deploy"], true)),
        builtin::<apps::StatefulSet>(workload(&["sts"], true)),
        builtin::<apps::ReplicaSet>(workload(&["rs"], true)),
    ];
    for t in &mut scalable {
        t.scale = Some(ScalePaths::workload());
    }

    let mut all = vec![
        namespace,
        service,
        pod,
        builtin::<core::Endpoints>(short(&["ep"])),
        builtin::<core::ConfigMap>(short(&["cm"])),
        builtin::<core::Secret>(PLAIN),
        builtin::<core::ServiceAccount>(short(&["sa"])),
        builtin::<core::Event>(short(&["ev"])),
        builtin::<core::Node>(Extra {
            status: true,
            ..short(&["no"])
        }),
        builtin::<core::PersistentVolumeClaim>(Extra {
            status: true,
            ..short(&["pvc"])
        }),
        builtin::<core::PersistentVolume>(Extra {
            status: true,
            ..short(&["pv"])
        }),
        builtin::<core::ResourceQuota>(Extra {
            status: true,
            ..short(&["quota"])
        }),
        builtin::<core::LimitRange>(short(&["limits"])),
        builtin::<apps::DaemonSet>(workload(&["ds"], true)),
        builtin::<apps::ControllerRevision>(PLAIN),
        builtin::<batch::Job>(workload(&[], true)),
        builtin::<batch::CronJob>(workload(&["cj"], true)),
        builtin::<autoscaling::HorizontalPodAutoscaler>(workload(&["hpa"], true)),
        builtin::<policy::PodDisruptionBudget>(workload(&["pdb"], false)),
        builtin::<networking::NetworkPolicy>(Extra {
            generation: true,
            ..short(&["netpol"])
        }),
        builtin::<networking::Ingress>(workload(&["ing"], false)),
        builtin::<networking::IngressClass>(PLAIN),
        builtin::<discovery::EndpointSlice>(PLAIN),
        builtin::<coordination::Lease>(PLAIN),
        events_v1,
        builtin::<rbac::Role>(PLAIN),
        builtin::<rbac::RoleBinding>(PLAIN),
        builtin::<rbac::ClusterRole>(PLAIN),
        builtin::<rbac::ClusterRoleBinding>(PLAIN),
        builtin::<apiextensions::CustomResourceDefinition>(workload(&["crd", "crds"], false)),
        builtin::<admission::ValidatingWebhookConfiguration>(Extra {
            generation: true,
            ..PLAIN
        }),
        builtin::<admission::MutatingWebhookConfiguration>(Extra {
            generation: true,
            ..PLAIN
        }),
        builtin::<scheduling::PriorityClass>(short(&["pc"])),
        builtin::<storage::StorageClass>(short(&["sc"])),
    ];
    all.extend(scalable);
    all
}

/// The served types, keyed by (group, version, plural). Owned by the store.
#[derive(Debug)]
pub struct Registry {
    types: BTreeMap<(String, String, String), Arc<ResourceType>>,
    /// Bumped whenever the set of types changes (OpenAPI document hashes use it).
    pub generation: u64,
}

impl Default for Registry {
    fn default() -> Self {
        let types = builtins()
            .into_iter()
            .map(|t| {
                (
                    (t.group.clone(), t.version.clone(), t.plural.clone()),
                    Arc::new(t),
                )
            })
            .collect();
        Registry {
            types,
            generation: 1,
        }
    }
}

impl Registry {
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// The type that serves `storage` in its stored version (used to walk all objects).
    pub fn for_storage(&self, storage: &StorageKey) -> Option<Arc<ResourceType>> {
        self.types
            .values()
            .find(|t| &t.storage == storage && t.api_version() == t.storage_api_version)
            .cloned()
    }

    /// Every distinct storage bucket together with its stored-version type.
    pub fn storages(&self) -> Vec<Arc<ResourceType>> {
        self.types
            .values()
            .filter(|t| t.api_version() == t.storage_api_version)
            .cloned()
            .collect()
    }

    /// Groups with their versions, versions ordered by Kubernetes version priority
    /// (the first is the preferred version). The core group is `""`.
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in self.types.values() {
            let versions = groups.entry(t.group.clone()).or_default();
            if !versions.contains(&t.version) {
                versions.push(t.version.clone());
            }
        }
        for versions in groups.values_mut() {
            versions.sort_by_key(|v| version_priority(v));
        }
        groups
    }

    pub fn in_group_version(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        self.types
            .values()
            .filter(|t| t.group == group && t.version == version)
            .cloned()
            .collect()
    }

    /// Serves the kinds of a (stored, defaulted) CRD in all its served versions,
    /// replacing what an earlier revision of the same CRD served.
    pub fn install_crd(&mut self, crd: &Value) -> Result<(), ApiError> {
        let types = types_of_crd(crd)?;
        let name = crd_name(crd);
        self.remove_crd(&name);
        for t in types {
            self.types.insert(
                (t.group.clone(), t.version.clone(), t.plural.clone()),
                Arc::new(t),
            );
        }
        self.generation += 1;
        Ok(())
    }

    pub fn remove_crd(&mut self, name: &str) {
        let before = self.types.len();
        self.types
            .retain(|_, t| !matches!(&t.shape, Shape::Custom { crd, .. } if crd == name));
        if self.types.len() != before {
            self.generation += 1;
        }
    }
}

fn crd_name(crd: &Value) -> String {
    crd.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn strings_at(value: &Value, pointer: &str) -> Vec<String> {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Checks a CRD the way the real server's validation does for the fields we rely on,
/// and fills the defaults it would (`singular`, `listKind`, `conversion`).
pub fn validate_and_default_crd(crd: &mut Value) -> Result<(), ApiError> {
    let name = crd_name(crd);
    let group = str_at(crd, "/spec/group").to_string();
    let plural = str_at(crd, "/spec/names/plural").to_string();
    let kind = str_at(crd, "/spec/names/kind").to_string();
    let scope = str_at(crd, "/spec/scope").to_string();
    let mut causes = Vec::new();
    if group.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.group",
            "Required value",
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.names.plural",
            "Required value",
        ));
    }
    if kind.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.names.kind",
            "Required value",
        ));
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push(Cause::new(
            "FieldValueNotSupported",
            "spec.scope",
            format!(
                "Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""
            ),
        ));
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.versions",
            "Invalid value: \"null\": must have exactly one version marked as storage version",
        ));
    } else {
        let storage = versions
            .iter()
            .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .count();
        if storage != 1 {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "spec.versions",
                format!(
                    "Invalid value: []apiextensions.CustomResourceDefinitionVersion{{...}}: must have exactly one version marked as storage version, found {storage}"
                ),
            ));
        }
        for (i, v) in versions.iter().enumerate() {
            if v.pointer("/schema/openAPIV3Schema").is_none() {
                causes.push(Cause::new(
                    "FieldValueRequired",
                    format!("spec.versions[{i}].schema.openAPIV3Schema"),
                    "Required value: schemas are required",
                ));
            }
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            &name,
            causes,
        ));
    }
    let names = &mut crd["spec"]["names"];
    if names
        .get("singular")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        names["singular"] = Value::String(kind.to_lowercase());
    }
    if names
        .get("listKind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        names["listKind"] = Value::String(format!("{kind}List"));
    }
    if crd.pointer("/spec/conversion").is_none() {
        crd["spec"]["conversion"] = serde_json::json!({ "strategy": "None" });
    }
    Ok(())
}

/// The resource types a CRD serves (one per served version).
fn types_of_crd(crd: &Value) -> Result<Vec<ResourceType>, ApiError> {
    let name = crd_name(crd);
    let group = str_at(crd, "/spec/group").to_string();
    let plural = str_at(crd, "/spec/names/plural").to_string();
    let kind = str_at(crd, "/spec/names/kind").to_string();
    let singular = match str_at(crd, "/spec/names/singular") {
        "" => kind.to_lowercase(),
        s => s.to_string(),
    };
    let list_kind = match str_at(crd, "/spec/names/listKind") {
        "" => format!("{kind}List"),
        s => s.to_string(),
    };
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let storage_version = versions
        .iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .and_then(|v| v.get("name").and_then(Value::as_str))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "CustomResourceDefinition {name} has no storage version"
            ))
        })?;
    let storage = StorageKey {
        group: group.clone(),
        resource: plural.clone(),
    };
    Ok(versions
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool) != Some(false))
        .map(|v| ResourceType {
            group: group.clone(),
            version: str_at(v, "/name").to_string(),
            kind: kind.clone(),
            list_kind: list_kind.clone(),
            plural: plural.clone(),
            singular: singular.clone(),
            namespaced: str_at(crd, "/spec/scope") == "Namespaced",
            short_names: strings_at(crd, "/spec/names/shortNames"),
            categories: strings_at(crd, "/spec/names/categories"),
            status_subresource: v.pointer("/subresources/status").is_some(),
            scale: v.pointer("/subresources/scale").map(|scale| ScalePaths {
                spec_replicas: pointer_of(str_at(scale, "/specReplicasPath")),
                status_replicas: pointer_of(str_at(scale, "/statusReplicasPath")),
                label_selector: scale
                    .get("labelSelectorPath")
                    .and_then(Value::as_str)
                    .map(pointer_of),
            }),
            tracks_generation: true,
            storage: storage.clone(),
            storage_api_version: api_version(&group, storage_version),
            conversion: Conversion::Identity,
            shape: Shape::Custom {
                crd: name.clone(),
                schema: v.pointer("/schema/openAPIV3Schema").cloned().map(Arc::new),
            },
        })
        .collect())
}

/// Sort key implementing Kubernetes version priority: GA before beta before alpha,
/// higher numbers first, then anything else alphabetically.
fn version_priority(version: &str) -> (u8, i64, i64, String) {
    let parsed = version.strip_prefix('v').and_then(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: i64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((0, major, 0));
        }
        for (label, rank) in [("beta", 1u8), ("alpha", 2u8)] {
            if let Some(n) = tail.strip_prefix(label) {
                let minor: i64 = n.parse().ok()?;
                return Some((rank, major, minor));
            }
        }
        None
    });
    match parsed {
        Some((rank, major, minor)) => (rank, -major, -minor, String::new()),
        None => (3, 0, 0, version.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builtins_come_from_k8s_openapi_metadata() {
        let registry = Registry::default();
        let deploy = registry
            .lookup("apps", "v1", "deployments")
            .expect("deployments");
        assert_eq!(deploy.kind, "Deployment");
        assert_eq!(deploy.list_kind, "DeploymentList");
        assert!(deploy.namespaced && deploy.status_subresource);
        assert_eq!(deploy.scale, Some(ScalePaths::workload()));
        assert!(
            registry
                .lookup("apps", "v1", "daemonsets")
                .unwrap()
                .scale
                .is_none()
        );
        let ns = registry.lookup("", "v1", "namespaces").expect("namespaces");
        assert!(!ns.namespaced);
        let ev = registry
            .lookup("events.k8s.io", "v1", "events")
            .expect("events");
        assert_eq!(
            ev.storage,
            registry.lookup("", "v1", "events").unwrap().storage
        );
        assert_eq!(ev.conversion, Conversion::EventsV1);
    }

    #[test]
    fn version_priority_orders_like_kubernetes() {
        let mut versions = vec![
            "v1alpha1", "v2beta1", "v1", "foo", "v2", "v1beta2", "v1beta1",
        ];
        versions.sort_by_key(|v| version_priority(v));
        assert_eq!(
            versions,
            vec![
                "v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1", "foo"
            ]
        );
    }

    #[test]
    fn crd_serves_every_served_version_over_one_storage() {
        let mut crd = json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [
                    {"name": "v1", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": {"type": "object"}},
                     "subresources": {"status": {}, "scale": {
                         "specReplicasPath": ".spec.size", "statusReplicasPath": ".status.size"}}},
                    {"name": "v1beta1", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object"}}}
                ]
            }
        });
        validate_and_default_crd(&mut crd).unwrap();
        assert_eq!(crd["spec"]["names"]["listKind"], "WidgetList");
        let mut registry = Registry::default();
        registry.install_crd(&crd).unwrap();
        let v1 = registry.lookup("example.com", "v1", "widgets").unwrap();
        let beta = registry
            .lookup("example.com", "v1beta1", "widgets")
            .unwrap();
        assert!(v1.status_subresource && !beta.status_subresource);
        let scale = v1.scale.clone().expect("scale");
        assert_eq!(
            (scale.spec_replicas.as_str(), scale.label_selector),
            ("/spec/size", None)
        );
        assert_eq!(beta.storage_api_version, "example.com/v1");
        assert_eq!(registry.groups()["example.com"], vec!["v1", "v1beta1"]);
        registry.remove_crd("widgets.example.com");
        assert!(registry.lookup("example.com", "v1", "widgets").is_none());
    }

    #[test]
    fn crd_name_must_be_plural_dot_group() {
        let mut crd = json!({
            "metadata": {"name": "wrong.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": {"type": "object"}}}]}
        });
        let err = validate_and_default_crd(&mut crd).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(err.message.contains("metadata.name"), "{}", err.message);
    }
}
