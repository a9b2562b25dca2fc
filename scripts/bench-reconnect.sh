#!/usr/bin/env bash
# The mass-reconnect run (docs/PERFORMANCE.md, "Mass reconnect"): three release
# pilotfish-xds --config-dir replicas on one mesh, 2,000 Envoy-like streams spread over
# them, one replica killed by PID, its streams reconnecting to the others with Envoy's
# backoff while an edit is pushed. Prints the figures; not a test.
#
#   scripts/bench-reconnect.sh                      # 2,000 SotW streams, 3 replicas
#   scripts/bench-reconnect.sh --mode delta --streams 3000
#                                                   # arguments passed to `pilotfish-xds-load reconnect`
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked --bin pilotfish-xds --bin pilotfish-xds-load

# Every stream is its own connection, in the client and in a replica.
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -lt 8192 ]; then
    echo "bench-reconnect: needs at least 8192 open files per process (ulimit -Hn is $(ulimit -Hn))" >&2
    exit 1
fi

./target/release/pilotfish-xds-load reconnect --server-bin target/release/pilotfish-xds "$@"
