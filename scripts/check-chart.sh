#!/usr/bin/env bash
# Checks the Helm chart and the Dockerfile (run by `make manifests-check`, part of make test):
#   - helm lint --strict, with the default values and each value set in the chart's ci/;
#   - helm template of each of those, CRDs included, validated with kubernetes-validate
#     --strict against Kubernetes 1.33 (the oldest version the project tests with) and 1.37
#     (the newest kubernetes-validate knows);
#   - checkov on each rendering: no failed check; the few skips are checkov.io/skipN
#     annotations in the templates, each with its reason beside it;
#   - hadolint on the Dockerfile (no Docker engine here, so the images are not built).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
chart=manifests/helm/pilotfish
kubernetes_versions=(1.33.0 1.37.0)

"$root/scripts/deps/kube-tools.sh" >/dev/null
"$root/scripts/deps/python-tools.sh"
"$root/scripts/deps/python-checkov.sh"
helm="$root/.tools/bin/helm"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

value_sets=(default "$chart"/ci/*-values.yaml)
for values in "${value_sets[@]}"; do
  name=$(basename "$values" .yaml)
  args=()
  [ "$values" = default ] || args=(--values "$values")
  echo "==> $name"
  "$helm" lint --strict --quiet "$chart" "${args[@]}" --namespace pilotfish-system
  "$helm" template pilotfish "$chart" "${args[@]}" --namespace pilotfish-system --include-crds \
    >"$tmp/$name.yaml"
  for version in "${kubernetes_versions[@]}"; do
    "$root/.venv-tools/bin/kubernetes-validate" --strict --quiet --kubernetes-version "$version" \
      "$tmp/$name.yaml"
  done
  # --skip-download: no network (and no Prisma Cloud account) on these machines.
  "$root/.venv-checkov/bin/checkov" --file "$tmp/$name.yaml" --framework kubernetes \
    --skip-download --compact --quiet >"$tmp/$name.checkov" 2>&1 || {
    cat "$tmp/$name.checkov" >&2
    echo "ERROR: checkov failed on the chart rendered with $values" >&2
    exit 1
  }
  grep -E "Passed checks|Skipped checks" "$tmp/$name.checkov" || true
done

echo "==> Dockerfile"
"$root/.venv-tools/bin/hadolint" Dockerfile
echo "chart: lint, kubernetes-validate ${kubernetes_versions[*]}, checkov and hadolint passed for ${#value_sets[@]} value sets"
