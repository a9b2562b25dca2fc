//! Property tests of the two per-stream state machines ([`SotwStream`], [`DeltaStream`]):
//! arbitrary sequences of client requests — subscribe and unsubscribe, wildcard, ACK and
//! NACK, stale, empty and made-up nonces, type URLs nobody serves, reconnect claims — and
//! snapshot changes (whole, or endpoints only), each followed by the transport taking every
//! response the stream has. Bounded (64 sequences of up to 40 steps per machine), so they
//! run in `make test`; `fuzz/` has the unbounded, coverage-guided counterparts.
//!
//! Invariants checked after every step:
//! - nothing panics; a stream never goes past its caps without ending (the sequence ends
//!   where the machine says the stream ends);
//! - a type is answered at most once per drain (one pending response per type), and never
//!   before the client asked for it;
//! - what is sent is exactly what the snapshot has for the subscription: SotW responses
//!   carry the whole subscribed view (its resources and payloads, from the model), RDS
//!   and EDS responses a part of it; a delta client that applies every response holds
//!   exactly the subscribed view (names and versions) once the stream drained;
//! - a NACKed response is not sent again: until the snapshot or that type's subscription
//!   changes, SotW never re-sends the NACKed version and delta never re-sends a resource
//!   at the version it NACKed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status;
use pilotfish_mesh::model::Proxy;
use proptest::prelude::*;

use super::delta::DeltaStream;
use super::map_snapshot::MapSnapshot;
use super::names::NameSets;
use super::resource::Resource;
use super::sotw::SotwStream;
use super::state::{MAX_UNKNOWN_TYPES, ProtocolEvent};
use super::types::XdsType;
use super::view::ServedSnapshot;

const T0: SystemTime = SystemTime::UNIX_EPOCH;
/// Names per type in the model: each may exist or not in a snapshot, and be subscribed.
const NAMES: usize = 5;
/// Type URLs nobody serves that requests may use (more than the per-stream cap).
const UNKNOWN: usize = MAX_UNKNOWN_TYPES + 4;

fn name(i: u8) -> String {
    format!("n{i}")
}

/// The model of a snapshot: per type, name → content number.
type Model = [BTreeMap<String, u8>; 4];

fn payload(name: &str, content: u8) -> Vec<u8> {
    format!("{name}:{content}").into_bytes()
}

fn snapshot_of(version: u64, model: &Model, endpoints_only_since: Option<u64>) -> MapSnapshot {
    let mut snapshot = MapSnapshot::new(version);
    for t in XdsType::ALL {
        for (n, c) in &model[t.index()] {
            snapshot.insert(t.type_url(), n, &payload(n, *c));
        }
    }
    match endpoints_only_since {
        Some(previous) => snapshot.endpoints_only_since(previous),
        None => snapshot,
    }
}

/// The version the engine gives a resource of the model (a content hash).
fn version_of(t: XdsType, name: &str, content: u8) -> String {
    let body = prost_types::Any {
        type_url: t.type_url().to_string(),
        value: payload(name, content),
    };
    Resource::new(name, body).version
}

/// Which nonce a request carries.
#[derive(Clone, Copy, Debug)]
enum NonceChoice {
    Empty,
    Latest,
    /// One sent before the latest (stale), when there is one.
    Older,
    MadeUp,
}

fn nonce_choice() -> impl Strategy<Value = NonceChoice> {
    prop_oneof![
        1 => Just(NonceChoice::Empty),
        4 => Just(NonceChoice::Latest),
        1 => Just(NonceChoice::Older),
        1 => Just(NonceChoice::MadeUp),
    ]
}

/// A type index: 0–3 the served types, above that type URLs nobody serves.
fn type_index() -> impl Strategy<Value = usize> {
    prop_oneof![9 => 0usize..4, 1 => 4usize..4 + UNKNOWN]
}

fn type_url(i: usize) -> String {
    match XdsType::ALL.get(i) {
        Some(t) => t.type_url().to_string(),
        None => format!("type.example.com/unknown.{i}"),
    }
}

/// Names of a request: indexes into the model's names; `NAMES` is the wildcard `*`.
fn names() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0u8..=NAMES as u8, 0..4)
}

fn name_list(names: &[u8]) -> Vec<String> {
    names
        .iter()
        .map(|i| {
            if usize::from(*i) == NAMES {
                "*".to_string()
            } else {
                name(*i)
            }
        })
        .collect()
}

/// A new snapshot: per type and name, absent or a content number; or endpoints only.
fn model_change() -> impl Strategy<Value = (Vec<Option<u8>>, bool)> {
    (
        prop::collection::vec(prop::option::of(0u8..3), 4 * NAMES),
        prop::bool::weighted(0.25),
    )
}

