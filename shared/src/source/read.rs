//! Reading one file of the config folder only when it is whole: a file that changed
//! within the settle window (a writer may be between two halves of it), that is not a
//! regular file, or whose identity (inode, size, times) changed while it was read, is not
//! used now but retried on a later scan. The caller keeps the file's last content
//! meanwhile.

use std::io::{self, Read};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// Files larger than this are refused: no Kubernetes object comes near it (the API server
/// refuses objects above 1.5 MiB, ConfigMaps above 1 MiB), and a stray huge file must not
/// cost the process its memory.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// What identifies a file's content without reading it: size, modification and change
/// times, and (on Unix) the inode, which a rename-into-place (editors, ConfigMap volume
/// swaps) changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    changed: (i64, i64),
    inode: (u64, u64),
}

impl FileStamp {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        let (changed, inode) = {
            use std::os::unix::fs::MetadataExt;
            ((meta.ctime(), meta.ctime_nsec()), (meta.dev(), meta.ino()))
        };
        #[cfg(not(unix))]
        let (changed, inode) = ((0, 0), (0, 0));
        FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            changed,
            inode,
        }
    }

    /// The later of the modification and the status-change time. The change time counts
    /// because tools that restore an old modification time (`cp -p`, `tar`) cannot set it.
    fn last_change(&self) -> Option<SystemTime> {
        let changed = u64::try_from(self.changed.0).ok().map(|s| {
            SystemTime::UNIX_EPOCH
                + Duration::from_secs(s)
                + Duration::from_nanos(self.changed.1.max(0) as u64)
        });
        match (self.modified, changed) {
            (Some(m), Some(c)) => Some(m.max(c)),
            (m, c) => m.or(c),
        }
    }
}

/// When this process first saw a file with a given stamp: a file whose times lie in the
/// future (a clock skew with a network file system) settles once it kept its stamp for
/// the settle window by this process' own clock.
#[derive(Clone, Copy, Debug)]
pub struct FirstSeen {
    pub stamp: FileStamp,
    pub at: Instant,
}

/// The answer of [`read_settled`].
#[derive(Debug)]
pub enum ReadOutcome {
    /// Same stamp as the content in use: nothing to read.
    Unchanged,
    /// Changed too recently, or changed while it was read: retry after `retry_after`.
    Unsettled {
        stamp: FileStamp,
        retry_after: Duration,
    },
    /// Not there any more (removed between listing and reading).
    Gone,
    /// The whole file, as it was during the whole read.
    Read { stamp: FileStamp, bytes: Vec<u8> },
    /// It cannot be read (permissions, I/O error, not a regular file, too large).
    Failed(String),
}

/// Reads `path` if it is settled: unchanged since `previous` → [`ReadOutcome::Unchanged`];
/// last changed less than `settle` before `now` (and not seen with the same stamp for
/// `settle` already, per `first_seen`) → [`ReadOutcome::Unsettled`]; otherwise it is
/// opened without blocking (a FIFO must not hang the scan), checked to be the regular file
/// that was looked at, read, and looked at again: any difference → unsettled.
pub fn read_settled(
    path: &Path,
    previous: Option<FileStamp>,
    first_seen: Option<FirstSeen>,
    settle: Duration,
    now: SystemTime,
) -> ReadOutcome {
    let stamp = match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => return ReadOutcome::Failed("not a regular file".into()),
        Ok(meta) => FileStamp::of(&meta),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return ReadOutcome::Gone,
        Err(e) => return ReadOutcome::Failed(e.to_string()),
    };
    if previous == Some(stamp) {
        return ReadOutcome::Unchanged;
    }
    if let Some(wait) = settle_wait(&stamp, first_seen, settle, now) {
        return ReadOutcome::Unsettled {
            stamp,
            retry_after: wait,
        };
    }
    if stamp.len > MAX_FILE_BYTES {
        return ReadOutcome::Failed(format!(
            "{} bytes, above the limit of {MAX_FILE_BYTES}",
            stamp.len
        ));
    }
    let unsettled = ReadOutcome::Unsettled {
        stamp,
        retry_after: settle,
    };
    let mut file = match open_nonblocking(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return ReadOutcome::Gone,
        Err(e) => return ReadOutcome::Failed(e.to_string()),
    };
    let same = |file: &std::fs::File| {
        file.metadata()
            .is_ok_and(|m| m.is_file() && FileStamp::of(&m) == stamp)
    };
    if !same(&file) {
        return unsettled;
    }
    let mut bytes = Vec::with_capacity(stamp.len as usize);
    if let Err(e) = (&mut file).take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes) {
        return ReadOutcome::Failed(e.to_string());
    }
    let path_same = std::fs::metadata(path).is_ok_and(|m| FileStamp::of(&m) == stamp);
    if !same(&file) || !path_same || bytes.len() as u64 != stamp.len {
        return unsettled;
    }
    ReadOutcome::Read { stamp, bytes }
}

