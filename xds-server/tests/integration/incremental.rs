//! Incremental generation (`GeneratedSnapshot::following`): a snapshot takes from the one
//! it replaces what the change did not touch. Asserted by counts (how many resources of
//! each part were generated after a one-service VirtualService edit) and by content: for
//! random meshes and random edits, every resource an incrementally made snapshot serves
//! is byte-identical to a snapshot generated from scratch. Also the audit's share of it
//! (only new content is decoded) and the bound on cached scopes when clients claim
//! made-up namespaces and localities.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use pilotfish_mesh::document::{parse_text, to_inputs};
use pilotfish_mesh::model::{Proxy, ProxyGenerator};
use pilotfish_mesh::push_context::{BuildInputs, JwksOutcome, JwksSource, PushContext, build};
use pilotfish_xds::ads::{ChangeKind, XdsSnapshot, XdsType};
use pilotfish_xds::generate::scope::Part;
use pilotfish_xds::generate::{Auditor, GeneratedSnapshot, check_snapshot};
use proptest::prelude::*;

const NAMESPACES: usize = 3;
const TYPES: [XdsType; 4] = [
    XdsType::Cluster,
    XdsType::Endpoint,
    XdsType::Listener,
    XdsType::Route,
];

/// A small mesh, every part of it switchable, so random edits touch every input kind.
#[derive(Clone, Debug)]
struct Mesh {
    /// Per service: present, HTTP (else TCP), endpoint address octet.
    services: Vec<(bool, bool, u8)>,
    /// Per service: a VirtualService splitting `weight` to the service and the rest to the
    /// next service.
    virtual_services: Vec<Option<u32>>,
    /// Per service: a DestinationRule with two subsets.
    destination_rules: Vec<bool>,
    /// The first VirtualService matches on the `sourceLabels` of svc0's workload.
    source_labels: bool,
    /// A VirtualService for `*.example.com` (a ServiceEntry host routes by it).
    wildcard: Option<u32>,
    /// PeerAuthentication STRICT in ns0.
    strict: bool,
    /// A RequestAuthentication for svc0's workload whose jwksUri's key set is at this
    /// revision (the controller's resolver fetched it; 0: the fetch failed).
    jwt: Option<u8>,
    /// An AuthorizationPolicy in ns0 denying svc0's workload one port (its content changes
    /// while its place in the snapshot does not).
    authz: Option<u8>,
}

impl Mesh {
    fn new(n: usize) -> Mesh {
        Mesh {
            services: (0..n).map(|i| (true, i % 5 != 4, 1)).collect(),
            virtual_services: (0..n).map(|i| (i % 3 == 0).then_some(80)).collect(),
            destination_rules: (0..n).map(|i| i % 4 == 1).collect(),
            source_labels: false,
            wildcard: None,
            strict: false,
            jwt: None,
            authz: None,
        }
    }

