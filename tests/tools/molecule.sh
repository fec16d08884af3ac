#!/usr/bin/env bash
# Runs every molecule scenario under extensions/molecule against the lab (delegated
# driver). Scenarios bring the lab up themselves (create) and down (destroy).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top/extensions"
export PATH="$top/.venv/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$top/.collections"
export ANSIBLE_CONFIG="$top/ansible.cfg"
scenarios=$(find molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' 2>/dev/null | xargs -rn1 basename | sort)
if [ -z "$scenarios" ]; then
  echo "molecule: no scenarios under extensions/molecule" >&2
  exit 1
fi
for s in ${MOLECULE_SCENARIOS:-$scenarios}; do
  echo "=== molecule test -s $s"
  "$top/.venv/bin/molecule" test -s "$s"
done
