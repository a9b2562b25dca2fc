#!/usr/bin/env bash
# Installs the Python tools the checks need into .venv-tools/ (git-ignored):
#   kubernetes-validate — validates the generated CRDs against Kubernetes' own schemas.
# Idempotent: returns at once when the pinned versions are already installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv-tools"
# Pinned so that `make crds-check` gives the same answer on every machine.
kubernetes_validate_version=1.37.0
requirements=("kubernetes-validate==$kubernetes_validate_version")

installed=$("$venv/bin/python" -c \
  'import importlib.metadata as m; print(m.version("kubernetes-validate"))' 2>/dev/null || true)
if [ -x "$venv/bin/kubernetes-validate" ] && [ "$installed" = "$kubernetes_validate_version" ]; then
  exit 0
fi

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}"
echo "installed ${requirements[*]} into $venv"
