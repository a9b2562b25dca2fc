#!/usr/bin/env bash
# Generates the Istio CRDs in crds/ from the Rust types (shared/src/api) with pilotfish-crdgen.
#
#   scripts/gen-crds.sh           regenerate crds/
#   scripts/gen-crds.sh --check   regenerate into a temp dir, fail if crds/ differs (drift),
#                                 and validate every file with kubernetes-validate --strict
#                                 against Kubernetes 1.33.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
kubernetes_version=1.33.0

mode=write
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

generate() {
  cargo run --quiet --package pilotfish-shared --bin pilotfish-crdgen -- "$1" >/dev/null
}

if [ "$mode" = write ]; then
  # Regenerate from scratch so that a CRD that no longer exists leaves no stale file.
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  generate "$tmp"
  mkdir -p crds
  rm -f crds/*.yaml
  cp "$tmp"/*.yaml crds/
  echo "crds/ regenerated: $(cd crds && ls *.yaml | tr '\n' ' ')"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generate "$tmp"
if ! diff -ru crds "$tmp" >"$tmp.diff" 2>&1; then
  echo "ERROR: crds/ is out of date with the types in shared/src/api." >&2
  echo "Run 'make crds' and commit the result. Difference (checked-in vs generated):" >&2
  head -n 60 "$tmp.diff" >&2
  rm -f "$tmp.diff"
  exit 1
fi
rm -f "$tmp.diff"

"$root/scripts/deps/python-tools.sh"
"$root/.venv-tools/bin/kubernetes-validate" --strict --quiet \
  --kubernetes-version "$kubernetes_version" crds/*.yaml
echo "crds/ is up to date and valid for Kubernetes $kubernetes_version"
