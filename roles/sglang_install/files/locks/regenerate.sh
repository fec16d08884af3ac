#!/usr/bin/env bash
# Regenerate the hashed SGLang lock for the container, against the real index (PyPI, or
# UV_INDEX_URL / UV_DEFAULT_INDEX when set), for Linux x86_64:
#
#   roles/sglang_install/files/locks/regenerate.sh VERSION PYVER [extra uv pip compile args...]
#   roles/sglang_install/files/locks/regenerate.sh 0.5.11 3.11
#   make sglang-lock SGLANG_VERSION=0.5.11 PYVER=3.11
#
# writes sglang-VERSION-pyPYVER-x86_64.txt next to this script (the name sglang_install
# looks for), or into $LOCK_DIR when set. PLATFORM (default x86_64-manylinux_2_36, glibc 2.36 = Debian bookworm) selects
# the wheels; uv comes from $UV, else the checkout's .venv, else PATH. No Python is
# downloaded (UV_PYTHON_DOWNLOADS=never): uv resolves for --python-version without one.
set -euo pipefail
usage="usage: $0 VERSION PYVER [extra uv pip compile args]   e.g. $0 0.5.11 3.11"
version=${1:?$usage}
pyver=${2:?$usage}
shift 2
[[ $version =~ ^[0-9][0-9A-Za-z.+!-]*$ ]] || { echo "bad version: $version" >&2; exit 2; }
[[ $pyver =~ ^3\.[0-9]+$ ]] || { echo "bad Python version (X.Y): $pyver" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../../.." && pwd)
platform=${PLATFORM:-x86_64-manylinux_2_36}
uv=${UV:-}
if [ -z "$uv" ]; then
  if [ -x "$top/.venv/bin/uv" ]; then uv="$top/.venv/bin/uv"; else uv=$(command -v uv) || { echo "uv not found (make setup)" >&2; exit 1; }; fi
fi
out="${LOCK_DIR:-$here}/sglang-$version-py$pyver-x86_64.txt"
tmp=$(mktemp "$out.XXXXXX")
trap 'rm -f "$tmp"' EXIT
compile() {
  printf '%s\n' "$@" | UV_PYTHON_DOWNLOADS=never "$uv" pip compile - \
    --python-version "$pyver" --python-platform "$platform" --generate-hashes \
    --custom-compile-command "roles/sglang_install/files/locks/regenerate.sh $version $pyver" \
    -o "$tmp" "${extra[@]}"
}
extra=("$@")
# uv keeps the pins of an existing output file it can: a regenerated lock moves only what it must
if [ -f "$out" ]; then cp "$out" "$tmp"; fi
compile "sglang==$version"
grep -q "^sglang==$version " "$tmp" || { echo "the lock does not pin sglang==$version" >&2; exit 1; }
# SGLang compiles kernels at its first forward pass (docs/runtime-toolchain.md): FlashInfer's JIT needs nvcc and the CCCL
# headers of the CUDA release torch is built for. torch pins that release as cuda-toolkit==X (its Requires-Dist); the
# same metapackage's extras nvcc, crt, nvvm and cccl give the compiler of exactly that release, hashed in the same lock
# (nvcc, crt and nvvm named together: nvidia-cuda-nvcc leaves its crt and nvvm unpinned, and uv would take the newest).
toolkit=$(sed -n 's/^cuda-toolkit==\([^ ]*\).*/\1/p' "$tmp")
[ -n "$toolkit" ] || { echo "the lock has no cuda-toolkit (torch's CUDA release): cannot pin nvcc" >&2; exit 1; }
compile "sglang==$version" "cuda-toolkit[nvcc,crt,nvvm,cccl]==$toolkit"
grep -q "^nvidia-cuda-nvcc==" "$tmp" || { echo "the lock does not pin nvidia-cuda-nvcc" >&2; exit 1; }
mv "$tmp" "$out"
trap - EXIT
echo "wrote $out ($(grep -c '^[A-Za-z0-9]' "$out") packages)"
