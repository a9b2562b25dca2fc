//! The delta (incremental) ADS state machine of one stream ([`DeltaStream`]): synchronous
//! and free of I/O, like [`super::sotw::SotwStream`], and like it computing a type's
//! response only when the stream can send it ([`DeltaStream::next_response`]).
//!
//! It tracks, per type, what the client holds: seeded from `initial_resource_versions` on
//! reconnect, and after every response exactly the view it was brought to — a view shared
//! with every stream of the same scope and subscription, not a per-stream map. Responses
//! carry only resources whose version differs from what the client holds, and
//! `removed_resources` for held resources that were deleted or unsubscribed, and for
//! subscribed names that do not exist (once). Because versions are content hashes, a
//! client that reconnects to another replica is sent nothing it already has.
//!
//! Subscription changes are applied even from a request with a stale nonce (they are
//! incremental: dropping one would lose it for good); only the ACK/NACK part of a stale
//! request is ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use pilotfish_mesh::model::Proxy;

use super::names::NameSets;
use super::resource::{ChangeKind, Resource};
use super::state::{AckStatus, Held, NackStatus, Reply, TypeStatus, owe};
use super::state::{
    Limit, MAX_SUBSCRIBED_NAMES, NonceSource, ProtocolEvent, SentRecord, TypeRecord,
};
use super::state::{name_bytes_left, served_type};
use super::types::XdsType;
use super::view::{ServedSnapshot, View};
use super::wire::{DeltaResources, DeltaResponse};

#[derive(Debug, Default)]
struct DeltaType {
    record: TypeRecord,
    /// Name → version of every resource the client holds, as far as the server knows.
    holds: Held,
    /// Subscribed names already reported as non-existent, so they are reported once.
    announced_absent: BTreeSet<String>,
    owed: Option<Reply>,
}

/// State of one delta ADS stream.
pub struct DeltaStream {
    proxy: Arc<Proxy>,
    snapshot: Arc<ServedSnapshot>,
    names: Arc<NameSets>,
    nonces: NonceSource,
    types: [DeltaType; 4],
    unknown_types: BTreeSet<String>,
    /// What the client held of the clusters before the cluster responses sent since the
    /// last endpoints response (`None`: none sent since). Clusters those responses made
    /// new or changed are warming: Envoy only finishes warming such a cluster on a fresh
    /// ClusterLoadAssignment, even an unchanged one, and in delta it does not ask again,
    /// so the next endpoints response (pushed right after CDS, or answering a later EDS
    /// subscription such as the one after a reconnect) carries them whatever the client
    /// holds.
    warm_base: Option<Held>,
}

