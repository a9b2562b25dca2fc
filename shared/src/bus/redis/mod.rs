//! The Redis bus: the controller's [`RedisPublisher`] writes snapshots, every xDS replica
//! runs a follower ([`follow`]). Public surface: [`RedisConfig`], [`RedisPublisher`],
//! [`follow`], [`Keys`].
//!
//! Key layout, prefix `p` (default `pilotfish`); one writer per prefix:
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `{p}:snapshot:{version}` | string | the blob; the newest K (default 5) persist; older ones are superseded: a short TTL (`superseded_ttl`, default 60 s) so a follower that read `latest` just before it moved can still fetch, and at most M (default 5) of them — older ones are deleted at once. At most K + M blobs, plus one being written |
//! | `{p}:snapshots` | sorted set | versions that have a persistent blob (score = version), for retention |
//! | `{p}:superseded` | sorted set | superseded versions, to delete beyond M |
//! | `{p}:refs` | hash | version → `"{epoch} {hash} {published_at_ms}"` of each persistent blob: a replica that cannot use `latest`'s blob falls back to the newest good one |
//! | `{p}:latest` | hash | `version`, `hash`, `epoch`, `published_at_ms` |
//! | `{p}:version` | string (integer) | version counter |
//! | `{p}:epoch` | string (integer) | epoch counter: the floor of the newest acquisition (set by TAKE_EPOCH, never raised by a publish) |
//! | `{p}:notify` | pub/sub channel | the new version, after `latest` moved |
//!
//! Notification is pub/sub, not a stream: a message is only a hint to re-read `latest`
//! (which is the truth), followers must re-read `latest` on connect and on a timer anyway
//! to heal a lost message or a restarted Redis, so a stream's replay and trimming would buy
//! nothing and cost a consumer position per replica.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Script};
use bytes::Bytes;

mod follower;
mod publisher;
mod scripts;

pub use follower::follow;
pub use publisher::RedisPublisher;

use super::{BusError, SnapshotRef};
use publisher::redis_op;

/// Environment variable holding the Redis password (preferred to a password in the URL).
pub const PASSWORD_ENV: &str = "PILOTFISH_REDIS_PASSWORD";

/// How to reach Redis and how the bus uses it. Build from flags:
/// `RedisConfig::new(url)?.with_prefix(p).with_password_file(path)?` or
/// `.with_env_password()`. `Debug`/`Display` never show the password.
#[derive(Clone)]
pub struct RedisConfig {
    info: ConnectionInfo,
    url_has_password: bool,
    /// Key prefix; one writer per prefix.
    pub prefix: String,
    /// Blobs kept persistent (K).
    pub retention: usize,
    /// TTL given to a blob when it falls out of the newest K.
    pub superseded_ttl: Duration,
    /// Superseded blobs kept at most (M); older ones are deleted at once.
    pub superseded_max: usize,
    /// How often a follower re-reads `latest` without a notification.
    pub resync_interval: Duration,
    /// How often the publisher checks that Redis still holds what it published (and how
    /// soon after Redis returns it republishes).
    pub watchdog_interval: Duration,
    pub connect_timeout: Duration,
    /// Per-command timeout; must cover the transfer of the largest blob. Short, so a
    /// slow Redis delays decisions by seconds, not minutes.
    pub response_timeout: Duration,
    /// Reconnect backoff: first delay and cap (jittered).
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Larger blobs are neither published nor downloaded.
    pub max_blob_bytes: u64,
    /// A follower stops being ready when it has not read `latest` for this long.
    pub stale_after: Option<Duration>,
    /// PEM CA certificate(s) trusted for `rediss://` instead of the web PKI roots (a
    /// private CA, as in-cluster Redis usually has).
    tls_ca: Option<Vec<u8>>,
}

impl RedisConfig {
    pub const DEFAULT_PREFIX: &'static str = "pilotfish";
    pub const DEFAULT_RETENTION: usize = 5;
    pub const DEFAULT_SUPERSEDED_MAX: usize = 5;

