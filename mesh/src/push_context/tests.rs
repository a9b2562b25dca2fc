//! Builder and query tests: objects written as YAML, built, then asked what Istio would
//! answer.

use std::path::Path;

use super::*;
use crate::config::Severity;
use crate::document::{parse_text, to_inputs};
use crate::model::{EndpointHealth, Protocol, ProxyGenerator};

fn inputs(yaml: &str) -> BuildInputs {
    let parsed = parse_text(Path::new("test.yaml"), yaml);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    to_inputs(
        &parsed.objects,
        BuildInputs {
            cluster_domain: "cluster.local".into(),
            ..Default::default()
        },
    )
}

fn proxy(ns: &str, labels: &[(&str, &str)]) -> Proxy {
    Proxy {
        namespace: ns.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        generator: ProxyGenerator::Envoy,
        ..Proxy::with_defaults("test")
    }
}

fn dr(ns: &str, name: &str, host: &str, extra: &str, created: &str) -> String {
    format!(
        "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{created}\"}}\nspec:\n  host: {host}\n{extra}"
    )
}

const REVIEWS: &str = "\
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: bookinfo}
spec:
  clusterIP: 10.0.0.9
  ports: [{name: http, port: 9080}]
  selector: {app: reviews}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v1, namespace: bookinfo, labels: {app: reviews, version: v1}}
