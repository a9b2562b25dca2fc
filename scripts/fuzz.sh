#!/usr/bin/env bash
# `make fuzz`: coverage-guided fuzzing (cargo-fuzz, libFuzzer) of what reads untrusted
# bytes — snapshot blobs, config-folder YAML, ADS requests (fuzz/fuzz_targets/). Each
# target runs FUZZ_SECONDS (default 60) from seed corpora made from the repo's test data
# (plus whatever earlier runs found, kept in fuzz/corpus/); any crash, panic, timeout or
# out-of-memory fails the run and leaves the input in fuzz/artifacts/TARGET/.
#
# cargo-fuzz needs a nightly compiler (sanitizers, -Z flags): the `nightly` toolchain when
# rustup has one, else the pinned stable toolchain with RUSTC_BOOTSTRAP=1. cargo-fuzz
# itself is installed into .tools/cargo when missing. FUZZ_TARGETS picks targets.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-snapshot_blob yaml_documents ads_sotw_requests ads_delta_requests}

tools=$root/.tools/cargo
export PATH="$tools/bin:$PATH"
if ! command -v cargo-fuzz >/dev/null; then
  echo "installing cargo-fuzz into $tools"
  cargo install --locked --root "$tools" cargo-fuzz
fi

if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=(+nightly)
  echo "fuzzing with the nightly toolchain"
else
  # The pinned stable compiler accepts nightly flags with RUSTC_BOOTSTRAP=1.
  toolchain=()
  export RUSTC_BOOTSTRAP=1
  echo "no nightly toolchain: fuzzing with $(rustc --version) and RUSTC_BOOTSTRAP=1"
fi

# Seeds from the repo's test data (a plain debug build in the main workspace).
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
cargo run -q -p pilotfish-testkit --bin pilotfish-fuzz-seeds -- "$root" "$seeds"

cd fuzz
cargo "${toolchain[@]}" fuzz build --release
status=0
for target in $targets; do
  corpus=corpus/$target
  mkdir -p "$corpus" "artifacts/$target"
  echo "== $target: ${seconds}s"
  # -rss_limit_mb: a decoder must not need more than 1 GiB for any input (the chart
  # gives replicas 1 GiB); -timeout: no input may take 10 s.
  if ! cargo "${toolchain[@]}" fuzz run --release "$target" "$corpus" "$seeds/$target" -- \
      -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -print_final_stats=1; then
    echo "== $target FAILED: see fuzz/artifacts/$target/" >&2
    status=1
  fi
done
exit $status
