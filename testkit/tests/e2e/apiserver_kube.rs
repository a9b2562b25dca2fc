//! The test API server as kube-rs sees it: watchers (in order, across 410 Gone, with
//! selectors), reflectors over list+watch and WatchList, optimistic concurrency,
//! server-side apply conflicts, custom resources with schema validation and the status
//! subresource, and events written through `events.k8s.io/v1` read back as core `v1`.

use std::collections::BTreeMap;
use std::pin::pin;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, ObjectReference};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, conditions, reflector, wait::await_condition, watcher};
use serde_json::json;
use tokio::sync::mpsc;

use crate::support::{Cluster, fixture, within};

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "data": {"value": value},
    }))
    .expect("config map")
}

type Item = Result<watcher::Event<ConfigMap>, watcher::Error>;

/// Runs a watcher in the background, forwarding its items.
fn spawn_watcher(
    api: Api<ConfigMap>,
    config: watcher::Config,
) -> (mpsc::UnboundedReceiver<Item>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut stream = pin!(watcher(api, config));
        while let Some(item) = stream.next().await {
            if tx.send(item).is_err() {
                return;
            }
        }
    });
    (rx, task)
}

/// A compact rendering of a watcher item, for comparing sequences.
fn describe(item: &Item) -> String {
    let show = |cm: &ConfigMap| {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let value = cm
            .data
            .as_ref()
            .and_then(|d| d.get("value").cloned())
            .unwrap_or_default();
        format!("{name}={value}")
    };
    match item {
        Ok(watcher::Event::Init) => "Init".into(),
        Ok(watcher::Event::InitApply(cm)) => format!("InitApply {}", show(cm)),
        Ok(watcher::Event::InitDone) => "InitDone".into(),
        Ok(watcher::Event::Apply(cm)) => format!("Apply {}", show(cm)),
        Ok(watcher::Event::Delete(cm)) => format!("Delete {}", show(cm)),
        Err(watcher::Error::WatchError(status)) => format!("Error {}", status.code),
        Err(other) => format!("Error {other}"),
    }
}

async fn expect_items(rx: &mut mpsc::UnboundedReceiver<Item>, expected: &[&str]) {
    for want in expected {
        let item = within(&format!("watcher item {want:?}"), rx.recv())
            .await
            .expect("watcher ended");
        assert_eq!(describe(&item), *want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_sees_create_update_delete_in_order() {
    let cluster = Cluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let (mut rx, task) = spawn_watcher(api.clone(), watcher::Config::default());
    expect_items(&mut rx, &["Init", "InitDone"]).await;

    api.create(&PostParams::default(), &config_map("a", "1"))
        .await
        .unwrap();
    expect_items(&mut rx, &["Apply a=1"]).await;
    let mut current = api.get("a").await.unwrap();
    current.data = Some(BTreeMap::from([("value".to_string(), "2".to_string())]));
    api.replace("a", &PostParams::default(), &current)
        .await
        .unwrap();
    expect_items(&mut rx, &["Apply a=2"]).await;
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": "3"}})),
    )
    .await
    .unwrap();
    expect_items(&mut rx, &["Apply a=3"]).await;
    api.delete("a", &DeleteParams::default()).await.unwrap();
    expect_items(&mut rx, &["Delete a=3"]).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_recovers_from_410_gone_by_relisting() {
    let cluster = Cluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    api.create(&PostParams::default(), &config_map("before", "1"))
        .await
        .unwrap();
    let (mut rx, task) = spawn_watcher(api.clone(), watcher::Config::default());
    expect_items(&mut rx, &["Init", "InitApply before=1", "InitDone"]).await;

    // Like an etcd compaction: the watch's resourceVersion is now too old.
    cluster.server.expire_watch_history();
    expect_items(
        &mut rx,
        &["Error 410", "Init", "InitApply before=1", "InitDone"],
    )
    .await;
    api.create(&PostParams::default(), &config_map("after", "2"))
        .await
        .unwrap();
    expect_items(&mut rx, &["Apply after=2"]).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_from_an_expired_resource_version_is_410_gone() {
    let cluster = Cluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    let old = list.metadata.resource_version.unwrap();
    cluster.server.expire_watch_history();
    let mut stream = pin!(api.watch(&Default::default(), &old).await.unwrap());
    let first = within("watch error", stream.next())
        .await
        .expect("an event");
    match first {
        Ok(kube::api::WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_with_label_selector_sees_objects_leave_the_selection() {
    let cluster = Cluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let config = watcher::Config::default().labels("app=demo");
    let (mut rx, task) = spawn_watcher(api.clone(), config);
    expect_items(&mut rx, &["Init", "InitDone"]).await;
    api.create(&PostParams::default(), &config_map("a", "1"))
        .await
        .unwrap();
    expect_items(&mut rx, &["Apply a=1"]).await;
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
    )
    .await
    .unwrap();
    expect_items(&mut rx, &["Delete a=1"]).await;
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "demo"}}, "data": {"value": "2"}})),
    )
    .await
    .unwrap();
    expect_items(&mut rx, &["Apply a=2"]).await;
    task.abort();
}