impl DeltaStream {
    pub fn new(proxy: Arc<Proxy>, snapshot: Arc<ServedSnapshot>, names: Arc<NameSets>) -> Self {
        DeltaStream {
            proxy,
            snapshot,
            names,
            nonces: NonceSource::default(),
            types: Default::default(),
            unknown_types: BTreeSet::new(),
            warm_base: None,
        }
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    pub fn snapshot_version(&self) -> u64 {
        self.snapshot.version()
    }

    /// Handles one client request: records ACK/NACK, what a reconnecting client holds
    /// and the subscription, and marks the type as owing a response when the request
    /// changes what the client should hold.
    pub fn on_request(
        &mut self,
        request: &DeltaDiscoveryRequest,
        now: SystemTime,
    ) -> Vec<ProtocolEvent> {
        let mut events = Vec::new();
        let Some(xds_type) = served_type(&request.type_url, &mut self.unknown_types, &mut events)
        else {
            return events;
        };
        let names = self.names.clone();
        let bytes_left = name_bytes_left(
            xds_type,
            XdsType::ALL
                .iter()
                .map(|t| (*t, &self.types[t.index()].record)),
        );
        let state = &mut self.types[xds_type.index()];
        let nonce = request.response_nonce.as_str();
        if state.record.is_stale(nonce) {
            events.push(ProtocolEvent::StaleNonce {
                xds_type,
                nonce: nonce.to_string(),
            });
        } else if let (false, Some(sent)) = (nonce.is_empty(), state.record.last_sent.as_ref()) {
            match &request.error_detail {
                // What the client holds is left as sent: the rejected versions are never
                // sent again, only newer content is.
                Some(error) => {
                    state.record.last_nack = Some(Box::new(NackStatus {
                        version: state
                            .record
                            .last_ack
                            .as_ref()
                            .map(|a| a.version.clone())
                            .unwrap_or_default(),
                        nonce: nonce.to_string(),
                        detail: error.message.clone(),
                        at: now,
                    }));
                    events.push(ProtocolEvent::Nack {
                        xds_type,
                        nonce: nonce.to_string(),
                        detail: error.message.clone(),
                    });
                }
                None => {
                    state.record.last_ack = Some(AckStatus {
                        version: sent.version.to_string(),
                        nonce: nonce.to_string(),
                        at: now,
                    });
                    events.push(ProtocolEvent::Ack {
                        xds_type,
                        nonce: nonce.to_string(),
                    });
                }
            }
        }
        let first_request = !state.record.requested;
        state.record.requested = true;
        if first_request && request.initial_resource_versions.len() > MAX_SUBSCRIBED_NAMES {
            events.push(ProtocolEvent::OverLimit {
                limit: Limit::SubscribedNames,
                reason: format!(
                    "{} initial resource versions for {xds_type} (at most {MAX_SUBSCRIBED_NAMES} per type)",
                    request.initial_resource_versions.len()
                ),
            });
            return events;
        }
        if first_request && !request.initial_resource_versions.is_empty() {
            let held: BTreeMap<String, String> = request
                .initial_resource_versions
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect();
            state.holds = Held::Versions(Arc::new(held));
        }
        let (unsubscribed, changed) = match state.record.subscription.apply_delta(
            xds_type,
            first_request,
            &request.resource_names_subscribe,
            &request.resource_names_unsubscribe,
            &names,
            bytes_left,
        ) {
            Ok(applied) => applied,
            Err(reason) => {
                events.push(ProtocolEvent::OverLimit {
                    limit: Limit::SubscribedNames,
                    reason,
                });
                return events;
            }
        };
        for name in &unsubscribed {
            state.announced_absent.remove(name);
        }
        if first_request && state.record.subscription.wildcard {
            // The first wildcard request is answered even when there is nothing to send.
            owe(&mut state.owed, Reply::Always);
        } else if first_request || changed {
            owe(&mut state.owed, Reply::IfChanged);
        }
        events
    }

    /// Moves the stream to a newer snapshot: every requested type (only EDS after an
    /// endpoints-only change) owes what changed.
    pub fn on_snapshot(&mut self, snapshot: Arc<ServedSnapshot>) {
        let previous = self.snapshot.version();
        if snapshot.version() == previous {
            return;
        }
        let kind = snapshot.change_since(previous);
        self.snapshot = snapshot;
        for xds_type in XdsType::ALL {
            let state = &mut self.types[xds_type.index()];
            if state.record.requested && (kind == ChangeKind::Full || xds_type == XdsType::Endpoint)
            {
                owe(&mut state.owed, Reply::IfChanged);
            }
        }
    }

    /// Whether some type owes a response (which may still turn out empty).
    pub fn has_owed(&self) -> bool {
        self.types.iter().any(|t| t.owed.is_some())
    }

    /// The next response to send, in make-before-break order, computed now from the
    /// newest snapshot; `None` when nothing is owed or nothing differs from what the
    /// client holds. What it returns is recorded as sent.
    pub fn next_response(&mut self, now: SystemTime) -> Option<DeltaResponse> {
        for xds_type in XdsType::ALL {
            let Some(reply) = self.types[xds_type.index()].owed.take() else {
                continue;
            };
            let desired = self.compute(xds_type);
            let (resources, removed) = self.diff(xds_type, &desired);
            let state = &mut self.types[xds_type.index()];
            if resources.is_empty() && removed.is_empty() && reply != Reply::Always {
                // The client holds exactly this: keep the current snapshot's copy.
                state.holds = Held::View(desired);
                continue;
            }
            for name in &removed {
                if state.record.subscription.names.contains(name) {
                    state.announced_absent.insert(name.clone());
                }
            }
            for resource in &resources {
                state.announced_absent.remove(&resource.name);
            }
            let previous = std::mem::replace(&mut state.holds, Held::View(desired.clone()));
            let nonce = self.nonces.next_nonce();
            let resources = if resources.len() == desired.len() {
                DeltaResources::All(desired.clone())
            } else {
                DeltaResources::Some(resources)
            };
            state.record.last_sent = Some(SentRecord {
                version: desired.version().clone(),
                nonce: nonce.clone(),
                at: now,
                view: None,
                resource_count: resources.len(),
                removed_count: removed.len(),
            });
            match xds_type {
                XdsType::Cluster => {
                    if self.warm_base.is_none() {
                        self.warm_base = Some(previous);
                    }
                    let endpoints = &mut self.types[XdsType::Endpoint.index()];
                    if endpoints.record.requested {
                        owe(&mut endpoints.owed, Reply::IfChanged);
                    }
                }
                XdsType::Endpoint => self.warm_base = None,
                _ => {}
            }
            return Some(DeltaResponse {
                xds_type,
                system_version: desired.version().clone(),
                resources,
                removed,
                nonce,
            });
        }
        None
    }

    pub fn status(&self) -> (Vec<TypeStatus>, Vec<String>) {
        let types = XdsType::ALL
            .iter()
            .map(|t| (*t, &self.types[t.index()]))
            .filter(|(_, s)| s.record.requested)
            .map(|(t, s)| s.record.status(t, s.holds.len()))
            .collect();
        (types, self.unknown_types.iter().cloned().collect())
    }

    fn compute(&self, xds_type: XdsType) -> Arc<View> {
        let subscription = &self.types[xds_type.index()].record.subscription;
        if subscription.is_empty() {
            return Arc::new(View::empty(xds_type));
        }
        self.snapshot
            .view(&self.proxy, xds_type, subscription.query())
    }

    /// Resources to send (changed for the client, or endpoints of a warming cluster) and
    /// names to remove.
    fn diff(&self, xds_type: XdsType, desired: &View) -> (Vec<Arc<Resource>>, Vec<String>) {
        let state = &self.types[xds_type.index()];
        let warming: BTreeSet<&str> = match (xds_type, &self.warm_base) {
            (XdsType::Endpoint, Some(base)) => match &self.types[XdsType::Cluster.index()].holds {
                Held::View(clusters) => base.changed_in(clusters).into_iter().collect(),
                _ => BTreeSet::new(),
            },
            _ => BTreeSet::new(),
        };
        let subscription = &state.record.subscription;
        // A named view is cut from the subscribed names: it has them all if it is as long.
        let every_name_exists = if subscription.wildcard {
            subscription.names.iter().all(|n| desired.get(n).is_some())
        } else {
            desired.len() == subscription.names.len()
        };
        if warming.is_empty() && state.holds.is(desired) && every_name_exists {
            return (Vec::new(), Vec::new());
        }
        let mut changed: Vec<&Arc<Resource>> = Vec::new();
        // Held but no longer wanted: deleted, or unsubscribed.
        let mut removed: Vec<String> = Vec::new();
        state.holds.walk(
            desired,
            |r| changed.push(r),
            |n| removed.push(n.to_string()),
        );
        let resources = if warming.is_empty() {
            changed.into_iter().cloned().collect()
        } else {
            let mut changed = changed.into_iter().peekable();
            desired
                .resources()
                .iter()
                .filter(|r| {
                    let is_changed = changed.next_if(|c| Arc::ptr_eq(c, r)).is_some();
                    is_changed || warming.contains(r.name.as_str())
                })
                .cloned()
                .collect()
        };
        // Subscribed but absent: say so once, so the client stops waiting for it.
        if !every_name_exists {
            let mut absent: Vec<String> = subscription
                .names
                .iter()
                .filter(|n| {
                    desired.get(n).is_none()
                        && state.holds.version_of(n).is_none()
                        && !state.announced_absent.contains(*n)
                })
                .cloned()
                .collect();
            removed.append(&mut absent);
            removed.sort();
            removed.dedup();
        }
        (resources, removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::map_snapshot::MapSnapshot;
    use crate::ads::resource::XdsSnapshot;
    use crate::ads::types::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};
    use crate::ads::wire::decode;
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse;
    use envoy_types::pb::google::rpc::Status;

    const T0: SystemTime = SystemTime::UNIX_EPOCH;

    /// What one input led to: the events, and every response the stream then sends
    /// (as the client decodes them) when the transport takes all it can.
    #[derive(Debug)]
    struct Output {
        responses: Vec<DeltaDiscoveryResponse>,
        events: Vec<ProtocolEvent>,
    }

    fn drain(s: &mut DeltaStream) -> Vec<DeltaDiscoveryResponse> {
        std::iter::from_fn(|| s.next_response(T0))
            .map(|r| decode::delta(&r))
            .collect()
    }

    fn handle(s: &mut DeltaStream, r: &DeltaDiscoveryRequest, now: SystemTime) -> Output {
        let events = s.on_request(r, now);
        Output {
            responses: drain(s),
            events,
        }
    }

    fn push(s: &mut DeltaStream, snapshot: Arc<dyn XdsSnapshot>, _now: SystemTime) -> Output {
        s.on_snapshot(ServedSnapshot::new(snapshot));
        Output {
            responses: drain(s),
            events: Vec::new(),
        }
    }

    fn with(snapshot: Arc<dyn XdsSnapshot>) -> DeltaStream {
        DeltaStream::new(
            Arc::new(Proxy::with_defaults("p")),
            ServedSnapshot::new(snapshot),
            NameSets::new(),
        )
    }

    fn stream(snapshot: MapSnapshot) -> DeltaStream {
        with(snapshot.shared())
    }

    fn req(type_url: &str, sub: &[&str], unsub: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.into(),
            resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn sent(r: &DeltaDiscoveryResponse) -> Vec<&str> {
        r.resources.iter().map(|x| x.name.as_str()).collect()
    }

    fn one(out: Output) -> DeltaDiscoveryResponse {
        assert_eq!(out.responses.len(), 1, "{:?}", out.responses);
        out.responses.into_iter().next().unwrap_or_default()
    }

    #[test]
    fn first_wildcard_request_is_answered_even_when_empty() {
        let mut s = stream(MapSnapshot::new(1));
        let r = one(handle(&mut s, &req(CLUSTER_TYPE, &[], &[], ""), T0));
        assert!(r.resources.is_empty() && r.removed_resources.is_empty());
        assert_eq!(
            r.control_plane.map(|c| c.identifier).as_deref(),
            Some("replica-a")
        );
    }

    #[test]
    fn initial_resource_versions_are_honoured() {
        let snap = MapSnapshot::sample(1);
        let mut first = stream(snap.clone());
        let r = one(handle(&mut first, &req(CLUSTER_TYPE, &["*"], &[], ""), T0));
        let held: std::collections::HashMap<String, String> = r
            .resources
            .iter()
            .map(|x| (x.name.clone(), x.version.clone()))
            .collect();
        // Reconnect (to another replica: another stream) with what it holds, one of them stale.
        let mut again = stream(snap.with(CLUSTER_TYPE, "c2", b"c2'"));
        let mut request = req(CLUSTER_TYPE, &["*"], &[], "");
        request.initial_resource_versions = held;
        request
            .initial_resource_versions
            .insert("gone".into(), "v".into());
        let r = one(handle(&mut again, &request, T0));
        assert_eq!(sent(&r), ["c2"]);
        assert_eq!(r.removed_resources, ["gone"]);
    }

    #[test]
    fn reconnect_with_everything_current_gets_nothing_but_the_wildcard_answer() {
        let mut a = stream(MapSnapshot::sample(1));
        let r = one(handle(&mut a, &req(LISTENER_TYPE, &["*"], &[], ""), T0));
        let mut b = stream(MapSnapshot::sample(1).next(7));
        let mut request = req(LISTENER_TYPE, &["*"], &[], "");
        request.initial_resource_versions = r
            .resources
            .iter()
            .map(|x| (x.name.clone(), x.version.clone()))
            .collect();
        let r = one(handle(&mut b, &request, T0));
        assert!(r.resources.is_empty() && r.removed_resources.is_empty());
        // Named (non-wildcard) resubscription with current versions: no response at all.
        let mut c = stream(MapSnapshot::sample(1));
        let mut request = req(ROUTE_TYPE, &["r1"], &[], "");
        let held = one(handle(
            &mut stream(MapSnapshot::sample(1)),
            &req(ROUTE_TYPE, &["r1"], &[], ""),
            T0,
        ));
        request.initial_resource_versions = held
            .resources
            .iter()
            .map(|x| (x.name.clone(), x.version.clone()))
            .collect();
        assert!(handle(&mut c, &request, T0).responses.is_empty());
    }

    #[test]
    fn only_changed_resources_are_sent_and_deletions_removed() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = one(handle(&mut s, &req(CLUSTER_TYPE, &["*"], &[], ""), T0));
        assert_eq!(sent(&r), ["c1", "c2"]);
        handle(&mut s, &req(CLUSTER_TYPE, &[], &[], &r.nonce), T0);
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"c1'")
            .without(CLUSTER_TYPE, "c2")
            .next(2);
        let r = one(push(&mut s, next.shared(), T0));
        assert_eq!(sent(&r), ["c1"]);
        assert_eq!(r.removed_resources, ["c2"]);
        // Nothing new: nothing sent.
        let again = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"c1'")
            .without(CLUSTER_TYPE, "c2")
            .next(3);
        assert!(push(&mut s, again.shared(), T0).responses.is_empty());
    }