status: {podIPs: [{ip: 10.1.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v2, namespace: bookinfo, labels: {app: reviews, version: v2}}
status: {podIPs: [{ip: 10.1.0.2}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: reviews-x, namespace: bookinfo, labels: {kubernetes.io/service-name: reviews}}
addressType: IPv4
ports: [{name: http, port: 9080}]
endpoints:
- addresses: [10.1.0.1]
  targetRef: {kind: Pod, name: reviews-v1}
- addresses: [10.1.0.2]
  conditions: {ready: false, terminating: false}
  targetRef: {kind: Pod, name: reviews-v2}
";

const ROUTING: &str = "\
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews]
  http:
  - route:
    - {destination: {host: reviews, subset: v1}, weight: 80}
    - {destination: {host: reviews, subset: v2}, weight: 20}
";

#[test]
fn builds_services_endpoints_and_routes() {
    let out = build(&inputs(&format!("{REVIEWS}{ROUTING}")), None);
    assert!(out.findings.is_empty(), "{:?}", out.findings);
    let ctx = out.context;
    let svc = ctx
        .service_for("reviews.bookinfo.svc.cluster.local", "default")
        .unwrap();
    assert_eq!(svc.ports[0].protocol, Protocol::Http);
    let eps = ctx.endpoints(svc).unwrap().port(9080).unwrap();
    assert_eq!(eps.endpoints.len(), 2);
    assert_eq!(eps.endpoints[1].health, EndpointHealth::Unhealthy);
    assert_eq!(
        eps.endpoints[0].labels.get("version").map(String::as_str),
        Some("v1")
    );
    let vs = ctx
        .virtual_service_for_host("reviews.bookinfo.svc.cluster.local", "default")
        .unwrap();
    assert_eq!(
        vs.spec.http[0].route[0].destination.host,
        "reviews.bookinfo.svc.cluster.local"
    );
    let dr = ctx
        .destination_rule(&proxy("default", &[]), &svc.hostname, Some("bookinfo"))
        .unwrap();
    assert_eq!(dr.spec.subsets.len(), 2);
}

#[test]
fn invalid_objects_are_left_out_with_field_errors() {
    let bad = ROUTING.replace("weight: 20", "weight: -20");
    let out = build(&inputs(&format!("{REVIEWS}{bad}")), None);
    let errors: Vec<_> = out.errors().collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].key.to_string(), "VirtualService bookinfo/reviews");
    assert_eq!(errors[0].path, "spec.http[0].route[1].weight");
    assert!(out.context.virtual_services().is_empty());
    // The DestinationRule and the service are unaffected.
    assert_eq!(out.context.destination_rules().len(), 1);
    assert!(out.kept_previous.is_empty());
}

#[test]
fn an_invalid_edit_keeps_the_last_accepted_version() {
    let good = build(&inputs(&format!("{REVIEWS}{ROUTING}")), None);
    let bad = ROUTING.replace("weight: 20", "weight: -20");
    let out = build(&inputs(&format!("{REVIEWS}{bad}")), Some(&good.context));
    assert_eq!(out.kept_previous.len(), 1);
    let vs = &out.context.virtual_services()[0];
    assert_eq!(vs.spec.http[0].route[1].weight, Some(20));
    let err = out.errors().next().unwrap();
    assert!(err.message.contains("must not be negative"), "{err}");
    // Deleting the object removes it for good.
    let gone = build(&inputs(REVIEWS), Some(&out.context));
    assert!(gone.context.virtual_services().is_empty());
}

/// Istio judges a VirtualService alone: a subset that no DestinationRule defines does not
/// reject it. It is served as written (the route to the missing subset answers 503) and
/// the reference is reported as a warning naming the destination.
#[test]
fn an_undefined_subset_keeps_the_virtual_service_and_warns_on_the_route() {
    let edited = ROUTING.replace("subset: v2}", "subset: v9}");
    let out = build(&inputs(&format!("{REVIEWS}{edited}")), None);
    assert!(out.errors().next().is_none(), "{:?}", out.findings);
    assert!(out.kept_previous.is_empty());
    let vs = &out.context.virtual_services()[0];
    assert_eq!(
        vs.spec.http[0].route[1].destination.subset.as_deref(),
        Some("v9")
    );
    let warning = out
        .findings
        .iter()
        .find(|f| f.path == "spec.http[0].route[1].destination.subset")
        .expect("a warning on the destination");
    assert!(warning.message.contains("503"), "{warning}");
}

#[test]
fn destination_rule_precedence_follows_istio() {
    let root = "istio-system";
    let yaml = [
        REVIEWS.to_string(),
        dr(root, "mesh-wide", "\"*.svc.cluster.local\"", "  trafficPolicy: {tls: {mode: DISABLE}}\n", "2020-01-01T00:00:00Z"),
        dr("bookinfo", "svc-ns", "reviews", "  subsets: [{name: from-service-ns}]\n", "2020-01-02T00:00:00Z"),
        dr("client", "client-ns", "reviews.bookinfo.svc.cluster.local", "  subsets: [{name: from-client-ns}]\n", "2020-01-03T00:00:00Z"),
        dr(
            "client",
            "selected",
            "reviews.bookinfo.svc.cluster.local",
            "  workloadSelector: {matchLabels: {app: special}}\n  subsets: [{name: from-selector}]\n",
            "2020-01-04T00:00:00Z",
        ),
        dr("other", "private", "reviews.bookinfo.svc.cluster.local", "  exportTo: [\".\"]\n  subsets: [{name: private}]\n", "2020-01-01T00:00:00Z"),
    ]
    .concat();
    let ctx = build(&inputs(&yaml), None).context;
    let host = "reviews.bookinfo.svc.cluster.local";
    let names = |p: &Proxy| -> Vec<String> {
        ctx.destination_rule(p, host, Some("bookinfo"))
            .map(|d| d.spec.subsets.iter().map(|s| s.name.clone()).collect())
            .unwrap_or_default()
    };
    assert_eq!(
        names(&proxy("client", &[])),
        ["from-client-ns"],
        "proxy namespace first"
    );
    assert_eq!(
        names(&proxy("client", &[("app", "special")])),
        ["from-selector"],
        "selector rules first"
    );
    assert_eq!(
        names(&proxy("elsewhere", &[])),
        ["from-service-ns"],
        "then the service namespace"
    );
    assert_eq!(
        names(&proxy("other", &[])),
        ["private"],
        "exportTo . is visible at home"
    );
    // Root namespace (mesh-wide, wildcard host) for a host nobody else configures.
    let p = proxy("elsewhere", &[]);
    let mesh = ctx
        .destination_rule(&p, "ratings.bookinfo.svc.cluster.local", Some("bookinfo"))
        .unwrap();
    assert_eq!(mesh.sources[0].name, "mesh-wide");
}

#[test]
fn same_host_rules_merge_oldest_first_with_a_warning() {
    let yaml = [
        REVIEWS.to_string(),
        dr("bookinfo", "newer", "reviews", "  trafficPolicy: {loadBalancer: {simple: RANDOM}}\n  subsets: [{name: v1}, {name: v3}]\n", "2021-01-01T00:00:00Z"),
        dr("bookinfo", "older", "reviews", "  trafficPolicy: {loadBalancer: {simple: LEAST_REQUEST}}\n  subsets: [{name: v1}, {name: v2}]\n", "2020-01-01T00:00:00Z"),
    ]
    .concat();
    let out = build(&inputs(&yaml), None);
    let d = out
        .context
        .destination_rule(
            &proxy("bookinfo", &[]),
            "reviews.bookinfo.svc.cluster.local",
            None,
        )
        .unwrap();
    let subsets: Vec<_> = d.spec.subsets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(subsets, ["v1", "v2", "v3"]);
    assert_eq!(
        d.spec.traffic_policy.unwrap().load_balancer.unwrap().simple,
        Some(crate::api::SimpleLb::LeastRequest)
    );
    let warnings: Vec<_> = out
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Warning)
        .map(|f| f.path.as_str())
        .collect();
    assert_eq!(warnings, ["spec.subsets[0].name", "spec.trafficPolicy"]);
}

