#!/usr/bin/env bash
# Generates the Istio CRDs from the Rust types (mesh/src/api) with pilotfish-crdgen, into
# both places that ship them: crds/ (for kubectl and the tests) and the Helm chart's crds/
# (manifests/helm/pilotfish/crds/, which helm installs before the templates). One
# generator, one drift check.
#
#   scripts/gen-crds.sh           regenerate both folders
#   scripts/gen-crds.sh --check   regenerate into a temp dir, fail if either folder differs
#                                 (drift), and validate every file with
#                                 kubernetes-validate --strict against Kubernetes 1.33.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
kubernetes_version=1.33.0
targets=(crds manifests/helm/pilotfish/crds)

mode=write
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

generate() {
  cargo run --quiet --package pilotfish-mesh --bin pilotfish-crdgen -- "$1" >/dev/null
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generate "$tmp/generated"

if [ "$mode" = write ]; then
  for target in "${targets[@]}"; do
    # Regenerate from scratch so that a CRD that no longer exists leaves no stale file.
    mkdir -p "$target"
    rm -f "$target"/*.yaml
    cp "$tmp"/generated/*.yaml "$target"/
    echo "$target/ regenerated: $(cd "$target" && ls *.yaml | tr '\n' ' ')"
  done
  exit 0
fi

for target in "${targets[@]}"; do
  if ! diff -ru "$target" "$tmp/generated" >"$tmp/diff" 2>&1; then
    echo "ERROR: $target/ is out of date with the types in mesh/src/api." >&2
    echo "Run 'make crds' (then 'make manifests') and commit the result. Difference (checked-in vs generated):" >&2
    head -n 60 "$tmp/diff" >&2
    exit 1
  fi
done

"$root/scripts/deps/python-tools.sh"
"$root/.venv-tools/bin/kubernetes-validate" --strict --quiet \
  --kubernetes-version "$kubernetes_version" crds/*.yaml
echo "${targets[*]} are up to date and valid for Kubernetes $kubernetes_version"