    fn yaml(&self) -> String {
        let n = self.services.len();
        let ns = |i: usize| format!("ns{}", i % NAMESPACES);
        let mut out = String::from(
            "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: ns0}
spec:
  hosts: [ext.example.com]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: DNS
",
        );
        for (i, (present, http, octet)) in self.services.iter().enumerate() {
            if !present {
                continue;
            }
            let port = if *http { "http" } else { "tcp" };
            out += &format!(
                "---
apiVersion: v1
kind: Service
metadata: {{name: svc{i}, namespace: {ns}}}
spec:
  clusterIP: 10.96.0.{ip}
  selector: {{app: svc{i}}}
  ports: [{{name: {port}, port: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: svc{i}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: svc{i}}}}}
addressType: IPv4
ports: [{{name: {port}, port: 8080}}]
endpoints: [{{addresses: [10.1.{i}.{octet}]}}]
",
                ns = ns(i),
                ip = i + 1,
            );
        }
        let mut first = true;
        for (i, vs) in self.virtual_services.iter().enumerate() {
            let Some(weight) = vs else { continue };
            let next = (i + 1) % n;
            let matched = if first && self.source_labels {
                "  - match: [{sourceLabels: {app: svc0}}]\n    route: [{destination: {host: svc0.ns0.svc.cluster.local}}]\n"
            } else {
                ""
            };
            first = false;
            out += &format!(
                "---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: svc{i}, namespace: {ns}}}
spec:
  hosts: [svc{i}]
  http:
{matched}  - route:
    - destination: {{host: svc{i}}}
      weight: {weight}
    - destination: {{host: svc{next}.{next_ns}.svc.cluster.local}}
      weight: {rest}
",
                ns = ns(i),
                next_ns = ns(next),
                rest = 100 - weight,
            );
        }
        for (i, dr) in self.destination_rules.iter().enumerate() {
            if *dr {
                out += &format!(
                    "---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: svc{i}, namespace: {ns}}}
spec:
  host: svc{i}
  trafficPolicy: {{connectionPool: {{tcp: {{maxConnections: 10}}}}}}
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
",
                    ns = ns(i),
                );
            }
        }
        if let Some(weight) = self.wildcard {
            out += &format!(
                "---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: wild, namespace: ns0}}
spec:
  hosts: ['*.example.com']
  http:
  - route:
    - destination: {{host: svc0.ns0.svc.cluster.local}}
      weight: {weight}
    - destination: {{host: ext.example.com}}
      weight: {rest}
",
                rest = 100 - weight,
            );
        }
        if self.strict {
            out += "---
apiVersion: security.istio.io/v1beta1
kind: PeerAuthentication
metadata: {name: default, namespace: ns0}
spec:
  mtls: {mode: STRICT}
";
        }
        if self.jwt.is_some() {
            out += "---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: tokens, namespace: ns0}
spec:
  selector: {matchLabels: {app: svc0}}
  jwtRules: [{issuer: 'https://issuer.example.com', jwksUri: 'https://keys.example.com/jwks.json'}]
";
        }
        if let Some(port) = self.authz {
            out += &format!(
                "---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: deny-port, namespace: ns0}}
spec:
  selector: {{matchLabels: {{app: svc0}}}}
  action: DENY
  rules: [{{to: [{{operation: {{ports: ['{}']}}}}]}}]
",
                8000 + u32::from(port)
            );
        }
        out
    }

    fn push(&self) -> Arc<PushContext> {
        let parsed = parse_text(Path::new("mesh.yaml"), &self.yaml());
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let inputs = to_inputs(
            &parsed.objects,
            BuildInputs {
                cluster_domain: "cluster.local".into(),
                jwks: self.key_sets(),
                ..Default::default()
            },
        );
        // Objects the builder rejects (a route to a removed service) are left out the
        // same way for both snapshots compared.
        Arc::new(build(&inputs, None).context)
    }
}

impl Mesh {
    fn key_sets(&self) -> BTreeMap<JwksSource, JwksOutcome> {
        let Some(revision) = self.jwt else {
            return BTreeMap::new();
        };
        let outcome = match revision {
            0 => JwksOutcome::Failed("connection refused".into()),
            r => JwksOutcome::Keys(format!(
                r#"{{"keys":[{{"kty":"RSA","kid":"r{r}","e":"AQAB","n":"xAE7eB6qugXyCAG3"}}]}}"#
            )),
        };
        BTreeMap::from([(
            JwksSource {
                issuer: "https://issuer.example.com".into(),
                jwks_uri: "https://keys.example.com/jwks.json".into(),
            },
            outcome,
        )])
    }
}

/// Per namespace: svc0's workload (or its namespace's first service's), a sidecar
/// without labels, a proxyless client.
fn proxies() -> Vec<Proxy> {
    let mut out = Vec::new();
    for n in 0..NAMESPACES {
        let ns = format!("ns{n}");
        let sidecar = |labels: Vec<(String, String)>, id: &str| Proxy {
            namespace: ns.clone(),
            labels: labels.into_iter().collect(),
            ..Proxy::with_defaults(format!(
                "sidecar~10.0.{n}.1~{id}.{ns}~{ns}.svc.cluster.local"
            ))
        };
        out.push(sidecar(vec![("app".into(), format!("svc{n}"))], "w"));
        out.push(sidecar(Vec::new(), "bare"));
        out.push(Proxy {
            generator: ProxyGenerator::Grpc,
            ..sidecar(Vec::new(), "grpc")
        });
    }
    out
}

