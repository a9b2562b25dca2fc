//! Envoy-like ADS client streams for the load benchmark, SotW and delta: wildcard CDS and
//! LDS, then EDS for the clusters' service names and RDS for the route configurations the
//! listeners name, ACKing every response — what a sidecar does, minus applying it.
//!
//! The streams of one run share a [`Fleet`]: it counts what they receive, records when
//! each is fully configured, and, while a [`Step`] is active (an edit), when each has
//! ACKed a response showing it. Stream 0 also keeps what it holds, so the run can be
//! replayed by the null server.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::mesh::Sidecar;
use super::wire::{
    CapturedResource, CapturedStep, CapturedType, RawDeltaResponse, RawResponse, SotwAck,
    SotwNames, cluster_eds_name, listener_rds_names, resource_name,
};

pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const TYPES: [&str; 4] = [CLUSTER, ENDPOINT, LISTENER, ROUTE];

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Which ADS flavour the streams speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Sotw,
    Delta,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sotw => "SotW",
            Mode::Delta => "delta",
        }
    }
}

/// What shows that a stream has a change.
#[derive(Clone, Debug)]
pub enum Check {
    /// A response carrying these bytes.
    Contains(String),
    /// A response that drops the resource whose name contains this: a cluster response
    /// without it (SotW), or a removal naming it (delta).
    Gone(String),
}

/// One change being measured.
#[derive(Debug)]
pub struct Step {
    check: Check,
    finder: regex::bytes::Regex,
    started: Instant,
    reached: Mutex<Vec<Option<Duration>>>,
    count: AtomicUsize,
}

