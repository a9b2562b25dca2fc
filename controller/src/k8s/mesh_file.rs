//! The `--mesh-config` file, followed while the controller runs: Istio applies a changed
//! MeshConfig without a restart (its mesh watcher), and so does Pilotfish — a new
//! `discoverySelectors`, root namespace, `exportTo` default or outbound policy takes
//! effect in the next build. The file is checked every [`POLL`] by its metadata (size,
//! modification time, inode — a ConfigMap volume swaps its `..data` link, which changes
//! them) and read only when they change; a file that does not parse is reported once and
//! the previous configuration stays.

use std::path::PathBuf;
use std::time::Duration;

use futures::FutureExt;
use pilotfish_mesh::mesh_config::MeshConfig;
use pilotfish_shared::cli::load_mesh_config;
use tokio::sync::watch;

use super::Task;

/// How often the file's metadata is looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// What identifies one version of the file without reading it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    inode: u64,
}

fn stamp(path: &std::path::Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        len: meta.len(),
        modified: meta.modified().ok(),
        inode: meta.ino(),
    })
}

/// The reader task: sends each new, valid configuration on `tx`.
pub fn task(path: PathBuf, tx: watch::Sender<MeshConfig>) -> Task {
    (
        "mesh config reader",
        async move {
            let mut seen = stamp(&path);
            let mut ticker = tokio::time::interval(POLL);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let now = stamp(&path);
                if now == seen {
                    continue;
                }
                seen = now;
                let (p, loaded) = {
                    let p = path.clone();
                    let loaded =
                        tokio::task::spawn_blocking(move || load_mesh_config(Some(&p))).await?;
                    (path.display().to_string(), loaded)
                };
                match loaded {
                    Ok(mesh) => {
                        let changed = tx.send_if_modified(|current| {
                            let differs = *current != mesh;
                            if differs {
                                *current = mesh;
                            }
                            differs
                        });
                        if changed {
                            tracing::info!(file = %p, "mesh config changed; rebuilding with it");
                        }
                        if tx.is_closed() {
                            anyhow::bail!("the controller loop is gone");
                        }
                    }
                    Err(e) => tracing::error!(
                        file = %p,
                        "mesh config not applied, the previous one stays in use: {e}"
                    ),
                }
            }
        }
        .boxed(),
    )
}
