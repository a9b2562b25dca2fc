#!/usr/bin/env bash
# Installs @bitnami/readme-generator-for-helm into .tools/readme-generator/ (git-ignored)
# from the committed package.json + package-lock.json beside this script, with `npm ci`,
# so every machine gets the same tree. scripts/gen-manifests.sh uses it to write the
# Parameters table of the chart's README from the comments in values.yaml.
# Idempotent: returns at once when the installed lockfile equals the committed one.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
pins="$root/scripts/deps/readme-generator"
dest="$root/.tools/readme-generator"

if [ -x "$dest/node_modules/.bin/readme-generator" ] &&
  cmp -s "$pins/package-lock.json" "$dest/package-lock.json"; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "npm is missing: install Node.js (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest"
cp "$pins/package.json" "$pins/package-lock.json" "$dest/"
(cd "$dest" && npm ci --no-audit --no-fund --loglevel=error)
echo "installed @bitnami/readme-generator-for-helm into $dest"
