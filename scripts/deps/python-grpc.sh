#!/usr/bin/env bash
# gRPC's own xDS client for the end-to-end tests: Python grpcio in .venv-grpc/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv-grpc"
version=1.85.1
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import grpc, sys; sys.exit(grpc.__version__ != '$version')" 2>/dev/null; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "grpcio==$version"
echo "installed grpcio==$version into $venv"
