//! The Kubernetes mode against an in-process test API server: the partial-mesh guard,
//! status conditions and Events for invalid objects without echo loops, objects that do
//! not decode, and a standby taking over through Redis fencing.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event as CoreEvent;
use kube::api::{Api, ListParams};
use pilotfish_mesh::codec::{self, DecodeLimits};
use pilotfish_mesh::push_context::PushContext;
use pilotfish_shared::bus::Verified;
use pilotfish_shared::bus::memory::MemoryBus;
use pilotfish_shared::bus::redis::{RedisConfig, RedisPublisher};
use pilotfish_shared::bus::{Follower, SnapshotPublisher};
use pilotfish_shared::pipeline::seed::read_published;
use pilotfish_testkit::redis::RedisServer;
use serde_json::json;

use crate::k8s_support::*;

fn decode(blob: &[u8]) -> Result<Verified<PushContext>, codec::DecodeError> {
    pilotfish_testkit::keys::decoder()(blob)
}

/// The VirtualService weights the bus currently serves.
fn served_weights(follower: &Follower<PushContext>, name: &str) -> Option<Vec<i32>> {
    weights(&follower.current()?.value, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_published_until_every_kind_is_listed() {
    let cluster = Cluster::start().await;
    // No Istio CRDs yet: the VirtualService list fails, so the mesh would be partial.
    cluster.apply(service("reviews", 9080)).await;
    let bus = MemoryBus::new();
    let (follower, _task) = bus.follow(decode);
    let mut replica = Replica::start(&cluster, "a", Arc::new(bus.publisher()), fast_timings());
    eventually("the replica to lead", || async {
        replica.is_leader().then_some(())
    })
    .await;
    // Leading, with Services listed, yet nothing published and not ready: a negative
    // check, so give it a few debounce periods and Lease renewals.
    tokio::time::sleep(Duration::from_secs(2)).await;
    replica.assert_alive();
    assert_eq!(bus.latest(), None, "a partial mesh was published");
    let (ready, detail) = replica.admin.readiness();
    assert!(!ready, "ready before every store synced: {detail}");
    assert!(detail.contains("VirtualService"), "{detail}");
    assert!(
        replica.admin.leader()["unsynced"]
            .as_array()
            .unwrap()
            .contains(&json!("DestinationRule")),
        "{}",
        replica.admin.leader()
    );

    cluster.install_istio_crds().await;
    reviews_mesh(&cluster).await;
    cluster
        .apply(split("reviews", "reviews", &[("v1", 80), ("v2", 20)]))
        .await;
    let weights = eventually("the first snapshot, with the route", || async {
        served_weights(&follower, "reviews")
    })
    .await;
    assert_eq!(weights, vec![80, 20]);
    let first = bus.latest().expect("published");
    let ctx = follower.current().unwrap();
    assert!(
        ctx.value
            .services()
            .iter()
            .any(|s| s.hostname == "reviews.default.svc.cluster.local"),
        "the Service listed before the CRDs is in the first snapshot"
    );
    assert!(replica.admin.readiness().0);
    // The first snapshot was complete: every later one has the same services.
    assert!(first.version >= 1);
    replica.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_objects_get_a_false_condition_and_one_event_and_keep_the_previous_route() {
    let cluster = Cluster::start().await;
    cluster.install_istio_crds().await;
    reviews_mesh(&cluster).await;
    cluster
        .apply(split("reviews", "reviews", &[("v1", 80), ("v2", 20)]))
        .await;
    let bus = MemoryBus::new();
    let (follower, _task) = bus.follow(decode);
    let mut replica = Replica::start(&cluster, "a", Arc::new(bus.publisher()), fast_timings());
    let vs = split("reviews", "reviews", &[("v1", 80), ("v2", 20)]);
    let accepted = eventually("the Reconciled=True condition", || async {
        let object = cluster.get(&vs).await?;
        let c = reconciled(&object)?;
        (c["status"] == "True").then_some((c, object))
    })
    .await;
    assert_eq!(accepted.0["reason"], "Accepted");
    assert_eq!(accepted.1.data["status"]["observedGeneration"], 1);
    // Every Istio kind gets its condition, not only VirtualServices.
    let dr = destination_rule("reviews", &["v1", "v2"]);
    eventually("the DestinationRule's Reconciled=True", || async {
        let c = reconciled(&cluster.get(&dr).await?)?;
        (c["status"] == "True").then_some(())
    })
    .await;
    assert_eq!(served_weights(&follower, "reviews"), Some(vec![80, 20]));

    // A negative weight and an unknown subset.
    let bad = split("reviews", "reviews", &[("v1", 110), ("v9", -10)]);
    cluster.apply(bad.clone()).await;
    let (condition, object) = eventually("the Reconciled=False condition", || async {
        let object = cluster.get(&bad).await?;
        let c = reconciled(&object)?;
        (c["status"] == "False").then_some((c, object))
    })
    .await;
    let message = condition["message"].as_str().unwrap();
    assert_eq!(condition["reason"], "InvalidConfig");
    assert!(
        message.contains("spec.http[0].route[1].weight"),
        "{message}"
    );
    // The subset no DestinationRule defines is not a reason to reject (Istio judges the
    // object alone): only the weight is an error.
    assert!(!message.contains("v9"), "{message}");
    assert!(
        message.contains("the last accepted version is still served"),
        "{message}"
    );
    assert_eq!(condition["observedGeneration"], 2);
    assert_eq!(object.data["status"]["observedGeneration"], 2);
    // The previous routing holds.
    assert_eq!(served_weights(&follower, "reviews"), Some(vec![80, 20]));
    let snapshot = replica.admin.snapshot();
    assert!(
        snapshot["kept_previous"]
            .to_string()
            .contains("VirtualService default/reviews"),
        "{snapshot}"
    );

    // One Warning Event, reason InvalidConfig, about this object.
    let invalid = invalid_config_events(&cluster).await;
    assert_eq!(invalid.len(), 1, "{invalid:?}");
    assert_eq!(invalid[0].type_.as_deref(), Some("Warning"));
    assert_eq!(invalid[0].involved_object.name.as_deref(), Some("reviews"));
    assert_eq!(
        invalid[0].involved_object.kind.as_deref(),
        Some("VirtualService")
    );

    // No echo loop: an unrelated rebuild (an endpoint change) leaves the status alone.
    // (The test server stores an identical write without a new version, so the writes
    // are counted too; tests run one at a time, so the process-wide counter is ours.)
    let writes = || {
        pilotfish_controller::metrics::STATUS_WRITES
            .with_label_values(&["VirtualService", "written"])
            .get()
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writes_before = writes();
    let version_before = object.metadata.resource_version.clone();
    let builds_before = replica.admin.snapshot()["hash"].clone();
    cluster
        .apply(endpoint_slice("reviews", "v2", "reviews-v2", 10003))
        .await;
    eventually("the endpoint rebuild", || async {
        (replica.admin.snapshot()["hash"] != builds_before).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = cluster.get(&bad).await.unwrap();
    assert_eq!(
        after.metadata.resource_version, version_before,
        "the status was written again though nothing changed"
    );
    assert_eq!(writes(), writes_before, "status writes without a change");
    let events: Api<CoreEvent> = Api::namespaced(cluster.client(), "default");
    let count = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("InvalidConfig"))
        .count();
    assert_eq!(count, 1, "the Event was repeated");

    // Fixed again: True, and the new split is served.
    let fixed = split("reviews", "reviews", &[("v1", 50), ("v2", 50)]);
    cluster.apply(fixed.clone()).await;
    eventually("the fixed split", || async {
        (served_weights(&follower, "reviews")? == [50, 50]).then_some(())
    })
    .await;
    eventually("Reconciled=True again", || async {
        let c = reconciled(&cluster.get(&fixed).await?)?;
        (c["status"] == "True" && c["observedGeneration"] == 3).then_some(())
    })
    .await;
    replica.assert_alive();
}

/// The cluster's CRDs are a newer Istio's: a VirtualService uses a field this Pilotfish
/// does not know, and names a subset no DestinationRule defines. Istio would serve it; so
/// does Pilotfish, with both reported as warnings in the status condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_and_undefined_subsets_are_warnings_and_the_route_is_served() {
    let cluster = Cluster::start().await;
    cluster
        .install_crds(crds_with_extra_field(
            "VirtualService",
            "spec.http[]",
            "futureRetryPolicy",
        ))
        .await;
    reviews_mesh(&cluster).await;
    let mut vs = split("reviews", "reviews", &[("v1", 80), ("v9", 20)]);
    vs["spec"]["http"][0]["futureRetryPolicy"] = json!({"budget": 5});
    cluster.apply(vs.clone()).await;
    let stored = cluster.get(&vs).await.expect("stored");
    assert_eq!(
        stored.data["spec"]["http"][0]["futureRetryPolicy"]["budget"], 5,
        "the API server keeps the field its CRD declares"
    );
    let bus = MemoryBus::new();
    let (follower, _task) = bus.follow(decode);
    let mut replica = Replica::start(&cluster, "a", Arc::new(bus.publisher()), fast_timings());
    let served = eventually("the route, served", || async {
        served_weights(&follower, "reviews")
    })
    .await;
    assert_eq!(served, vec![80, 20]);
    let condition = eventually("the Reconciled condition", || async {
        reconciled(&cluster.get(&vs).await?)
    })
    .await;
    assert_eq!(condition["status"], "True", "{condition}");
    assert_eq!(condition["reason"], "AcceptedWithWarnings", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("spec.http[0].futureRetryPolicy: unknown field"),
        "{message}"
    );
    assert!(
        message.contains("spec.http[0].route[1].destination.subset: subset \"v9\""),
        "{message}"
    );
    replica.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_does_not_decode_is_reported_and_its_watch_goes_on() {
    let cluster = Cluster::start().await;
    cluster.install_istio_crds().await;
    reviews_mesh(&cluster).await;
    // The CRD schema accepts any string as a timeout; our types do not.
    let mut unreadable = split("reviews", "reviews", &[("v1", 100)]);
    unreadable["spec"]["http"][0]["timeout"] = json!("soon");
    cluster.apply(unreadable.clone()).await;
    let bus = MemoryBus::new();
    let (follower, _task) = bus.follow(decode);
    let mut replica = Replica::start(&cluster, "a", Arc::new(bus.publisher()), fast_timings());
    let condition = eventually("the decode failure in the status", || async {
        let c = reconciled(&cluster.get(&unreadable).await?)?;
        (c["status"] == "False").then_some(c)
    })
    .await;
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.starts_with("cannot read the object: spec.http[0].timeout"),
        "{message}"
    );
    // Everything else is served, and later changes still arrive.
    eventually("a snapshot without the unreadable route", || async {
        let ctx = follower.current()?;
        (ctx.value.services().len() == 1 && weights(&ctx.value, "reviews").is_none()).then_some(())
    })
    .await;
    cluster
        .apply(split("ratings", "reviews", &[("v2", 100)]))
        .await;
    let w = eventually("a VirtualService applied afterwards", || async {
        served_weights(&follower, "ratings")
    })
    .await;
    assert_eq!(w, vec![100]);
    replica.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_a_killed_leader_with_a_new_epoch() {
    let redis = RedisServer::start().expect("redis-server");
    let cluster = Cluster::start().await;
    cluster.install_istio_crds().await;
    reviews_mesh(&cluster).await;
    cluster
        .apply(split("reviews", "reviews", &[("v1", 80), ("v2", 20)]))
        .await;
    let config = || RedisConfig::new(&redis.url()).unwrap().with_prefix("it");
    let publisher_a = RedisPublisher::new(config()).unwrap();
    let publisher_b = RedisPublisher::new(config()).unwrap();
    let observer = RedisPublisher::new(config()).unwrap();
    let (follower, _task) =
        pilotfish_shared::bus::redis::follow(config(), decode).expect("follow Redis");

    let a = Replica::start(
        &cluster,
        "a",
        Arc::new(publisher_a) as Arc<dyn SnapshotPublisher>,
        fast_timings(),
    );
    eventually("a to lead", || async { a.is_leader().then_some(()) }).await;
    let mut b = Replica::start(
        &cluster,
        "b",
        Arc::new(publisher_b) as Arc<dyn SnapshotPublisher>,
        fast_timings(),
    );
    eventually("the first publish", || async {
        (served_weights(&follower, "reviews")? == [80, 20]).then_some(())
    })
    .await;
    eventually("b ready as a standby", || async {
        b.admin.readiness().0.then_some(())
    })
    .await;
    assert!(!b.is_leader());
    let epoch_a = a.epoch().expect("a took an epoch");
    let first = observer.latest().await.unwrap().expect("latest");
    assert_eq!(first.epoch, epoch_a);

    // SIGKILL-like: no release. A change lands while nobody leads.
    a.kill();
    cluster
        .apply(split("reviews", "reviews", &[("v1", 50), ("v2", 50)]))
        .await;
    eventually("b to lead", || async { b.is_leader().then_some(()) }).await;
    eventually("the change made while leaderless to be served", || async {
        (served_weights(&follower, "reviews")? == [50, 50]).then_some(())
    })
    .await;
    let latest = observer.latest().await.unwrap().expect("latest");
    let epoch_b = b.epoch().expect("b took an epoch");
    assert!(epoch_b > epoch_a, "new epoch {epoch_b} after {epoch_a}");
    assert_eq!(latest.epoch, epoch_b);
    assert!(latest.version > first.version);
    b.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_never_publish_a_partial_mesh_and_deleting_the_route_restores_the_default() {
    let cluster = Cluster::start().await;
    cluster.install_istio_crds().await;
    reviews_mesh(&cluster).await;
    let vs = split("reviews", "reviews", &[("v1", 80), ("v2", 20)]);
    cluster.apply(vs.clone()).await;
    let bus = MemoryBus::new();
    let (follower, _task) = bus.follow(decode);
    // Record every snapshot the bus serves from now on.
    let mut updates = follower.subscribe();
    let seen = tokio::spawn(async move {
        let mut seen: Vec<(u64, Option<Vec<i32>>, usize)> = Vec::new();
        while updates.changed().await.is_ok() {
            let current = updates.borrow_and_update().clone();
            if let Some(f) = current {
                seen.push((
                    f.reference.version,
                    weights(&f.value, "reviews"),
                    f.value.services().len(),
                ));
            }
        }
        seen
    });
    let start = |identity: &str| {
        Replica::start(
            &cluster,
            identity,
            Arc::new(bus.publisher()),
            fast_timings(),
        )
    };
    let a = start("a");
    eventually("the first publish", || async {
        (served_weights(&follower, "reviews")? == [80, 20]).then_some(())
    })
    .await;
    // SIGTERM-style restart, then a SIGKILL-style one.
    a.stop().await;
    let a = start("a");
    eventually("the restarted replica to lead", || async {
        a.is_leader().then_some(())
    })
    .await;
    eventually("its first publish", || async {
        (a.admin.snapshot()["publish"]["result"] == "unchanged").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.kill();
    let mut a = start("a");
    eventually("the restarted replica to lead again", || async {
        a.is_leader().then_some(())
    })
    .await;
    // Same content: the publish finds `latest` unchanged and writes nothing.
    eventually("a publish (unchanged) by the restarted replica", || async {
        let result = a.admin.snapshot()["publish"]["result"].clone();
        (result == "unchanged" || result == "published").then_some(())
    })
    .await;

    // Deleting the VirtualService returns the host to default routing.
    cluster.delete(vs).await;
    eventually("the route to be gone", || async {
        let ctx = follower.current()?;
        weights(&ctx.value, "reviews").is_none().then_some(())
    })
    .await;
    assert_eq!(follower.current().unwrap().value.services().len(), 1);
    a.assert_alive();
    drop(a);
    drop(follower);
    drop(_task);
    let seen = tokio::time::timeout(WAIT, seen)
        .await
        .expect("recorder ended")
        .unwrap();
    // Until the deletion, every snapshot ever served had the service and the route.
    let before_delete: Vec<_> = seen.iter().take_while(|(_, w, _)| w.is_some()).collect();
    assert!(!before_delete.is_empty());
    for (version, w, services) in &seen[..before_delete.len()] {
        assert_eq!(*services, 1, "v{version} lost the service");
        assert_eq!(w.as_deref(), Some(&[80, 20][..]), "v{version}");
    }
    assert!(
        seen[before_delete.len()..]
            .iter()
            .all(|(_, w, s)| w.is_none() && *s == 1),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_keeps_the_last_accepted_version_of_an_object_invalid_at_start() {
    let redis = RedisServer::start().expect("redis-server");
    let cluster = Cluster::start().await;
    cluster.install_istio_crds().await;
    reviews_mesh(&cluster).await;
    cluster
        .apply(split("reviews", "reviews", &[("v1", 80), ("v2", 20)]))
        .await;
    let config = || RedisConfig::new(&redis.url()).unwrap().with_prefix("seed");
    let (follower, _task) =
        pilotfish_shared::bus::redis::follow(config(), decode).expect("follow Redis");
    let start = |identity: &str| {
        let publisher: Arc<dyn SnapshotPublisher> =
            Arc::new(RedisPublisher::new(config()).unwrap());
        Replica::start_seeded(
            &cluster,
            identity,
            publisher.clone(),
            Some(read_published(
                publisher,
                DecodeLimits::default(),
                pilotfish_testkit::keys::verify_keys(),
            )),
            fast_timings(),
        )
    };
    let a = start("a");
    eventually("the first publish", || async {
        (served_weights(&follower, "reviews")? == [80, 20]).then_some(())
    })
    .await;
    let bad = split("reviews", "reviews", &[("v1", 100), ("v2", -1)]);
    cluster.apply(bad.clone()).await;
    eventually("Reconciled=False", || async {
        (reconciled(&cluster.get(&bad).await?)?["status"] == "False").then_some(())
    })
    .await;
    a.kill();
    // A fresh process: its pipeline has never seen the accepted version.
    let mut b = start("b");
    eventually("the new replica to lead and publish", || async {
        let result = b.admin.snapshot()["publish"]["result"].clone();
        (b.is_leader() && (result == "unchanged" || result == "published")).then_some(())
    })
    .await;
    let snapshot = b.admin.snapshot();
    assert!(
        snapshot["kept_previous"]
            .to_string()
            .contains("VirtualService default/reviews"),
        "{snapshot}"
    );
    assert_eq!(served_weights(&follower, "reviews"), Some(vec![80, 20]));
    b.assert_alive();
}

/// PeerAuthentication is watched like the networking kinds: a valid one reaches the
/// snapshot (decoded by the replica), an invalid one — port-level mTLS without a selector,
/// which Istio rejects — gets `Reconciled=False` naming the field and one `InvalidConfig`
/// Event about the `security.istio.io` object, and is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_authentications_are_served_and_invalid_ones_reported() {
    let cluster = Cluster::start().await;
    cluster.install_istio_crds().await;
    reviews_mesh(&cluster).await;
    let strict = json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": "default"},
        "spec": {"mtls": {"mode": "STRICT"}},
    });
    let bad = json!({
        "apiVersion": "security.istio.io/v1beta1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "ports-without-selector", "namespace": "default"},
        "spec": {"portLevelMtls": {"8080": {"mode": "DISABLE"}}},
    });
    cluster.apply(strict.clone()).await;
    cluster.apply(bad.clone()).await;
    let bus = MemoryBus::new();
    let (follower, _task) = bus.follow(decode);
    let mut replica = Replica::start(&cluster, "a", Arc::new(bus.publisher()), fast_timings());
    let served = eventually("the valid PeerAuthentication, served", || async {
        let ctx = follower.current()?;
        let names: Vec<String> = ctx
            .value
            .peer_authentications()
            .iter()
            .map(|p| format!("{}/{}", p.meta.namespace, p.meta.name))
            .collect();
        (!names.is_empty()).then_some(names)
    })
    .await;
    assert_eq!(served, ["default/default"]);
    let labels = std::collections::BTreeMap::from([("app".to_string(), "reviews".to_string())]);
    assert_eq!(
        follower
            .current()
            .unwrap()
            .value
            .mtls_for_workload("default", &labels)
            .mode,
        pilotfish_mesh::api::MtlsMode::Strict
    );
    let condition = eventually("Reconciled=False on the invalid one", || async {
        let c = reconciled(&cluster.get(&bad).await?)?;
        (c["status"] == "False").then_some(c)
    })
    .await;
    assert_eq!(condition["reason"], "InvalidConfig");
    let message = condition["message"].as_str().unwrap();
    assert!(message.contains("spec.portLevelMtls"), "{message}");
    let valid = eventually("Reconciled=True on the valid one", || async {
        reconciled(&cluster.get(&strict).await?)
    })
    .await;
    assert_eq!(valid["status"], "True", "{valid}");
    let invalid = invalid_config_events(&cluster).await;
    assert_eq!(invalid.len(), 1, "{invalid:?}");
    let about = &invalid[0].involved_object;
    assert_eq!(about.kind.as_deref(), Some("PeerAuthentication"));
    assert_eq!(about.api_version.as_deref(), Some("security.istio.io/v1"));
    assert_eq!(about.name.as_deref(), Some("ports-without-selector"));
    replica.assert_alive();
}

/// AuthorizationPolicy is watched like the other Istio kinds: a valid one reaches the
/// snapshot and applies to the workloads it selects; a CUSTOM one (ext_authz, which
/// Pilotfish does not support) gets `Reconciled=False` saying so and one `InvalidConfig`
/// Event about the `security.istio.io` object — and stays in the snapshot, where the
/// generators turn it into DENY rules (it never allows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_policies_are_served_and_custom_ones_refused() {
    let cluster = Cluster::start().await;
    cluster.install_istio_crds().await;
    reviews_mesh(&cluster).await;
    let allow = json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "reviews-get", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": "reviews"}},
            "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]
        },
    });
    let custom = json!({
        "apiVersion": "security.istio.io/v1beta1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "ext-authz", "namespace": "default"},
        "spec": {"action": "CUSTOM", "provider": {"name": "opa"}, "rules": [{}]},
    });
    cluster.apply(allow.clone()).await;
    cluster.apply(custom.clone()).await;
    let bus = MemoryBus::new();
    let (follower, _task) = bus.follow(decode);
    let mut replica = Replica::start(&cluster, "a", Arc::new(bus.publisher()), fast_timings());
    let served = eventually("both AuthorizationPolicies, served", || async {
        let ctx = follower.current()?;
        let names: Vec<String> = ctx
            .value
            .authorization_policies()
            .iter()
            .map(|p| format!("{}/{}", p.meta.namespace, p.meta.name))
            .collect();
        (names.len() == 2).then_some(names)
    })
    .await;
    assert_eq!(served, ["default/ext-authz", "default/reviews-get"]);
    let labels = std::collections::BTreeMap::from([("app".to_string(), "reviews".to_string())]);
    let applied = follower
        .current()
        .unwrap()
        .value
        .authorization_for_workload("default", &labels);
    assert_eq!(applied.allow.len(), 1);
    assert_eq!(applied.custom.len(), 1);
    let condition = eventually("Reconciled=False on the CUSTOM one", || async {
        let c = reconciled(&cluster.get(&custom).await?)?;
        (c["status"] == "False").then_some(c)
    })
    .await;
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("spec.action: CUSTOM (ext_authz) is not supported by Pilotfish"),
        "{message}"
    );
    let valid = eventually("Reconciled=True on the valid one", || async {
        reconciled(&cluster.get(&allow).await?)
    })
    .await;
    assert_eq!(valid["status"], "True", "{valid}");
    let invalid = invalid_config_events(&cluster).await;
    assert_eq!(invalid.len(), 1, "{invalid:?}");
    let about = &invalid[0].involved_object;
    assert_eq!(about.kind.as_deref(), Some("AuthorizationPolicy"));
    assert_eq!(about.api_version.as_deref(), Some("security.istio.io/v1"));
    assert_eq!(about.name.as_deref(), Some("ext-authz"));
    replica.assert_alive();
}

/// Sidecar is watched like the other Istio kinds: a valid one reaches the snapshot (the
/// replica selects it for the namespace), one with a field Pilotfish ignores as Istio does by
/// default (an ingress listener's `tls`) is
/// served with `Reconciled=True` and a warning naming it, an invalid one (no egress,
/// ingress, policy nor pool: Istio's "empty configuration") gets `Reconciled=False` and
/// one `InvalidConfig` Event, and is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_are_served_and_invalid_ones_reported() {
    let cluster = Cluster::start().await;
    cluster.install_istio_crds().await;
    reviews_mesh(&cluster).await;
    let scoped = json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "Sidecar",
        "metadata": {"name": "default", "namespace": "default"},
        "spec": {"egress": [{"hosts": ["./*"]}]},
    });
    let with_ingress = json!({
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "Sidecar",
        "metadata": {"name": "reviews", "namespace": "default"},
        "spec": {
            "workloadSelector": {"labels": {"app": "reviews"}},
            "ingress": [{"port": {"number": 9443, "protocol": "HTTPS", "name": "https"}, "defaultEndpoint": "127.0.0.1:9080", "captureMode": "NONE",
                "tls": {"mode": "SIMPLE", "serverCertificate": "/etc/certs/cert.pem", "privateKey": "/etc/certs/key.pem"}}],
        },
    });
    let empty = json!({
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "Sidecar",
        "metadata": {"name": "empty", "namespace": "default"},
        "spec": {},
    });
    for object in [&scoped, &with_ingress, &empty] {
        cluster.apply(object.clone()).await;
    }
    let bus = MemoryBus::new();
    let (follower, _task) = bus.follow(decode);
    let mut replica = Replica::start(&cluster, "a", Arc::new(bus.publisher()), fast_timings());
    let served = eventually("the valid Sidecars, served", || async {
        let ctx = follower.current()?;
        let names: Vec<String> = ctx
            .value
            .sidecars()
            .iter()
            .map(|s| format!("{}/{}", s.meta.namespace, s.meta.name))
            .collect();
        (names.len() == 2).then_some(names)
    })
    .await;
    assert_eq!(served, ["default/default", "default/reviews"]);
    let current = follower.current().unwrap();
    let ctx = &current.value;
    let chosen = ctx
        .sidecar_for("default", &std::collections::BTreeMap::new())
        .unwrap();
    assert_eq!(ctx.sidecars()[chosen].meta.name, "default");
    let condition = eventually("Reconciled=False on the empty one", || async {
        let c = reconciled(&cluster.get(&empty).await?)?;
        (c["status"] == "False").then_some(c)
    })
    .await;
    assert_eq!(condition["reason"], "InvalidConfig");
    let warned = eventually("AcceptedWithWarnings on the one with ingress", || async {
        let c = reconciled(&cluster.get(&with_ingress).await?)?;
        (c["reason"] == "AcceptedWithWarnings").then_some(c)
    })
    .await;
    assert_eq!(warned["status"], "True", "{warned}");
    assert!(
        warned["message"]
            .as_str()
            .unwrap()
            .contains("spec.ingress[0].tls"),
        "{warned}"
    );
    let invalid = invalid_config_events(&cluster).await;
    assert_eq!(invalid.len(), 1, "{invalid:?}");
    let about = &invalid[0].involved_object;
    assert_eq!(about.kind.as_deref(), Some("Sidecar"));
    assert_eq!(about.api_version.as_deref(), Some("networking.istio.io/v1"));
    assert_eq!(about.name.as_deref(), Some("empty"));
    replica.assert_alive();
}