fn apply_change(model: &Model, change: &[Option<u8>], endpoints_only: bool) -> Model {
    let mut next = model.clone();
    for t in XdsType::ALL {
        if endpoints_only && t != XdsType::Endpoint {
            continue;
        }
        let of_type = &mut next[t.index()];
        of_type.clear();
        for i in 0..NAMES {
            if let Some(content) = change[t.index() * NAMES + i] {
                of_type.insert(name(i as u8), content);
            }
        }
    }
    next
}

#[derive(Clone, Debug)]
enum SotwOp {
    Request {
        ty: usize,
        names: Vec<u8>,
        nonce: NonceChoice,
        nack: bool,
        /// Repeat the type's current names instead of `names` (as an ACK or NACK does).
        same_names: bool,
    },
    Snapshot(Vec<Option<u8>>, bool),
}

fn sotw_op() -> impl Strategy<Value = SotwOp> {
    prop_oneof![
        4 => (type_index(), names(), nonce_choice(), prop::bool::weighted(0.3), prop::bool::weighted(0.6))
            .prop_map(|(ty, names, nonce, nack, same_names)| SotwOp::Request { ty, names, nonce, nack, same_names }),
        1 => model_change().prop_map(|(c, e)| SotwOp::Snapshot(c, e)),
    ]
}

/// What the test client knows per type: nonces and versions it was sent, and its names.
#[derive(Clone, Debug, Default)]
struct ClientType {
    nonces: Vec<String>,
    versions: Vec<String>,
    names: Vec<String>,
    requested: bool,
}

impl ClientType {
    fn nonce(&self, choice: NonceChoice) -> String {
        match choice {
            NonceChoice::Empty => String::new(),
            NonceChoice::Latest => self.nonces.last().cloned().unwrap_or_default(),
            NonceChoice::Older => self
                .nonces
                .iter()
                .rev()
                .nth(1)
                .cloned()
                .unwrap_or_else(|| "0".into()),
            NonceChoice::MadeUp => "made-up".into(),
        }
    }
}

fn proxy() -> Arc<Proxy> {
    Arc::new(Proxy::with_defaults("p"))
}

fn ends(events: &[ProtocolEvent]) -> bool {
    events
        .iter()
        .any(|e| matches!(e, ProtocolEvent::OverLimit { .. }))
}