/// Everything `snapshot` serves `proxies`: per proxy and type, name → (version, bytes).
type Served = Vec<BTreeMap<String, (String, Vec<u8>)>>;

fn served(snapshot: &GeneratedSnapshot, proxies: &[Proxy]) -> Served {
    let mut out = Vec::new();
    for proxy in proxies {
        for kind in TYPES {
            out.push(
                snapshot
                    .all(proxy, kind)
                    .into_iter()
                    .map(|(name, r)| (name, (r.version.clone(), r.body.value.to_vec())))
                    .collect(),
            );
        }
    }
    out
}

/// [`served`] as ADS streams of `streams` get it: through `stream_parts`, which keeps
/// what it derived from each stream's proxy (its scope) per snapshot and may take it from
/// the previous snapshot (merged as `GeneratedSnapshot::all` merges parts).
fn streamed(snapshot: &GeneratedSnapshot, streams: &[Arc<Proxy>]) -> Served {
    let mut out = Vec::new();
    for proxy in streams {
        for kind in TYPES {
            let mut resources = BTreeMap::new();
            for part in snapshot.stream_parts(proxy, kind) {
                for (name, r) in part.iter() {
                    resources.insert(name.clone(), (r.version.clone(), r.body.value.to_vec()));
                }
            }
            out.push(resources);
        }
    }
    out
}

fn generated(snapshot: &GeneratedSnapshot, part: Part) -> u64 {
    snapshot.generated_resources(part)
}

#[test]
fn a_virtual_service_edit_regenerates_that_services_routing_only() {
    let proxies = proxies();
    let mut mesh = Mesh::new(30);
    let first = Arc::new(GeneratedSnapshot::new(mesh.push(), 1, ChangeKind::Full));
    let before = served(&first, &proxies);
    assert!(
        generated(&first, Part::Routes) > 30,
        "a fresh snapshot generates every route configuration"
    );

    let streams: Vec<Arc<Proxy>> = proxies.iter().cloned().map(Arc::new).collect();
    assert_eq!(streamed(&first, &streams), before);
    assert_eq!(first.stream_scopes_computed(), streams.len() as u64);
    assert!(first.plans_computed() >= NAMESPACES as u64);

    // svc3 (ns0) has a VirtualService: change its split.
    mesh.virtual_services[3] = Some(60);
    let edited = GeneratedSnapshot::following(&first, mesh.push(), 2);
    let after = served(&edited, &proxies);
    assert_ne!(before, after, "the edit changes something");
    // The same streams: their scopes and every scope's outbound plan are the previous
    // snapshot's (the edit changes neither).
    assert_eq!(streamed(&edited, &streams), after);
    assert_eq!(edited.stream_scopes_computed(), 0);
    assert_eq!(edited.plans_computed(), 0);

    // Per namespace: the sidecars' scope regenerates svc3's route configuration and the
    // port's catch-all (which lists every VirtualService-only host), the proxyless
    // client's scope svc3's route configuration; svc3's listener, `virtualOutbound` and
    // `0.0.0.0_8080` per sidecar scope. Nothing of clusters or endpoints.
    let scopes = NAMESPACES as u64;
    assert!(
        generated(&edited, Part::Routes) <= 3 * scopes,
        "route configurations generated: {}",
        generated(&edited, Part::Routes)
    );
    assert!(
        generated(&edited, Part::OutboundListeners) <= 3 * scopes,
        "listeners generated: {}",
        generated(&edited, Part::OutboundListeners)
    );
    for part in [
        Part::OutboundClusters,
        Part::InboundClusters,
        Part::Endpoints,
        Part::InboundListener,
    ] {
        assert_eq!(generated(&edited, part), 0, "{part:?}");
    }
    let (parts, resources) = edited.reused();
    assert!(
        parts > 0 && resources > 0,
        "{parts} parts, {resources} resources"
    );

    // And the content is exactly what a fresh snapshot of the same mesh serves.
    let fresh = GeneratedSnapshot::new(mesh.push(), 2, ChangeKind::Full);
    assert_eq!(after, served(&fresh, &proxies));
}