    /// Parses `url`: `redis://[user[:password]@]host[:port][/db]`, `rediss://…` (TLS,
    /// server certificate checked against the web PKI roots), or
    /// `unix:///path/redis.sock[?db=N]`. A password inside the URL works but is logged as
    /// a warning: pass it with [`with_password_file`](Self::with_password_file) or
    /// `PILOTFISH_REDIS_PASSWORD` instead.
    pub fn new(url: &str) -> Result<Self, BusError> {
        if ::redis::parse_redis_url(url).is_none() {
            return Err(BusError::Config(format!(
                "{:?} is not a Redis URL (expected redis://host:port/db, rediss://… or unix:///path)",
                redact_url(url)
            )));
        }
        let info = url
            .into_connection_info()
            .map_err(|e| BusError::Config(format!("Redis URL {:?}: {e}", redact_url(url))))?;
        if !info.addr().is_supported() {
            return Err(BusError::Config(format!(
                "Redis URL {:?}: this transport is not supported by this build",
                redact_url(url)
            )));
        }
        let url_has_password = info.redis_settings().password().is_some();
        let config = RedisConfig {
            info,
            url_has_password,
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            retention: Self::DEFAULT_RETENTION,
            superseded_ttl: Duration::from_secs(60),
            superseded_max: Self::DEFAULT_SUPERSEDED_MAX,
            resync_interval: Duration::from_secs(10),
            watchdog_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            max_blob_bytes: pilotfish_mesh::codec::DecodeLimits::DEFAULT_MAX_BLOB_BYTES as u64,
            stale_after: None,
            tls_ca: None,
        };
        if url_has_password {
            tracing::warn!(
                redis = %config,
                "the Redis URL contains a password; prefer --redis-password-file or {PASSWORD_ENV}"
            );
        }
        Ok(config)
    }

    /// Whether the URL itself carried a password (warned about at parse time).
    pub fn url_has_password(&self) -> bool {
        self.url_has_password
    }

    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Keep the newest `k` blobs (at least 1).
    pub fn with_retention(mut self, k: usize) -> Result<Self, BusError> {
        if k == 0 {
            return Err(BusError::Config(
                "snapshot retention must keep at least 1 blob".into(),
            ));
        }
        self.retention = k;
        Ok(self)
    }

    pub fn with_resync_interval(mut self, every: Duration) -> Self {
        self.resync_interval = every;
        self
    }

    pub fn with_superseded_ttl(mut self, ttl: Duration) -> Self {
        self.superseded_ttl = ttl;
        self
    }

    /// Keep at most `m` superseded blobs (0: delete them as soon as they fall out of K).
    pub fn with_superseded_max(mut self, m: usize) -> Self {
        self.superseded_max = m;
        self
    }

    pub fn with_watchdog_interval(mut self, every: Duration) -> Self {
        self.watchdog_interval = every;
        self
    }

    /// A follower stops being ready after not reading `latest` for `after` (`None`: never).
    pub fn with_stale_after(mut self, after: Option<Duration>) -> Self {
        self.stale_after = after;
        self
    }

    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max.max(base);
        self
    }

    pub fn with_timeouts(mut self, connect: Duration, response: Duration) -> Self {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }

    pub fn with_max_blob_bytes(mut self, max: u64) -> Self {
        self.max_blob_bytes = max;
        self
    }

    /// Sets the AUTH password (overrides one in the URL; the user name stays the URL's).
    pub fn with_password(mut self, password: impl AsRef<str>) -> Self {
        let settings = self.info.redis_settings().clone().set_password(password);
        self.info = self.info.set_redis_settings(settings);
        self
    }

    /// Reads the password from a file (a mounted Secret); one trailing newline is ignored.
    pub fn with_password_file(self, path: impl AsRef<Path>) -> Result<Self, BusError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| BusError::PasswordFile {
            path: path.to_owned(),
            source,
        })?;
        let password = text.strip_suffix('\n').unwrap_or(&text);
        let password = password.strip_suffix('\r').unwrap_or(password);
        if password.is_empty() {
            return Err(BusError::Config(format!(
                "Redis password file {} is empty",
                path.display()
            )));
        }
        Ok(self.with_password(password))
    }

    /// Uses `PILOTFISH_REDIS_PASSWORD` when it is set and not empty.
    pub fn with_env_password(self) -> Self {
        match std::env::var(PASSWORD_ENV) {
            Ok(p) if !p.is_empty() => self.with_password(p),
            _ => self,
        }
    }

    /// The password source a binary uses: the file if given, else the environment.
    pub fn with_password_from(self, file: Option<&Path>) -> Result<Self, BusError> {
        match file {
            Some(path) => self.with_password_file(path),
            None => Ok(self.with_env_password()),
        }
    }

    /// Trusts the PEM CA certificate(s) in `path` for `rediss://` (instead of the web PKI).
    pub fn with_tls_ca_file(mut self, path: impl AsRef<Path>) -> Result<Self, BusError> {
        let path = path.as_ref();
        let pem = std::fs::read(path).map_err(|e| {
            BusError::Config(format!(
                "cannot read the Redis CA file {}: {e}",
                path.display()
            ))
        })?;
        if !self.is_tls() {
            return Err(BusError::Config(format!(
                "a Redis CA file ({}) needs a rediss:// URL",
                path.display()
            )));
        }
        self.tls_ca = Some(pem);
        Ok(self)
    }

    pub fn keys(&self) -> Keys {
        Keys::new(&self.prefix)
    }

    pub(crate) fn client(&self) -> Result<::redis::Client, BusError> {
        if self.is_tls() {
            // redis builds rustls configs with the process-wide default provider, and the
            // dependency graph may enable none or several: pick one explicitly. Fails
            // harmlessly when the binary already installed one.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = match &self.tls_ca {
            Some(ca) => ::redis::Client::build_with_tls(
                self.info.clone(),
                ::redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            ),
            None => ::redis::Client::open(self.info.clone()),
        };
        client.map_err(|source| BusError::Redis {
            operation: "client",
            source,
        })
    }

    /// Database number selected after connecting.
    pub fn db(&self) -> i64 {
        self.info.redis_settings().db()
    }

    pub fn username(&self) -> Option<&str> {
        self.info.redis_settings().username()
    }

    pub fn has_password(&self) -> bool {
        self.info.redis_settings().password().is_some()
    }

    pub fn is_tls(&self) -> bool {
        matches!(self.info.addr(), ConnectionAddr::TcpTls { .. })
    }
}

