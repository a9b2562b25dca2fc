//! Writes the seed corpora of `make fuzz` (the cargo-fuzz targets in `fuzz/`) from the
//! repository's test data: `pilotfish-fuzz-seeds REPO_ROOT OUT_DIR`.
//!
//! - `yaml_documents`: every YAML file of `examples/` and `mesh/tests/data/`.
//! - `snapshot_blob`: each of those folders' meshes built and encoded, in the target's
//!   three modes (a signed blob, a signed zstd frame with its length, a protobuf payload),
//!   signed with the key the target trusts (seed `[7; 32]`).
//! - `ads_sotw_requests`: a proxy's request sequence (wildcard CDS and LDS, EDS and RDS by
//!   name, ACKs and a NACK), length-prefixed as the target reads them.
//! - `ads_delta_requests`: the same for delta (subscribe and unsubscribe, a reconnect's
//!   claims, a NACK), with a snapshot change (a length of 0).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status;
use pilotfish_mesh::codec::{self, HEADER_LEN, SnapshotSigner};
use pilotfish_mesh::document::{parse_text, to_inputs};
use pilotfish_mesh::push_context::{BuildInputs, build};
use pilotfish_xds::ads::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};
use prost::Message;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, root, out] = args.as_slice() else {
        bail!("usage: pilotfish-fuzz-seeds REPO_ROOT OUT_DIR");
    };
    let (root, out) = (Path::new(root), Path::new(out));
    let mut folders = vec![root.join("examples/bookinfo")];
    folders.push(root.join("mesh/tests/data"));
    let mut yaml_files = Vec::new();
    for folder in &folders {
        collect_yaml(folder, &mut yaml_files)
            .with_context(|| format!("cannot list {}", folder.display()))?;
    }
    yaml_files.sort();

    let yaml_out = out.join("yaml_documents");
    std::fs::create_dir_all(&yaml_out)?;
    let mut texts = Vec::new();
    for (i, file) in yaml_files.iter().enumerate() {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        std::fs::write(yaml_out.join(format!("repo-{i:04}")), &text)?;
        texts.push((file.clone(), text));
    }

    // One mesh per folder of examples, plus one per test-data file (small ones).
    let blob_out = out.join("snapshot_blob");
    std::fs::create_dir_all(&blob_out)?;
    let signer = SnapshotSigner::from_seed([7; 32]);
    let mut meshes: Vec<Vec<&(PathBuf, String)>> = vec![
        texts
            .iter()
            .filter(|(p, _)| p.starts_with(&folders[0]))
            .collect(),
    ];
    meshes.extend(texts.iter().take(24).map(|t| vec![t]));
    for (i, files) in meshes.iter().enumerate() {
        let objects: Vec<_> = files
            .iter()
            .flat_map(|(p, t)| parse_text(p, t).objects)
            .collect();
        let inputs = to_inputs(
            &objects,
            BuildInputs {
                cluster_domain: "cluster.local".into(),
                ..Default::default()
            },
        );
        let ctx = build(&inputs, None).context;
        let payload = codec::to_pb(&ctx).encode_to_vec();
        let blob = codec::seal(&payload, &signer).bytes;
        let frame = &blob[HEADER_LEN..];
        let write = |mode: u8, body: &[u8]| {
            let mut seed = vec![mode];
            seed.extend_from_slice(body);
            std::fs::write(blob_out.join(format!("mesh-{i:02}-mode{mode}")), seed)
        };
        write(0, &blob)?;
        let mut framed = (payload.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(frame);
        write(1, &framed)?;
        write(2, &payload)?;
    }

    let ads_out = out.join("ads_sotw_requests");
    std::fs::create_dir_all(&ads_out)?;
    let node = envoy_types::pb::envoy::config::core::v3::Node {
        id: "sidecar~10.0.0.1~a-0.ns~ns.svc.cluster.local".into(),
        ..Default::default()
    };
    let request = |type_url: &str, names: &[&str], nonce: &str, nack: bool| DiscoveryRequest {
        node: Some(node.clone()),
        type_url: type_url.into(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        response_nonce: nonce.into(),
        error_detail: nack.then(|| Status {
            code: 3,
            message: "rejected".into(),
            details: vec![],
        }),
        ..Default::default()
    };
    let sequences = [
        vec![
            request(CLUSTER_TYPE, &[], "", false),
            request(CLUSTER_TYPE, &[], "?", false),
            request(ENDPOINT_TYPE, &["c1", "c2"], "", false),
            request(ENDPOINT_TYPE, &["c1"], "?", false),
            request(LISTENER_TYPE, &[], "", false),
            request(ROUTE_TYPE, &["r1"], "", false),
            request(ROUTE_TYPE, &["r1", "r2"], "?", true),
        ],
        vec![
            request("type.googleapis.com/unknown.Type", &["x"], "", false),
            request(LISTENER_TYPE, &["*"], "stale", false),
        ],
    ];
    for (i, sequence) in sequences.iter().enumerate() {
        let mut seed = Vec::new();
        for r in sequence {
            let bytes = r.encode_to_vec();
            let len = u8::try_from(bytes.len()).context("a seed request above 255 bytes")?;
            seed.push(len);
            seed.extend_from_slice(&bytes);
        }
        std::fs::write(ads_out.join(format!("sequence-{i}")), seed)?;
    }
    let delta_out = out.join("ads_delta_requests");
    std::fs::create_dir_all(&delta_out)?;
    let delta =
        |type_url: &str, subscribe: &[&str], unsubscribe: &[&str], nonce: &str, nack: bool| {
            DeltaDiscoveryRequest {
                node: Some(node.clone()),
                type_url: type_url.into(),
                resource_names_subscribe: subscribe.iter().map(|n| n.to_string()).collect(),
                resource_names_unsubscribe: unsubscribe.iter().map(|n| n.to_string()).collect(),
                response_nonce: nonce.into(),
                error_detail: nack.then(|| Status {
                    code: 3,
                    message: "rejected".into(),
                    details: vec![],
                }),
                ..Default::default()
            }
        };
    let mut reconnect = delta(CLUSTER_TYPE, &["*"], &[], "", false);
    reconnect
        .initial_resource_versions
        .insert("c1".into(), "stale".into());
    // `None`: a snapshot change (length 0).
    let delta_sequences = [
        vec![
            Some(delta(CLUSTER_TYPE, &[], &[], "", false)),
            Some(delta(CLUSTER_TYPE, &[], &[], "?", false)),
            Some(delta(ENDPOINT_TYPE, &["c1", "c2"], &[], "", false)),
            None,
            Some(delta(ENDPOINT_TYPE, &[], &["c2"], "?", false)),
            Some(delta(LISTENER_TYPE, &["*"], &[], "", false)),
            Some(delta(ROUTE_TYPE, &["r1", "zz"], &[], "", false)),
            None,
            Some(delta(ROUTE_TYPE, &["r2"], &["r1"], "?", true)),
        ],
        vec![
            Some(reconnect),
            Some(delta(
                "type.googleapis.com/unknown.Type",
                &["x"],
                &[],
                "",
                false,
            )),
            Some(delta(LISTENER_TYPE, &["*"], &["*"], "stale", false)),
        ],
    ];
    for (i, sequence) in delta_sequences.iter().enumerate() {
        let mut seed = Vec::new();
        for r in sequence {
            match r {
                None => seed.push(0),
                Some(r) => {
                    let bytes = r.encode_to_vec();
                    let len =
                        u8::try_from(bytes.len()).context("a seed request above 255 bytes")?;
                    seed.push(len);
                    seed.extend_from_slice(&bytes);
                }
            }
        }
        std::fs::write(delta_out.join(format!("sequence-{i}")), seed)?;
    }
    println!(
        "seeds: {} YAML files, {} blobs, {} request sequences in {}",
        texts.len(),
        meshes.len() * 3,
        sequences.len() + delta_sequences.len(),
        out.display()
    );
    Ok(())
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_yaml(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    Ok(())
}
