#!/usr/bin/env bash
# Installs Debian's redis-server (and openssl, for the TLS test's certificates) for the
# snapshot-bus tests. The tests start their own redis-server processes on 127.0.0.1 with
# no persistence, so the system service is not started (policy-rc.d refuses it).
# Idempotent: returns at once when both tools are on PATH.
set -euo pipefail
# openssl generates the throw-away certificates of the TLS test.
if command -v redis-server >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1; then
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
trap 'if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends redis-server openssl
command -v redis-server >/dev/null
command -v openssl >/dev/null