impl fmt::Display for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.info.addr() {
            ConnectionAddr::TcpTls { .. } => "rediss://",
            ConnectionAddr::Unix(_) => "unix://",
            _ => "redis://",
        };
        let user = match (self.username(), self.has_password()) {
            (Some(u), true) => format!("{u}:***@"),
            (Some(u), false) => format!("{u}@"),
            (None, true) => ":***@".to_owned(),
            (None, false) => String::new(),
        };
        write!(
            f,
            "{scheme}{user}{} db {} prefix {:?}",
            self.info.addr(),
            self.db(),
            self.prefix
        )
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("redis", &self.to_string())
            .field("retention", &self.retention)
            .field("resync_interval", &self.resync_interval)
            .finish_non_exhaustive()
    }
}

/// Replaces a URL's password with `***` for messages.
fn redact_url(url: &str) -> String {
    match ::redis::parse_redis_url(url) {
        Some(mut parsed) if parsed.password().is_some() => {
            // Setting a password cannot fail on a URL that already has one.
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Some(parsed) => parsed.to_string(),
        None if url.contains('@') => "<unparsable URL with credentials>".to_owned(),
        None => url.to_owned(),
    }
}

/// The Redis names under one prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    pub latest: String,
    pub version: String,
    pub epoch: String,
    pub index: String,
    pub superseded: String,
    pub refs: String,
    pub channel: String,
    /// `{p}:snapshot:`; a blob key is this plus the version.
    pub snapshot_prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Keys {
            latest: format!("{prefix}:latest"),
            version: format!("{prefix}:version"),
            epoch: format!("{prefix}:epoch"),
            index: format!("{prefix}:snapshots"),
            superseded: format!("{prefix}:superseded"),
            refs: format!("{prefix}:refs"),
            channel: format!("{prefix}:notify"),
            snapshot_prefix: format!("{prefix}:snapshot:"),
        }
    }

    pub fn snapshot(&self, version: u64) -> String {
        format!("{}{version}", self.snapshot_prefix)
    }
}

/// Parses the `latest` hash (from HGETALL: field/value pairs). Empty = missing.
pub(crate) fn parse_latest(fields: &[(String, String)]) -> Result<Option<SnapshotRef>, BusError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let get = |name: &str| -> Result<&str, BusError> {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| BusError::MalformedLatest(format!("field {name:?} missing")))
    };
    let number = |name: &str| -> Result<u64, BusError> {
        let raw = get(name)?;
        raw.parse().map_err(|_| {
            BusError::MalformedLatest(format!(
                "field {name:?} = {raw:?} is not an unsigned integer"
            ))
        })
    };
    Ok(Some(SnapshotRef {
        version: number("version")?,
        hash: get("hash")?.to_owned(),
        epoch: number("epoch")?,
        published_at_ms: number("published_at_ms").unwrap_or(0),
    }))
}

/// Parses a `{p}:refs` entry (`"{epoch} {hash} {published_at_ms}"`) of `version`.
pub(crate) fn parse_ref(version: u64, entry: &str) -> Option<SnapshotRef> {
    let mut parts = entry.split(' ');
    let epoch = parts.next()?.parse().ok()?;
    let hash = parts.next().filter(|h| !h.is_empty())?.to_owned();
    let published_at_ms = parts.next()?.parse().ok()?;
    Some(SnapshotRef {
        version,
        hash,
        epoch,
        published_at_ms,
    })
}

/// What [`fetch_bounded`] found.
#[derive(Debug)]
pub(crate) enum Fetched {
    Missing,
    /// Larger than the limit: its size; not transferred.
    TooLarge(u64),
    Blob(Bytes),
}