#[test]
fn virtual_service_precedence_visibility_and_gateways() {
    let vs = |ns: &str, name: &str, hosts: &str, extra: &str, created: &str| {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{created}\"}}\nspec:\n  hosts: {hosts}\n{extra}  http: [{{route: [{{destination: {{host: reviews.bookinfo.svc.cluster.local}}}}]}}]\n"
        )
    };
    let yaml = [
        REVIEWS.to_string(),
        vs("bookinfo", "newer", "[reviews]", "", "2021-01-01T00:00:00Z"),
        vs("bookinfo", "older", "[reviews]", "", "2020-01-01T00:00:00Z"),
        vs(
            "bookinfo",
            "wild",
            "[\"*.bookinfo.svc.cluster.local\"]",
            "",
            "2019-01-01T00:00:00Z",
        ),
        vs(
            "bookinfo",
            "gw-only",
            "[ratings]",
            "  gateways: [bookinfo-gateway]\n",
            "2019-01-01T00:00:00Z",
        ),
        vs(
            "bookinfo",
            "local",
            "[details]",
            "  exportTo: [\".\"]\n",
            "2019-01-01T00:00:00Z",
        ),
    ]
    .concat();
    let out = build(&inputs(&yaml), None);
    let ctx = &out.context;
    let pick = |host: &str, ns: &str| {
        ctx.virtual_service_for_host(host, ns)
            .map(|v| v.meta.name.clone())
    };
    assert_eq!(
        pick("reviews.bookinfo.svc.cluster.local", "x").as_deref(),
        Some("older"),
        "exact beats wildcard, oldest wins"
    );
    assert_eq!(
        pick("ratings.bookinfo.svc.cluster.local", "x").as_deref(),
        Some("wild"),
        "gateway-bound VS is not for sidecars"
    );
    assert_eq!(
        pick("details.bookinfo.svc.cluster.local", "x").as_deref(),
        Some("wild"),
        "exportTo . hides it elsewhere"
    );
    assert_eq!(
        pick("details.bookinfo.svc.cluster.local", "bookinfo").as_deref(),
        Some("local")
    );
    let conflict = out.findings.iter().find(|f| f.key.name == "newer").unwrap();
    assert!(
        conflict
            .message
            .contains("older VirtualService bookinfo/older"),
        "{conflict}"
    );
}

#[test]
fn service_entry_hosts_prefer_the_proxy_namespace() {
    let se = |ns: &str, created: &str, addr: &str| {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: ext, namespace: {ns}, creationTimestamp: \"{created}\"}}\nspec:\n  hosts: [db.example.com]\n  ports: [{{number: 5432, name: tcp, protocol: TCP}}]\n  resolution: STATIC\n  endpoints: [{{address: {addr}}}]\n"
        )
    };
    let ctx = build(
        &inputs(
            &[
                se("a", "2021-01-01T00:00:00Z", "10.9.0.1"),
                se("b", "2020-01-01T00:00:00Z", "10.9.0.2"),
            ]
            .concat(),
        ),
        None,
    )
    .context;
    let addr = |ns: &str| {
        let s = ctx.service_for("db.example.com", ns).unwrap();
        ctx.endpoints(s).unwrap().ports[0].endpoints[0]
            .address
            .clone()
    };
    assert_eq!(addr("a"), "10.9.0.1");
    assert_eq!(addr("b"), "10.9.0.2");
    assert_eq!(
        addr("c"),
        "10.9.0.2",
        "oldest when the proxy namespace has none"
    );
    assert_eq!(ctx.services_visible_to("c").len(), 1);
}

