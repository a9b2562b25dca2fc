#!/usr/bin/env bash
# Node's gRPC xDS client (@grpc/grpc-js-xds) for the end-to-end tests, installed from the
# npm registry into testkit/node/node_modules/ at the versions package-lock.json pins.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir="$root/testkit/node"
command -v node >/dev/null || { echo "node is required for the grpc-js-xds tests" >&2; exit 1; }
want=$(node -e "console.log(require('$dir/package.json').dependencies['@grpc/grpc-js-xds'])")
have=$(node -e "try{console.log(require('$dir/node_modules/@grpc/grpc-js-xds/package.json').version)}catch(e){}")
if [ "$have" = "$want" ]; then
  exit 0
fi
# --ignore-scripts: no package needs an install script for the client (protobufjs's
# postinstall only prints a version warning).
(cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
echo "installed @grpc/grpc-js-xds@$want into $dir/node_modules"