#[test]
fn a_snapshot_whose_predecessor_is_gone_generates_everything() {
    let proxies = proxies();
    let mut mesh = Mesh::new(12);
    let first = Arc::new(GeneratedSnapshot::new(mesh.push(), 1, ChangeKind::Full));
    served(&first, &proxies);
    mesh.virtual_services[3] = Some(60);
    let edited = GeneratedSnapshot::following(&first, mesh.push(), 2);
    drop(first);
    let after = served(&edited, &proxies);
    assert_eq!(edited.reused(), (0, 0));
    let fresh = GeneratedSnapshot::new(mesh.push(), 2, ChangeKind::Full);
    assert_eq!(after, served(&fresh, &proxies));
    assert_eq!(
        generated(&edited, Part::Routes),
        generated(&fresh, Part::Routes)
    );
}

/// One random edit of a mesh.
#[derive(Clone, Debug)]
enum Edit {
    Weight(usize, u32),
    ToggleVirtualService(usize),
    ToggleDestinationRule(usize),
    ToggleService(usize),
    Protocol(usize),
    Endpoint(usize, u8),
    SourceLabels,
    Wildcard(Option<u32>),
    Strict,
    Jwt(Option<u8>),
    Authz(Option<u8>),
}

const SERVICES: usize = 8;

fn edit() -> impl Strategy<Value = Edit> {
    let i = 0..SERVICES;
    prop_oneof![
        3 => (i.clone(), 1u32..100).prop_map(|(i, w)| Edit::Weight(i, w)),
        1 => i.clone().prop_map(Edit::ToggleVirtualService),
        1 => i.clone().prop_map(Edit::ToggleDestinationRule),
        1 => i.clone().prop_map(Edit::ToggleService),
        1 => i.clone().prop_map(Edit::Protocol),
        2 => (i, 1u8..4).prop_map(|(i, o)| Edit::Endpoint(i, o)),
        1 => Just(Edit::SourceLabels),
        1 => proptest::option::of(1u32..100).prop_map(Edit::Wildcard),
        1 => Just(Edit::Strict),
        1 => proptest::option::of(0u8..3).prop_map(Edit::Jwt),
        1 => proptest::option::of(0u8..3).prop_map(Edit::Authz),
    ]
}

