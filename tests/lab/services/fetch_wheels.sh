#!/usr/bin/env bash
# Download, once, the wheels the lab's package index serves that come from PyPI (today: uv, at the
# version pinned in requirements/dev.lock) into a cache directory, and check them against the lock's
# hashes. Runs on the controller (which can reach PyPI); the lab namespaces cannot.
#
#   tests/lab/services/fetch_wheels.sh [CACHE_DIR]     (default ${KPGS_LAB_CACHE:-/var/cache/kpgs-lab}/wheels)
#
# Then serve it: labsvc.py ... --index-port 18601 --index-dir CACHE_DIR [--index-dir <stand-in wheels>]
# PIP overrides the pip command (default: python3 -m pip). Idempotent: a wheel already in the cache
# with a locked hash is not fetched again.
set -euo pipefail
top=$(cd "$(dirname "$0")/../../.." && pwd)
cache="${1:-${KPGS_LAB_CACHE:-/var/cache/kpgs-lab}/wheels}"
lock="$top/requirements/dev.lock"
pip=${PIP:-python3 -m pip}
ver=$(sed -n 's/^uv==\([^ ]*\).*/\1/p' "$lock")
[ -n "$ver" ] || { echo "fetch_wheels: no uv== pin in $lock" >&2; exit 1; }
# the sha256 values of uv's entry in the lock (the lines after "uv==" up to the next requirement)
hashes=$(awk '/^[^ #]/{f=($0 ~ /^uv==/)} f&&/--hash=sha256:/{h=$0; sub(/.*--hash=sha256:/,"",h); sub(/[ \\].*/,"",h); print h}' "$lock")
mkdir -p "$cache"
have() {
  local w
  for w in "$cache"/uv-"$ver"-*manylinux*x86_64*.whl; do
    [ -f "$w" ] && grep -qx "$(sha256sum "$w" | cut -d' ' -f1)" <<<"$hashes" && { echo "$w"; return 0; }
  done
  return 1
}
if w=$(have); then echo "fetch_wheels: cached $w"; exit 0; fi
$pip download --disable-pip-version-check --no-cache-dir --only-binary=:all: --no-deps \
  --platform manylinux_2_17_x86_64 --python-version 3.11 --implementation py -d "$cache" "uv==$ver"
if w=$(have); then echo "fetch_wheels: fetched $w"; exit 0; fi
echo "fetch_wheels: the downloaded uv $ver wheel does not match any sha256 in $lock" >&2
exit 1
