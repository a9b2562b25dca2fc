#!/usr/bin/env bash
# Installs what the test suite needs that a fresh machine lacks. Each concern has its own
# script in scripts/deps/ (idempotent: it returns at once when its tool is present).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for s in "$here"/deps/*.sh; do
  [ -e "$s" ] || continue
  echo "==> $(basename "$s")"
  bash "$s"
done