#[test]
fn delegates_are_expanded_and_unused_delegates_warned() {
    let yaml = format!(
        "{REVIEWS}{ROUTING}---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: root, namespace: bookinfo}}
spec:
  hosts: [bookinfo.example.com]
  http:
  - match: [{{uri: {{prefix: /reviews}}}}]
    delegate: {{name: reviews-delegate}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews-delegate, namespace: bookinfo}}
spec:
  http:
  - route: [{{destination: {{host: reviews, subset: v2}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: orphan, namespace: bookinfo}}
spec:
  http:
  - route: [{{destination: {{host: reviews}}}}]
"
    );
    let out = build(&inputs(&yaml), None);
    let root = out
        .context
        .virtual_services()
        .iter()
        .find(|v| v.meta.name == "root")
        .unwrap();
    assert_eq!(root.spec.http.len(), 1);
    assert!(root.spec.http[0].delegate.is_none());
    assert_eq!(
        root.spec.http[0].route[0].destination.subset.as_deref(),
        Some("v2")
    );
    assert_eq!(
        out.context.virtual_services().len(),
        2,
        "delegates are not served on their own"
    );
    let warning = out
        .findings
        .iter()
        .find(|f| f.key.name == "orphan")
        .unwrap();
    assert_eq!(warning.severity, Severity::Warning);
}

#[test]
fn endpoint_only_changes_are_recognised_and_the_cheap_path_matches_a_full_build() {
    let base = inputs(&format!("{REVIEWS}{ROUTING}"));
    let first = build(&base, None).context;
    let moved = inputs(&format!("{REVIEWS}{ROUTING}").replace(
        "conditions: {ready: false, terminating: false}",
        "conditions: {ready: true}",
    ));
    let full = build(&moved, Some(&first)).context;
    let summary = diff(&first, &full);
    assert!(summary.is_endpoints_only(), "{summary:?}");
    assert_eq!(summary.endpoints.len(), 1);
    let cheap = build_endpoints_only(&moved, &first);
    assert_eq!(cheap.data(), full.data());
    assert!(diff(&full, &cheap).is_empty());

    let rerouted = inputs(&format!("{REVIEWS}{ROUTING}").replace("weight: 20", "weight: 30"));
    let summary = diff(&first, &build(&rerouted, Some(&first)).context);
    assert!(!summary.is_endpoints_only());
    assert_eq!(summary.configs.len(), 1);
}

/// Istio 1.30's DestinationRule lookup under `exportTo` (push_context.go
/// `setDestinationRules`, `destinationRule`, `getExportedDestinationRuleFromNamespace`;
/// destination_rule.go `mergeDestinationRule`; sidecar.go `SidecarScope.DestinationRule`).
#[test]
fn destination_rule_export_to_follows_istio() {
    let host = "reviews.bookinfo.svc.cluster.local";
    let build_with = |docs: &[String], mesh_default: &[&str]| {
        let mut i = inputs(
            &[REVIEWS.to_string()]
                .iter()
                .chain(docs)
                .cloned()
                .collect::<String>(),
        );
        i.mesh.default_destination_rule_export_to =
            mesh_default.iter().map(|s| s.to_string()).collect();
        build(&i, None).context
    };
    let subsets = |ctx: &PushContext, p: &Proxy| -> Vec<String> {
        ctx.destination_rule(p, host, Some("bookinfo"))
            .map(|d| d.spec.subsets.iter().map(|s| s.name.clone()).collect())
            .unwrap_or_default()
    };
    let t = |n: u32| format!("2020-01-0{n}T00:00:00Z");

    // A rule exported by name to a client namespace, living in neither the client's, the
    // service's nor the root namespace, is never consulted.
    let ctx = build_with(
        &[dr(
            "third",
            "named",
            host,
            "  exportTo: [client]\n  subsets: [{name: third}]\n",
            &t(1),
        )],
        &[],
    );
    assert!(subsets(&ctx, &proxy("client", &[])).is_empty());

    // Exported by name from the service's namespace: seen by that client only.
    let ctx = build_with(
        &[dr(
            "bookinfo",
            "named",
            host,
            "  exportTo: [client]\n  subsets: [{name: svc}]\n",
            &t(1),
        )],
        &[],
    );
    assert_eq!(subsets(&ctx, &proxy("client", &[])), ["svc"]);
    assert!(subsets(&ctx, &proxy("other", &[])).is_empty());
    assert!(
        subsets(&ctx, &proxy("bookinfo", &[])).is_empty(),
        "exported by name only: not visible at home"
    );

    // The mesh default `.` makes rules without exportTo private; an explicit `*` is not.
    let docs = [
        dr(
            "bookinfo",
            "plain",
            host,
            "  subsets: [{name: plain}]\n",
            &t(1),
        ),
        dr(
            "istio-system",
            "root",
            "\"*.cluster.local\"",
            "  exportTo: [\"*\"]\n  subsets: [{name: root}]\n",
            &t(2),
        ),
    ];
    let ctx = build_with(&docs, &["."]);
    assert_eq!(subsets(&ctx, &proxy("client", &[])), ["root"]);
    assert_eq!(subsets(&ctx, &proxy("bookinfo", &[])), ["plain"]);
    // ... and a default naming namespaces does not restrict a rule without exportTo
    // (Istio honours only `.` in defaultDestinationRuleExportTo).
    let ctx = build_with(&docs, &["elsewhere"]);
    assert_eq!(subsets(&ctx, &proxy("client", &[])), ["plain"]);

    // Workload-selector rules apply only to their own namespace's workloads, the root
    // namespace's included; a namespace whose most specific rule for the host is a
    // selector rule that does not match gets no rule at all.
    let docs = [
        dr(
            "istio-system",
            "root-sel",
            host,
            "  workloadSelector: {matchLabels: {app: a}}\n  subsets: [{name: root-sel}]\n",
            &t(1),
        ),
        dr(
            "client",
            "sel",
            host,
            "  workloadSelector: {matchLabels: {app: a}}\n  subsets: [{name: sel}]\n",
            &t(2),
        ),
        dr("bookinfo", "svc", host, "  subsets: [{name: svc}]\n", &t(3)),
    ];
    let ctx = build_with(&docs, &[]);
    assert_eq!(subsets(&ctx, &proxy("client", &[("app", "a")])), ["sel"]);
    assert!(subsets(&ctx, &proxy("client", &[("app", "b")])).is_empty());
    assert_eq!(
        subsets(&ctx, &proxy("other", &[("app", "a")])),
        ["svc"],
        "a root selector rule is private to the root namespace"
    );
    assert_eq!(
        subsets(&ctx, &proxy("istio-system", &[("app", "a")])),
        ["root-sel"]
    );

    // Enhanced merge: same-host rules merge only with equal exportTo; otherwise each
    // stands alone and the later one wins where both are visible.
    let docs = [
        dr("bookinfo", "old", host, "  subsets: [{name: v1}]\n", &t(1)),
        dr("bookinfo", "same", host, "  subsets: [{name: v2}]\n", &t(2)),
        dr(
            "bookinfo",
            "private",
            host,
            "  exportTo: [\".\"]\n  subsets: [{name: v3}]\n",
            &t(3),
        ),
    ];
    let ctx = build_with(&docs, &[]);
    assert_eq!(subsets(&ctx, &proxy("client", &[])), ["v1", "v2"]);
    assert_eq!(subsets(&ctx, &proxy("bookinfo", &[])), ["v3"]);
    let merged = ctx
        .destination_rule(&proxy("client", &[]), host, Some("bookinfo"))
        .unwrap();
    let from: Vec<_> = merged.sources.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(from, ["old", "same"]);

    // A proxy in the root namespace looks at the root's private rules first, then the
    // service namespace's exported ones.
    let docs = [
        dr(
            "istio-system",
            "public",
            host,
            "  subsets: [{name: public}]\n",
            &t(1),
        ),
        dr("bookinfo", "svc", host, "  subsets: [{name: svc}]\n", &t(2)),
    ];
    let ctx = build_with(&docs, &[]);
    assert_eq!(subsets(&ctx, &proxy("istio-system", &[])), ["svc"]);
}

#[test]
fn virtual_service_export_to_tiers_and_mesh_default() {
    let vs = |ns: &str, name: &str, extra: &str, created: &str| {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{created}\"}}\nspec:\n  hosts: [reviews.bookinfo.svc.cluster.local]\n{extra}  http: [{{route: [{{destination: {{host: reviews.bookinfo.svc.cluster.local}}}}]}}]\n"
        )
    };
    let yaml = [
        REVIEWS.to_string(),
        vs("bookinfo", "public", "", "2019-01-01T00:00:00Z"),
        vs(
            "client",
            "named",
            "  exportTo: [client2]\n",
            "2020-01-01T00:00:00Z",
        ),
        vs(
            "client2",
            "private",
            "  exportTo: [\".\"]\n",
            "2021-01-01T00:00:00Z",
        ),
        vs(
            "client3",
            "own-public",
            "  exportTo: [\"*\"]\n",
            "2022-01-01T00:00:00Z",
        ),
        vs(
            "client4",
            "own-name",
            "  exportTo: [client4]\n",
            "2022-01-01T00:00:00Z",
        ),
    ]
    .concat();
    let mut i = inputs(&yaml);
    let pick = |ctx: &PushContext, ns: &str| {
        ctx.virtual_service_for_host("reviews.bookinfo.svc.cluster.local", ns)
            .map(|v| v.meta.name.clone())
            .unwrap_or_default()
    };
    let ctx = build(&i, None).context;
    assert_eq!(
        pick(&ctx, "client2"),
        "private",
        "private before named and public, age aside"
    );
    assert_eq!(pick(&ctx, "client"), "public", "exported to client2 only");
    assert_eq!(
        pick(&ctx, "client3"),
        "public",
        "own namespace but public: oldest public wins"
    );
    assert_eq!(
        pick(&ctx, "client4"),
        "own-name",
        "its own name counts as private"
    );
    assert_eq!(pick(&ctx, "x"), "public");

    i.mesh.default_virtual_service_export_to = vec![".".into()];
    let ctx = build(&i, None).context;
    assert_eq!(
        pick(&ctx, "x"),
        "own-public",
        "the mesh default hides VirtualServices without exportTo, not those exporting to *"
    );
    assert_eq!(pick(&ctx, "bookinfo"), "public");
    assert_eq!(pick(&ctx, "client3"), "own-public");
}

