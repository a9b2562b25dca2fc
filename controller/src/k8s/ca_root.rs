//! The mesh CA's Kubernetes side, done by the leader (as istiod's namespace controller
//! and self-signed CA do):
//!
//! - **the CA Secret**: a plugged-in `cacerts` (with a `ca-key.pem`) in the controller's
//!   namespace is used as it is; otherwise `istio-ca-secret`, which the leader creates
//!   with a new self-signed root (ECDSA P-256, organization = trust domain, ten years)
//!   when it is missing. The xDS replicas mount both and sign with the first that holds
//!   a key; this controller holds no signing key in memory beyond the check.
//! - **the root ConfigMap**: `istio-ca-root-cert` (key `root-cert.pem`, label
//!   `istio.io/config: "true"`) in every namespace but Kubernetes' own
//!   (`kube-public`, `kube-node-lease`, `local-path-storage`) and terminating ones, kept
//!   equal to the root bundle. Namespaces and those ConfigMaps (by field selector) are
//!   watched; [`plan`] decides the writes from what is watched, so a cluster already in
//!   step costs no API call.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use pilotfish_ca::CaFiles;
use pilotfish_ca::bundle::{self, PLUGGED_SECRET, SELF_SIGNED_SECRET, SELF_SIGNED_SECRET_TYPE};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::lease::Leadership;

/// Istio's names.
pub const ROOT_CONFIGMAP: &str = "istio-ca-root-cert";
pub const ROOT_KEY: &str = "root-cert.pem";
/// Namespaces that never get the ConfigMap (Istio's ignored namespaces but kube-system).
pub const IGNORED_NAMESPACES: [&str; 3] = ["kube-public", "kube-node-lease", "local-path-storage"];
/// Lifetime of a root this controller creates (Istio's CITADEL_SELF_SIGNED_CA_CERT_TTL).
pub const SELF_SIGNED_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Settings.
#[derive(Clone, Debug)]
pub struct CaRootConfig {
    /// Where `cacerts` / `istio-ca-secret` live (the controller's namespace).
    pub namespace: String,
    /// Organization of a self-signed root: the trust domain.
    pub trust_domain: String,
    /// How often the CA Secrets are re-read (a rotated `cacerts` is published within
    /// this); production: [`RECHECK_CA_EVERY`].
    pub recheck_every: Duration,
}

pub const RECHECK_CA_EVERY: Duration = Duration::from_secs(30);

/// One write to bring a namespace's ConfigMap in step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Create {
        namespace: String,
    },
    /// Replace, conditional on the observed `resourceVersion`.
    Update {
        namespace: String,
        resource_version: String,
    },
}

/// What a namespace looks like to the planner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceView {
    pub name: String,
    pub terminating: bool,
}

/// What an existing ConfigMap looks like to the planner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigMapView {
    pub namespace: String,
    pub root: Option<String>,
    pub labelled: bool,
    pub resource_version: String,
}

/// The writes that make every namespace's `istio-ca-root-cert` hold `root`.
pub fn plan(namespaces: &[NamespaceView], configmaps: &[ConfigMapView], root: &str) -> Vec<Write> {
    let existing: BTreeMap<&str, &ConfigMapView> = configmaps
        .iter()
        .map(|c| (c.namespace.as_str(), c))
        .collect();
    namespaces
        .iter()
        .filter(|ns| !ns.terminating && !IGNORED_NAMESPACES.contains(&ns.name.as_str()))
        .filter_map(|ns| match existing.get(ns.name.as_str()) {
            None => Some(Write::Create {
                namespace: ns.name.clone(),
            }),
            Some(cm) if cm.root.as_deref() != Some(root) || !cm.labelled => Some(Write::Update {
                namespace: ns.name.clone(),
                resource_version: cm.resource_version.clone(),
            }),
            Some(_) => None,
        })
        .collect()
}

fn secret_files(secret: &Secret) -> CaFiles {
    let data = secret.data.clone().unwrap_or_default();
    CaFiles::from_lookup(|name| data.get(name).map(|b| b.0.clone()))
}

