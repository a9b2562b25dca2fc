//! `make demo`: Pilotfish routing real RPCs in about a minute, on this machine alone.
//!
//! Starts three gRPC backends (reviews v1, v2, v3) on 127.0.0.1, writes the reviews mesh
//! (Service, Pods, EndpointSlices, DestinationRule, an 80/20 VirtualService) into a temp
//! folder, runs `pilotfish-xds` in standalone mode on it, and drives gRPC's own xDS client
//! (Python grpcio) through it: the 80/20 split, a header route to v3, then a live edit of
//! the VirtualService to 50/50. Everything it starts is stopped when it exits.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pilotfish_testkit::grpc::{GrpcBackends, RpcTally, XdsClient, bootstrap};
use pilotfish_testkit::mesh::{
    reviews_destination_rule, reviews_target, reviews_virtual_service, reviews_workloads,
};
use pilotfish_testkit::process::{XdsServer, free_port};

fn show(title: &str, t: &RpcTally) {
    println!("\n{title}");
    for (backend, n) in &t.counts {
        let pct = t.percent(backend);
        println!(
            "  {backend:<11} {n:>5}  {pct:5.1}%  {}",
            "#".repeat((pct / 2.0).round() as usize)
        );
    }
    for (code, n) in &t.errors {
        println!("  {code:<11} {n:>5}  (failed)");
    }
}

fn main() -> Result<()> {
    let ports = [
        ("v1", free_port()),
        ("v2", free_port()),
        ("v3", free_port()),
    ];
    let named: Vec<(String, u16)> = ports
        .iter()
        .map(|(v, p)| (format!("reviews-{v}"), *p))
        .collect();
    let refs: Vec<(&str, u16)> = named.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    let _backends = GrpcBackends::start(&refs)
        .context("starting the gRPC backends (run `make demo`, which installs grpcio)")?;
    println!(
        "backends: {}",
        named
            .iter()
            .map(|(n, p)| format!("{n} on 127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("workloads.yaml"), reviews_workloads(&ports))?;
    std::fs::write(
        dir.path().join("destination-rule.yaml"),
        reviews_destination_rule(),
    )?;
    std::fs::write(
        dir.path().join("virtual-service.yaml"),
        reviews_virtual_service(80, 20),
    )?;
    println!("mesh config: {}", dir.path().display());

    let server = XdsServer::standalone("pilotfish-demo", dir.path())
        .context("starting pilotfish-xds (run `make demo`, which builds it)")?;
    println!(
        "pilotfish-xds: ADS on {}, admin on http://{}/debug/adsz",
        server.xds, server.admin
    );

    let node = "sidecar~127.0.0.1~demo-client.default~default.svc.cluster.local";
    let mut client = XdsClient::start(&bootstrap(&server.xds.to_string(), node, "default"))?;
    let target = reviews_target();
    println!("client: gRPC's xDS client dialing {target}");

    show(
        "1,000 RPCs with the VirtualService at 80/20:",
        &client.rpcs(&target, 1000, &[])?,
    );
    show(
        "100 RPCs with header `end-user: jason` (routed to v3):",
        &client.rpcs(&target, 100, &[("end-user", "jason")])?,
    );

    std::fs::write(
        dir.path().join("virtual-service.yaml"),
        reviews_virtual_service(50, 50),
    )?;
    let edited = Instant::now();
    println!("\nedited virtual-service.yaml to 50/50 ...");
    let mut tally;
    loop {
        tally = client.rpcs(&target, 200, &[])?;
        if (tally.percent("reviews-v1") - 50.0).abs() < 12.0
            || edited.elapsed() > Duration::from_secs(30)
        {
            break;
        }
    }
    println!(
        "the client follows the edit after {:?} (no restart)",
        edited.elapsed()
    );
    show(
        "1,000 RPCs after the edit:",
        &client.rpcs(&target, 1000, &[])?,
    );
    let syncz = server.admin_json("/debug/syncz")?;
    println!("\n/debug/syncz: {syncz}");
    Ok(())
}
