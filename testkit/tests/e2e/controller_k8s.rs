//! `pilotfish-controller` in its Kubernetes mode, as real processes: the test API server
//! binary, `redis-server`, two controllers electing a leader over a Lease, driven by the
//! real kubectl 1.33 with the YAML in `fixtures/mesh/`.
//!
//! - [`controllers_publish_mark_invalid_configs_fail_over_and_fence`] reads what the
//!   controllers publish straight from Redis (decoded with the shared codec): apply,
//!   invalid config (status, Event, previous routing kept), SIGKILL failover with a change
//!   made while leaderless, SIGSTOP/SIGCONT fencing, restarts that never publish a partial
//!   mesh, deletion.
//! - [`grpc_clients_follow_kubectl_through_two_controllers_and_two_xds_replicas`] adds two
//!   `pilotfish-xds` replicas, backend gRPC servers and gRPC's own xDS client, and checks
//!   what traffic does: the 80/20 split, the time from `kubectl apply` to a new split,
//!   invalid config, failover, restarts without errors, deletion back to default routing.
//!
//! Timings are measured and printed (`MEASURED …` lines, see docs/PERFORMANCE.md), never
//! asserted; bounds only keep a broken run from hanging.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pilotfish_mesh::codec;
use pilotfish_mesh::push_context::PushContext;
use pilotfish_shared::bus::redis::{RedisConfig, RedisPublisher, follow};
use pilotfish_shared::bus::{Follower, Verified};
use pilotfish_testkit::grpc::{GrpcBackends, RpcTally, XdsClient, bootstrap};
use pilotfish_testkit::process::{ChildProcess, XdsServer, binary, free_port, http_get};
use pilotfish_testkit::redis::RedisServer;
use pilotfish_testkit::tools::{self, KubeEnv, workspace_root};
use serde_json::Value;

use crate::support::{TOOL_TIMEOUT, WAIT, fixture};

/// The xDS target of the reviews service.
const REVIEWS: &str = "xds:///reviews.default.svc.cluster.local:9080";

/// Short Lease timings (seconds-scale failover); debounce at its defaults.
pub(crate) const LEASE_FLAGS: [&str; 6] = [
    "--lease-duration",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "500ms",
];

/// Polls `check` every 50 ms until it returns `Some`, for at most [`WAIT`].
pub(crate) async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn decode(blob: &[u8]) -> Result<Verified<PushContext>, codec::DecodeError> {
    pilotfish_testkit::keys::decoder()(blob)
}