#[test]
fn service_export_to_annotation_service_entries_and_mesh_default() {
    let svc = |name: &str, annotation: &str| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: a{annotation}}}\nspec: {{clusterIP: 10.0.0.1, ports: [{{name: http, port: 80}}]}}\n"
        )
    };
    let ann = |v: &str| format!(", annotations: {{networking.istio.io/exportTo: \"{v}\"}}");
    let yaml = [
        svc("plain", ""),
        svc("local", &ann(".")),
        svc("named", &ann("b, c")),
        svc("nobody", &ann("~")),
        svc("odd", &ann("~,.")),
        "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ext, namespace: a}\nspec:\n  hosts: [api.example.com]\n  exportTo: [\"~\"]\n  ports: [{number: 443, name: tls, protocol: TLS}]\n  resolution: DNS\n".to_string(),
    ]
    .concat();
    let mut i = inputs(&yaml);
    let seen = |ctx: &PushContext, ns: &str| -> Vec<String> {
        ctx.services_visible_to(ns)
            .iter()
            .map(|s| s.name.clone())
            .collect()
    };
    let ctx = build(&i, None).context;
    assert_eq!(seen(&ctx, "a"), ["local", "plain"]);
    assert_eq!(seen(&ctx, "b"), ["named", "plain"]);
    assert_eq!(seen(&ctx, "z"), ["plain"]);
    i.mesh.default_service_export_to = vec![".".into()];
    let ctx = build(&i, None).context;
    assert_eq!(seen(&ctx, "z"), Vec::<String>::new());
    assert_eq!(seen(&ctx, "a"), ["local", "plain"]);
}