/// How much longer a file with `stamp` must stay as it is before it is read; `None` when
/// it is settled.
fn settle_wait(
    stamp: &FileStamp,
    first_seen: Option<FirstSeen>,
    settle: Duration,
    now: SystemTime,
) -> Option<Duration> {
    const MIN_RETRY: Duration = Duration::from_millis(10);
    let by_clock = match stamp.last_change().map(|t| now.duration_since(t)) {
        Some(Ok(age)) if age >= settle => return None,
        Some(Ok(age)) => Some(settle - age),
        // In the future, or no times at all: only this process' clock can tell.
        _ => None,
    };
    let by_watching = match first_seen.filter(|f| f.stamp == *stamp) {
        Some(f) if f.at.elapsed() >= settle => return None,
        Some(f) => settle - f.at.elapsed(),
        None => settle,
    };
    Some(
        by_clock
            .unwrap_or(by_watching)
            .min(by_watching)
            .max(MIN_RETRY),
    )
}

fn open_nonblocking(path: &Path) -> io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading blocks until a writer comes; the check after opening
        // refuses it. (O_NONBLOCK does not change reads of regular files.)
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_secs(1);

    /// A FIFO (named pipe) at `path`, made by coreutils' `mkfifo`.
    fn mkfifo(path: &std::path::Path) {
        let made = std::process::Command::new("mkfifo").arg(path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", path.display());
    }

    fn later(d: Duration) -> SystemTime {
        SystemTime::now() + d
    }

    #[test]
    fn a_file_changed_within_the_window_waits_and_is_read_once_settled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.yaml");
        std::fs::write(&path, "a: 1\n").unwrap();
        let ReadOutcome::Unsettled { stamp, retry_after } =
            read_settled(&path, None, None, SETTLE, SystemTime::now())
        else {
            panic!("a file just written was read");
        };
        assert!(retry_after <= SETTLE);
        // Seen a window later (by the file system's clock): read, whole.
        match read_settled(&path, None, None, SETTLE, later(SETTLE)) {
            ReadOutcome::Read { stamp: s, bytes } => {
                assert_eq!(s, stamp);
                assert_eq!(bytes, b"a: 1\n");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read_settled(&path, Some(stamp), None, SETTLE, later(SETTLE)),
            ReadOutcome::Unchanged
        ));
    }

    /// Times in the future (clock skew): the file settles by this process' clock, after
    /// keeping its stamp for the window.
    #[test]
    fn a_file_from_the_future_settles_by_being_watched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.yaml");
        std::fs::write(&path, "a: 1\n").unwrap();
        let past = SystemTime::now() - Duration::from_secs(3600);
        let ReadOutcome::Unsettled { stamp, .. } = read_settled(&path, None, None, SETTLE, past)
        else {
            panic!("read although its times are in the future");
        };
        let seen_now = FirstSeen {
            stamp,
            at: Instant::now(),
        };
        assert!(matches!(
            read_settled(&path, None, Some(seen_now), SETTLE, past),
            ReadOutcome::Unsettled { .. }
        ));
        let Some(long_ago) = Instant::now().checked_sub(SETTLE) else {
            return;
        };
        let seen_long_ago = FirstSeen {
            stamp,
            at: long_ago,
        };
        assert!(matches!(
            read_settled(&path, None, Some(seen_long_ago), SETTLE, past),
            ReadOutcome::Read { .. }
        ));
    }

    #[test]
    fn fifos_directories_missing_and_oversized_files_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe.yaml");
        mkfifo(&fifo);
        let far = later(SETTLE * 10);
        assert!(matches!(
            read_settled(&fifo, None, None, SETTLE, far),
            ReadOutcome::Failed(m) if m == "not a regular file"
        ));
        assert!(matches!(
            read_settled(dir.path(), None, None, SETTLE, far),
            ReadOutcome::Failed(_)
        ));
        assert!(matches!(
            read_settled(&dir.path().join("nope.yaml"), None, None, SETTLE, far),
            ReadOutcome::Gone
        ));
        let big = dir.path().join("big.yaml");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_FILE_BYTES + 1).unwrap();
        assert!(matches!(
            read_settled(&big, None, None, SETTLE, far),
            ReadOutcome::Failed(m) if m.contains("above the limit")
        ));
    }
}