/// The root bundle of the CA the replicas sign with, creating `istio-ca-secret` when no
/// CA exists yet.
pub async fn ensure_ca(secrets: &Api<Secret>, config: &CaRootConfig) -> anyhow::Result<String> {
    if let Some(plugged) = secrets.get_opt(PLUGGED_SECRET).await? {
        let files = secret_files(&plugged);
        if files.has_signing_key() {
            let ca = pilotfish_ca::CaBundle::load(&files, SystemTime::now()).map_err(|e| {
                anyhow::anyhow!("Secret {}/{PLUGGED_SECRET}: {e}", config.namespace)
            })?;
            return Ok(ca.roots_pem().to_string());
        }
    }
    let existing = match secrets.get_opt(SELF_SIGNED_SECRET).await? {
        Some(s) => s,
        None => {
            let files = bundle::generate_self_signed(
                &config.trust_domain,
                SELF_SIGNED_TTL,
                SystemTime::now(),
            )?;
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(SELF_SIGNED_SECRET.into()),
                    namespace: Some(config.namespace.clone()),
                    ..Default::default()
                },
                type_: Some(SELF_SIGNED_SECRET_TYPE.into()),
                data: Some(
                    files
                        .self_signed_secret_data()
                        .into_iter()
                        .map(|(k, v)| (k, ByteString(v)))
                        .collect(),
                ),
                ..Default::default()
            };
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(created) => {
                    info!(secret = %format!("{}/{SELF_SIGNED_SECRET}", config.namespace), "created a self-signed root CA");
                    created
                }
                // Another controller created it first: use theirs.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    secrets.get(SELF_SIGNED_SECRET).await?
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    let ca = pilotfish_ca::CaBundle::load(&secret_files(&existing), SystemTime::now())
        .map_err(|e| anyhow::anyhow!("Secret {}/{SELF_SIGNED_SECRET}: {e}", config.namespace))?;
    Ok(ca.roots_pem().to_string())
}

fn desired(namespace: &str, root: &str, resource_version: Option<String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(ROOT_CONFIGMAP.into()),
            namespace: Some(namespace.into()),
            labels: Some([("istio.io/config".to_string(), "true".to_string())].into()),
            resource_version,
            ..Default::default()
        },
        data: Some([(ROOT_KEY.to_string(), root.to_string())].into()),
        ..Default::default()
    }
}

fn views(
    namespaces: &Store<Namespace>,
    configmaps: &Store<ConfigMap>,
) -> (Vec<NamespaceView>, Vec<ConfigMapView>) {
    let ns = namespaces
        .state()
        .iter()
        .map(|n| NamespaceView {
            name: n.metadata.name.clone().unwrap_or_default(),
            terminating: n.metadata.deletion_timestamp.is_some()
                || n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating"),
        })
        .collect();
    let cms = configmaps
        .state()
        .iter()
        .map(|c| ConfigMapView {
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            root: c.data.as_ref().and_then(|d| d.get(ROOT_KEY).cloned()),
            labelled: c
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("istio.io/config"))
                .is_some_and(|v| v == "true"),
            resource_version: c.metadata.resource_version.clone().unwrap_or_default(),
        })
        .collect();
    (ns, cms)
}

