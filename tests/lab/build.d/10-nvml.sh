#!/bin/sh
# Build the lab's simulated NVIDIA driver stack on the controller and place it in the node:
#   .run/build/libnvidia-ml.so.1                      fake NVML (tests/lab/nvml/fakenvml.c)
#   .run/build/NVIDIA-Linux-x86_64-<ver>.run(.sha256) installer stand-in carrying it
# and copies both to <node>/usr/lib/kpro-lab/blobs/. Run by labctl with KPGS_NODE_ROOT and
# KPGS_RUN set; idempotent (the .run is byte-reproducible).
set -eu
LAB=$(cd "$(dirname "$0")/.." && pwd)
: "${KPGS_RUN:=$LAB/.run}"
VERSION=${KPGS_NVIDIA_VERSION:-580.126.09}
B="$KPGS_RUN/build"
mkdir -p "$B"
gcc -shared -fPIC -O2 -Wall -Wl,-soname,libnvidia-ml.so.1 -o "$B/libnvidia-ml.so.1.tmp" "$LAB/nvml/fakenvml.c" -ldl
mv -f "$B/libnvidia-ml.so.1.tmp" "$B/libnvidia-ml.so.1"
python3 "$LAB/nvidia/build_run.py" --version "$VERSION" --lib "$B/libnvidia-ml.so.1" \
    --out "$B/NVIDIA-Linux-x86_64-$VERSION.run" >/dev/null
if [ -n "${KPGS_NODE_ROOT:-}" ]; then
    install -d "$KPGS_NODE_ROOT/usr/lib/kpro-lab/blobs"
    install -m 0644 "$B/libnvidia-ml.so.1" "$KPGS_NODE_ROOT/usr/lib/kpro-lab/blobs/libnvidia-ml.so.1"
    install -m 0755 "$B/NVIDIA-Linux-x86_64-$VERSION.run" "$B/NVIDIA-Linux-x86_64-$VERSION.run.sha256" \
        "$KPGS_NODE_ROOT/usr/lib/kpro-lab/blobs/"
fi
