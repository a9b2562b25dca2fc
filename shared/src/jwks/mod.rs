//! The control plane's JWKS resolver: fetches the key sets RequestAuthentication rules name
//! (`jwksUri`, or OpenID discovery from the issuer), keeps them fresh and hands them to the
//! snapshot builder, which carries them in the snapshot (sidecars get them inline, as
//! istiod inlines them). Only the process that publishes snapshots runs it — the leading
//! controller, or the folder loop — so xDS replicas never reach out to key servers.
//!
//! Istio 1.30's schedule (`pilot/pkg/model/jwks_resolver.go`): a source seen for the first
//! time is fetched at once, without retries; if that fails it is retried at once with up
//! to 7 retries a second apart. Every source is refreshed every 20 minutes
//! (`PILOT_JWT_PUB_KEY_REFRESH_INTERVAL`) with the same retries; after a refresh with any
//! failure the next one comes after 1 minute, then twice as long each time up to 60
//! minutes, and back to 20 minutes after a clean refresh. A failed refresh keeps the last
//! good key set — for at most 7 days without a successful refresh, after which the source
//! counts as failed. A source with no key set fails closed in the generated filter.
//!
//! Bounded: at most [`ResolverSettings::max_sources`] sources (more are failed with a
//! reason), each request within its rule's timeout, bodies at most
//! [`ResolverSettings::max_body_bytes`], a body that is not a JSON Web Key Set counts as a
//! failed fetch (Istio would hand it to Envoy, which then verifies nothing: same outcome).
//!
//! [`Schedule`] is the refresh-interval state machine (pure, tested); [`run`] is the task.

mod fetch;

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures::StreamExt;
use pilotfish_mesh::push_context::request_authn::OPENID_DISCOVERY_SUFFIX;
use pilotfish_mesh::push_context::{JwksOutcome, JwksSource};
use prometheus::{IntCounterVec, Opts, register_int_counter_vec};
use tokio::sync::watch;
use tokio::time::Instant;

pub use fetch::Fetcher;

/// What the builder is given: the outcome of every source fetched at least once.
pub type Resolved = Arc<BTreeMap<JwksSource, JwksOutcome>>;

/// What the resolver is asked for: the sources the accepted policies need, with the
/// longest fetch timeout of the rules naming each, and whether this process may fetch
/// (the leader; a standby holds still).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Wanted {
    pub sources: BTreeMap<JwksSource, Duration>,
    pub active: bool,
}

/// How the resolver runs; [`ResolverSettings::default`] is Istio's.
#[derive(Clone, Debug)]
pub struct ResolverSettings {
    pub refresh_interval: Duration,
    pub failure_interval: Duration,
    pub max_failure_interval: Duration,
    pub retries: u32,
    pub retry_interval: Duration,
    /// A key set not refreshed successfully for this long is no longer served.
    pub max_staleness: Duration,
    pub max_sources: usize,
    pub max_body_bytes: usize,
    /// Fetches in flight at once.
    pub concurrency: usize,
}

impl Default for ResolverSettings {
    fn default() -> Self {
        ResolverSettings {
            refresh_interval: Duration::from_secs(20 * 60),
            failure_interval: Duration::from_secs(60),
            max_failure_interval: Duration::from_secs(60 * 60),
            retries: 7,
            retry_interval: Duration::from_secs(1),
            max_staleness: Duration::from_secs(7 * 24 * 3600),
            max_sources: 1024,
            max_body_bytes: 1 << 20,
            concurrency: 8,
        }
    }
}

/// Fetches, by result (`success`, `failure`): Istio's
/// `pilot_jwks_resolver_network_fetch_{success,fail}_total` as one labelled counter.
pub static FETCHES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_jwks_fetches_total",
            "HTTP fetches of JSON Web Key Sets and OpenID discovery documents by the resolver, by result."
        ),
        &["result"]
    )
    .expect("register pilotfish_jwks_fetches_total")
});