fn run_sotw(ops: Vec<SotwOp>) -> Result<(), TestCaseError> {
    let mut model: Model = Default::default();
    let mut version = 1;
    let mut stream = SotwStream::new(
        proxy(),
        ServedSnapshot::new(snapshot_of(version, &model, None).shared()),
        NameSets::new(),
    );
    let mut client: [ClientType; 4] = Default::default();
    // Per type: the version NACKed, while neither the snapshot nor the names changed.
    let mut nacked: [Option<String>; 4] = Default::default();
    // Per type, the subscription as the model tracks it: wildcard, and whether names were
    // ever given (then an empty list means nothing, not the legacy wildcard).
    let mut wildcard = [false; 4];
    let mut named_ever = [false; 4];
    for op in ops {
        match op {
            SotwOp::Request {
                ty,
                names,
                nonce,
                nack,
                same_names,
            } => {
                let known = ty < 4;
                let state = client.get(ty).cloned().unwrap_or_default();
                let list = if same_names && known {
                    state.names.clone()
                } else {
                    name_list(&names)
                };
                let nonce = state.nonce(nonce);
                let is_latest = !nonce.is_empty() && state.nonces.last() == Some(&nonce);
                let request = DiscoveryRequest {
                    type_url: type_url(ty),
                    resource_names: list.clone(),
                    response_nonce: nonce.clone(),
                    version_info: if nack {
                        String::new()
                    } else {
                        state.versions.last().cloned().unwrap_or_default()
                    },
                    error_detail: nack.then(|| Status {
                        code: 3,
                        message: "rejected".into(),
                        details: vec![],
                    }),
                    ..Default::default()
                };
                let events = stream.on_request(&request.into(), T0);
                if ends(&events) {
                    prop_assert!(!known, "only type URLs can end these streams");
                    let (_, unknown) = stream.status();
                    prop_assert!(unknown.len() <= MAX_UNKNOWN_TYPES);
                    return Ok(());
                }
                let stale =
                    !nonce.is_empty() && state.nonces.last().is_some_and(|latest| *latest != nonce);
                if known && !stale {
                    let t = XdsType::ALL[ty];
                    let c = &mut client[ty];
                    if list.is_empty() {
                        wildcard[ty] = t.empty_means_wildcard()
                            && !named_ever[ty]
                            && (!c.requested || wildcard[ty]);
                    } else {
                        named_ever[ty] = true;
                        wildcard[ty] = list.iter().any(|n| n == "*");
                    }
                    let names_changed = c.requested && {
                        let a: BTreeSet<&String> = c.names.iter().collect();
                        let b: BTreeSet<&String> = list.iter().collect();
                        a != b
                    };
                    if names_changed || nonce.is_empty() {
                        nacked[ty] = None;
                    }
                    if nack && is_latest && !names_changed {
                        nacked[ty] = c.versions.last().cloned();
                    }
                    c.names = list;
                    c.requested = true;
                }
            }
            SotwOp::Snapshot(change, endpoints_only) => {
                let next = apply_change(&model, &change, endpoints_only);
                let previous = version;
                version += 1;
                model = next;
                stream.on_snapshot(ServedSnapshot::new(
                    snapshot_of(version, &model, endpoints_only.then_some(previous)).shared(),
                ));
                nacked = Default::default();
            }
        }
        // The transport takes everything.
        let mut sent_types = BTreeSet::new();
        while let Some(response) = stream.next_response(T0) {
            let t = response.xds_type();
            prop_assert!(sent_types.insert(t), "{t} answered twice in one drain");
            let c = &mut client[t.index()];
            prop_assert!(c.requested, "{t} answered before it was requested");
            let version_sent = response.view.version().to_string();
            if let Some(v) = &nacked[t.index()] {
                prop_assert_ne!(v, &version_sent, "NACKed version of {} sent again", t);
            }
            // The whole view is the subscription's cut of the snapshot.
            let wildcard = wildcard[t.index()];
            let expected: BTreeMap<String, Vec<u8>> = model[t.index()]
                .iter()
                .filter(|(n, _)| wildcard || c.names.contains(n))
                .map(|(n, content)| (n.clone(), payload(n, *content)))
                .collect();
            let view: BTreeMap<String, Vec<u8>> = response
                .view
                .resources()
                .iter()
                .map(|r| (r.name.clone(), r.body.value.clone()))
                .collect();
            prop_assert_eq!(&view, &expected, "{} view", t);
            if let Some(part) = &response.partial {
                prop_assert!(!t.sends_state_of_the_world());
                for r in part {
                    prop_assert_eq!(expected.get(&r.name), Some(&r.body.value));
                }
            }
            c.nonces.push(response.nonce.clone());
            c.versions.push(version_sent);
            if t == XdsType::Cluster {
                // A changed cluster is followed by its endpoints even unchanged (warming).
                nacked[XdsType::Endpoint.index()] = None;
            }
        }
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum DeltaOp {
    Request {
        ty: usize,
        subscribe: Vec<u8>,
        unsubscribe: Vec<u8>,
        nonce: NonceChoice,
        nack: bool,
        /// Reconnect claims on a first request: name index → the true version or not.
        claims: Vec<(u8, bool)>,
    },
    Snapshot(Vec<Option<u8>>, bool),
}

fn delta_op() -> impl Strategy<Value = DeltaOp> {
    prop_oneof![
        4 => (
            type_index(),
            names(),
            prop::collection::vec(0u8..=NAMES as u8, 0..2),
            nonce_choice(),
            prop::bool::weighted(0.3),
            prop::collection::vec((0u8..NAMES as u8, any::<bool>()), 0..3),
        )
            .prop_map(|(ty, subscribe, unsubscribe, nonce, nack, claims)| DeltaOp::Request {
                ty,
                subscribe,
                unsubscribe,
                nonce,
                nack,
                claims,
            }),
        1 => model_change().prop_map(|(c, e)| DeltaOp::Snapshot(c, e)),
    ]
}

fn run_delta(ops: Vec<DeltaOp>) -> Result<(), TestCaseError> {
    let mut model: Model = Default::default();
    let mut version = 1;
    let mut stream = DeltaStream::new(
        proxy(),
        ServedSnapshot::new(snapshot_of(version, &model, None).shared()),
        NameSets::new(),
    );
    let mut client: [ClientType; 4] = Default::default();
    // What the client holds per type (name → version), applying every response.
    let mut holds: [BTreeMap<String, String>; 4] = Default::default();
    // Per type: the subscription as the model tracks it.
    let mut wildcard = [false; 4];
    let mut subscribed: [BTreeSet<String>; 4] = Default::default();
    // Per type: (name, version) pairs of a NACKed response, while nothing changed.
    let mut nacked: [BTreeSet<(String, String)>; 4] = Default::default();
    let mut last_sent: [BTreeSet<(String, String)>; 4] = Default::default();
    for op in ops {
        match op {
            DeltaOp::Request {
                ty,
                subscribe,
                unsubscribe,
                nonce,
                nack,
                claims,
            } => {
                let known = ty < 4;
                let state = client.get(ty).cloned().unwrap_or_default();
                let first = known && !state.requested;
                let nonce = state.nonce(nonce);
                let is_latest = !nonce.is_empty() && state.nonces.last() == Some(&nonce);
                let subscribe = name_list(&subscribe);
                let unsubscribe = name_list(&unsubscribe);
                let mut request = DeltaDiscoveryRequest {
                    type_url: type_url(ty),
                    resource_names_subscribe: subscribe.clone(),
                    resource_names_unsubscribe: unsubscribe.clone(),
                    response_nonce: nonce.clone(),
                    error_detail: nack.then(|| Status {
                        code: 3,
                        message: "rejected".into(),
                        details: vec![],
                    }),
                    ..Default::default()
                };
                if first && let Some(t) = XdsType::ALL.get(ty) {
                    for (i, truthful) in &claims {
                        let n = name(*i);
                        let claimed = match model[t.index()].get(&n) {
                            Some(content) if *truthful => version_of(*t, &n, *content),
                            _ => "stale-version".to_string(),
                        };
                        request
                            .initial_resource_versions
                            .insert(n.clone(), claimed.clone());
                        holds[ty].insert(n, claimed);
                    }
                }
                let events = stream.on_request(&request, T0);
                if ends(&events) {
                    prop_assert!(!known, "only type URLs can end these streams");
                    return Ok(());
                }
                if known {
                    let t = XdsType::ALL[ty];
                    let before = (wildcard[ty], subscribed[ty].clone());
                    if first && subscribe.is_empty() && t.empty_means_wildcard() {
                        wildcard[ty] = true;
                    }
                    for n in &subscribe {
                        if n == "*" {
                            wildcard[ty] = true;
                        } else {
                            subscribed[ty].insert(n.clone());
                        }
                    }
                    for n in &unsubscribe {
                        if n == "*" {
                            wildcard[ty] = false;
                        } else {
                            subscribed[ty].remove(n);
                        }
                    }
                    if before != (wildcard[ty], subscribed[ty].clone()) {
                        nacked[ty].clear();
                    }
                    if nack && is_latest {
                        nacked[ty].extend(last_sent[ty].iter().cloned());
                    }
                    client[ty].requested = true;
                }
            }
            DeltaOp::Snapshot(change, endpoints_only) => {
                let next = apply_change(&model, &change, endpoints_only);
                let previous = version;
                version += 1;
                model = next;
                stream.on_snapshot(ServedSnapshot::new(
                    snapshot_of(version, &model, endpoints_only.then_some(previous)).shared(),
                ));
                nacked = Default::default();
            }
        }
        let mut sent_types = BTreeSet::new();
        while let Some(response) = stream.next_response(T0) {
            let t = response.xds_type;
            let i = t.index();
            prop_assert!(sent_types.insert(t), "{t} answered twice in one drain");
            prop_assert!(client[i].requested, "{t} answered before it was requested");
            let mut pairs = BTreeSet::new();
            for r in response.resources.iter() {
                let pair = (r.name.clone(), r.version.clone());
                prop_assert!(
                    !nacked[i].contains(&pair),
                    "NACKed {pair:?} of {t} sent again"
                );
                // Only what the snapshot has for the subscription, at its content.
                let content = model[i].get(&r.name);
                prop_assert!(
                    content.is_some(),
                    "{} of {t} is not in the snapshot",
                    r.name
                );
                prop_assert_eq!(&r.body.value, &payload(&r.name, *content.unwrap_or(&0)));
                prop_assert!(wildcard[i] || subscribed[i].contains(&r.name));
                holds[i].insert(r.name.clone(), r.version.clone());
                pairs.insert(pair);
            }
            for n in &response.removed {
                holds[i].remove(n);
            }
            last_sent[i] = pairs;
            client[i].nonces.push(response.nonce.clone());
            if t == XdsType::Cluster {
                // A changed cluster is followed by its endpoints even unchanged (warming).
                nacked[XdsType::Endpoint.index()].clear();
            }
        }
        // Drained: a requested type's client holds exactly its subscribed view.
        for t in XdsType::ALL {
            let i = t.index();
            if !client[i].requested {
                continue;
            }
            let expected: BTreeMap<String, String> = model[i]
                .iter()
                .filter(|(n, _)| wildcard[i] || subscribed[i].contains(*n))
                .map(|(n, c)| (n.clone(), version_of(t, n, *c)))
                .collect();
            prop_assert_eq!(&holds[i], &expected, "what the client holds of {}", t);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn sotw_requests_and_snapshots_keep_the_invariants(ops in prop::collection::vec(sotw_op(), 1..40)) {
        run_sotw(ops)?;
    }

    #[test]
    fn delta_requests_and_snapshots_keep_the_invariants(ops in prop::collection::vec(delta_op(), 1..40)) {
        run_delta(ops)?;
    }
}