/// The leader's loop: every few seconds (and on a leadership change), while leading,
/// makes sure the CA exists and writes the ConfigMaps that are out of step.
pub async fn run(
    client: kube::Client,
    config: CaRootConfig,
    mut leadership: watch::Receiver<Leadership>,
) -> anyhow::Result<()> {
    let (ns_store, ns_writer) = reflector::store::<Namespace>();
    let (cm_store, cm_writer) = reflector::store::<ConfigMap>();
    let ns_stream = reflector::reflector(
        ns_writer,
        watcher::watcher(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff(),
    )
    .for_each(|_| async {});
    let cm_stream = reflector::reflector(
        cm_writer,
        watcher::watcher(
            Api::<ConfigMap>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={ROOT_CONFIGMAP}")),
        )
        .default_backoff(),
    )
    .for_each(|_| async {});
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let reconcile = async {
        let mut root: Option<(String, Instant)> = None;
        loop {
            let leading = leadership.borrow().holds(Instant::now());
            if leading
                && ns_store.wait_until_ready().await.is_ok()
                && cm_store.wait_until_ready().await.is_ok()
            {
                // Re-read the CA Secrets every `recheck_every` (rotation of `cacerts`).
                let stale = root
                    .as_ref()
                    .is_none_or(|(_, at)| at.elapsed() > config.recheck_every);
                if stale {
                    match ensure_ca(&secrets, &config).await {
                        Ok(r) => root = Some((r, Instant::now())),
                        Err(e) => {
                            warn!(error = %e, "cannot read or create the CA Secret; retrying")
                        }
                    }
                }
                if let Some((root_pem, _)) = &root {
                    let (namespaces, configmaps) = views(&ns_store, &cm_store);
                    for write in plan(&namespaces, &configmaps, root_pem) {
                        if !leadership.borrow().holds(Instant::now()) {
                            break;
                        }
                        let (namespace, rv) = match write {
                            Write::Create { namespace } => (namespace, None),
                            Write::Update {
                                namespace,
                                resource_version,
                            } => (namespace, Some(resource_version)),
                        };
                        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
                        let object = desired(&namespace, root_pem, rv.clone());
                        let result = match rv {
                            None => api
                                .create(&PostParams::default(), &object)
                                .await
                                .map(|_| ()),
                            Some(_) => api
                                .replace(ROOT_CONFIGMAP, &PostParams::default(), &object)
                                .await
                                .map(|_| ()),
                        };
                        match result {
                            Ok(()) => info!(%namespace, "wrote {ROOT_CONFIGMAP}"),
                            // A conflict: the watch brings the newer object; the next round retries.
                            Err(e) => {
                                warn!(%namespace, error = %e, "cannot write {ROOT_CONFIGMAP}; retrying")
                            }
                        }
                    }
                }
            }
            tokio::select! {
                _ = leadership.changed() => {}
                () = tokio::time::sleep(config.recheck_every.min(Duration::from_secs(5))) => {}
            }
        }
    };
    tokio::select! {
        () = ns_stream => anyhow::bail!("the Namespace watch of the root publisher ended"),
        () = cm_stream => anyhow::bail!("the {ROOT_CONFIGMAP} watch ended"),
        () = reconcile => unreachable!("the reconcile loop never ends"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(name: &str, terminating: bool) -> NamespaceView {
        NamespaceView {
            name: name.into(),
            terminating,
        }
    }

    fn cm(namespace: &str, root: &str, labelled: bool) -> ConfigMapView {
        ConfigMapView {
            namespace: namespace.into(),
            root: Some(root.into()),
            labelled,
            resource_version: "7".into(),
        }
    }

    #[test]
    fn writes_only_what_is_out_of_step() {
        let namespaces = [
            ns("default", false),
            ns("bookinfo", false),
            ns("stale", false),
            ns("unlabelled", false),
            ns("going", true),
            ns("kube-public", false),
            ns("kube-system", false),
        ];
        let configmaps = [
            cm("default", "ROOT", true),
            cm("stale", "OLD", true),
            cm("unlabelled", "ROOT", false),
            cm("nowhere", "OLD", true),
        ];
        let writes = plan(&namespaces, &configmaps, "ROOT");
        assert_eq!(
            writes,
            [
                Write::Create {
                    namespace: "bookinfo".into()
                },
                Write::Update {
                    namespace: "stale".into(),
                    resource_version: "7".into()
                },
                Write::Update {
                    namespace: "unlabelled".into(),
                    resource_version: "7".into()
                },
                Write::Create {
                    namespace: "kube-system".into()
                },
            ]
        );
        assert!(plan(&namespaces[..1], &configmaps, "ROOT").is_empty());
    }
}