/// The refresh interval after each refresh round (Istio's `refreshCache`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    interval: Duration,
    last_failed: bool,
}

impl Schedule {
    pub fn new(settings: &ResolverSettings) -> Schedule {
        Schedule {
            interval: settings.refresh_interval,
            last_failed: false,
        }
    }

    /// The wait before the next round, given whether this round had a failure.
    pub fn after_round(&mut self, failed: bool, settings: &ResolverSettings) -> Duration {
        self.interval = match (failed, self.last_failed) {
            (false, _) => settings.refresh_interval,
            (true, false) => settings.failure_interval,
            (true, true) => (self.interval * 2).min(settings.max_failure_interval),
        };
        self.last_failed = failed;
        self.interval
    }
}

#[derive(Clone, Debug)]
struct Entry {
    timeout: Duration,
    keys: Option<String>,
    last_success: Option<Instant>,
    last_error: Option<String>,
    attempted: bool,
}

impl Entry {
    fn outcome(&self, now: Instant, settings: &ResolverSettings) -> Option<JwksOutcome> {
        let stale = self
            .last_success
            .is_some_and(|t| now.duration_since(t) >= settings.max_staleness);
        match (&self.keys, &self.last_error) {
            (Some(_), Some(e)) if stale => Some(JwksOutcome::Failed(format!(
                "not refreshed for {:?}: {e}",
                settings.max_staleness
            ))),
            (Some(keys), _) => Some(JwksOutcome::Keys(keys.clone())),
            (None, Some(e)) => Some(JwksOutcome::Failed(e.clone())),
            (None, None) => None,
        }
    }
}

/// The ends a snapshot loop holds: where it says what it needs (after each build), where
/// it reads what was fetched (a change is a reason to rebuild).
#[derive(Clone, Debug)]
pub struct JwksLink {
    pub wanted: watch::Sender<Wanted>,
    pub resolved: watch::Receiver<Resolved>,
}

impl JwksLink {
    /// Tells the resolver the sources a new snapshot needs and whether it may fetch.
    pub fn want(&self, sources: BTreeMap<JwksSource, Duration>, active: bool) {
        let next = Wanted { sources, active };
        self.wanted.send_if_modified(|current| {
            let changed = *current != next;
            if changed {
                *current = next;
            }
            changed
        });
    }

    /// The key sets fetched so far, for the next build's inputs.
    pub fn current(&self) -> BTreeMap<JwksSource, JwksOutcome> {
        (**self.resolved.borrow()).clone()
    }
}

/// A resolver with Istio's settings and the system's roots, its task spawned (in the
/// background) into `tasks`: for the folder loops, which publish what they build.
pub fn spawn_default(tasks: &mut crate::supervise::Supervisor) -> Result<JwksLink, String> {
    let settings = ResolverSettings::default();
    let fetcher = Fetcher::new(None, settings.max_body_bytes)?;
    let (link, task) = resolver(settings, fetcher);
    tasks.spawn_background("JWKS resolver", async move {
        task.await;
        Ok::<(), std::convert::Infallible>(())
    });
    Ok(link)
}

