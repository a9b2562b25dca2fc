#!/usr/bin/env bash
# Regenerates (or with --check, verifies) xds-server/src/generate/envoy-descriptors.bin: the
# FileDescriptorSet pilotfish-xds embeds to print Envoy messages as proto JSON (golden
# files, config_dump). It is derived from the descriptor set the `envoy-types` crate ships
# (`src/generated/types.bin`), so the JSON mapping always matches the Rust types we encode
# with; run this after bumping envoy-types. Needs the .venv-pgv Python (scripts/deps).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
manifest=$(cargo metadata --format-version 1 --locked 2>/dev/null |
  python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "envoy-types"))')
types_bin="$(dirname "$manifest")/src/generated/types.bin"
[ -f "$types_bin" ] || { echo "no descriptor set at $types_bin" >&2; exit 1; }
bash scripts/deps/python-pgv.sh
exec .venv-pgv/bin/python scripts/envoy_descriptors.py "$types_bin" xds-server/src/generate/envoy-descriptors.bin "$@"
