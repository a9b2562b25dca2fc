//! The delta (incremental) ADS state machine of one stream ([`DeltaStream`]): synchronous
//! and free of I/O, like [`super::sotw::SotwStream`].
//!
//! It tracks, per type, what the client holds (name → version): seeded from
//! `initial_resource_versions` on reconnect, updated by every response. Responses carry
//! only resources whose version differs from what the client holds, and
//! `removed_resources` for held resources that were deleted or unsubscribed, and for
//! subscribed names that do not exist (once). Because versions are content hashes, a client
//! that reconnects to another replica is sent nothing it already has.
//!
//! Subscription changes are applied even from a request with a stale nonce (they are
//! incremental: dropping one would lose it for good); only the ACK/NACK part of a stale
//! request is ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource as WireResource,
};
use pilotfish_mesh::model::Proxy;

use super::resource::{ChangeKind, Resource, XdsSnapshot, to_envoy_any};
use super::state::{AckStatus, NackStatus, TypeStatus};
use super::state::{
    NonceSource, Output, ProtocolEvent, SentRecord, TypeRecord, served_type, view_version,
};
use super::types::XdsType;

#[derive(Debug, Default)]
struct DeltaType {
    record: TypeRecord,
    /// Name → version of every resource the client holds, as far as the server knows.
    holds: BTreeMap<String, String>,
    /// Subscribed names already reported as non-existent, so they are reported once.
    announced_absent: BTreeSet<String>,
}

/// What one delta response would carry.
struct Diff {
    resources: Vec<Arc<Resource>>,
    removed: BTreeSet<String>,
}

impl Diff {
    fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.removed.is_empty()
    }
}

/// State of one delta ADS stream.
pub struct DeltaStream {
    proxy: Arc<Proxy>,
    control_plane: ControlPlane,
    snapshot: Arc<dyn XdsSnapshot>,
    nonces: NonceSource,
    types: BTreeMap<XdsType, DeltaType>,
    unknown_types: BTreeSet<String>,
    /// Clusters sent new or changed whose endpoints have not been sent since. Envoy only
    /// finishes warming such a cluster on a fresh ClusterLoadAssignment, even an
    /// unchanged one, and in delta it does not ask again: the next EDS response for the
    /// stream (pushed right after CDS, or answering a later EDS subscription such as the
    /// one after a reconnect) carries them whatever the client holds.
    warming: BTreeSet<String>,
}