/// Resolves when the resolver has new outcomes; never without a resolver (or once it is
/// gone) — a `select!` branch of a snapshot loop, on a receiver the loop keeps, so no
/// change is missed between two waits.
pub async fn changed(resolved: &mut Option<watch::Receiver<Resolved>>) {
    if let Some(rx) = resolved.as_mut()
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// A resolver: the link for the snapshot loop, and the task to run (supervised); the task
/// ends when every copy of the link is gone.
pub fn resolver(
    settings: ResolverSettings,
    fetcher: Fetcher,
) -> (JwksLink, impl std::future::Future<Output = ()> + Send) {
    let (wanted_tx, wanted_rx) = watch::channel(Wanted::default());
    let (resolved_tx, resolved_rx) = watch::channel(Resolved::default());
    let link = JwksLink {
        wanted: wanted_tx,
        resolved: resolved_rx,
    };
    (link, run(settings, fetcher, wanted_rx, resolved_tx))
}

/// Runs the resolver: follows `wanted` (until its sender is gone), publishes on `resolved`
/// whenever an outcome changes.
pub async fn run(
    settings: ResolverSettings,
    fetcher: Fetcher,
    mut wanted: watch::Receiver<Wanted>,
    resolved: watch::Sender<Resolved>,
) {
    let mut entries: BTreeMap<JwksSource, Entry> = BTreeMap::new();
    let mut schedule = Schedule::new(&settings);
    let mut next_round = Instant::now() + settings.refresh_interval;
    loop {
        let current = wanted.borrow_and_update().clone();
        let active = current.active;
        // Beyond the bound, sources are recorded as failed and never fetched.
        let fetchable: Vec<JwksSource> = current
            .sources
            .keys()
            .take(settings.max_sources)
            .cloned()
            .collect();
        // Sources no policy names any more go (bounded by the configuration).
        entries.retain(|s, _| current.sources.contains_key(s));
        for (i, (source, timeout)) in current.sources.iter().enumerate() {
            let entry = entries.entry(source.clone()).or_insert_with(|| Entry {
                timeout: *timeout,
                keys: None,
                last_success: None,
                last_error: None,
                attempted: false,
            });
            entry.timeout = *timeout;
            if i >= settings.max_sources {
                entry.last_error = Some(format!(
                    "more than {} key-set sources are configured; this one is not fetched",
                    settings.max_sources
                ));
                entry.attempted = true;
            }
        }
        if active {
            // First sight: once without retries, then the failures with retries.
            let new: Vec<JwksSource> = fetchable
                .iter()
                .filter(|s| entries.get(*s).is_some_and(|e| !e.attempted))
                .cloned()
                .collect();
            let failed = fetch_all(&settings, &fetcher, &mut entries, &new, 0).await;
            fetch_all(&settings, &fetcher, &mut entries, &failed, settings.retries).await;
        }
        publish(&entries, &settings, &resolved);
        tokio::select! {
            changed = wanted.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep_until(next_round), if active => {
                let failed =
                    fetch_all(&settings, &fetcher, &mut entries, &fetchable, settings.retries).await;
                next_round = Instant::now() + schedule.after_round(!failed.is_empty(), &settings);
            }
        }
    }
}

/// Fetches `sources` (at most `concurrency` at once), each with up to `retries` retries;
/// records the outcomes and returns the sources that failed.
async fn fetch_all(
    settings: &ResolverSettings,
    fetcher: &Fetcher,
    entries: &mut BTreeMap<JwksSource, Entry>,
    sources: &[JwksSource],
    retries: u32,
) -> Vec<JwksSource> {
    let owned: Vec<(JwksSource, Duration)> = sources
        .iter()
        .filter_map(|s| Some((s.clone(), entries.get(s)?.timeout)))
        .collect();
    let retry_interval = settings.retry_interval;
    let jobs = owned.into_iter().map(|(source, timeout)| {
        let fetcher = fetcher.clone();
        async move {
            let mut attempt = 0;
            loop {
                let result = fetch_key_set(&fetcher, &source, timeout).await;
                if result.is_ok() || attempt >= retries {
                    return (source, result);
                }
                attempt += 1;
                tokio::time::sleep(retry_interval).await;
            }
        }
    });
    let results: Vec<(JwksSource, Result<String, String>)> = futures::stream::iter(jobs)
        .buffer_unordered(settings.concurrency.max(1))
        .collect()
        .await;
    let mut failed = Vec::new();
    for (source, result) in results {
        let Some(entry) = entries.get_mut(&source) else {
            continue;
        };
        entry.attempted = true;
        match result {
            Ok(keys) => {
                if entry.keys.as_deref() != Some(keys.as_str()) {
                    tracing::info!(source = %source, "fetched a new JSON Web Key Set");
                }
                entry.keys = Some(keys);
                entry.last_success = Some(Instant::now());
                entry.last_error = None;
            }
            Err(why) => {
                tracing::warn!(
                    source = %source,
                    error = %why,
                    kept_previous = entry.keys.is_some(),
                    "fetching a JSON Web Key Set failed; rules using it reject tokens until a fetch succeeds (a previously fetched set is kept for up to 7 days)"
                );
                entry.last_error = Some(why);
                failed.push(source);
            }
        }
    }
    failed
}

/// One source: OpenID discovery when there is no URI, then the key set, checked.
async fn fetch_key_set(
    fetcher: &Fetcher,
    source: &JwksSource,
    timeout: Duration,
) -> Result<String, String> {
    let counted = |result: Result<bytes::Bytes, String>| {
        FETCHES
            .with_label_values(&[if result.is_ok() { "success" } else { "failure" }])
            .inc();
        result
    };
    let uri = if source.jwks_uri.is_empty() {
        let url = format!(
            "{}{OPENID_DISCOVERY_SUFFIX}",
            source.issuer.trim_end_matches('/')
        );
        let body = counted(fetcher.get(&url, timeout).await)?;
        let document: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| format!("{url}: not a JSON discovery document: {e}"))?;
        match document.get("jwks_uri").and_then(|v| v.as_str()) {
            Some(uri) => uri.to_string(),
            None => return Err(format!("{url}: the discovery document has no jwks_uri")),
        }
    } else {
        source.jwks_uri.clone()
    };
    let body = counted(fetcher.get(&uri, timeout).await)?;
    let text = String::from_utf8(body.to_vec()).map_err(|_| format!("{uri}: not UTF-8"))?;
    pilotfish_mesh::api::request_authentication::parse_jwks(&text)
        .map_err(|e| format!("{uri}: not a JSON Web Key Set: {e}"))?;
    Ok(text)
}

