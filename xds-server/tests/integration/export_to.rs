//! `exportTo` over the wire: one server, one snapshot (the `export-to` golden case), and
//! sidecars of three namespaces, each asking for every cluster and route configuration
//! over a real ADS stream — each gets what is exported to its own namespace.

use std::collections::BTreeSet;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use pilotfish_xds::ads::{AdsConfig, CLUSTER_TYPE, ChangeKind, ROUTE_TYPE, StampedSnapshot};
use pilotfish_xds::generate::GeneratedSnapshot;
use prost::Message;

use crate::harness::*;

fn sidecar_of(namespace: &str) -> String {
    format!("sidecar~10.1.7.1~app-1.{namespace}~{namespace}.svc.cluster.local")
}

async fn outbound_clusters(server: &TestServer, namespace: &str) -> BTreeSet<String> {
    let mut s = server
        .sotw(DiscoveryRequest {
            node: node(&sidecar_of(namespace)),
            ..request(CLUSTER_TYPE, &[], "")
        })
        .await
        .expect("stream");
    let r = s.recv().await;
    r.resources
        .iter()
        .map(|any| {
            Cluster::decode(any.value.as_slice())
                .expect("a Cluster")
                .name
        })
        .filter(|name| name.starts_with("outbound|"))
        .collect()
}

/// The route timeout the sidecar of `namespace` gets for `fqdn:8080`'s first route.
async fn timeout_of(server: &TestServer, namespace: &str, fqdn: &str) -> Option<i64> {
    let name = format!("{fqdn}:8080");
    let mut s = server
        .sotw(DiscoveryRequest {
            node: node(&sidecar_of(namespace)),
            ..request(ROUTE_TYPE, &[name.as_str()], "")
        })
        .await
        .expect("stream");
    let r = s.recv().await;
    let config = r
        .resources
        .iter()
        .map(|any| RouteConfiguration::decode(any.value.as_slice()).expect("a route config"))
        .find(|c| c.name == name)?;
    let vh = config
        .virtual_hosts
        .iter()
        .find(|vh| vh.domains.iter().any(|d| d == fqdn))?;
    use envoy_types::pb::envoy::config::route::v3::route::Action;
    match vh.routes.first()?.action.as_ref()? {
        Action::Route(action) => action.timeout.as_ref().map(|d| d.seconds),
        _ => None,
    }
}

#[tokio::test]
async fn each_namespace_gets_what_is_exported_to_it() {
    let (snapshot, _, _) = crate::golden::case_snapshot("export-to", None, "client");
    let snapshot = GeneratedSnapshot::new(snapshot.push_context().clone(), 1, ChangeKind::Full);
    let server = TestServer::start_stamped(
        AdsConfig::default(),
        Some(StampedSnapshot::now(Arc::new(snapshot))),
    )
    .await;
    let set = |names: &[&str]| -> BTreeSet<String> {
        names.iter().map(|n| format!("outbound|{n}")).collect()
    };
    assert_eq!(
        outbound_clusters(&server, "client").await,
        set(&[
            "443||api.client.example.com",
            "8080||catalog.shop.svc.cluster.local",
            "8080||partner.shop.svc.cluster.local",
        ]),
    );
    assert_eq!(
        outbound_clusters(&server, "billing").await,
        set(&[
            "8080||catalog.shop.svc.cluster.local",
            "8080||partner.shop.svc.cluster.local",
        ]),
        "partner is exported to billing too; api.client.example.com only to client"
    );
    assert_eq!(
        outbound_clusters(&server, "shop").await,
        set(&[
            "443||api.private.example.com",
            "8080||catalog.shop.svc.cluster.local",
            "8080||internal.shop.svc.cluster.local",
        ]),
        "at home: the private ones, not those exported only elsewhere nor to nobody"
    );
    // VirtualServices: `catalog-local` (exportTo .) applies at home only, `partner`
    // (exportTo client) in client only.
    let catalog = "catalog.shop.svc.cluster.local";
    assert_eq!(timeout_of(&server, "shop", catalog).await, Some(1));
    assert_eq!(timeout_of(&server, "client", catalog).await, Some(0));
    let partner = "partner.shop.svc.cluster.local";
    assert_eq!(timeout_of(&server, "client", partner).await, Some(3));
    assert_eq!(timeout_of(&server, "billing", partner).await, Some(0));
    server.stop().await;
}