/// A key server for the JWKS test: answers every request with `body` (a real HTTP/1.1
/// server on 127.0.0.1), counting requests.
async fn key_server(body: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tcp.write_all(response.as_bytes()).await;
            });
        }
    });
    (format!("http://{addr}/jwks.json"), hits)
}

/// RequestAuthentication end to end through the controller: the leader fetches the key
/// set a jwksUri names (from a real HTTP server) and the replica decodes it from the
/// snapshot; an unreachable jwksUri is recorded as failed (the rule fails closed) and the
/// policy says so in `Reconciled` (accepted, with a warning naming the rule and the URI);
/// an invalid policy gets `Reconciled=False` and one `InvalidConfig` Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_authentications_are_served_with_fetched_key_sets() {
    const KEYS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"k1","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;
    let (jwks_uri, hits) = key_server(KEYS).await;
    let unreachable = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/jwks.json", l.local_addr().unwrap())
    };
    let cluster = Cluster::start().await;
    cluster.install_istio_crds().await;
    reviews_mesh(&cluster).await;
    let fetched = json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": "fetched", "namespace": "default"},
        "spec": {"jwtRules": [{"issuer": "https://issuer.example.com", "jwksUri": jwks_uri}]},
    });
    let down = json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": "down", "namespace": "default"},
        "spec": {"jwtRules": [{"issuer": "https://down.example.com", "jwksUri": unreachable, "timeout": "500ms"}]},
    });
    let bad = json!({
        "apiVersion": "security.istio.io/v1beta1",
        "kind": "RequestAuthentication",
        "metadata": {"name": "no-issuer", "namespace": "default"},
        "spec": {"jwtRules": [{"audiences": ["a"]}]},
    });
    for object in [&fetched, &down, &bad] {
        cluster.apply(object.clone()).await;
    }
    let bus = MemoryBus::new();
    let (follower, _task) = bus.follow(decode);
    let mut replica = Replica::start(&cluster, "a", Arc::new(bus.publisher()), fast_timings());
    let key_sets = eventually("both key sets resolved in the served snapshot", || async {
        let ctx = follower.current()?;
        let jwks = ctx.value.jwks().clone();
        (jwks.len() == 2).then_some(jwks)
    })
    .await;
    let outcome = |uri: &str| {
        key_sets
            .iter()
            .find(|(s, _)| s.jwks_uri == uri)
            .map(|(_, o)| o.clone())
            .expect("a source per jwksUri")
    };
    assert_eq!(
        outcome(&jwks_uri),
        pilotfish_mesh::push_context::JwksOutcome::Keys(KEYS.into())
    );
    assert!(matches!(
        outcome(&unreachable),
        pilotfish_mesh::push_context::JwksOutcome::Failed(_)
    ));
    assert!(hits.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    let served = follower.current().unwrap();
    let names: Vec<String> = served
        .value
        .request_authentications()
        .iter()
        .map(|r| r.meta.name.clone())
        .collect();
    assert_eq!(names, ["down", "fetched"]);
    let warned = eventually("a warning on the policy whose key set is down", || async {
        let c = reconciled(&cluster.get(&down).await?)?;
        (c["reason"] == "AcceptedWithWarnings").then_some(c)
    })
    .await;
    let message = warned["message"].as_str().unwrap();
    assert!(
        message.contains("spec.jwtRules[0].jwksUri") && message.contains(&unreachable),
        "{message}"
    );
    let condition = eventually("Reconciled=False on the invalid one", || async {
        let c = reconciled(&cluster.get(&bad).await?)?;
        (c["status"] == "False").then_some(c)
    })
    .await;
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("spec.jwtRules[0]"),
        "{condition}"
    );
    let invalid = invalid_config_events(&cluster).await;
    assert_eq!(invalid.len(), 1, "{invalid:?}");
    assert_eq!(
        invalid[0].involved_object.kind.as_deref(),
        Some("RequestAuthentication")
    );
    replica.assert_alive();
}

/// The `InvalidConfig` Events of namespace `default`, once there is at least one.
async fn invalid_config_events(cluster: &Cluster) -> Vec<CoreEvent> {
    let events: Api<CoreEvent> = Api::namespaced(cluster.client(), "default");
    eventually("the InvalidConfig Event", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let found: Vec<CoreEvent> = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("InvalidConfig"))
            .collect();
        (!found.is_empty()).then_some(found)
    })
    .await
}