    #[test]
    fn unsubscribe_removes_and_resubscribe_resends() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = one(handle(&mut s, &req(ROUTE_TYPE, &["r1"], &[], ""), T0));
        assert_eq!(sent(&r), ["r1"]);
        let r = one(handle(
            &mut s,
            &req(ROUTE_TYPE, &["r2"], &["r1"], &r.nonce),
            T0,
        ));
        assert_eq!(sent(&r), ["r2"]);
        assert_eq!(r.removed_resources, ["r1"]);
        let r = one(handle(
            &mut s,
            &req(ROUTE_TYPE, &["r1"], &["r2"], &r.nonce),
            T0,
        ));
        assert_eq!(sent(&r), ["r1"], "R1 again after R1→R2→R1");
        assert_eq!(r.removed_resources, ["r2"]);
    }

    #[test]
    fn absent_names_are_announced_once_and_sent_when_they_appear() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = one(handle(
            &mut s,
            &req(ENDPOINT_TYPE, &["c1", "later"], &[], ""),
            T0,
        ));
        assert_eq!(sent(&r), ["c1"]);
        assert_eq!(r.removed_resources, ["later"]);
        assert!(
            push(&mut s, MapSnapshot::sample(1).next(2).shared(), T0)
                .responses
                .is_empty()
        );
        let r = one(push(
            &mut s,
            MapSnapshot::sample(1)
                .with(ENDPOINT_TYPE, "later", b"x")
                .next(3)
                .shared(),
            T0,
        ));
        assert_eq!(sent(&r), ["later"]);
        assert!(r.removed_resources.is_empty());
    }

    #[test]
    fn ack_is_never_answered_and_nack_never_resends() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = one(handle(&mut s, &req(CLUSTER_TYPE, &["*"], &[], ""), T0));
        let out = handle(&mut s, &req(CLUSTER_TYPE, &[], &[], &r.nonce), T0);
        assert!(out.responses.is_empty());
        assert!(matches!(out.events[0], ProtocolEvent::Ack { .. }));
        let bad = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"bad")
            .next(2);
        let r = one(push(&mut s, bad.clone().shared(), T0));
        let mut n = req(CLUSTER_TYPE, &[], &[], &r.nonce);
        n.error_detail = Some(Status {
            code: 3,
            message: "rejected c1".into(),
            details: vec![],
        });
        let out = handle(&mut s, &n, T0);
        assert!(out.responses.is_empty());
        assert!(
            matches!(&out.events[0], ProtocolEvent::Nack { detail, .. } if detail == "rejected c1")
        );
        assert!(
            push(&mut s, bad.next(3).shared(), T0).responses.is_empty(),
            "same content after NACK"
        );
        let fixed = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"good")
            .next(4);
        assert_eq!(sent(&one(push(&mut s, fixed.shared(), T0))), ["c1"]);
    }

    #[test]
    fn stale_nonce_ack_is_ignored_but_subscription_is_applied() {
        let mut s = stream(MapSnapshot::sample(1));
        let first = one(handle(&mut s, &req(ROUTE_TYPE, &["r1"], &[], ""), T0));
        let _second = one(push(
            &mut s,
            MapSnapshot::sample(1)
                .with(ROUTE_TYPE, "r1", b"r1'")
                .next(2)
                .shared(),
            T0,
        ));
        let out = handle(&mut s, &req(ROUTE_TYPE, &["r2"], &[], &first.nonce), T0);
        assert!(matches!(out.events[0], ProtocolEvent::StaleNonce { .. }));
        assert_eq!(sent(&out.responses[0]), ["r2"]);
        assert!(s.status().0[0].last_ack.is_none());
    }

    #[test]
    fn changed_cluster_is_followed_by_its_endpoints_even_unchanged() {
        let mut s = stream(MapSnapshot::sample(1));
        handle(&mut s, &req(CLUSTER_TYPE, &["*"], &[], ""), T0);
        handle(&mut s, &req(ENDPOINT_TYPE, &["c1", "c2"], &[], ""), T0);
        let out = push(
            &mut s,
            MapSnapshot::sample(1)
                .with(CLUSTER_TYPE, "c1", b"c1'")
                .next(2)
                .shared(),
            T0,
        );
        assert_eq!(out.responses.len(), 2);
        assert_eq!(out.responses[0].type_url, CLUSTER_TYPE);
        assert_eq!(out.responses[1].type_url, ENDPOINT_TYPE);
        assert_eq!(sent(&out.responses[1]), ["c1"]);
    }

    #[test]
    fn reconnect_after_a_cluster_change_sends_its_endpoints_even_when_held() {
        // Replica a served c1 and its endpoints; replica b has a changed c1, same endpoints.
        let mut a = stream(MapSnapshot::sample(1));
        let cds = one(handle(&mut a, &req(CLUSTER_TYPE, &["*"], &[], ""), T0));
        let eds = one(handle(&mut a, &req(ENDPOINT_TYPE, &["c1"], &[], ""), T0));
        let held = |r: &DeltaDiscoveryResponse| -> std::collections::HashMap<String, String> {
            r.resources
                .iter()
                .map(|x| (x.name.clone(), x.version.clone()))
                .collect()
        };
        let mut b = stream(MapSnapshot::sample(1).with(CLUSTER_TYPE, "c1", b"c1'"));
        let mut cds_again = req(CLUSTER_TYPE, &["*"], &[], "");
        cds_again.initial_resource_versions = held(&cds);
        assert_eq!(sent(&one(handle(&mut b, &cds_again, T0))), ["c1"]);
        // The EDS subscription arrives after that CDS answer, holding current endpoints.
        let mut eds_again = req(ENDPOINT_TYPE, &["c1"], &[], "");
        eds_again.initial_resource_versions = held(&eds);
        let r = one(handle(&mut b, &eds_again, T0));
        assert_eq!(
            sent(&r),
            ["c1"],
            "the changed cluster needs fresh endpoints to warm"
        );
        // Once sent, they are not forced again.
        assert!(
            push(
                &mut b,
                MapSnapshot::sample(1)
                    .with(CLUSTER_TYPE, "c1", b"c1'")
                    .next(2)
                    .shared(),
                T0
            )
            .responses
            .is_empty()
        );
    }

    #[test]
    fn a_nonce_from_a_previous_stream_on_the_first_request_is_answered() {
        let mut s = stream(MapSnapshot::sample(1));
        let out = handle(&mut s, &req(LISTENER_TYPE, &["*"], &[], "old-nonce"), T0);
        assert!(out.events.is_empty(), "{:?}", out.events);
        assert_eq!(sent(&one(out)), ["l1"]);
    }

    #[test]
    fn push_order_is_make_before_break() {
        let mut s = stream(MapSnapshot::sample(1));
        for (t, n) in [
            (ROUTE_TYPE, &["r1"][..]),
            (LISTENER_TYPE, &["*"]),
            (ENDPOINT_TYPE, &["c1"]),
            (CLUSTER_TYPE, &["*"]),
        ] {
            handle(&mut s, &req(t, n, &[], ""), T0);
        }
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"c1'")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .with(LISTENER_TYPE, "l1", b"l1'")
            .with(ROUTE_TYPE, "r1", b"r1'")
            .next(2);
        let out = push(&mut s, next.shared(), T0);
        let order: Vec<&str> = out.responses.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(
            order,
            [CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE]
        );
    }

    #[test]
    fn endpoints_only_change_recomputes_eds_alone() {
        let mut s = stream(MapSnapshot::sample(1));
        handle(&mut s, &req(CLUSTER_TYPE, &["*"], &[], ""), T0);
        handle(&mut s, &req(ENDPOINT_TYPE, &["c1"], &[], ""), T0);
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c9", b"c9")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .next(2)
            .endpoints_only_since(1);
        let out = push(&mut s, next.shared(), T0);
        assert_eq!(out.responses.len(), 1);
        assert_eq!(out.responses[0].type_url, ENDPOINT_TYPE);
    }

    #[test]
    fn unknown_type_is_reported_once() {
        let mut s = stream(MapSnapshot::sample(1));
        let url = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
        let first = handle(&mut s, &req(url, &[], &[], ""), T0);
        let again = handle(&mut s, &req(url, &[], &[], ""), T0);
        assert!(first.responses.is_empty() && again.responses.is_empty());
        assert_eq!(
            first.events,
            [ProtocolEvent::UnknownType {
                type_url: url.into(),
                first_time: true
            }]
        );
        assert_eq!(
            again.events,
            [ProtocolEvent::UnknownType {
                type_url: url.into(),
                first_time: false
            }]
        );
    }

    #[test]
    fn never_the_same_name_twice_in_a_response() {
        let mut s = with(Arc::new(crate::ads::state::DuplicatingSnapshot));
        let r = one(handle(&mut s, &req(CLUSTER_TYPE, &["*"], &[], ""), T0));
        assert_eq!(sent(&r), ["dup"]);
    }

    #[test]
    fn deleted_then_recreated_resource_is_sent_again() {
        let mut s = stream(MapSnapshot::sample(1));
        one(handle(&mut s, &req(LISTENER_TYPE, &["*"], &[], ""), T0));
        let r = one(push(
            &mut s,
            MapSnapshot::sample(1)
                .without(LISTENER_TYPE, "l1")
                .next(2)
                .shared(),
            T0,
        ));
        assert_eq!(r.removed_resources, ["l1"]);
        let r = one(push(&mut s, MapSnapshot::sample(1).next(3).shared(), T0));
        assert_eq!(sent(&r), ["l1"]);
    }

    #[test]
    fn snapshots_that_arrive_before_the_stream_can_send_are_replaced_by_the_newest() {
        let mut s = stream(MapSnapshot::sample(1));
        let first = one(handle(&mut s, &req(CLUSTER_TYPE, &["*"], &[], ""), T0));
        s.on_request(&req(CLUSTER_TYPE, &[], &[], &first.nonce), T0);
        // c2 changes, then is deleted, then c3 appears, all before the stream can send.
        let base = MapSnapshot::sample(1);
        for snapshot in [
            base.with(CLUSTER_TYPE, "c2", b"c2'").next(2),
            MapSnapshot::sample(1).without(CLUSTER_TYPE, "c2").next(3),
            MapSnapshot::sample(1)
                .without(CLUSTER_TYPE, "c2")
                .with(CLUSTER_TYPE, "c3", b"c3")
                .next(4),
        ] {
            s.on_snapshot(ServedSnapshot::new(snapshot.shared()));
        }
        let out = drain(&mut s);
        assert_eq!(out.len(), 1, "one response for three snapshots");
        assert_eq!(sent(&out[0]), ["c3"]);
        assert_eq!(out[0].removed_resources, ["c2"]);
        assert_eq!(out[0].nonce, "2");
    }

    #[test]
    fn an_ack_arriving_while_a_newer_response_is_owed_is_an_ack_not_stale() {
        let mut s = stream(MapSnapshot::sample(1));
        let first = one(handle(&mut s, &req(LISTENER_TYPE, &["*"], &[], ""), T0));
        s.on_snapshot(ServedSnapshot::new(
            MapSnapshot::sample(1)
                .with(LISTENER_TYPE, "l1", b"l1'")
                .next(2)
                .shared(),
        ));
        let events = s.on_request(&req(LISTENER_TYPE, &[], &[], &first.nonce), T0);
        assert!(
            matches!(events[..], [ProtocolEvent::Ack { .. }]),
            "{events:?}"
        );
        assert_eq!(s.status().0[0].sync_state(), "SYNCED");
        let next = one(Output {
            responses: drain(&mut s),
            events: vec![],
        });
        assert_eq!(sent(&next), ["l1"]);
        assert_eq!(s.status().0[0].sync_state(), "STALE");
    }

    #[test]
    fn what_the_client_holds_is_the_view_shared_by_its_scope() {
        let served = ServedSnapshot::new(MapSnapshot::sample(1).shared());
        let names = NameSets::new();
        let mut streams: Vec<DeltaStream> = (0..3)
            .map(|i| {
                DeltaStream::new(
                    Arc::new(Proxy::with_defaults(format!("p{i}"))),
                    served.clone(),
                    names.clone(),
                )
            })
            .collect();
        for s in &mut streams {
            let r = one(handle(s, &req(ENDPOINT_TYPE, &["c1", "c2"], &[], ""), T0));
            assert_eq!(sent(&r), ["c1", "c2"]);
        }
        let held: Vec<Arc<View>> = streams
            .iter()
            .map(|s| match &s.types[XdsType::Endpoint.index()].holds {
                Held::View(view) => view.clone(),
                other => panic!("holds {other:?}"),
            })
            .collect();
        assert!(held.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
        assert_eq!(names.len(), 1);
        // A snapshot with the same endpoints: nothing sent, and the same view is held.
        let next = ServedSnapshot::new(MapSnapshot::sample(1).next(2).shared());
        for s in &mut streams {
            s.on_snapshot(next.clone());
            assert!(drain(s).is_empty());
            assert!(
                matches!(&s.types[XdsType::Endpoint.index()].holds, Held::View(v) if Arc::ptr_eq(v, &held[0]))
            );
        }
        assert_eq!(next.live_views(), 1);
    }

    #[test]
    fn a_client_that_holds_nothing_gets_the_views_shared_body() {
        let mut s = stream(MapSnapshot::sample(1));
        s.on_request(&req(CLUSTER_TYPE, &["*"], &[], ""), T0);
        let response = s.next_response(T0).expect("a response");
        assert!(
            matches!(&response.resources, DeltaResources::All(view) if view.len() == 2),
            "{response:?}"
        );
        // A reconnect holding one of the two: only the other, as its own resource.
        let mut again = stream(MapSnapshot::sample(1));
        let mut request = req(CLUSTER_TYPE, &["*"], &[], "");
        request.initial_resource_versions = response
            .resources
            .iter()
            .take(1)
            .map(|r| (r.name.clone(), r.version.clone()))
            .collect();
        again.on_request(&request, T0);
        let response = again.next_response(T0).expect("a response");
        assert!(matches!(&response.resources, DeltaResources::Some(list) if list.len() == 1));
    }

    fn over_limit(events: &[ProtocolEvent]) -> bool {
        events.iter().any(|e| {
            matches!(
                e,
                ProtocolEvent::OverLimit {
                    limit: Limit::SubscribedNames,
                    ..
                }
            )
        })
    }

    fn held_names(s: &DeltaStream, xds_type: XdsType) -> (usize, usize) {
        let names = &s.types[xds_type.index()].record.subscription.names;
        (names.len(), names.bytes())
    }

    #[test]
    fn subscriptions_accumulate_up_to_the_name_cap_and_no_further() {
        use crate::ads::state::MAX_SUBSCRIBED_NAMES;
        let mut s = stream(MapSnapshot::sample(1));
        let name = |i: usize| format!("outbound|80||svc-{i:06}.ns.svc.cluster.local");
        let chunk = MAX_SUBSCRIBED_NAMES / 4;
        for part in 0..4 {
            let names: Vec<String> = (part * chunk..(part + 1) * chunk).map(name).collect();
            let mut request = req(ENDPOINT_TYPE, &[], &[], "");
            request.resource_names_subscribe = names;
            assert!(!over_limit(&s.on_request(&request, T0)));
            drain(&mut s);
        }
        let (count, bytes) = held_names(&s, XdsType::Endpoint);
        assert_eq!(count, MAX_SUBSCRIBED_NAMES);
        assert_eq!(
            bytes,
            (0..MAX_SUBSCRIBED_NAMES)
                .map(|i| name(i).len())
                .sum::<usize>()
        );
        // Names already held are no growth; one more name is.
        let again = req(ENDPOINT_TYPE, &[&name(7)], &[], "");
        assert!(!over_limit(&s.on_request(&again, T0)));
        let more = req(ENDPOINT_TYPE, &[&name(MAX_SUBSCRIBED_NAMES)], &[], "");
        assert!(over_limit(&s.on_request(&more, T0)));
        assert_eq!(
            held_names(&s, XdsType::Endpoint),
            (count, bytes),
            "nothing applied"
        );
        // Another type has a cap of its own.
        let routes = req(ROUTE_TYPE, &[&name(0)], &[], "");
        assert!(!over_limit(&s.on_request(&routes, T0)));
        // Too many versions claimed on a reconnect is refused too.
        let mut fresh = stream(MapSnapshot::sample(1));
        let mut reconnect = req(CLUSTER_TYPE, &["*"], &[], "");
        reconnect.initial_resource_versions = (0..=MAX_SUBSCRIBED_NAMES)
            .map(|i| (name(i), "v".into()))
            .collect();
        assert!(over_limit(&fresh.on_request(&reconnect, T0)));
        assert_eq!(fresh.types[XdsType::Cluster.index()].holds.len(), 0);
    }

    #[test]
    fn subscribed_name_bytes_are_capped_per_stream_across_types() {
        use crate::ads::state::MAX_SUBSCRIBED_NAME_BYTES;
        let mut s = stream(MapSnapshot::sample(1));
        // 40,000 names of 256 bytes: 10 MiB, within the byte cap and under the name cap.
        let long = |prefix: &str, i: usize| format!("{prefix}{i:0>252}");
        let eds: Vec<String> = (0..40_000).map(|i| long("eds-", i)).collect();
        let mut request = req(ENDPOINT_TYPE, &[], &[], "");
        request.resource_names_subscribe = eds;
        assert!(!over_limit(&s.on_request(&request, T0)));
        assert_eq!(held_names(&s, XdsType::Endpoint).1, 40_000 * 256);
        // As many route names would bring the stream to 20 MiB: refused, nothing held.
        let rds: Vec<String> = (0..40_000).map(|i| long("rds-", i)).collect();
        let mut request = req(ROUTE_TYPE, &[], &[], "");
        request.resource_names_subscribe = rds;
        assert!(over_limit(&s.on_request(&request, T0)));
        assert_eq!(held_names(&s, XdsType::Route), (0, 0));
        let total: usize = XdsType::ALL.iter().map(|t| held_names(&s, *t).1).sum();
        assert!(total <= MAX_SUBSCRIBED_NAME_BYTES);
        // Unsubscribing makes room again.
        let names: Vec<String> = (0..40_000).map(|i| long("eds-", i)).collect();
        let mut request = req(ENDPOINT_TYPE, &[], &[], "");
        request.resource_names_unsubscribe = names;
        assert!(!over_limit(&s.on_request(&request, T0)));
        let rds: Vec<String> = (0..40_000).map(|i| long("rds-", i)).collect();
        let mut request = req(ROUTE_TYPE, &[], &[], "");
        request.resource_names_subscribe = rds;
        assert!(!over_limit(&s.on_request(&request, T0)));
    }
}
