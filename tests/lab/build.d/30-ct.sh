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
# The lab's state library and NVML renderer: the "driver" every container process shares with
# the node, so a GPU allocation made in the CT (the SGLang stand-in) re-renders nvml.conf at once.
for f in labstate.py nvml_render.py; do
    install -D -m 0644 "$LAB/rootfs/usr/lib/kpro-lab/$f" "$SEED.new/usr/lib/kpro-lab/$f"
done
rm -rf "$SEED"
mv "$SEED.new" "$SEED"
