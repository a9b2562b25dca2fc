//! Logs and metrics plumbing shared by the binaries: `tracing` to stderr, filtered by
//! `RUST_LOG` (default `info`), as text or one JSON object per line (`--log-format json`);
//! and the Prometheus text of every metric in the default registry, for `/metrics`.

use std::str::FromStr;

/// Output format of the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "log format must be `text` or `json` (got {other:?})"
            )),
        }
    }
}

/// Installs the global subscriber. Calling it twice is harmless (the second call is ignored).
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The Prometheus text exposition of every metric in the default registry.
pub fn render_metrics() -> String {
    let families = prometheus::gather();
    prometheus::TextEncoder::new()
        .encode_to_string(&families)
        .unwrap_or_default()
}

/// Registers `metric` in the default registry. A name clash (another component registered
/// the same name) is logged, and the metric still works, unexported: metrics must never
/// take the process down.
pub(crate) fn registered<C: prometheus::core::Collector + Clone + 'static>(metric: C) -> C {
    if let Err(e) = prometheus::register(Box::new(metric.clone())) {
        tracing::warn!(error = %e, "metric not registered");
    }
    metric
}
