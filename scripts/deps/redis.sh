#!/usr/bin/env bash
# Installs Debian's redis-server for the snapshot-bus tests. The tests start their own
# redis-server processes on 127.0.0.1 with no persistence, so the system service is not
# started (policy-rc.d refuses it) and is left alone if it already exists. Idempotent:
# returns at once when redis-server is on PATH.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "redis-server is missing and this script needs root to apt-get install it" >&2
  exit 1
fi
# Refuse service starts during the install (exit code 101 = action forbidden), and remove
# that guard afterwards only if we created it.
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  created_policy=1
fi
trap '[ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends redis-server
command -v redis-server >/dev/null
