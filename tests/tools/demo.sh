#!/usr/bin/env bash
# The main job on the lab: a fresh simulated kpro5, the full migration playbook, then
# the same playbook again, which must report changed=0 for every host; the lab is
# brought down at the end whatever happened.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
py=.venv/bin/python
log_dir=.demo  # outside tests/lab/.run, which lab down removes
trap '$py tests/lab/labctl.py down >/dev/null 2>&1 || true' EXIT
$py tests/lab/labctl.py reset
mkdir -p "$log_dir"
play() {
  ANSIBLE_CONFIG="$top/ansible.cfg" .venv/bin/ansible-playbook -i inventories/lab playbooks/migrate-kpro6-to-kpro5.yml
}
echo "=== first run (converge)"
play | tee "$log_dir/run1.log"
echo "=== second run (must change nothing)"
play | tee "$log_dir/run2.log"
# Every host's recap line must say changed=0 (and failed=0).
recap=$(sed -n '/^PLAY RECAP/,$p' "$log_dir/run2.log" | grep -E 'ok=')
if echo "$recap" | grep -Ev 'changed=0 .*failed=0' >/dev/null; then
  echo "demo: the second run changed something or failed:" >&2
  echo "$recap" >&2
  exit 1
fi
echo "=== second run: changed=0 on every host"
echo "$recap"
