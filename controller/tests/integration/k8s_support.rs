//! Fixtures of the Kubernetes-mode tests: an in-process test API server with the Istio
//! CRDs, server-side apply of JSON objects, and the controller's tasks run in-process
//! (as `main` runs them) with a handle to kill them (like SIGKILL: no Lease release) or
//! stop them (like SIGTERM).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::wait::{await_condition, conditions};
use pilotfish_controller::admin::AdminState;
use pilotfish_controller::k8s::KubeMode;
use pilotfish_controller::k8s::lease::{LeaseConfig, LeaseTimings};
use pilotfish_mesh::push_context::{BuildInputs, PushContext};
use pilotfish_shared::bus::SnapshotPublisher;
use pilotfish_shared::pipeline::Pipeline;
use pilotfish_shared::pipeline::seed::Seed;
use pilotfish_testkit::apiserver::TestApiServer;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Generous bound for anything asynchronous, so a broken test fails instead of hanging.
pub const WAIT: Duration = Duration::from_secs(60);

/// Short Lease timings so takeovers happen within seconds.
pub fn fast_timings() -> LeaseTimings {
    LeaseTimings {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(300),
    }
}

/// Polls `check` every 50 ms until it returns `Some`, for at most [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {WAIT:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub struct Cluster {
    pub server: TestApiServer,
}

impl Cluster {
    pub async fn start() -> Self {
        Cluster {
            server: TestApiServer::start()
                .await
                .expect("start the test API server"),
        }
    }

    pub fn client(&self) -> Client {
        let url = self.server.url().parse().expect("server URL");
        Client::try_from(kube::Config::new(url)).expect("kube client")
    }

    pub async fn install_istio_crds(&self) {
        self.install_crds(pilotfish_mesh::api::crd::crds()).await;
    }

    /// Installs `crds` and waits until each is established.
    pub async fn install_crds(&self, crds: Vec<CustomResourceDefinition>) {
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        for crd in crds {
            let name = crd.metadata.name.clone().expect("CRD name");
            api.create(&PostParams::default(), &crd)
                .await
                .unwrap_or_else(|e| panic!("create CRD {name}: {e}"));
            tokio::time::timeout(
                WAIT,
                await_condition(api.clone(), &name, conditions::is_crd_established()),
            )
            .await
            .expect("CRD established in time")
            .expect("CRD established");
        }
    }

    fn api_for(&self, object: &Value) -> (Api<DynamicObject>, String) {
        let api_version = object["apiVersion"].as_str().expect("apiVersion");
        let kind = object["kind"].as_str().expect("kind");
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let plural = match kind {
            "EndpointSlice" => "endpointslices".to_string(),
            "Namespace" => "namespaces".to_string(),
            "AuthorizationPolicy" => "authorizationpolicies".to_string(),
            other => format!("{}s", other.to_lowercase()),
        };
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, kind),
            &plural,
        );
        let name = object["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string();
        let api = match object["metadata"]["namespace"].as_str() {
            _ if kind == "Namespace" => Api::all_with(self.client(), &resource),
            Some(ns) => Api::namespaced_with(self.client(), ns, &resource),
            None => Api::namespaced_with(self.client(), "default", &resource),
        };
        (api, name)
    }

    /// Server-side apply of one object (JSON), as `kubectl apply --server-side` does.
    pub async fn apply(&self, object: Value) -> DynamicObject {
        let (api, name) = self.api_for(&object);
        api.patch(
            &name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {name}: {e}"))
    }

    pub async fn delete(&self, object: Value) {
        let (api, name) = self.api_for(&object);
        api.delete(&name, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    }

    pub async fn get(&self, object: &Value) -> Option<DynamicObject> {
        let (api, name) = self.api_for(object);
        api.get_opt(&name).await.expect("get")
    }
}

/// Pilotfish's CRDs with one field more in every served version of `kind`, at `path`
/// (`.`-separated properties, `[]` into list items) — what a newer Istio's CRD looks like
/// to this Pilotfish.
pub fn crds_with_extra_field(kind: &str, path: &str, field: &str) -> Vec<CustomResourceDefinition> {
    let mut crds = pilotfish_mesh::api::crd::crds();
    for crd in crds.iter_mut().filter(|c| c.spec.names.kind == kind) {
        for version in &mut crd.spec.versions {
            let schema = version.schema.as_mut().expect("schema");
            let props = schema.open_api_v3_schema.as_mut().expect("openAPIV3Schema");
            let mut value = serde_json::to_value(&*props).expect("schema as JSON");
            let mut node = &mut value;
            for step in path.split('.') {
                node = match step.strip_suffix("[]") {
                    Some(name) => &mut node["properties"][name]["items"],
                    None => &mut node["properties"][step],
                };
            }
            node["properties"][field] =
                json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
            *props = serde_json::from_value(value).expect("schema from JSON");
        }
    }
    crds
}

// ---- objects ---------------------------------------------------------------------------

pub fn service(name: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"app": name}, "ports": [{"name": "grpc", "port": port, "targetPort": port}]}
    })
}

pub fn pod(name: &str, app: &str, version: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app, "version": version}},
        "spec": {"serviceAccountName": app, "containers": [{"name": "app", "image": "example/app"}]}
    })
}

/// One EndpointSlice per version so each can have its own port.
pub fn endpoint_slice(service: &str, version: &str, pod: &str, port: u16) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-{version}"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true},
                       "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"}}]
    })
}