impl DeltaStream {
    pub fn new(proxy: Arc<Proxy>, control_plane_id: &str, snapshot: Arc<dyn XdsSnapshot>) -> Self {
        DeltaStream {
            proxy,
            control_plane: ControlPlane {
                identifier: control_plane_id.to_string(),
            },
            snapshot,
            nonces: NonceSource::default(),
            types: XdsType::ALL
                .iter()
                .map(|t| (*t, DeltaType::default()))
                .collect(),
            unknown_types: BTreeSet::new(),
            warming: BTreeSet::new(),
        }
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    pub fn snapshot_version(&self) -> u64 {
        self.snapshot.version()
    }

    /// Handles one client request.
    pub fn on_request(
        &mut self,
        request: &DeltaDiscoveryRequest,
        now: SystemTime,
    ) -> Output<DeltaDiscoveryResponse> {
        let mut out = Output::default();
        let Some(xds_type) = served_type(&request.type_url, &mut self.unknown_types, &mut out)
        else {
            return out;
        };
        let state = self.type_state(xds_type);
        let nonce = request.response_nonce.as_str();
        if state.record.is_stale(nonce) {
            out.events.push(ProtocolEvent::StaleNonce {
                xds_type,
                nonce: nonce.to_string(),
            });
        } else if let (false, Some(sent)) = (nonce.is_empty(), state.record.last_sent.as_ref()) {
            match &request.error_detail {
                // What the client holds is left as sent: the rejected versions are never
                // sent again, only newer content is.
                Some(error) => {
                    state.record.last_nack = Some(NackStatus {
                        version: state
                            .record
                            .last_ack
                            .as_ref()
                            .map(|a| a.version.clone())
                            .unwrap_or_default(),
                        nonce: nonce.to_string(),
                        detail: error.message.clone(),
                        at: now,
                    });
                    out.events.push(ProtocolEvent::Nack {
                        xds_type,
                        nonce: nonce.to_string(),
                        detail: error.message.clone(),
                    });
                }
                None => {
                    state.record.last_ack = Some(AckStatus {
                        version: sent.version.clone(),
                        nonce: nonce.to_string(),
                        at: now,
                    });
                    out.events.push(ProtocolEvent::Ack {
                        xds_type,
                        nonce: nonce.to_string(),
                    });
                }
            }
        }
        let first_request = !state.record.requested;
        state.record.requested = true;
        if first_request {
            state.holds.extend(
                request
                    .initial_resource_versions
                    .iter()
                    .map(|(n, v)| (n.clone(), v.clone())),
            );
        }
        let (unsubscribed, changed) = state.record.subscription.apply_delta(
            xds_type,
            first_request,
            &request.resource_names_subscribe,
            &request.resource_names_unsubscribe,
        );
        for name in &unsubscribed {
            state.announced_absent.remove(name);
        }
        let wildcard = state.record.subscription.wildcard;
        if !first_request && !changed {
            return out;
        }
        let diff = self.diff(xds_type);
        if diff.is_empty() && !(first_request && wildcard) {
            return out;
        }
        out.responses.push(self.send(xds_type, diff, now));
        if xds_type == XdsType::Cluster && self.type_state(XdsType::Endpoint).record.requested {
            let follow = self.diff(XdsType::Endpoint);
            if !follow.is_empty() {
                out.responses
                    .push(self.send(XdsType::Endpoint, follow, now));
            }
        }
        out
    }

    /// Moves the stream to a newer snapshot and returns what must be pushed.
    pub fn on_snapshot(
        &mut self,
        snapshot: Arc<dyn XdsSnapshot>,
        now: SystemTime,
    ) -> Output<DeltaDiscoveryResponse> {
        let mut out = Output::default();
        let previous = self.snapshot.version();
        if snapshot.version() == previous {
            return out;
        }
        let kind = snapshot.change_since(previous);
        self.snapshot = snapshot;
        for xds_type in XdsType::ALL {
            if !self.type_state(xds_type).record.requested
                || (kind == ChangeKind::EndpointsOnly && xds_type != XdsType::Endpoint)
            {
                continue;
            }
            let diff = self.diff(xds_type);
            if diff.is_empty() {
                continue;
            }
            out.responses.push(self.send(xds_type, diff, now));
        }
        out
    }

    pub fn status(&self) -> (Vec<TypeStatus>, Vec<String>) {
        let types = self
            .types
            .iter()
            .filter(|(_, s)| s.record.requested)
            .map(|(t, s)| s.record.status(*t, s.holds.len()))
            .collect();
        (types, self.unknown_types.iter().cloned().collect())
    }

    fn type_state(&mut self, xds_type: XdsType) -> &mut DeltaType {
        self.types.entry(xds_type).or_default()
    }

    /// Resources to send (changed for the client, or endpoints of a warming cluster) and
    /// names to remove.
    fn diff(&self, xds_type: XdsType) -> Diff {
        let state = &self.types[&xds_type];
        let no_force = BTreeSet::new();
        let force = if xds_type == XdsType::Endpoint {
            &self.warming
        } else {
            &no_force
        };
        let subscription = &state.record.subscription;
        let mut desired: BTreeMap<String, Arc<Resource>> = BTreeMap::new();
        if !subscription.is_empty() {
            for resource in
                self.snapshot
                    .resources(&self.proxy, xds_type.type_url(), subscription.query())
            {
                desired.entry(resource.name.clone()).or_insert(resource);
            }
        }
        let resources = desired
            .values()
            .filter(|r| force.contains(&r.name) || state.holds.get(&r.name) != Some(&r.version))
            .cloned()
            .collect();
        // Held but no longer wanted: deleted, or unsubscribed.
        let mut removed: BTreeSet<String> = state
            .holds
            .keys()
            .filter(|n| !desired.contains_key(*n))
            .cloned()
            .collect();
        // Subscribed but absent: say so once, so the client stops waiting for it.
        removed.extend(
            subscription
                .names
                .iter()
                .filter(|n| {
                    !desired.contains_key(*n)
                        && !state.holds.contains_key(*n)
                        && !state.announced_absent.contains(*n)
                })
                .cloned(),
        );
        Diff { resources, removed }
    }

    fn send(&mut self, xds_type: XdsType, diff: Diff, now: SystemTime) -> DeltaDiscoveryResponse {
        let nonce = self.nonces.next_nonce();
        let control_plane = self.control_plane.clone();
        match xds_type {
            XdsType::Cluster => {
                self.warming
                    .extend(diff.resources.iter().map(|r| r.name.clone()));
                for name in &diff.removed {
                    self.warming.remove(name);
                }
            }
            XdsType::Endpoint => {
                for resource in &diff.resources {
                    self.warming.remove(&resource.name);
                }
            }
            _ => {}
        }
        let state = self.type_state(xds_type);
        for resource in &diff.resources {
            state
                .holds
                .insert(resource.name.clone(), resource.version.clone());
            state.announced_absent.remove(&resource.name);
        }
        for name in &diff.removed {
            state.holds.remove(name);
            if state.record.subscription.names.contains(name) {
                state.announced_absent.insert(name.clone());
            }
        }
        let system_version = view_version(state.holds.iter());
        let response = DeltaDiscoveryResponse {
            system_version_info: system_version.clone(),
            resources: diff
                .resources
                .iter()
                .map(|r| WireResource {
                    name: r.name.clone(),
                    version: r.version.clone(),
                    resource: Some(to_envoy_any(&r.body)),
                    ..Default::default()
                })
                .collect(),
            type_url: xds_type.type_url().to_string(),
            removed_resources: diff.removed.iter().cloned().collect(),
            nonce: nonce.clone(),
            control_plane: Some(control_plane),
            ..Default::default()
        };
        state.record.last_sent = Some(SentRecord {
            version: system_version,
            nonce,
            at: now,
            resources: Arc::default(),
            resource_count: diff.resources.len(),
            removed_count: diff.removed.len(),
        });
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::map_snapshot::MapSnapshot;
    use crate::ads::types::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};
    use envoy_types::pb::google::rpc::Status;

    const T0: SystemTime = SystemTime::UNIX_EPOCH;

    fn stream(snapshot: MapSnapshot) -> DeltaStream {
        DeltaStream::new(
            Arc::new(Proxy::with_defaults("p")),
            "replica-a",
            snapshot.shared(),
        )
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

    fn one(out: Output<DeltaDiscoveryResponse>) -> DeltaDiscoveryResponse {
        assert_eq!(out.responses.len(), 1, "{:?}", out.responses);
        out.responses.into_iter().next().unwrap_or_default()
    }

    #[test]
    fn first_wildcard_request_is_answered_even_when_empty() {
        let mut s = stream(MapSnapshot::new(1));
        let r = one(s.on_request(&req(CLUSTER_TYPE, &[], &[], ""), T0));
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
        let r = one(first.on_request(&req(CLUSTER_TYPE, &["*"], &[], ""), T0));
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
        let r = one(again.on_request(&request, T0));
        assert_eq!(sent(&r), ["c2"]);
        assert_eq!(r.removed_resources, ["gone"]);
    }

    #[test]
    fn reconnect_with_everything_current_gets_nothing_but_the_wildcard_answer() {
        let mut a = stream(MapSnapshot::sample(1));
        let r = one(a.on_request(&req(LISTENER_TYPE, &["*"], &[], ""), T0));
        let mut b = stream(MapSnapshot::sample(1).next(7));
        let mut request = req(LISTENER_TYPE, &["*"], &[], "");
        request.initial_resource_versions = r
            .resources
            .iter()
            .map(|x| (x.name.clone(), x.version.clone()))
            .collect();
        let r = one(b.on_request(&request, T0));
        assert!(r.resources.is_empty() && r.removed_resources.is_empty());
        // Named (non-wildcard) resubscription with current versions: no response at all.
        let mut c = stream(MapSnapshot::sample(1));
        let mut request = req(ROUTE_TYPE, &["r1"], &[], "");
        let held =
            one(stream(MapSnapshot::sample(1)).on_request(&req(ROUTE_TYPE, &["r1"], &[], ""), T0));
        request.initial_resource_versions = held
            .resources
            .iter()
            .map(|x| (x.name.clone(), x.version.clone()))
            .collect();
        assert!(c.on_request(&request, T0).responses.is_empty());
    }

    #[test]
    fn only_changed_resources_are_sent_and_deletions_removed() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = one(s.on_request(&req(CLUSTER_TYPE, &["*"], &[], ""), T0));
        assert_eq!(sent(&r), ["c1", "c2"]);
        s.on_request(&req(CLUSTER_TYPE, &[], &[], &r.nonce), T0);
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"c1'")
            .without(CLUSTER_TYPE, "c2")
            .next(2);
        let r = one(s.on_snapshot(next.shared(), T0));
        assert_eq!(sent(&r), ["c1"]);
        assert_eq!(r.removed_resources, ["c2"]);
        // Nothing new: nothing sent.
        let again = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"c1'")
            .without(CLUSTER_TYPE, "c2")
            .next(3);
        assert!(s.on_snapshot(again.shared(), T0).responses.is_empty());
    }

    #[test]
    fn unsubscribe_removes_and_resubscribe_resends() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = one(s.on_request(&req(ROUTE_TYPE, &["r1"], &[], ""), T0));
        assert_eq!(sent(&r), ["r1"]);
        let r = one(s.on_request(&req(ROUTE_TYPE, &["r2"], &["r1"], &r.nonce), T0));
        assert_eq!(sent(&r), ["r2"]);
        assert_eq!(r.removed_resources, ["r1"]);
        let r = one(s.on_request(&req(ROUTE_TYPE, &["r1"], &["r2"], &r.nonce), T0));
        assert_eq!(sent(&r), ["r1"], "R1 again after R1→R2→R1");
        assert_eq!(r.removed_resources, ["r2"]);
    }

    #[test]
    fn absent_names_are_announced_once_and_sent_when_they_appear() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = one(s.on_request(&req(ENDPOINT_TYPE, &["c1", "later"], &[], ""), T0));
        assert_eq!(sent(&r), ["c1"]);
        assert_eq!(r.removed_resources, ["later"]);
        assert!(
            s.on_snapshot(MapSnapshot::sample(1).next(2).shared(), T0)
                .responses
                .is_empty()
        );
        let r = one(s.on_snapshot(
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
        let r = one(s.on_request(&req(CLUSTER_TYPE, &["*"], &[], ""), T0));
        let out = s.on_request(&req(CLUSTER_TYPE, &[], &[], &r.nonce), T0);
        assert!(out.responses.is_empty());
        assert!(matches!(out.events[0], ProtocolEvent::Ack { .. }));
        let bad = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"bad")
            .next(2);
        let r = one(s.on_snapshot(bad.clone().shared(), T0));
        let mut n = req(CLUSTER_TYPE, &[], &[], &r.nonce);
        n.error_detail = Some(Status {
            code: 3,
            message: "rejected c1".into(),
            details: vec![],
        });
        let out = s.on_request(&n, T0);
        assert!(out.responses.is_empty());
        assert!(
            matches!(&out.events[0], ProtocolEvent::Nack { detail, .. } if detail == "rejected c1")
        );
        assert!(
            s.on_snapshot(bad.next(3).shared(), T0).responses.is_empty(),
            "same content after NACK"
        );
        let fixed = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"good")
            .next(4);
        assert_eq!(sent(&one(s.on_snapshot(fixed.shared(), T0))), ["c1"]);
    }

    #[test]
    fn stale_nonce_ack_is_ignored_but_subscription_is_applied() {
        let mut s = stream(MapSnapshot::sample(1));
        let first = one(s.on_request(&req(ROUTE_TYPE, &["r1"], &[], ""), T0));
        let _second = one(s.on_snapshot(
            MapSnapshot::sample(1)
                .with(ROUTE_TYPE, "r1", b"r1'")
                .next(2)
                .shared(),
            T0,
        ));
        let out = s.on_request(&req(ROUTE_TYPE, &["r2"], &[], &first.nonce), T0);
        assert!(matches!(out.events[0], ProtocolEvent::StaleNonce { .. }));
        assert_eq!(sent(&out.responses[0]), ["r2"]);
        assert!(s.status().0[0].last_ack.is_none());
    }

    #[test]
    fn changed_cluster_is_followed_by_its_endpoints_even_unchanged() {
        let mut s = stream(MapSnapshot::sample(1));
        s.on_request(&req(CLUSTER_TYPE, &["*"], &[], ""), T0);
        s.on_request(&req(ENDPOINT_TYPE, &["c1", "c2"], &[], ""), T0);
        let out = s.on_snapshot(
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
        let cds = one(a.on_request(&req(CLUSTER_TYPE, &["*"], &[], ""), T0));
        let eds = one(a.on_request(&req(ENDPOINT_TYPE, &["c1"], &[], ""), T0));
        let held = |r: &DeltaDiscoveryResponse| -> std::collections::HashMap<String, String> {
            r.resources
                .iter()
                .map(|x| (x.name.clone(), x.version.clone()))
                .collect()
        };
        let mut b = stream(MapSnapshot::sample(1).with(CLUSTER_TYPE, "c1", b"c1'"));
        let mut cds_again = req(CLUSTER_TYPE, &["*"], &[], "");
        cds_again.initial_resource_versions = held(&cds);
        assert_eq!(sent(&one(b.on_request(&cds_again, T0))), ["c1"]);
        // The EDS subscription arrives after that CDS answer, holding current endpoints.
        let mut eds_again = req(ENDPOINT_TYPE, &["c1"], &[], "");
        eds_again.initial_resource_versions = held(&eds);
        let r = one(b.on_request(&eds_again, T0));
        assert_eq!(
            sent(&r),
            ["c1"],
            "the changed cluster needs fresh endpoints to warm"
        );
        // Once sent, they are not forced again.
        assert!(
            b.on_snapshot(
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
        let out = s.on_request(&req(LISTENER_TYPE, &["*"], &[], "old-nonce"), T0);
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
            s.on_request(&req(t, n, &[], ""), T0);
        }
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"c1'")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .with(LISTENER_TYPE, "l1", b"l1'")
            .with(ROUTE_TYPE, "r1", b"r1'")
            .next(2);
        let out = s.on_snapshot(next.shared(), T0);
        let order: Vec<&str> = out.responses.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(
            order,
            [CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE]
        );
    }

    #[test]
    fn endpoints_only_change_recomputes_eds_alone() {
        let mut s = stream(MapSnapshot::sample(1));
        s.on_request(&req(CLUSTER_TYPE, &["*"], &[], ""), T0);
        s.on_request(&req(ENDPOINT_TYPE, &["c1"], &[], ""), T0);
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c9", b"c9")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .next(2)
            .endpoints_only_since(1);
        let out = s.on_snapshot(next.shared(), T0);
        assert_eq!(out.responses.len(), 1);
        assert_eq!(out.responses[0].type_url, ENDPOINT_TYPE);
    }

    #[test]
    fn unknown_type_is_reported_once() {
        let mut s = stream(MapSnapshot::sample(1));
        let url = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
        let first = s.on_request(&req(url, &[], &[], ""), T0);
        let again = s.on_request(&req(url, &[], &[], ""), T0);
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
        let snapshot = Arc::new(crate::ads::state::DuplicatingSnapshot);
        let mut s = DeltaStream::new(Arc::new(Proxy::with_defaults("p")), "r", snapshot);
        let r = one(s.on_request(&req(CLUSTER_TYPE, &["*"], &[], ""), T0));
        assert_eq!(sent(&r), ["dup"]);
    }

    #[test]
    fn deleted_then_recreated_resource_is_sent_again() {
        let mut s = stream(MapSnapshot::sample(1));
        one(s.on_request(&req(LISTENER_TYPE, &["*"], &[], ""), T0));
        let r = one(s.on_snapshot(
            MapSnapshot::sample(1)
                .without(LISTENER_TYPE, "l1")
                .next(2)
                .shared(),
            T0,
        ));
        assert_eq!(r.removed_resources, ["l1"]);
        let r = one(s.on_snapshot(MapSnapshot::sample(1).next(3).shared(), T0));
        assert_eq!(sent(&r), ["l1"]);
    }
}
