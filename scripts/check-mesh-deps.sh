#!/usr/bin/env bash
# "The domain does no I/O" as a Cargo fact: fails when pilotfish-mesh (mesh/) depends, as a
# normal dependency, directly or through any other crate, on an async runtime, Redis, file
# watching, a metrics registry, flag parsing or log setup. Those belong to pilotfish-shared
# and the binaries. Build and dev dependencies are not checked (protox, criterion).
#
#   scripts/check-mesh-deps.sh    run by `make lint`
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
package=pilotfish-mesh
forbidden=(tokio redis notify prometheus clap tracing-subscriber)

# Every package in the normal-dependency tree, for every target platform, one name a line.
tree=$(cargo tree --quiet --package "$package" --edges normal --target all \
  --prefix none --format '{p}')
names=$(sed -e 's/ .*//' <<<"$tree" | sort -u)
if ! grep -qx "$package" <<<"$names"; then
  echo "ERROR: cargo tree did not list $package itself; cannot check its dependencies." >&2
  exit 1
fi

found=()
for crate in "${forbidden[@]}"; do
  if grep -qx "$crate" <<<"$names"; then
    found+=("$crate")
  fi
done
if [ "${#found[@]}" -gt 0 ]; then
  for crate in "${found[@]}"; do
    echo "ERROR: $package depends on $crate (the domain crate does no I/O). Path:" >&2
    cargo tree --quiet --package "$package" --edges normal --target all \
      --invert "$crate" >&2 || true
  done
  exit 1
fi
echo "$package: no ${forbidden[*]} among the $(wc -l <<<"$names") packages of its normal dependency tree"
