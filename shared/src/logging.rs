//! Log setup shared by the binaries: `tracing` to stderr, filtered by `RUST_LOG` (default
//! `info`), as human-readable text or one JSON object per line (`--log-format json`).

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
pub fn init(format: LogFormat) {
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