impl Step {
    pub fn new(check: Check, streams: usize) -> Arc<Step> {
        let needle = match &check {
            Check::Contains(s) | Check::Gone(s) => regex::escape(s),
        };
        Arc::new(Step {
            finder: regex::bytes::Regex::new(&needle).expect("an escaped literal"),
            check,
            started: Instant::now(),
            reached: Mutex::new(vec![None; streams]),
            count: AtomicUsize::new(0),
        })
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// Streams that have the change.
    pub fn reached(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// When each stream ACKed the change, from the step's start.
    pub fn times(&self) -> Vec<Option<Duration>> {
        self.reached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn mark(&self, stream: usize, at: Instant) {
        let mut reached = self.reached.lock().unwrap_or_else(|e| e.into_inner());
        if reached[stream].is_none() {
            reached[stream] = Some(at.saturating_duration_since(self.started));
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What one stream holds of one type: name → (version, encoded `Any`).
type Held = BTreeMap<String, (String, Bytes)>;

/// The streams of one run.
#[derive(Debug)]
pub struct Fleet {
    started: Instant,
    bytes: AtomicU64,
    messages: AtomicU64,
    /// Nanoseconds after `started` of the last message received.
    last_message: AtomicU64,
    configured: Mutex<Vec<Option<Duration>>>,
    configured_count: AtomicUsize,
    failed: AtomicUsize,
    step: Mutex<Option<Arc<Step>>>,
    /// What stream 0 holds, by type URL: name → (version, encoded Any). SotW resources
    /// have no names on the wire; they are numbered.
    held: Mutex<BTreeMap<String, Held>>,
    interner: Mutex<std::collections::HashSet<Arc<str>>>,
}

impl Fleet {
    pub fn new(streams: usize) -> Arc<Fleet> {
        Arc::new(Fleet {
            started: Instant::now(),
            bytes: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            last_message: AtomicU64::new(0),
            configured: Mutex::new(vec![None; streams]),
            configured_count: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            step: Mutex::new(None),
            held: Mutex::new(BTreeMap::new()),
            interner: Mutex::new(Default::default()),
        })
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// Bytes of responses received (gRPC framing included).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }

    /// How long ago the last response arrived.
    pub fn quiet_for(&self) -> Duration {
        let last = Duration::from_nanos(self.last_message.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }

    pub fn configured(&self) -> usize {
        self.configured_count.load(Ordering::Relaxed)
    }

    /// Time from the start of the run until each stream was fully configured.
    pub fn configured_times(&self) -> Vec<Option<Duration>> {
        self.configured
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn failed(&self) -> usize {
        self.failed.load(Ordering::Relaxed)
    }

    /// Starts measuring `step` (replacing any other).
    pub fn begin(&self, step: Arc<Step>) {
        *self.step.lock().unwrap_or_else(|e| e.into_inner()) = Some(step);
    }

    pub fn end_step(&self) {
        *self.step.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// What stream 0 holds now.
    pub fn capture(&self) -> CapturedStep {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        CapturedStep {
            types: held
                .iter()
                .map(|(type_url, resources)| CapturedType {
                    type_url: type_url.clone(),
                    resources: resources
                        .iter()
                        .map(|(name, (version, any))| CapturedResource {
                            name: name.clone(),
                            version: version.clone(),
                            any: any.clone(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    fn intern(&self, name: &str) -> Arc<str> {
        let mut names = self.interner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = names.get(name) {
            return existing.clone();
        }
        let name: Arc<str> = name.into();
        names.insert(name.clone());
        name
    }

    fn received(&self, bytes: usize) {
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.messages.fetch_add(1, Ordering::Relaxed);
        let at = self.started.elapsed().as_nanos() as u64;
        self.last_message.fetch_max(at, Ordering::Relaxed);
    }

    fn mark_configured(&self, stream: usize) {
        let mut configured = self.configured.lock().unwrap_or_else(|e| e.into_inner());
        if configured[stream].is_none() {
            configured[stream] = Some(self.started.elapsed());
            self.configured_count.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn current_step(&self) -> Option<Arc<Step>> {
        self.step.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The node of a sidecar, as Envoy's Istio agent fills it.
pub fn node(sidecar: &Sidecar) -> Node {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_string())),
    };
    let labels = Struct {
        fields: [
            ("app".to_string(), string(&sidecar.app)),
            ("version".to_string(), string(&sidecar.version)),
        ]
        .into(),
    };
    Node {
        id: sidecar.node_id(),
        metadata: Some(Struct {
            fields: [
                ("NAMESPACE".to_string(), string(&sidecar.namespace)),
                (
                    "LABELS".to_string(),
                    Value {
                        kind: Some(Kind::StructValue(labels)),
                    },
                ),
                ("INSTANCE_IPS".to_string(), string(&sidecar.ip)),
            ]
            .into(),
        }),
        ..Default::default()
    }
}

/// Runs stream `index` against `url` until the server ends it or the task is aborted.
/// A stream that fails before its first response is opened again (as Envoy does, with
/// backoff); one that fails later is counted as failed.
pub async fn run(index: usize, node: Node, url: String, mode: Mode, fleet: Arc<Fleet>) {
    let mut result = Ok(());
    for attempt in 0..10u64 {
        let mut answered = false;
        result = open(index, node.clone(), &url, None, mode, &fleet, &mut answered).await;
        if result.is_ok() || answered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
    }
    if let Err(e) = result {
        fleet.failed.fetch_add(1, Ordering::Relaxed);
        if fleet.failed() <= 5 {
            eprintln!("stream {index}: {e:#}");
        }
    }
}

/// One stream of `index` on its own connection to `url` (from the source address `local`,
/// when given: a pod of its own, as the server's per-peer admission sees it), until the
/// server ends it. `answered` is set once a response arrived.
pub async fn open(
    index: usize,
    node: Node,
    url: &str,
    local: Option<IpAddr>,
    mode: Mode,
    fleet: &Fleet,
    answered: &mut bool,
) -> Result<()> {
    match mode {
        Mode::Sotw => sotw(index, node, url, local, fleet, answered).await,
        Mode::Delta => delta(index, node, url, local, fleet, answered).await,
    }
}

async fn connect(
    url: &str,
    local: Option<IpAddr>,
) -> Result<tonic::client::Grpc<tonic::transport::Channel>> {
    let mut last = None;
    // A connection refused while thousands connect at once is retried, as Envoy would.
    for attempt in 0..20u64 {
        match tonic::transport::Endpoint::from_shared(url.to_string())?
            .local_address(local)
            .connect()
            .await
        {
            Ok(channel) => {
                let mut grpc = tonic::client::Grpc::new(channel);
                grpc.ready().await.context("channel ready")?;
                return Ok(grpc);
            }
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
            }
        }
    }
    bail!("cannot connect to {url}: {last:?}")
}

/// What a stream asks for first, as Envoy does: clusters, then listeners (RDS and EDS
/// follow from their answers).
const FIRST_TYPES: [&str; 2] = [CLUSTER, LISTENER];

/// Opens an ADS stream at `path` (SotW or delta) and sends the first requests,
/// `first(node, type_url)` for each of [`FIRST_TYPES`], the node only on the first.
async fn open_ads<Req, Resp>(
    node: &Node,
    url: &str,
    local: Option<IpAddr>,
    path: &'static str,
    first: impl Fn(Option<Node>, &'static str) -> Req,
) -> Result<(mpsc::UnboundedSender<Req>, tonic::Streaming<Resp>)>
where
    Req: Message + Send + 'static,
    Resp: Message + Default + Send + 'static,
{
    let mut grpc = connect(url, local).await?;
    let (tx, rx) = mpsc::unbounded_channel::<Req>();
    for (i, type_url) in FIRST_TYPES.into_iter().enumerate() {
        tx.send(first((i == 0).then(|| node.clone()), type_url))
            .map_err(|_| anyhow::anyhow!("request channel closed"))?;
    }
    let inbound = grpc
        .streaming(
            tonic::Request::new(UnboundedReceiverStream::new(rx)),
            hyper::http::uri::PathAndQuery::from_static(path),
            tonic_prost::ProstCodec::<Req, Resp>::default(),
        )
        .await?
        .into_inner();
    Ok((tx, inbound))
}

/// Per type on a SotW stream.
#[derive(Default)]
struct SotwType {
    nonce: String,
    version: String,
    names: Vec<Arc<str>>,
    /// `names`, encoded as the requests carry them.
    encoded_names: SotwNames,
    /// A response arrived since the last request.
    answered: bool,
    requested: bool,
}

async fn sotw(
    index: usize,
    node: Node,
    url: &str,
    local: Option<IpAddr>,
    fleet: &Fleet,
    answered: &mut bool,
) -> Result<()> {
    let (tx, mut inbound) =
        open_ads::<_, RawResponse>(&node, url, local, SOTW_PATH, |node, type_url| SotwAck {
            node,
            type_url: type_url.into(),
            ..Default::default()
        })
        .await?;
    let mut types: HashMap<&'static str, SotwType> = HashMap::new();
    for type_url in FIRST_TYPES {
        types.entry(type_url).or_default().requested = true;
    }
    let mut configured = false;
    while let Some(response) = inbound.message().await? {
        *answered = true;
        fleet.received(response.encoded_len() + 5);
        let Some(type_url) = TYPES.iter().copied().find(|t| *t == response.type_url) else {
            continue;
        };
        // What this response makes the client ask next (EDS after CDS, RDS after LDS).
        let follow = match type_url {
            CLUSTER => Some((
                ENDPOINT,
                names_of(fleet, &response.resources, |any| {
                    cluster_eds_name(any)
                        .and_then(|(_, eds)| eds)
                        .into_iter()
                        .collect()
                }),
            )),
            LISTENER => Some((
                ROUTE,
                names_of(fleet, &response.resources, |any| {
                    listener_rds_names(any).map(|(_, r)| r).unwrap_or_default()
                }),
            )),
            _ => None,
        };
        let state = types.entry(type_url).or_default();
        state.nonce = response.nonce.clone();
        state.version = response.version_info.clone();
        state.answered = true;
        tx.send(SotwAck {
            version_info: state.version.clone(),
            type_url: type_url.into(),
            response_nonce: state.nonce.clone(),
            names: state.encoded_names.clone(),
            ..Default::default()
        })?;
        let acked = Instant::now();
        if let Some((child, names)) = follow {
            let child_state = types.entry(child).or_default();
            if names != child_state.names {
                child_state.encoded_names = SotwNames::new(names.iter().map(|n| &**n));
                child_state.names = names;
                child_state.answered = false;
                child_state.requested = true;
                tx.send(SotwAck {
                    version_info: child_state.version.clone(),
                    type_url: child.into(),
                    response_nonce: child_state.nonce.clone(),
                    names: child_state.encoded_names.clone(),
                    ..Default::default()
                })?;
            }
        }
        if let Some(step) = fleet.current_step() {
            let has_it = match &step.check {
                Check::Contains(_) => response.resources.iter().any(|r| step.finder.is_match(r)),
                Check::Gone(_) => {
                    type_url == CLUSTER
                        && !response.resources.iter().any(|r| step.finder.is_match(r))
                }
            };
            if has_it {
                step.mark(index, acked);
            }
        }
        if index == 0 {
            // As Envoy holds them: LDS and CDS replaced, RDS and EDS merged (a response may
            // carry only what changed), and what no listener or cluster names any more
            // dropped. SotW has no versions on the wire: a content hash stands in.
            let mut held = fleet.held.lock().unwrap_or_else(|e| e.into_inner());
            let of_type = held.entry(type_url.to_string()).or_default();
            if !matches!(type_url, ROUTE | ENDPOINT) {
                of_type.clear();
            }
            for (i, any) in response.resources.iter().enumerate() {
                let name = resource_name(any).unwrap_or_else(|| format!("{i:06}"));
                let version = {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::hash::DefaultHasher::new();
                    any.hash(&mut h);
                    format!("{:016x}", h.finish())
                };
                of_type.insert(name, (version, any.clone()));
            }
            for child in [ROUTE, ENDPOINT] {
                if let (Some(of_child), Some(state)) = (held.get_mut(child), types.get(child)) {
                    of_child.retain(|n, _| {
                        state
                            .names
                            .binary_search_by(|x| (**x).cmp(n.as_str()))
                            .is_ok()
                    });
                }
            }
        }
        if !configured
            && [CLUSTER, LISTENER, ENDPOINT, ROUTE].iter().all(|t| {
                types
                    .get(t)
                    .is_some_and(|s| s.answered || (!s.requested && s.names.is_empty()))
            })
        {
            configured = true;
            fleet.mark_configured(index);
        }
    }
    Ok(())
}

/// The sorted, deduplicated names `extract` finds in `resources`, interned.
fn names_of(
    fleet: &Fleet,
    resources: &[Bytes],
    extract: impl Fn(&[u8]) -> Vec<String>,
) -> Vec<Arc<str>> {
    let names: BTreeSet<String> = resources.iter().flat_map(|r| extract(r)).collect();
    names.iter().map(|n| fleet.intern(n)).collect()
}

/// Per type on a delta stream.
#[derive(Default)]
struct DeltaType {
    /// Resource → the names it makes the client ask for (a cluster's EDS name, a
    /// listener's route configurations).
    held: HashMap<Arc<str>, Vec<Arc<str>>>,
    subscribed: BTreeSet<Arc<str>>,
    answered: bool,
    requested: bool,
}

async fn delta(
    index: usize,
    node: Node,
    url: &str,
    local: Option<IpAddr>,
    fleet: &Fleet,
    answered: &mut bool,
) -> Result<()> {
    let (tx, mut inbound) =
        open_ads::<_, RawDeltaResponse>(&node, url, local, DELTA_PATH, |node, type_url| {
            DeltaDiscoveryRequest {
                node,
                type_url: type_url.into(),
                ..Default::default()
            }
        })
        .await?;
    let mut types: HashMap<&'static str, DeltaType> = HashMap::new();
    for type_url in FIRST_TYPES {
        types.entry(type_url).or_default().requested = true;
    }
    let mut configured = false;
    while let Some(response) = inbound.message().await? {
        *answered = true;
        fleet.received(response.encoded_len() + 5);
        let Some(type_url) = TYPES.iter().copied().find(|t| *t == response.type_url) else {
            continue;
        };
        let child = match type_url {
            CLUSTER => Some(ENDPOINT),
            LISTENER => Some(ROUTE),
            _ => None,
        };
        let state = types.entry(type_url).or_default();
        state.answered = true;
        for name in &response.removed_resources {
            state.held.remove(name.as_str());
        }
        for resource in &response.resources {
            let follows: Vec<Arc<str>> = match type_url {
                CLUSTER => cluster_eds_name(&resource.resource)
                    .and_then(|(_, eds)| eds)
                    .map(|n| fleet.intern(&n))
                    .into_iter()
                    .collect(),
                LISTENER => listener_rds_names(&resource.resource)
                    .map(|(_, names)| names.iter().map(|n| fleet.intern(n)).collect())
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            state.held.insert(fleet.intern(&resource.name), follows);
        }
        let wanted: BTreeSet<Arc<str>> = state.held.values().flatten().cloned().collect();
        tx.send(DeltaDiscoveryRequest {
            type_url: type_url.into(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        })?;
        let acked = Instant::now();
        if let Some(child) = child {
            let child_state = types.entry(child).or_default();
            let subscribe: Vec<String> = wanted
                .difference(&child_state.subscribed)
                .map(|n| n.to_string())
                .collect();
            let unsubscribe: Vec<String> = child_state
                .subscribed
                .difference(&wanted)
                .map(|n| n.to_string())
                .collect();
            if !subscribe.is_empty() || !unsubscribe.is_empty() {
                if !subscribe.is_empty() {
                    child_state.answered = false;
                }
                child_state.requested = true;
                child_state.subscribed = wanted;
                tx.send(DeltaDiscoveryRequest {
                    type_url: child.into(),
                    resource_names_subscribe: subscribe,
                    resource_names_unsubscribe: unsubscribe,
                    ..Default::default()
                })?;
            }
        }
        if let Some(step) = fleet.current_step() {
            let has_it = match &step.check {
                Check::Contains(_) => response
                    .resources
                    .iter()
                    .any(|r| step.finder.is_match(&r.resource)),
                Check::Gone(_) => response
                    .removed_resources
                    .iter()
                    .any(|r| step.finder.is_match(r.as_bytes())),
            };
            if has_it {
                step.mark(index, acked);
            }
        }
        if index == 0 {
            let mut held = fleet.held.lock().unwrap_or_else(|e| e.into_inner());
            let of_type = held.entry(type_url.to_string()).or_default();
            for name in &response.removed_resources {
                of_type.remove(name);
            }
            for r in &response.resources {
                of_type.insert(r.name.clone(), (r.version.clone(), r.resource.clone()));
            }
        }
        if !configured
            && [CLUSTER, LISTENER, ENDPOINT, ROUTE].iter().all(|t| {
                types
                    .get(t)
                    .is_some_and(|s| s.answered || (!s.requested && s.subscribed.is_empty()))
            })
        {
            configured = true;
            fleet.mark_configured(index);
        }
    }
    Ok(())
}