impl Mesh {
    fn apply(&mut self, edit: &Edit) {
        match *edit {
            Edit::Weight(i, w) => self.virtual_services[i] = Some(w),
            Edit::ToggleVirtualService(i) => {
                self.virtual_services[i] = match self.virtual_services[i] {
                    Some(_) => None,
                    None => Some(50),
                }
            }
            Edit::ToggleDestinationRule(i) => {
                self.destination_rules[i] = !self.destination_rules[i]
            }
            Edit::ToggleService(i) => self.services[i].0 = !self.services[i].0,
            Edit::Protocol(i) => self.services[i].1 = !self.services[i].1,
            Edit::Endpoint(i, o) => self.services[i].2 = o,
            Edit::SourceLabels => self.source_labels = !self.source_labels,
            Edit::Wildcard(w) => self.wildcard = w,
            Edit::Strict => self.strict = !self.strict,
            Edit::Jwt(revision) => self.jwt = revision,
            Edit::Authz(port) => self.authz = port,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A chain of snapshots, each made from the one before it, serves exactly what
    /// snapshots generated from scratch serve. Sometimes the previous snapshot served
    /// only some proxies (its other parts were never generated).
    #[test]
    fn incremental_snapshots_equal_fresh_ones(
        edits in proptest::collection::vec((edit(), any::<bool>()), 1..5)
    ) {
        // And a sidecar in a namespace the mesh does not name (its scope is the class of
        // all such namespaces).
        let mut proxies = proxies();
        proxies.push(Proxy {
            namespace: "elsewhere".into(),
            labels: [("app".to_string(), "svc0".to_string())].into_iter().collect(),
            ..Proxy::with_defaults("sidecar~10.0.9.1~x.elsewhere~elsewhere.svc.cluster.local")
        });
        // The same proxies as streams, which keep their `Arc<Proxy>` from snapshot to
        // snapshot (what a snapshot remembers per stream may be carried along).
        let streams: Vec<Arc<Proxy>> = proxies.iter().cloned().map(Arc::new).collect();
        let mut mesh = Mesh::new(SERVICES);
        let mut previous = Arc::new(GeneratedSnapshot::new(mesh.push(), 1, ChangeKind::Full));
        served(&previous, &proxies);
        streamed(&previous, &streams);
        for (version, (edit, partly)) in (2..).zip(&edits) {
            mesh.apply(edit);
            let push = mesh.push();
            let next = Arc::new(GeneratedSnapshot::following(&previous, push.clone(), version));
            let (asked, asking): (&[Proxy], &[Arc<Proxy>]) = if *partly {
                (&proxies[..2], &streams[..2])
            } else {
                (&proxies, &streams)
            };
            let incremental = served(&next, asked);
            let fresh = GeneratedSnapshot::new(push, version, ChangeKind::Full);
            let expected = served(&fresh, asked);
            prop_assert_eq!(&incremental, &expected, "after {:?}", edit);
            prop_assert_eq!(&streamed(&next, asking), &expected, "streams, after {:?}", edit);
            previous = next;
        }
    }
}

/// What ADS streams of `proxies` would ask `snapshot` for: every type's parts (so their
/// scopes count as served, for the audit).
fn serve(snapshot: &GeneratedSnapshot, proxies: &[Proxy], kinds: &[XdsType]) {
    for proxy in proxies {
        let proxy = Arc::new(proxy.clone());
        for kind in kinds {
            snapshot.stream_parts(&proxy, *kind);
        }
    }
}

#[test]
fn the_audit_decodes_only_new_content() {
    let proxies = proxies();
    let mut mesh = Mesh::new(30);
    let first = Arc::new(GeneratedSnapshot::new(mesh.push(), 1, ChangeKind::Full));
    serve(&first, &proxies, &TYPES);
    let mut auditor = Auditor::default();
    assert_eq!(auditor.check(&first), Vec::new());
    let whole = auditor.decoded();
    assert!(
        whole > 100,
        "the first audit decodes every resource: {whole}"
    );
    assert_eq!(auditor.remembered() as u64, whole);

    mesh.virtual_services[3] = Some(60);
    let edited = GeneratedSnapshot::following(&first, mesh.push(), 2);
    serve(&edited, &proxies, &TYPES);
    assert_eq!(auditor.check(&edited), Vec::new());
    // New content per namespace: svc3's route configuration for sidecars and for
    // proxyless clients.
    let new = auditor.decoded() - whole;
    assert!(
        (1..=2 * NAMESPACES as u64).contains(&new),
        "decoded {new} new resources"
    );
    // Only the last snapshot's facts are kept.
    assert!(
        auditor.remembered() as u64 <= whole,
        "{}",
        auditor.remembered()
    );

    // A fresh check of the same snapshot's representative views finds nothing either.
    assert_eq!(check_snapshot(&edited), Vec::new());
}

/// The replica's audit checks the scopes streams were served, from the parts cached for
/// them, and generates nothing: a snapshot nobody asked for is not audited, and a scope
/// is audited once all its types' parts exist.
#[test]
fn the_audit_checks_what_was_served_and_generates_nothing() {
    let proxies = proxies();
    let mesh = Mesh::new(30);
    let snapshot = GeneratedSnapshot::new(mesh.push(), 1, ChangeKind::Full);
    let mut auditor = Auditor::default();
    assert_eq!(auditor.check(&snapshot), Vec::new());
    assert_eq!(auditor.decoded(), 0, "nothing served, nothing audited");
    assert_eq!(snapshot.generations(), 0, "the audit generated something");

    // Namespace ns0's three proxies, every type.
    serve(&snapshot, &proxies[..3], &TYPES);
    let generated = snapshot.generations();
    assert_eq!(auditor.check(&snapshot), Vec::new());
    assert_eq!(
        snapshot.generations(),
        generated,
        "the audit generated something"
    );
    let ns0 = auditor.decoded();
    assert!(ns0 > 50, "ns0's views decoded: {ns0}");

    // A sidecar of svc4's workload (ns1, a TCP port: an inbound listener no other proxy
    // shares) asked for clusters only: its inbound listener does not exist yet, so its
    // scope is not audited (and nothing is generated for it).
    let tcp_workload = [Proxy {
        namespace: "ns1".into(),
        labels: [("app".to_string(), "svc4".to_string())]
            .into_iter()
            .collect(),
        ..Proxy::with_defaults("sidecar~10.1.4.1~w4.ns1~ns1.svc.cluster.local")
    }];
    serve(&snapshot, &tcp_workload, &[XdsType::Cluster]);
    let generated = snapshot.generations();
    assert_eq!(auditor.check(&snapshot), Vec::new());
    assert_eq!(snapshot.generations(), generated);
    assert_eq!(
        auditor.decoded(),
        ns0,
        "a scope not fully served was audited"
    );

    // Once it has asked for every type, it is.
    serve(&snapshot, &tcp_workload, &TYPES);
    assert_eq!(auditor.check(&snapshot), Vec::new());
    assert!(
        auditor.decoded() > ns0,
        "ns1's sidecar view was not audited"
    );
}

/// A stream's parts are the parts of its proxy, whichever proxies asked before (each
/// stream's scope is remembered per snapshot), and the snapshot keeps no stream's proxy.
#[test]
fn stream_parts_are_the_proxys_parts_and_keep_no_proxy() {
    let mesh = Mesh::new(30);
    let snapshot = GeneratedSnapshot::new(mesh.push(), 1, ChangeKind::Full);
    let streams: Vec<Arc<Proxy>> = proxies().into_iter().map(Arc::new).collect();
    for _ in 0..2 {
        for proxy in &streams {
            for kind in TYPES {
                let ids = |parts: Vec<Arc<pilotfish_xds::ads::ResourceMap>>| {
                    parts.iter().map(Arc::as_ptr).collect::<Vec<_>>()
                };
                assert_eq!(
                    ids(snapshot.stream_parts(proxy, kind)),
                    ids(snapshot.parts(proxy, kind)),
                    "{} {kind:?}",
                    proxy.id
                );
            }
        }
    }
    let gone: Vec<_> = streams.iter().map(Arc::downgrade).collect();
    drop(streams);
    assert!(
        gone.iter().all(|p| p.upgrade().is_none()),
        "a proxy is kept"
    );
}

/// Namespaces, localities and label values a client makes up all fall into one class each:
/// thousands of such proxies cost the parts of one scope per flavour, not one per claim.
#[test]
fn made_up_namespaces_and_localities_share_one_scope() {
    let yaml = format!(
        "{}---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: svc0-locality, namespace: ns0}}
spec:
  host: svc0.ns0.svc.cluster.local
  trafficPolicy:
    outlierDetection: {{consecutive5xxErrors: 5}}
    loadBalancer:
      localityLbSetting:
        failoverPriority: [topology.istio.io/network]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: svc2, namespace: ns2}}
spec:
  hosts: [svc2]
  http:
  - match: [{{sourceNamespace: made-up-8}}]
    route: [{{destination: {{host: svc1.ns1.svc.cluster.local}}}}]
  - route: [{{destination: {{host: svc2}}}}]
",
        Mesh::new(6).yaml()
    );
    let parsed = parse_text(Path::new("mesh.yaml"), &yaml);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let inputs = to_inputs(
        &parsed.objects,
        BuildInputs {
            cluster_domain: "cluster.local".into(),
            ..Default::default()
        },
    );
    let push = Arc::new(build(&inputs, None).context);
    let snapshot = GeneratedSnapshot::new(push.clone(), 1, ChangeKind::Full);
    let claimed = |i: usize| {
        let ns = format!("made-up-{i}");
        let mut proxy = Proxy {
            namespace: ns.clone(),
            labels: [("topology.istio.io/network".to_string(), format!("net-{i}"))]
                .into_iter()
                .collect(),
            locality: Some(pilotfish_mesh::model::Locality {
                region: format!("region-{i}"),
                zone: format!("zone-{i}"),
                subzone: format!("subzone-{i}"),
            }),
            ..Proxy::with_defaults(format!("sidecar~10.9.0.1~p{i}.{ns}~{ns}.svc.cluster.local"))
        };
        if i % 2 == 1 {
            proxy.generator = ProxyGenerator::Grpc;
        }
        proxy
    };
    let first = served(&snapshot, &[claimed(0), claimed(1)]);
    for i in 0..3000 {
        let proxy = claimed(i);
        for kind in TYPES {
            snapshot.all(&proxy, kind);
        }
    }
    // Sidecar: 4 planned parts and 2 inbound; proxyless: 4 planned parts; and the
    // sidecar of made-up-8, a namespace svc2's VirtualService names: 4 planned parts.
    assert!(
        snapshot.cached_parts() <= 14,
        "{} parts cached",
        snapshot.cached_parts()
    );
    assert!(snapshot.generations() <= 14, "{}", snapshot.generations());
    // A made-up namespace gets what any other made-up namespace gets: generated apart,
    // in fresh snapshots, the output is the same.
    let apart = GeneratedSnapshot::new(push.clone(), 1, ChangeKind::Full);
    assert_eq!(first, served(&apart, &[claimed(2998), claimed(2999)]));
    // A namespace the snapshot names (here by a `sourceNamespace` match) is its own.
    let named = GeneratedSnapshot::new(push, 1, ChangeKind::Full);
    assert_ne!(
        served(&named, &[claimed(8)]),
        served(&named, &[claimed(10)]),
        "made-up-8 is matched by svc2's VirtualService"
    );
}

