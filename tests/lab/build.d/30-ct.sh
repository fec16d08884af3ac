#!/bin/sh
# Install the container seed into the node: tests/lab/rootfs-ct/ (the CT's init + systemd
# stand-in, systemctl, journalctl) -> <node>/usr/lib/kpro-lab/ct-seed/, which the node's CT
# runtime (usr/lib/kpro-lab/ct/runtime.py) copies into every container's rootfs at start.
# Run by labctl with KPGS_NODE_ROOT (writable node root) and KPGS_RUN; idempotent.
set -eu
LAB=$(cd "$(dirname "$0")/.." && pwd)
: "${KPGS_NODE_ROOT:?KPGS_NODE_ROOT (the node root) is required}"
SEED="$KPGS_NODE_ROOT/usr/lib/kpro-lab/ct-seed"
rm -rf "$SEED.new"
mkdir -p "$SEED.new"
# copy the tree, without caches
(cd "$LAB/rootfs-ct" && find . -type d -name __pycache__ -prune -o -type f -print) | while IFS= read -r f; do
    install -D -m "$(stat -c %a "$LAB/rootfs-ct/$f")" "$LAB/rootfs-ct/$f" "$SEED.new/$f"
done
rm -rf "$SEED"
mv "$SEED.new" "$SEED"