#[test]
fn a_delegate_not_exported_to_the_root_namespace_is_skipped_with_a_warning() {
    let yaml = format!(
        "{REVIEWS}---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: root, namespace: front}}
spec:
  hosts: [bookinfo.example.com]
  http:
  - match: [{{uri: {{prefix: /private}}}}]
    delegate: {{name: private, namespace: bookinfo}}
  - match: [{{uri: {{prefix: /shared}}}}]
    delegate: {{name: shared, namespace: bookinfo}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: private, namespace: bookinfo}}
spec:
  exportTo: [\".\"]
  http: [{{route: [{{destination: {{host: reviews}}}}]}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: shared, namespace: bookinfo}}
spec:
  exportTo: [front]
  http: [{{route: [{{destination: {{host: reviews}}}}]}}]
"
    );
    let out = build(&inputs(&yaml), None);
    let root = out
        .context
        .virtual_services()
        .iter()
        .find(|v| v.meta.name == "root")
        .expect("the root is served");
    assert_eq!(root.spec.http.len(), 1);
    let warning = out
        .findings
        .iter()
        .find(|f| f.key.name == "root" && f.path == "spec.http[0].delegate")
        .expect("a warning on the skipped route");
    assert_eq!(warning.severity, Severity::Warning);
    assert!(warning.message.contains("not exported"), "{warning}");
}