pub fn destination_rule(host: &str, subsets: &[&str]) -> Value {
    let subsets: Vec<Value> = subsets
        .iter()
        .map(|s| json!({"name": s, "labels": {"version": s}}))
        .collect();
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": host, "namespace": "default"},
        "spec": {"host": host, "subsets": subsets}
    })
}

/// A VirtualService splitting `host` between subsets by weight.
pub fn split(name: &str, host: &str, weights: &[(&str, i32)]) -> Value {
    let route: Vec<Value> = weights
        .iter()
        .map(|(subset, w)| json!({"destination": {"host": host, "subset": subset}, "weight": w}))
        .collect();
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"hosts": [host], "http": [{"route": route}]}
    })
}

/// The `reviews` service with pods, slices and subsets v1/v2.
pub async fn reviews_mesh(cluster: &Cluster) {
    cluster.apply(service("reviews", 9080)).await;
    for (version, port) in [("v1", 10001), ("v2", 10002)] {
        let pod_name = format!("reviews-{version}");
        cluster.apply(pod(&pod_name, "reviews", version)).await;
        cluster
            .apply(endpoint_slice("reviews", version, &pod_name, port))
            .await;
    }
    cluster
        .apply(destination_rule("reviews", &["v1", "v2"]))
        .await;
}

/// Weights of the first HTTP route of a VirtualService in a snapshot.
pub fn weights(ctx: &PushContext, name: &str) -> Option<Vec<i32>> {
    let vs = ctx
        .virtual_services()
        .iter()
        .find(|vs| vs.meta.namespace == "default" && vs.meta.name == name)?;
    Some(
        vs.spec
            .http
            .first()?
            .route
            .iter()
            .map(|r| r.weight.unwrap_or(0))
            .collect(),
    )
}

/// The `Reconciled` condition of an object, as JSON.
pub fn reconciled(object: &DynamicObject) -> Option<Value> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Reconciled")
        .cloned()
}

// ---- the controller, in-process ------------------------------------------------------

/// One controller replica's tasks, as `main` runs them.
pub struct Replica {
    pub identity: String,
    pub admin: AdminState,
    tasks: JoinSet<(&'static str, anyhow::Result<()>)>,
    shutdown: CancellationToken,
}

impl Replica {
    pub fn start(
        cluster: &Cluster,
        identity: &str,
        publisher: Arc<dyn SnapshotPublisher>,
        timings: LeaseTimings,
    ) -> Replica {
        Self::start_seeded(cluster, identity, publisher, None, timings)
    }

    /// Like [`Replica::start`], reading the published snapshot first (`seed`).
    pub fn start_seeded(
        cluster: &Cluster,
        identity: &str,
        publisher: Arc<dyn SnapshotPublisher>,
        seed: Option<Seed>,
        timings: LeaseTimings,
    ) -> Replica {
        Self::start_configured(cluster, identity, publisher, seed, timings, None)
    }

    /// Like [`Replica::start_seeded`], with `--mesh-config FILE` (read now, and followed
    /// as `main` follows it).
    pub fn start_configured(
        cluster: &Cluster,
        identity: &str,
        publisher: Arc<dyn SnapshotPublisher>,
        seed: Option<Seed>,
        timings: LeaseTimings,
        mesh_file: Option<&std::path::Path>,
    ) -> Replica {
        let admin = AdminState::default();
        let shutdown = CancellationToken::new();
        let mesh = pilotfish_shared::cli::load_mesh_config(mesh_file).expect("mesh config");
        let mode = KubeMode {
            client: cluster.client(),
            mesh_file: mesh_file.map(std::path::Path::to_path_buf),
            base: BuildInputs {
                mesh,
                cluster_domain: "cluster.local".into(),
                ..Default::default()
            },
            debounce_after: Duration::from_millis(50),
            debounce_max: Duration::from_millis(500),
            lease: LeaseConfig {
                name: "pilotfish-controller".into(),
                namespace: "default".into(),
                identity: identity.into(),
                timings,
            },
            ca_root: None,
        };
        let mut tasks = JoinSet::new();
        let (mode_tasks, _claim) = mode.tasks(
            Pipeline::new(publisher, pilotfish_testkit::keys::signer()),
            seed,
            admin.clone(),
            shutdown.clone(),
        );
        for (name, task) in mode_tasks {
            tasks.spawn(async move { (name, task.await) });
        }
        Replica {
            identity: identity.into(),
            admin,
            tasks,
            shutdown,
        }
    }

    /// Like SIGKILL: every task stops at once, the Lease is not released.
    pub fn kill(mut self) {
        self.tasks.abort_all();
    }

    /// Like SIGTERM: the Lease task releases the Lease, then everything stops.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(WAIT, async {
            while let Some(ended) = self.tasks.join_next().await {
                if matches!(ended, Ok(("Lease election", _))) {
                    break;
                }
            }
        })
        .await;
        self.tasks.abort_all();
    }

    /// Fails the test if a long-lived task ended (as `main` would exit).
    pub fn assert_alive(&mut self) {
        if let Some(ended) = self.tasks.try_join_next() {
            panic!("{}: a long-lived task ended: {ended:?}", self.identity);
        }
    }

    pub fn is_leader(&self) -> bool {
        self.admin.leader()["leader"] == json!(true)
    }

    pub fn epoch(&self) -> Option<u64> {
        self.admin.leader()["epoch"].as_u64()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}
