#!/usr/bin/env bash
# Installs Envoy's protoc-gen-validate checker into .venv-pgv/ (git-ignored), used by the
# golden tests of pilotfish-xds as a stand-in for Envoy's own acceptance of our resources:
#   xds-protos           — Envoy's protos compiled for Python, PGV annotations included
#   protoc-gen-validate  — evaluates those annotations on a message (`validate()`)
# The three versions are pinned together: protoc-gen-validate 1.3.3 works with protobuf 5
# only (protobuf 7 breaks it), and xds-protos 1.69 is built against protobuf 5.
# Idempotent: returns at once when the pinned versions are already installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv-pgv"
requirements=("protobuf==5.29.6" "xds-protos==1.69.0" "protoc-gen-validate==1.3.3")

installed=$("$venv/bin/python" - 2>/dev/null <<'PY' || true
import importlib.metadata as m
print(" ".join(f"{p}=={m.version(p)}" for p in ("protobuf", "xds-protos", "protoc-gen-validate")))
PY
)
if [ "$installed" = "${requirements[*]}" ]; then
  exit 0
fi

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}"
echo "installed ${requirements[*]} into $venv"
