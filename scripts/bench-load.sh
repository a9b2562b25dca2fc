#!/usr/bin/env bash
# The ADS load benchmark (docs/PERFORMANCE.md, "xDS at scale"): a release build of
# pilotfish-xds pinned to core 0, the load client pinned to core 1, the issue's reference
# mesh (1,000 services, 2,000 sidecar streams) and 100 services with 5,000 streams, SotW
# and delta, each against the real server and the null server.
#
#   scripts/bench-load.sh               # both meshes
#   scripts/bench-load.sh --services 1000 --streams 2000 --edits 20 --modes delta
#                                       # one run, arguments passed to `pilotfish-xds-load bench`
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked --bin pilotfish-xds --bin pilotfish-xds-load

# Every stream is its own connection: both processes need a descriptor per stream and more.
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -lt 12000 ]; then
    echo "bench-load: needs at least 12000 open files per process (ulimit -Hn is $(ulimit -Hn))" >&2
    exit 1
fi

cores=$(nproc)
if [ "$cores" -ge 2 ]; then
    server=(--server-cpu 0)
    client=(taskset -c 1)
else
    echo "bench-load: one core only; server and client share it" >&2
    server=()
    client=()
fi

run() {
    "${client[@]}" ./target/release/pilotfish-xds-load bench \
        --server-bin target/release/pilotfish-xds "${server[@]}" "$@"
}

if [ "$#" -gt 0 ]; then
    run "$@"
else
    run --services 1000 --namespaces 20 --pods 2 --streams 2000 --edits 20
    run --services 100 --namespaces 20 --pods 2 --streams 5000 --edits 20
fi
