//! Lease election against the test API server (kube-rs watcher, create/replace with
//! resourceVersion preconditions): one leader among racing candidates, takeover after a
//! leader dies without releasing, and release on shutdown.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use pilotfish_controller::k8s::lease::{self, Leadership, LeaseConfig, LeaseTimings};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::k8s_support::*;

struct Candidate {
    identity: String,
    leadership: watch::Receiver<Leadership>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), lease::LeaseError>>,
}

impl Candidate {
    fn start(cluster: &Cluster, identity: &str, timings: LeaseTimings) -> Candidate {
        let (tx, leadership) = watch::channel(Leadership::standby(identity));
        let shutdown = CancellationToken::new();
        let api: Api<Lease> = Api::namespaced(cluster.client(), "default");
        let config = LeaseConfig {
            name: "election".into(),
            namespace: "default".into(),
            identity: identity.into(),
            timings,
        };
        let task = tokio::spawn(lease::run(api, config, tx, shutdown.clone()));
        Candidate {
            identity: identity.into(),
            leadership,
            shutdown,
            task,
        }
    }

    fn leads(&self) -> bool {
        self.leadership.borrow().holds(Instant::now())
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn holder(cluster: &Cluster) -> (Option<String>, i32) {
    let api: Api<Lease> = Api::namespaced(cluster.client(), "default");
    let spec = api
        .get_opt("election")
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .unwrap_or_default();
    (
        spec.holder_identity.filter(|h| !h.is_empty()),
        spec.lease_transitions.unwrap_or(0),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_candidates_elect_exactly_one_leader() {
    let cluster = Cluster::start().await;
    let candidates: Vec<Candidate> = ["a", "b", "c"]
        .iter()
        .map(|id| Candidate::start(&cluster, id, fast_timings()))
        .collect();
    let leader = eventually("a leader", || async {
        candidates
            .iter()
            .find(|c| c.leads())
            .map(|c| c.identity.clone())
    })
    .await;
    // Over several renewals, nobody else ever claims it and the Lease names the leader.
    for _ in 0..20 {
        let leading: Vec<&str> = candidates
            .iter()
            .filter(|c| c.leads())
            .map(|c| c.identity.as_str())
            .collect();
        assert_eq!(leading, vec![leader.as_str()]);
        assert_eq!(holder(&cluster).await.0.as_deref(), Some(leader.as_str()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for c in &candidates {
        assert!(!c.task.is_finished(), "{} ended", c.identity);
        if c.identity != leader {
            assert_eq!(
                c.leadership.borrow().holder.as_deref(),
                Some(leader.as_str()),
                "a standby watches the Lease and knows the holder"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_when_the_leader_dies_without_releasing() {
    let cluster = Cluster::start().await;
    let a = Candidate::start(&cluster, "a", fast_timings());
    eventually("a to lead", || async { a.leads().then_some(()) }).await;
    let b = Candidate::start(&cluster, "b", fast_timings());
    eventually("b to see a as holder", || async {
        (b.leadership.borrow().holder.as_deref() == Some("a")).then_some(())
    })
    .await;
    assert!(!b.leads());
    let (_, transitions_before) = holder(&cluster).await;
    let killed = Instant::now();
    drop(a); // aborts the task: no release, the Lease must expire
    eventually("b to lead", || async { b.leads().then_some(()) }).await;
    let handover = killed.elapsed();
    let (now_holder, transitions) = holder(&cluster).await;
    assert_eq!(now_holder.as_deref(), Some("b"));
    assert_eq!(transitions, transitions_before + 1);
    assert_eq!(b.leadership.borrow().term, 1);
    eprintln!("handover after an unreleased Lease (2 s duration): {handover:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_shutdown_hands_over_before_the_lease_would_expire() {
    let cluster = Cluster::start().await;
    // A long Lease: only a release lets b take over within the wait below.
    let timings = LeaseTimings {
        lease_duration: Duration::from_secs(600),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_millis(300),
    };
    let a = Candidate::start(&cluster, "a", timings);
    eventually("a to lead", || async { a.leads().then_some(()) }).await;
    let b = Candidate::start(&cluster, "b", timings);
    eventually("b to see a as holder", || async {
        (b.leadership.borrow().holder.as_deref() == Some("a")).then_some(())
    })
    .await;
    a.shutdown.cancel();
    eventually("a to step down", || async {
        (!a.leadership.borrow().leader).then_some(())
    })
    .await;
    eventually("b to lead after the release", || async {
        b.leads().then_some(())
    })
    .await;
    assert_eq!(holder(&cluster).await.0.as_deref(), Some("b"));
}
