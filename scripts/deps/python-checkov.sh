#!/usr/bin/env bash
# Installs checkov (static analysis of the rendered Helm chart) into .venv-checkov/
# (git-ignored). It has a venv of its own because it pins many libraries (packaging,
# among others) that would fight the pins of .venv-tools.
# Idempotent: returns at once when the pinned version is already installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv-checkov"
# Pinned: a newer checkov adds checks, which would fail `make manifests-check` on a
# machine that happened to install it later.
checkov_version=3.3.30

installed=$("$venv/bin/python" -c \
  'import importlib.metadata as m; print(m.version("checkov"))' 2>/dev/null || true)
if [ -x "$venv/bin/checkov" ] && [ "$installed" = "$checkov_version" ]; then
  exit 0
fi

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "checkov==$checkov_version"
echo "installed checkov==$checkov_version into $venv"