/// A rotated key set reaches the selected workload's inbound listener in a snapshot made
/// from the previous one (the policy's hash follows its key sets), and only there.
#[test]
fn a_rotated_key_set_regenerates_the_selected_workloads_inbound_listener() {
    let proxies = proxies();
    let mut mesh = Mesh::new(6);
    mesh.jwt = Some(1);
    let first = Arc::new(GeneratedSnapshot::new(mesh.push(), 1, ChangeKind::Full));
    let before = served(&first, &proxies);
    mesh.jwt = Some(2);
    let next = GeneratedSnapshot::following(&first, mesh.push(), 2);
    let after = served(&next, &proxies);
    let inbound = |served: &Served, proxy: usize| {
        // The listener type of one proxy, virtualInbound's bytes.
        served[proxy * TYPES.len() + 2]
            .get("virtualInbound")
            .map(|(_, bytes)| bytes.clone())
    };
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    // proxies()[0] is svc0's workload in ns0: its listener now carries revision 2.
    let old = text(inbound(&before, 0).expect("an inbound listener"));
    let new = text(inbound(&after, 0).expect("an inbound listener"));
    assert!(old.contains("\"kid\":\"r1\"") && new.contains("\"kid\":\"r2\""));
    // The bare sidecar of ns0 is not selected: no filter, unchanged.
    assert_eq!(inbound(&before, 1), inbound(&after, 1));
    assert!(!text(inbound(&after, 1).expect("an inbound listener")).contains("jwt_authn"));
}