#[test]
fn sidecar_ingress_tls_is_kept_only_with_the_switch_as_istio() {
    let yaml = "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, namespace: a}\nspec:\n  ingress:\n  - port: {number: 9443, protocol: HTTPS, name: https}\n    defaultEndpoint: 127.0.0.1:8080\n    tls: {mode: SIMPLE, serverCertificate: /c.pem, privateKey: /k.pem}\n";
    let off = build(&inputs(yaml), None);
    assert!(
        off.context.sidecars()[0].spec.ingress[0].tls.is_none(),
        "Istio ignores it without ENABLE_TLS_ON_SIDECAR_INGRESS"
    );
    let warned: Vec<&str> = off.findings.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(warned, ["spec.ingress[0].tls"]);
    assert!(off.findings.iter().all(|f| !f.is_error()));
    let on = build(
        &BuildInputs {
            enable_tls_on_sidecar_ingress: true,
            ..inputs(yaml)
        },
        None,
    );
    assert!(on.context.sidecars()[0].spec.ingress[0].tls.is_some());
    assert!(on.findings.is_empty(), "{:?}", on.findings);
}

/// Only the hosts of a VirtualService that changed count as changed; a changed wildcard
/// host makes every host a candidate (unknown).
#[test]
fn virtual_service_hosts_changed_names_the_edited_hosts() {
    let vs = |name: &str, host: &str, weight: u32| {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: bookinfo}}\nspec:\n  hosts: [\"{host}\"]\n  http:\n  - route:\n    - destination: {{host: reviews}}\n      weight: {weight}\n    - destination: {{host: ratings}}\n      weight: {}\n",
            100 - weight
        )
    };
    let push = |extra: &str| build(&inputs(&format!("{REVIEWS}{extra}")), None).context;
    let before = push(&format!(
        "{}{}",
        vs("a", "a.example.com", 50),
        vs("b", "b.example.com", 50)
    ));
    let edited = push(&format!(
        "{}{}",
        vs("a", "a.example.com", 60),
        vs("b", "b.example.com", 50)
    ));
    let changed = virtual_service_hosts_changed(&before, &edited).expect("no wildcard");
    assert_eq!(changed, ["a.example.com".to_string()].into());
    assert_eq!(
        virtual_service_hosts_changed(&before, &before),
        Some(Default::default())
    );
    let wild = |w| {
        push(&format!(
            "{}{}",
            vs("a", "a.example.com", 50),
            vs("w", "*.example.com", w)
        ))
    };
    assert_eq!(virtual_service_hosts_changed(&wild(50), &wild(60)), None);
    assert!(virtual_service_hosts_changed(&wild(50), &wild(50)).is_some());
}
