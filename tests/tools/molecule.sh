#!/usr/bin/env bash
# Runs every molecule scenario under extensions/molecule against the lab (delegated
# driver). Scenarios bring the lab up themselves (create) and down (destroy).
# Every scenario runs even when one fails; the end of the output then repeats the
# lines that say what failed (a CI log often shows only its tail).
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
logs="$top/tests/lab/.run/molecule"
mkdir -p "$logs"
failed=()
for s in ${MOLECULE_SCENARIOS:-$scenarios}; do
  echo "=== molecule test -s $s"
  start=$SECONDS
  if "$top/.venv/bin/molecule" test -s "$s" 2>&1 | tee "$logs/$s.log"; then
    echo "=== molecule $s passed in $((SECONDS - start)) s"
  else
    echo "=== molecule $s FAILED after $((SECONDS - start)) s"
    failed+=("$s")
  fi
done
for s in "${failed[@]}"; do
  echo "=== what failed in scenario $s (full log: $logs/$s.log)"
  sed 's/\x1b\[[0-9;]*m//g' "$logs/$s.log" \
    | grep -E 'MISMATCH|NOT ready|CHANGED:|fatal: |FAILED!|failed=[1-9]|Assertion failed|ERROR |"msg": ' | tail -n 60 || true
done
[ ${#failed[@]} -eq 0 ]