/// Drives a reflector until its store holds exactly the names and values on the server.
async fn assert_reflector_converges(cluster: &Cluster, config: watcher::Config) {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &config_map(&format!("pre-{i}"), "0"),
        )
        .await
        .unwrap();
    }
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = watcher(api.clone(), config)
        .default_backoff()
        .reflect(writer);
    let task = tokio::spawn(async move {
        let mut stream = pin!(stream);
        while stream.next().await.is_some() {}
    });
    within("reflector initial sync", reader.wait_until_ready())
        .await
        .unwrap();
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &config_map(&format!("new-{i}"), "1"),
        )
        .await
        .unwrap();
    }
    api.patch(
        "pre-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": "changed"}})),
    )
    .await
    .unwrap();
    api.delete("pre-2", &DeleteParams::default()).await.unwrap();
    api.delete("new-4", &DeleteParams::default()).await.unwrap();

    let snapshot = |items: Vec<ConfigMap>| -> BTreeMap<String, String> {
        items
            .into_iter()
            .map(|cm| {
                let value = cm
                    .data
                    .and_then(|d| d.get("value").cloned())
                    .unwrap_or_default();
                (cm.metadata.name.unwrap_or_default(), value)
            })
            .collect()
    };
    let expected = snapshot(api.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(expected.len(), 8);
    assert_eq!(expected["pre-1"], "changed");
    within("reflector convergence", async {
        loop {
            let cached = snapshot(reader.state().iter().map(|cm| (**cm).clone()).collect());
            if cached == expected {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_converges_over_list_and_watch() {
    let cluster = Cluster::start().await;
    // A small page size exercises limit/continue in the initial list.
    assert_reflector_converges(&cluster, watcher::Config::default().page_size(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_converges_over_a_streaming_watch_list() {
    let cluster = Cluster::start().await;
    assert_reflector_converges(&cluster, watcher::Config::default().streaming_lists()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_updates_and_apply_conflicts_are_409() {
    let cluster = Cluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    api.create(&PostParams::default(), &config_map("a", "1"))
        .await
        .unwrap();
    let base = api.get("a").await.unwrap();
    let mut first = base.clone();
    first.data = Some(BTreeMap::from([("value".into(), "first".into())]));
    api.replace("a", &PostParams::default(), &first)
        .await
        .unwrap();
    let mut second = base;
    second.data = Some(BTreeMap::from([("value".into(), "second".into())]));
    match api.replace("a", &PostParams::default(), &second).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
            assert!(
                status.message.contains("the object has been modified"),
                "{}",
                status.message
            );
        }
        other => panic!("expected 409 Conflict, got {other:?}"),
    }
    let duplicate = api
        .create(&PostParams::default(), &config_map("a", "x"))
        .await;
    assert!(
        matches!(&duplicate, Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists"),
        "{duplicate:?}"
    );

    // Server-side apply: a field owned by another manager conflicts unless forced.
    let apply = |value: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"value": value}});
    api.patch("ssa", &PatchParams::apply("one"), &Patch::Apply(apply("1")))
        .await
        .unwrap();
    match api
        .patch("ssa", &PatchParams::apply("two"), &Patch::Apply(apply("2")))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 409);
            assert!(
                status.message.contains("conflict with \"one\""),
                "{}",
                status.message
            );
        }
        other => panic!("expected an apply conflict, got {other:?}"),
    }
    let forced = api
        .patch(
            "ssa",
            &PatchParams::apply("two").force(),
            &Patch::Apply(apply("2")),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap()["value"], "2");
}

fn widgets(cluster: &Cluster) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    Api::namespaced_with(cluster.client(), "default", &resource)
}

async fn install_widget_crd(cluster: &Cluster) {
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client());
    let text = std::fs::read_to_string(fixture("widgets-crd.yaml")).unwrap();
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    within(
        "CRD established",
        await_condition(
            crds,
            "widgets.example.com",
            conditions::is_crd_established(),
        ),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_are_validated_and_keep_status_separate() {
    let cluster = Cluster::start().await;
    install_widget_crd(&cluster).await;
    let api = widgets(&cluster);
    let widget = |spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w"}, "spec": spec}))
        .unwrap()
    };
    match api
        .create(
            &PostParams::default(),
            &widget(json!({"hosts": "not-a-list"})),
        )
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
            let causes = status.details.expect("details").causes;
            assert_eq!(causes[0].field, "spec.hosts");
            assert!(
                status.message.contains("must be of type array"),
                "{}",
                status.message
            );
        }
        other => panic!("expected 422, got {other:?}"),
    }
    let created = api
        .create(
            &PostParams::default(),
            &widget(json!({"hosts": ["a"], "port": 8080})),
        )
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(
        created.data["spec"]["mode"], "Safe",
        "schema default applied"
    );

    let status = api
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}, "spec": {"hosts": ["ignored"]}})),
        )
        .await
        .unwrap();
    assert_eq!(status.data["status"]["ready"], true);
    assert_eq!(
        status.data["spec"]["hosts"],
        json!(["a"]),
        "/status ignores spec"
    );
    assert_eq!(
        status.metadata.generation,
        Some(1),
        "status writes keep generation"
    );

    let updated = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hosts": ["b"]}, "status": {"ready": false}})),
        )
        .await
        .unwrap();
    assert_eq!(updated.metadata.generation, Some(2));
    assert_eq!(
        updated.data["status"]["ready"], true,
        "main resource ignores status"
    );

    // `/scale` reads and writes the paths the CRD names.
    let scale = api
        .patch_scale(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(4));
    let scaled = api.get("w").await.unwrap();
    assert_eq!(scaled.data["spec"]["replicas"], 4);
    assert_eq!(scaled.metadata.generation, Some(3));

    // The v1beta1 version serves the same objects.
    let gvk = GroupVersionKind::gvk("example.com", "v1beta1", "Widget");
    let beta: Api<DynamicObject> = Api::namespaced_with(
        cluster.client(),
        "default",
        &ApiResource::from_gvk_with_plural(&gvk, "widgets"),
    );
    let seen = beta.get("w").await.unwrap();
    assert_eq!(seen.types.unwrap().api_version, "example.com/v1beta1");
    assert_eq!(seen.data["spec"]["hosts"], json!(["b"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_events_are_readable_as_core_events() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let recorder = Recorder::new(client.clone(), Reporter::from("pilotfish-test"));
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: Some("subject".into()),
        namespace: Some("default".into()),
        ..Default::default()
    };
    let event = RecordedEvent {
        type_: EventType::Warning,
        reason: "Rejected".into(),
        note: Some("route refers to a missing host".into()),
        action: "Validate".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    // The same event again becomes a series (a merge patch through events.k8s.io/v1).
    recorder.publish(&event, &reference).await.unwrap();
    let core: Api<CoreEvent> = Api::namespaced(client, "default");
    let events = core.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(events.len(), 1, "{events:?}");
    let seen = &events[0];
    assert_eq!(
        seen.message.as_deref(),
        Some("route refers to a missing host")
    );
    assert_eq!(seen.reason.as_deref(), Some("Rejected"));
    assert_eq!(seen.involved_object.name.as_deref(), Some("subject"));
    assert_eq!(seen.reporting_component.as_deref(), Some("pilotfish-test"));
    assert_eq!(seen.series.as_ref().and_then(|s| s.count), Some(2));
}
