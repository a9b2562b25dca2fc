//! Prometheus metrics of the folder source, in the default registry: how many files it
//! read (a quiet folder reads none), put off while they were changing, or skipped, and how
//! many objects of each kind it ignores.

use std::sync::LazyLock;

use prometheus::{IntCounter, IntGaugeVec, Opts, register_int_counter, register_int_gauge_vec};

// Registration fails only on a duplicate name or a malformed definition: programming
// errors that the unit test below catches, so a panic at first use is the right response.

/// Files read from disk (unchanged files are not read again).
pub static FILE_READS: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "pilotfish_source_file_reads_total",
        "Files the folder source read from disk (files whose size and times are unchanged are not read)."
    )
    .expect("register pilotfish_source_file_reads_total")
});

/// Objects in the folder that Pilotfish does not read, by `apiVersion/kind`.
pub static IGNORED_OBJECTS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        Opts::new(
            "pilotfish_source_ignored_objects",
            "Objects in the config folder of kinds Pilotfish does not read (Istio kinds it does not support yet included), by apiVersion/kind."
        ),
        &["kind"]
    )
    .expect("register pilotfish_source_ignored_objects")
});

/// Documents of the folder that do not parse (their object's last good version, if
/// any, stays in use).
pub static INVALID_DOCUMENTS: LazyLock<prometheus::IntGauge> = LazyLock::new(|| {
    prometheus::register_int_gauge!(
        "pilotfish_source_invalid_documents",
        "Documents (or whole files) of the config folder that do not parse."
    )
    .expect("register pilotfish_source_invalid_documents")
});

/// Reads put off because the file changed within the settle window or during the read.
pub static DEFERRED_READS: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "pilotfish_source_deferred_reads_total",
        "Times the folder source put off reading a file because it was changing (modified within the settle window, or during the read); the file is read once settled."
    )
    .expect("register pilotfish_source_deferred_reads_total")
});

/// Entries of the folder skipped by the last scan (unreadable folders, looping links,
/// FIFOs, links to nothing).
pub static SKIPPED_PATHS: LazyLock<prometheus::IntGauge> = LazyLock::new(|| {
    prometheus::register_int_gauge!(
        "pilotfish_source_skipped_paths",
        "Entries of the config folder the last scan skipped: folders it cannot list, links that loop or lead nowhere, files that are not regular files."
    )
    .expect("register pilotfish_source_skipped_paths")
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_registers_and_renders() {
        FILE_READS.inc_by(0);
        IGNORED_OBJECTS.with_label_values(&["test/v1/Thing"]).set(0);
        INVALID_DOCUMENTS.set(INVALID_DOCUMENTS.get());
        DEFERRED_READS.inc_by(0);
        SKIPPED_PATHS.set(SKIPPED_PATHS.get());
        let text = crate::telemetry::render_metrics();
        for name in [
            "pilotfish_source_file_reads_total",
            "pilotfish_source_ignored_objects",
            "pilotfish_source_invalid_documents",
            "pilotfish_source_deferred_reads_total",
            "pilotfish_source_skipped_paths",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
    }
}