fn publish(
    entries: &BTreeMap<JwksSource, Entry>,
    settings: &ResolverSettings,
    resolved: &watch::Sender<Resolved>,
) {
    let now = Instant::now();
    let next: BTreeMap<JwksSource, JwksOutcome> = entries
        .iter()
        .filter_map(|(s, e)| Some((s.clone(), e.outcome(now, settings)?)))
        .collect();
    resolved.send_if_modified(|current| {
        if **current == next {
            false
        } else {
            *current = Arc::new(next);
            true
        }
    });
}

#[cfg(test)]
mod server_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_interval_follows_istio_on_success_and_failure() {
        let settings = ResolverSettings::default();
        let mut s = Schedule::new(&settings);
        assert_eq!(s.after_round(false, &settings), Duration::from_secs(1200));
        assert_eq!(s.after_round(true, &settings), Duration::from_secs(60));
        assert_eq!(s.after_round(true, &settings), Duration::from_secs(120));
        assert_eq!(s.after_round(true, &settings), Duration::from_secs(240));
        for _ in 0..10 {
            s.after_round(true, &settings);
        }
        assert_eq!(s.after_round(true, &settings), Duration::from_secs(3600));
        assert_eq!(s.after_round(false, &settings), Duration::from_secs(1200));
        assert_eq!(s.after_round(true, &settings), Duration::from_secs(60));
    }

    #[test]
    fn a_kept_key_set_expires_after_max_staleness() {
        let settings = ResolverSettings::default();
        let now = Instant::now();
        let entry = Entry {
            timeout: Duration::from_secs(5),
            keys: Some("{\"keys\":[]}".into()),
            last_success: now.checked_sub(Duration::from_secs(3600)),
            last_error: Some("refused".into()),
            attempted: true,
        };
        assert_eq!(
            entry.outcome(now, &settings),
            Some(JwksOutcome::Keys("{\"keys\":[]}".into()))
        );
        let short = ResolverSettings {
            max_staleness: Duration::from_secs(60),
            ..ResolverSettings::default()
        };
        assert!(matches!(
            entry.outcome(now, &short),
            Some(JwksOutcome::Failed(_))
        ));
    }
}