/// Reads the blob at `key` if it is at most `max` bytes, atomically (one script: the
/// size cannot change between the check and the read, and an oversized blob never
/// crosses the network).
pub(crate) async fn fetch_bounded<C: ConnectionLike + Send>(
    script: &Script,
    conn: &mut C,
    key: &str,
    max: u64,
) -> Result<Fetched, BusError> {
    let reply: Vec<::redis::Value> =
        redis_op("fetch_blob", script.key(key).arg(max).invoke_async(conn)).await?;
    let size = match reply.first() {
        Some(::redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
        other => return Err(BusError::Script(format!("fetch replied {other:?}"))),
    };
    match reply.get(1) {
        None if size == 0 => Ok(Fetched::Missing),
        None => Ok(Fetched::TooLarge(size)),
        Some(::redis::Value::BulkString(bytes)) => Ok(Fetched::Blob(Bytes::copy_from_slice(bytes))),
        Some(other) => Err(BusError::Script(format!("fetch replied {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn url_forms_parse() {
        let plain = RedisConfig::new("redis://127.0.0.1:6390/3").unwrap();
        assert_eq!(plain.db(), 3);
        assert!(!plain.is_tls());
        assert!(!plain.has_password());
        assert_eq!(plain.prefix, "pilotfish");
        assert_eq!(plain.retention, 5);

        let tls = RedisConfig::new("rediss://redis.example:6380").unwrap();
        assert!(tls.is_tls());
        assert_eq!(tls.db(), 0);

        let unix = RedisConfig::new("unix:///tmp/redis.sock?db=2").unwrap();
        assert_eq!(unix.db(), 2);
    }

    #[test]
    fn bad_urls_are_refused_clearly() {
        for url in [
            "http://host",
            "redis://host/notanumber",
            "not a url",
            "redis://0.0.0.0",
        ] {
            let err = RedisConfig::new(url).unwrap_err();
            assert!(matches!(err, BusError::Config(_)), "{url}: {err}");
        }
    }

    #[test]
    fn password_in_url_is_flagged_and_never_displayed() {
        let c = RedisConfig::new("redis://alice:s3cret@127.0.0.1:6379/1").unwrap();
        assert!(c.url_has_password());
        assert!(c.has_password());
        assert_eq!(c.username(), Some("alice"));
        let shown = format!("{c} {c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("alice:***@"), "{shown}");
        let err = RedisConfig::new("http://bob:hunter2@host")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn password_file_overrides_and_trims_one_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "from-file\n").unwrap();
        let c = RedisConfig::new("redis://u:in-url@127.0.0.1/0")
            .unwrap()
            .with_password_file(&path)
            .unwrap();
        assert_eq!(c.info.redis_settings().password(), Some("from-file"));
        assert_eq!(c.username(), Some("u"));

        std::fs::write(&path, "\n").unwrap();
        let empty = RedisConfig::new("redis://127.0.0.1")
            .unwrap()
            .with_password_file(&path);
        assert!(matches!(empty, Err(BusError::Config(_))));
        let missing = RedisConfig::new("redis://127.0.0.1")
            .unwrap()
            .with_password_file(dir.path().join("nope"));
        assert!(matches!(missing, Err(BusError::PasswordFile { .. })));
    }

    #[test]
    fn retention_must_keep_something() {
        let c = RedisConfig::new("redis://127.0.0.1").unwrap();
        assert!(c.clone().with_retention(0).is_err());
        assert_eq!(c.with_retention(2).unwrap().retention, 2);
    }

    #[test]
    fn keys_follow_the_prefix() {
        let k = Keys::new("mesh1");
        assert_eq!(k.latest, "mesh1:latest");
        assert_eq!(k.snapshot(42), "mesh1:snapshot:42");
        assert_eq!(k.epoch, "mesh1:epoch");
        assert_eq!(k.channel, "mesh1:notify");
    }

    #[test]
    fn latest_parses_and_rejects_garbage() {
        assert_eq!(parse_latest(&[]).unwrap(), None);
        let ok = parse_latest(&pairs(&[
            ("version", "7"),
            ("hash", "abc"),
            ("epoch", "2"),
            ("published_at_ms", "1000"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (ok.version, ok.hash.as_str(), ok.epoch, ok.published_at_ms),
            (7, "abc", 2, 1000)
        );
        let err =
            parse_latest(&pairs(&[("version", "x"), ("hash", "abc"), ("epoch", "2")])).unwrap_err();
        assert!(err.to_string().contains("\"version\""), "{err}");
        assert!(parse_latest(&pairs(&[("version", "1"), ("epoch", "2")])).is_err());
    }

    #[test]
    fn references_of_retained_blobs_parse() {
        let r = parse_ref(7, "4000000000000001 abc 1700").unwrap();
        assert_eq!(
            (r.version, r.epoch, r.hash.as_str(), r.published_at_ms),
            (7, 4_000_000_000_000_001, "abc", 1700)
        );
        for bad in ["", "x abc 1", "4 abc", "4  1", "4 abc x"] {
            assert_eq!(parse_ref(7, bad), None, "{bad:?}");
        }
    }
}
