#!/usr/bin/env bash
# Runs `ansible-test sanity` on a copy of the checkout placed where ansible-test wants a
# collection (…/ansible_collections/kpro/gpu_serving). Extra arguments go to ansible-test
# (for example a file list or `--test validate-modules`).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
venv="$top/.venv"
# Outside any git work tree: inside one, ansible-test would list only that tree's tracked files.
dest="${TMPDIR:-/tmp}/kpgs-sanity-$(printf %s "$top" | md5sum | cut -c1-8)-${SANITY_TAG:-main}/ansible_collections/kpro/gpu_serving"
py_version=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# ansible-test bootstraps pip in each sanity venv with a script it downloads from a host
# this machine cannot reach; a stand-in that uses ensurepip does the same job offline.
pip_version=$("$venv/bin/python" - <<'PY'
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import NativePythonConfig
print(get_venv_packages(NativePythonConfig(version=None, path=None))['pip'])
PY
) || pip_version=""
cache="$HOME/.ansible/test/cache"
mkdir -p "$cache"
for v in $pip_version 24.2 25.0.1 25.1.1 25.2 25.3; do
  f="$cache/get_pip_${v//./_}.py"
  [ -f "$f" ] || cat >"$f" <<'PY'
import subprocess, sys
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install", "--disable-pip-version-check"] + args)
PY
done

rm -rf "$dest"; mkdir -p "$dest"
cd "$top"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
  [ -e "$f" ] || continue
  mkdir -p "$dest/$(dirname "$f")"; cp -a "$f" "$dest/$f"
done
cd "$dest"
PATH="$venv/bin:$PATH" exec "$venv/bin/ansible-test" sanity --python "$py_version" --local --color no "$@"