/// Weights of the reviews VirtualService's first route in a snapshot (`None`: no route).
pub(crate) fn reviews_weights(ctx: &PushContext) -> Option<Vec<i32>> {
    let vs = ctx
        .virtual_services()
        .iter()
        .find(|vs| vs.meta.namespace == "default" && vs.meta.name == "reviews")?;
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

pub(crate) fn served(follower: &Follower<PushContext>) -> Option<Option<Vec<i32>>> {
    follower.current().map(|f| reviews_weights(&f.value))
}

/// `address=region/zone/subzone` of every reviews endpoint (port 9080) in a snapshot.
fn reviews_localities(ctx: &PushContext) -> Option<Vec<String>> {
    let svc = ctx.service_for("reviews.default.svc.cluster.local", "default")?;
    let mut out: Vec<String> = ctx
        .endpoints(svc)?
        .ports
        .iter()
        .flat_map(|p| &p.endpoints)
        .map(|e| format!("{}={}", e.workload.as_deref().unwrap_or("?"), e.locality))
        .collect();
    out.sort();
    out.dedup();
    Some(out)
}

/// The value of one sample (`name{labels}`) in a Prometheus text page; 0 when absent.
pub(crate) fn metric(page: &str, sample: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The test API server process, kubectl pointed at it, and scratch files.
pub(crate) struct Cluster {
    _server: ChildProcess,
    pub(crate) kubeconfig: PathBuf,
    env: KubeEnv,
    dir: tempfile::TempDir,
}

impl Cluster {
    pub(crate) async fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        let server = ChildProcess::spawn(
            "pilotfish-test-apiserver",
            Path::new(env!("CARGO_BIN_EXE_pilotfish-test-apiserver")),
            &[
                "--addr".into(),
                "127.0.0.1:0".into(),
                "--kubeconfig-out".into(),
                kubeconfig.display().to_string(),
            ],
            &[("RUST_LOG", "warn")],
        )
        .expect("start the test API server");
        eventually("the API server's kubeconfig", || {
            kubeconfig.exists().then_some(())
        })
        .await;
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let env = KubeEnv::new(&home, &kubeconfig);
        Cluster {
            _server: server,
            kubeconfig,
            env,
            dir,
        }
    }

    pub(crate) async fn kubectl(&self, args: &[&str]) -> String {
        let kubectl = tools::kubectl().unwrap_or_else(|e| panic!("{e}"));
        let out = self
            .env
            .run(&kubectl, args, TOOL_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.success,
            "kubectl {args:?} failed: {}\n{}",
            out.stderr, out.stdout
        );
        out.stdout
    }

    /// `kubectl apply --server-side -f` of a file in `fixtures/mesh/` (or a path).
    pub(crate) async fn apply(&self, file: &str) -> String {
        let path = if Path::new(file).is_absolute() {
            file.to_string()
        } else {
            fixture(&format!("mesh/{file}"))
        };
        self.kubectl(&["apply", "--server-side", "-f", &path]).await
    }

    /// The Istio CRDs, the reviews Service, Pods (and their status), EndpointSlices on
    /// the given ports, the DestinationRule and the 80/20 VirtualService.
    pub(crate) async fn install_reviews(&self, v1_port: u16, v2_port: u16) {
        let crds = workspace_root().join("crds");
        self.kubectl(&["apply", "--server-side", "-f", crds.to_str().unwrap()])
            .await;
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/virtualservices.networking.istio.io",
            "crd/destinationrules.networking.istio.io",
            "crd/serviceentries.networking.istio.io",
            "--timeout=60s",
        ])
        .await;
        self.apply("reviews.yaml").await;
        self.kubectl(&[
            "apply",
            "--server-side",
            "--subresource=status",
            "-f",
            &fixture("mesh/reviews-pods-status.yaml"),
        ])
        .await;
        let template = std::fs::read_to_string(fixture("mesh/reviews-endpoints.yaml")).unwrap();
        let endpoints = self.dir.path().join("reviews-endpoints.yaml");
        std::fs::write(
            &endpoints,
            template
                .replace("${V1_PORT}", &v1_port.to_string())
                .replace("${V2_PORT}", &v2_port.to_string()),
        )
        .unwrap();
        self.apply(endpoints.to_str().unwrap()).await;
        self.apply("reviews-destination-rule.yaml").await;
        self.apply("reviews-80-20.yaml").await;
    }

    /// `kubectl get events -o json`: the InvalidConfig Events, waiting for at least one.
    async fn invalid_config_events(&self) -> Vec<Value> {
        let deadline = Instant::now() + WAIT;
        loop {
            let json = self.kubectl(&["get", "events", "-o", "json"]).await;
            let list: Value = serde_json::from_str(&json).expect("kubectl JSON");
            let found: Vec<Value> = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["reason"] == "InvalidConfig")
                .cloned()
                .collect();
            if !found.is_empty() {
                return found;
            }
            assert!(Instant::now() < deadline, "no InvalidConfig Event:\n{json}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the reviews VirtualService's `Reconciled` condition has `status`;
    /// returns the condition (from `-o json`: the YAML printer folds long messages) and
    /// the `-o yaml` text a user would read.
    pub(crate) async fn wait_reconciled(&self, status: &str) -> (Value, String) {
        let deadline = Instant::now() + WAIT;
        loop {
            let json = self
                .kubectl(&["get", "virtualservice", "reviews", "-o", "json"])
                .await;
            let object: Value = serde_json::from_str(&json).expect("kubectl JSON");
            let condition = object["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Reconciled"))
                .cloned();
            if let Some(c) = condition.filter(|c| c["status"] == status) {
                let yaml = self
                    .kubectl(&["get", "virtualservice", "reviews", "-o", "yaml"])
                    .await;
                return (c, yaml);
            }
            assert!(
                Instant::now() < deadline,
                "Reconciled={status} never shown:\n{json}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// One `pilotfish-controller` process (restartable).
pub(crate) struct Controller {
    pub(crate) name: String,
    pub(crate) admin: SocketAddr,
    args: Vec<String>,
    kubeconfig: String,
    process: Option<ChildProcess>,
}

impl Controller {
    pub(crate) fn new(name: &str, redis_url: &str, cluster: &Cluster) -> Controller {
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut args: Vec<String> = [
            "--redis-url",
            redis_url,
            "--admin-addr",
            &admin.to_string(),
            "--replica-name",
            name,
            "--lease-namespace",
            "default",
            "--signing-key-file",
            &pilotfish_testkit::keys::files()
                .signing
                .display()
                .to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(LEASE_FLAGS.iter().map(|s| s.to_string()));
        Controller {
            name: name.into(),
            admin,
            args,
            kubeconfig: cluster.kubeconfig.display().to_string(),
            process: None,
        }
    }

    /// Adds flags (before the Lease timings).
    pub(crate) fn with_flags(mut self, flags: &[&str]) -> Controller {
        let at = self.args.len() - LEASE_FLAGS.len();
        for (i, f) in flags.iter().enumerate() {
            self.args.insert(at + i, f.to_string());
        }
        self
    }

    /// The running process's id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ChildProcess::pid)
    }

    /// Replaces the Lease timings (the default is [`LEASE_FLAGS`]).
    fn with_lease_flags(mut self, flags: &[&str]) -> Controller {
        let keep = self.args.len() - LEASE_FLAGS.len();
        self.args.truncate(keep);
        self.args.extend(flags.iter().map(|s| s.to_string()));
        self
    }

    pub(crate) fn start(&mut self) {
        let program = binary("pilotfish-controller").unwrap_or_else(|e| panic!("{e}"));
        let process = ChildProcess::spawn(
            &self.name,
            &program,
            &self.args,
            &[
                ("KUBECONFIG", &self.kubeconfig),
                (
                    "RUST_LOG",
                    &std::env::var("PILOTFISH_E2E_LOG").unwrap_or_else(|_| "warn".into()),
                ),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        self.process = Some(process);
    }

    pub(crate) fn get(&self, path: &str) -> Option<String> {
        match http_get(self.admin, path) {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    }

    pub(crate) fn leader_page(&self) -> Option<Value> {
        serde_json::from_str(&self.get("/debug/leader")?).ok()
    }

    pub(crate) fn leads(&self) -> bool {
        self.leader_page().is_some_and(|l| l["leader"] == true)
    }

    pub(crate) fn epoch(&self) -> Option<u64> {
        self.leader_page()?["epoch"].as_u64()
    }

    pub(crate) fn ready(&self) -> bool {
        self.get("/readyz").is_some()
    }

    pub(crate) fn metrics(&self) -> String {
        self.get("/metrics").unwrap_or_default()
    }

    pub(crate) fn signal(&self, signal: &str) {
        self.process
            .as_ref()
            .expect("running")
            .signal(signal)
            .unwrap_or_else(|e| panic!("kill -{signal} {}: {e}", self.name));
    }

    /// SIGKILL: no Lease release, no goodbye.
    pub(crate) fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.signal("KILL").unwrap();
            p.wait_exit(WAIT).expect("exit after SIGKILL");
        }
    }

    /// SIGTERM: releases the Lease and exits 0.
    pub(crate) fn terminate(&mut self) {
        let mut p = self.process.take().expect("running");
        p.signal("TERM").unwrap();
        let status = p.wait_exit(WAIT).expect("exit after SIGTERM");
        assert!(
            status.success(),
            "{} exited with {status} after SIGTERM",
            self.name
        );
    }

    /// After a SIGTERM sent with [`Controller::signal`]: waits for a clean exit.
    fn terminate_wait(&mut self) {
        let mut p = self.process.take().expect("running");
        let status = p.wait_exit(WAIT).expect("exit after SIGTERM");
        assert!(
            status.success(),
            "{} exited with {status} after SIGTERM",
            self.name
        );
    }

    pub(crate) fn assert_running(&mut self) {
        if let Some(p) = self.process.as_mut() {
            assert!(p.try_wait().is_none(), "{} exited", self.name);
        }
    }
}

/// Waits until exactly one of `controllers` leads; returns its index.
pub(crate) async fn leader_of(controllers: &[&Controller]) -> usize {
    eventually("a leader", || {
        let leading: Vec<usize> = (0..controllers.len())
            .filter(|&i| controllers[i].leads())
            .collect();
        (leading.len() == 1).then(|| leading[0])
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_publish_mark_invalid_configs_fail_over_and_fence() {
    let cluster = Cluster::start().await;
    let redis = RedisServer::start().expect("redis-server");
    let config = RedisConfig::new(&redis.url()).unwrap();
    let observer = RedisPublisher::new(config.clone()).unwrap();
    let (follower, _follow_task) = follow(config.clone(), decode).expect("follow Redis");
    let mut a = Controller::new("controller-a", &redis.url(), &cluster);
    let mut b = Controller::new("controller-b", &redis.url(), &cluster);
    a.start();
    b.start();
    cluster.install_reviews(10001, 10002).await;
    eventually("the 80/20 route in Redis", || {
        (served(&follower)?? == [80, 20]).then_some(())
    })
    .await;
    eventually("both controllers ready", || {
        (a.ready() && b.ready()).then_some(())
    })
    .await;
    let mut controllers = [&mut a, &mut b];
    let first = leader_of(&[&*controllers[0], &*controllers[1]]).await;
    println!("leader: {}", controllers[first].name);

    // --- locality from the Pod's Node, following the Node's labels ---
    let localities = || {
        follower
            .current()
            .and_then(|f| reviews_localities(&f.value))
    };
    assert_eq!(
        localities(),
        Some(vec![
            "default/reviews-v1=//".to_string(),
            "default/reviews-v2=//".to_string()
        ]),
        "no Node yet: no locality"
    );
    cluster.apply("reviews-nodes.yaml").await;
    eventually("reviews-v1 in its Node's locality", || {
        (localities()?.first()? == "default/reviews-v1=eu/eu-1a/rack1").then_some(())
    })
    .await;
    cluster
        .kubectl(&[
            "label",
            "node",
            "node-a",
            "topology.kubernetes.io/zone=eu-1b",
            "--overwrite",
        ])
        .await;
    eventually("the relabelled Node's zone", || {
        (localities()? == ["default/reviews-v1=eu/eu-1b/rack1", "default/reviews-v2=//"])
            .then_some(())
    })
    .await;

    // --- an invalid edit: marked, reported, and the previous routing holds ---
    cluster.apply("reviews-invalid.yaml").await;
    let (condition, yaml) = cluster.wait_reconciled("False").await;
    for needle in [
        "type: Reconciled",
        "reason: InvalidConfig",
        "status: \"False\"",
        "observedGeneration: 2",
        "spec.http[0].match[0].uri.regex",
    ] {
        assert!(yaml.contains(needle), "{needle:?} missing from:\n{yaml}");
    }
    let message = condition["message"].as_str().unwrap_or_default();
    for needle in [
        "spec.http[0].match[0].uri.regex: invalid regular expression",
        "spec.http[0].route[1].weight: weight must not be negative",
        "the last accepted version is still served",
    ] {
        assert!(
            message.contains(needle),
            "{needle:?} missing from {message:?}"
        );
    }
    // The subset no DestinationRule defines is not among the errors: Istio judges the
    // object alone.
    assert!(!message.contains("\"v3\""), "{message:?}");
    let events = cluster.invalid_config_events().await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(events[0]["involvedObject"]["kind"], "VirtualService");
    assert_eq!(events[0]["involvedObject"]["name"], "reviews");
    assert!(
        events[0]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.http[0].route[1].weight"),
        "{events:?}"
    );
    // The plain listing names it too (the test server prints NAME/AGE only).
    let listing = cluster.kubectl(&["get", "events"]).await;
    let event_name = events[0]["metadata"]["name"].as_str().unwrap();
    assert!(listing.contains(event_name), "{listing}");
    assert_eq!(
        served(&follower),
        Some(Some(vec![80, 20])),
        "previous routing lost"
    );
    let snapshot: Value = serde_json::from_str(
        &controllers[first]
            .get("/debug/snapshot")
            .expect("snapshot page"),
    )
    .unwrap();
    assert!(
        snapshot["kept_previous"]
            .to_string()
            .contains("VirtualService default/reviews"),
        "{snapshot}"
    );
    let leader_metrics = controllers[first].metrics();
    assert!(
        metric(
            &leader_metrics,
            "pilotfish_invalid_configs{kind=\"VirtualService\"}"
        ) >= 1.0,
        "{leader_metrics}"
    );
    assert!(
        metric(
            &leader_metrics,
            "pilot_k8s_cfg_events{event=\"update\",type=\"VirtualService\"}"
        ) >= 1.0
    );

    // --- how long from `kubectl apply` to the new snapshot in Redis ---
    let mut publish_samples = Vec::new();
    for (file, weights) in [
        ("reviews-50-50.yaml", [50, 50]),
        ("reviews-80-20.yaml", [80, 20]),
        ("reviews-50-50.yaml", [50, 50]),
        ("reviews-80-20.yaml", [80, 20]),
        ("reviews-50-50.yaml", [50, 50]),
    ] {
        cluster.apply(file).await;
        let applied = Instant::now();
        eventually("the applied split in Redis", || {
            (served(&follower)?? == weights).then_some(())
        })
        .await;
        publish_samples.push(applied.elapsed());
    }
    publish_samples.sort();
    println!(
        "MEASURED kubectl apply -> snapshot published and read back from Redis (debounce 100ms): median {:?}, max {:?}",
        publish_samples[publish_samples.len() / 2],
        publish_samples[publish_samples.len() - 1]
    );
    cluster.apply("reviews-80-20.yaml").await;
    eventually("80/20 again", || {
        (served(&follower)?? == [80, 20]).then_some(())
    })
    .await;

    // --- SIGKILL of the leader; a change lands while nobody leads ---
    let standby = 1 - first;
    let old_epoch = controllers[first].epoch().expect("leader epoch");
    let killed = Instant::now();
    controllers[first].kill();
    cluster.apply("reviews-50-50.yaml").await;
    eventually("the standby to lead", || {
        controllers[standby].leads().then_some(())
    })
    .await;
    let handover = killed.elapsed();
    eventually("the change made meanwhile to be published", || {
        (served(&follower)?? == [50, 50]).then_some(())
    })
    .await;
    let kill_to_published = killed.elapsed();
    let new_epoch = controllers[standby].epoch().expect("new leader epoch");
    assert!(new_epoch > old_epoch);
    let latest = observer.latest().await.unwrap().expect("latest");
    assert_eq!(latest.epoch, new_epoch);
    println!(
        "MEASURED controller SIGKILL failover (lease 3s/2s/500ms): new leader after {handover:?}, change made meanwhile published after {kill_to_published:?}"
    );
    cluster.wait_reconciled("True").await;
    controllers[first].start();
    eventually("the restarted controller ready as a standby", || {
        (controllers[first].ready() && !controllers[first].leads()).then_some(())
    })
    .await;

    // --- fencing: the leader is stopped until the standby leads, then resumed ---
    let stopped = standby;
    let taker = first;
    let fenced_epoch = controllers[stopped].epoch().expect("epoch");
    let published_before = metric(
        &controllers[stopped].metrics(),
        "pilotfish_snapshot_publishes_total{outcome=\"published\"}",
    );
    controllers[stopped].signal("STOP");
    let stopped_at = Instant::now();
    eventually("the other controller to lead", || {
        controllers[taker].leads().then_some(())
    })
    .await;
    let fence_handover = stopped_at.elapsed();
    let taker_epoch = eventually("the new leader's epoch", || controllers[taker].epoch()).await;
    assert!(taker_epoch > fenced_epoch);
    cluster.apply("reviews-0-100.yaml").await;
    eventually("the new leader's publish", || {
        (served(&follower)?? == [0, 100]).then_some(())
    })
    .await;
    let before_resume = observer.latest().await.unwrap().expect("latest");
    assert_eq!(before_resume.epoch, taker_epoch);
    controllers[stopped].signal("CONT");
    eventually("the resumed controller to step down", || {
        let page = controllers[stopped].leader_page()?;
        (page["leader"] == false).then_some(())
    })
    .await;
    // A change after the resume: only the new leader may publish it.
    cluster.apply("reviews-80-20.yaml").await;
    eventually("the next change", || {
        (served(&follower)?? == [80, 20]).then_some(())
    })
    .await;
    let after = observer.latest().await.unwrap().expect("latest");
    assert_eq!(
        after.epoch, taker_epoch,
        "the resumed controller moved `latest`"
    );
    assert!(after.version > before_resume.version);
    let resumed = controllers[stopped].metrics();
    assert_eq!(
        metric(
            &resumed,
            "pilotfish_snapshot_publishes_total{outcome=\"published\"}"
        ),
        published_before,
        "the resumed controller published"
    );
    assert_eq!(metric(&resumed, "pilotfish_leader"), 0.0);
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let epoch_counter: u64 = redis::AsyncCommands::get(&mut conn, "pilotfish:epoch")
        .await
        .unwrap();
    assert_eq!(
        epoch_counter, taker_epoch,
        "the resumed controller took an epoch"
    );
    println!(
        "MEASURED controller SIGSTOP takeover (lease 3s/2s/500ms): new leader after {fence_handover:?}"
    );

    // --- restarts never publish a partial mesh ---
    let mut updates = follower.subscribe();
    let recorder = tokio::spawn(async move {
        let mut seen = Vec::new();
        while updates.changed().await.is_ok() {
            if let Some(f) = updates.borrow_and_update().clone() {
                seen.push((
                    f.reference.version,
                    reviews_weights(&f.value),
                    f.value.services().len(),
                ));
            }
        }
        seen
    });
    let leader = taker;
    controllers[leader].terminate();
    eventually("the other controller to lead after the release", || {
        controllers[stopped].leads().then_some(())
    })
    .await;
    controllers[leader].start();
    eventually("the restarted controller ready", || {
        controllers[leader].ready().then_some(())
    })
    .await;
    controllers[stopped].kill();
    controllers[stopped].start();
    eventually("a leader after both restarts", || {
        (controllers[leader].leads() || controllers[stopped].leads()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // --- deletion: the route goes, the service stays ---
    cluster
        .kubectl(&["delete", "-f", &fixture("mesh/reviews-80-20.yaml")])
        .await;
    eventually("the route to be gone", || {
        (served(&follower)?.is_none()).then_some(())
    })
    .await;
    assert_eq!(follower.current().unwrap().value.services().len(), 1);
    drop(follower);
    drop(_follow_task);
    let seen = tokio::time::timeout(WAIT, recorder)
        .await
        .expect("recorder")
        .unwrap();
    let (with_route, without): (Vec<_>, Vec<_>) = seen.iter().partition(|(_, w, _)| w.is_some());
    for (version, w, services) in &with_route {
        assert_eq!(
            (*services, w.as_deref()),
            (1, Some(&[80, 20][..])),
            "v{version}"
        );
    }
    assert!(without.iter().all(|(_, _, s)| *s == 1), "{seen:?}");
    assert!(
        seen.iter()
            .position(|(_, w, _)| w.is_none())
            .is_none_or(|i| seen[i..].iter().all(|(_, w, _)| w.is_none())),
        "a snapshot without the route was published before the deletion: {seen:?}"
    );
    for c in controllers.iter_mut() {
        c.assert_running();
    }
}

/// Runs `count` RPCs on a blocking thread (the client is a child process driven over
/// pipes) and gives the client back.
async fn rpcs(client: XdsClient, count: u32) -> (XdsClient, RpcTally) {
    tokio::task::spawn_blocking(move || {
        let mut client = client;
        let tally = client.rpcs(REVIEWS, count, &[]).expect("RPCs");
        (client, tally)
    })
    .await
    .unwrap()
}

/// Batches of 100 RPCs until `done` holds for a batch; returns the client and how long
/// it took (for measurements; bounded by [`WAIT`]).
async fn until_split(
    client: XdsClient,
    done: impl Fn(&RpcTally) -> bool + Send + 'static,
) -> (XdsClient, Duration) {
    tokio::task::spawn_blocking(move || {
        let mut client = client;
        let started = Instant::now();
        loop {
            let tally = client.rpcs(REVIEWS, 100, &[]).expect("RPCs");
            if done(&tally) {
                return (client, started.elapsed());
            }
            assert!(
                started.elapsed() < WAIT,
                "the split never changed: last {tally:?}"
            );
        }
    })
    .await
    .unwrap()
}

fn assert_split(tally: &RpcTally, v1: f64, v2: f64, tolerance: f64) {
    assert!(tally.errors.is_empty(), "failed RPCs: {tally:?}");
    let (p1, p2) = (tally.percent("reviews-v1"), tally.percent("reviews-v2"));
    assert!(
        (p1 - v1).abs() <= tolerance && (p2 - v2).abs() <= tolerance,
        "expected {v1}/{v2} ±{tolerance}%, got {p1:.1}/{p2:.1} over {} RPCs",
        tally.total()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_clients_follow_kubectl_through_two_controllers_and_two_xds_replicas() {
    let cluster = Cluster::start().await;
    let redis = RedisServer::start().expect("redis-server");
    let (v1_port, v2_port) = (free_port(), free_port());
    let _backends = GrpcBackends::start(&[("reviews-v1", v1_port), ("reviews-v2", v2_port)])
        .expect("gRPC backends");
    let mut a = Controller::new("controller-a", &redis.url(), &cluster);
    let mut b = Controller::new("controller-b", &redis.url(), &cluster);
    a.start();
    b.start();
    cluster.install_reviews(v1_port, v2_port).await;
    // Each replica is ready once it serves a snapshot, i.e. after the first publish.
    let xds_url = redis.url();
    let (mut xds1, mut xds2) = tokio::task::spawn_blocking(move || {
        (
            XdsServer::following("xds-1", &xds_url, &[]).expect("xds-1 ready"),
            XdsServer::following("xds-2", &xds_url, &[]).expect("xds-2 ready"),
        )
    })
    .await
    .unwrap();
    let node = "sidecar~127.0.0.1~client.default~default.svc.cluster.local";
    let client1 =
        XdsClient::start(&bootstrap(&xds1.xds.to_string(), node, "default")).expect("xDS client 1");
    let client2 =
        XdsClient::start(&bootstrap(&xds2.xds.to_string(), node, "default")).expect("xDS client 2");

    // --- 80/20 through either replica ---
    let (client1, tally) = rpcs(client1, 2000).await;
    assert_split(&tally, 80.0, 20.0, 5.0);
    let (client2, tally) = rpcs(client2, 2000).await;
    assert_split(&tally, 80.0, 20.0, 5.0);
    drop(client2);
    let (code, syncz) = http_get(xds1.admin, "/debug/syncz").expect("/debug/syncz");
    assert_eq!(code, 200, "{syncz}");

    // --- 50/50: time from `kubectl apply` to the new split ---
    let mut samples = Vec::new();
    let mut client = client1;
    for (file, v2_share) in [
        ("reviews-50-50.yaml", 50.0),
        ("reviews-80-20.yaml", 20.0),
        ("reviews-50-50.yaml", 50.0),
        ("reviews-80-20.yaml", 20.0),
        ("reviews-50-50.yaml", 50.0),
    ] {
        cluster.apply(file).await;
        let applied = Instant::now();
        // A batch of 100 clearly past the midpoint between the old and new share.
        let (c, _) = until_split(client, move |t| {
            let p2 = t.percent("reviews-v2");
            if v2_share > 35.0 {
                p2 >= 35.0
            } else {
                p2 <= 35.0
            }
        })
        .await;
        samples.push(applied.elapsed());
        client = c;
    }
    samples.sort();
    println!(
        "MEASURED kubectl apply -> new split seen by the gRPC client (batches of 100 RPCs): median {:?}, max {:?}, all {samples:?}",
        samples[samples.len() / 2],
        samples[samples.len() - 1]
    );
    let (c, tally) = rpcs(client, 2000).await;
    client = c;
    assert_split(&tally, 50.0, 50.0, 5.0);

    // --- invalid: marked, the 50/50 routing holds ---
    cluster.apply("reviews-invalid.yaml").await;
    cluster.wait_reconciled("False").await;
    let events = cluster.invalid_config_events().await;
    assert!(!events.is_empty());
    let (c, tally) = rpcs(client, 1000).await;
    client = c;
    assert_split(&tally, 50.0, 50.0, 6.0);

    // --- SIGKILL of the leader; the change made meanwhile reaches the client ---
    let mut controllers = [&mut a, &mut b];
    let leader = leader_of(&[&*controllers[0], &*controllers[1]]).await;
    let killed = Instant::now();
    controllers[leader].kill();
    cluster.apply("reviews-0-100.yaml").await;
    let (c, _) = until_split(client, |t| t.percent("reviews-v2") == 100.0).await;
    client = c;
    println!(
        "MEASURED leader SIGKILL -> change made meanwhile served to the client: {:?}",
        killed.elapsed()
    );
    controllers[leader].start();

    // --- restarts with traffic flowing: no failed RPC, no lost route ---
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || {
            let mut client = client;
            let mut total = RpcTally::default();
            while !stop.load(Ordering::Relaxed) {
                let t = client.rpcs(REVIEWS, 50, &[]).expect("RPCs");
                for (k, v) in t.counts {
                    *total.counts.entry(k).or_default() += v;
                }
                for (k, v) in t.errors {
                    *total.errors.entry(k).or_default() += v;
                }
                total.details.extend(t.details);
            }
            (client, total)
        })
    };
    eventually("the restarted controller ready", || {
        controllers[leader].ready().then_some(())
    })
    .await;
    let current = leader_of(&[&*controllers[0], &*controllers[1]]).await;
    controllers[current].terminate();
    controllers[current].start();
    let other = 1 - current;
    eventually("both ready", || {
        (controllers[0].ready() && controllers[1].ready()).then_some(())
    })
    .await;
    controllers[other].kill();
    controllers[other].start();
    eventually("a leader again", || {
        (controllers[0].leads() || controllers[1].leads()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let (client, total) = traffic.await.unwrap();
    assert!(total.total() > 0);
    assert_split(&total, 0.0, 100.0, 0.0);

    // --- deleting the VirtualService returns to default routing (both versions) ---
    cluster
        .kubectl(&["delete", "-f", &fixture("mesh/reviews-0-100.yaml")])
        .await;
    let (client, _) = until_split(client, |t| t.percent("reviews-v1") > 0.0).await;
    let (_client, tally) = rpcs(client, 1000).await;
    assert!(tally.errors.is_empty(), "{tally:?}");
    assert!(
        tally.percent("reviews-v1") > 20.0 && tally.percent("reviews-v2") > 20.0,
        "default routing should reach both versions: {tally:?}"
    );
    for c in controllers.iter_mut() {
        c.assert_running();
    }
    assert!(
        xds1.process.try_wait().is_none() && xds2.process.try_wait().is_none(),
        "an xDS replica exited"
    );
    for replica in [&xds1, &xds2] {
        assert_eq!(replica.nacks().unwrap(), vec![], "a client NACKed");
    }
}

/// A leader that receives SIGTERM releases its Lease, and the standby, which watches the
/// Lease rather than polling it, takes over at once — not after the Lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_the_lease_over_without_waiting_for_it_to_expire() {
    // A long Lease: a standby that waited for expiry would need 30 s or more.
    const LONG_LEASE: [&str; 6] = [
        "--lease-duration",
        "30s",
        "--renew-deadline",
        "20s",
        "--retry-period",
        "1s",
    ];
    let cluster = Cluster::start().await;
    let redis = RedisServer::start().expect("redis-server");
    let config = RedisConfig::new(&redis.url()).unwrap();
    let (follower, _follow_task) = follow(config, decode).expect("follow Redis");
    let mut a =
        Controller::new("controller-a", &redis.url(), &cluster).with_lease_flags(&LONG_LEASE);
    let mut b =
        Controller::new("controller-b", &redis.url(), &cluster).with_lease_flags(&LONG_LEASE);
    a.start();
    b.start();
    cluster.install_reviews(10001, 10002).await;
    eventually("both controllers ready", || {
        (a.ready() && b.ready()).then_some(())
    })
    .await;
    eventually("the 80/20 route in Redis", || {
        (served(&follower)?? == [80, 20]).then_some(())
    })
    .await;
    let leader = leader_of(&[&a, &b]).await;
    let (old, new) = if leader == 0 {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let epoch_before = old.epoch();

    let sent = Instant::now();
    old.signal("TERM");
    eventually("the standby to lead", || new.leads().then_some(())).await;
    let handover = sent.elapsed();
    old.terminate_wait();
    println!("SIGTERM of the leader → the standby leads after {handover:?} (Lease duration 30 s)");
    assert!(
        handover < Duration::from_secs(15),
        "the standby took {handover:?}: the Lease was not released on SIGTERM"
    );
    assert!(
        new.epoch() > epoch_before,
        "the new leader fences the old one with a newer epoch"
    );
    // The new leader publishes: a change applied now reaches Redis.
    cluster.apply("reviews-50-50.yaml").await;
    eventually("the 50/50 route in Redis", || {
        (served(&follower)?? == [50, 50]).then_some(())
    })
    .await;
}
