#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: run_lock
short_description: One run at a time per container - take or release its lock on the Proxmox node
version_added: "0.2.0"
description:
  - "Runs on the container's Proxmox node (C(delegate_to)). The lock is C(<lock_dir>/kpro-gpu-serving-<vmid>.lock): the
    holder as JSON (controller host, ansible-playbook PID and start time, when taken, the node's boot id), empty when
    free; every look and change is made under C(flock) on that file."
  - "The action plugin of the same name (on the controller) names this run, waits up to O(wait) seconds for another
    run's lock, polling every O(poll) seconds, and then fails (phase C(run_locked)) naming the holder. A lock is
    taken over when its holder's ansible-playbook process on this same controller is gone, when the node rebooted
    since it was taken, or when it was taken more than O(max_age) seconds ago."
  - A second take by the same run (a later stage) renews it; O(state=released) frees it only when this run holds it.
author:
  - kpro.gpu_serving developers (!UNKNOWN)
options:
  vmid:
    description: The container the run changes.
    type: int
    required: true
  state:
    description: V(taken) or V(released).
    type: str
    choices: [taken, released]
    default: taken
  max_age:
    description: Seconds after which a lock that was never released is stale (longer than the longest run).
    type: int
    default: 21600
  wait:
    description: Seconds to wait for another run's lock (in the action plugin, on the controller).
    type: int
    default: 120
  poll:
    description: Seconds between two tries while waiting (in the action plugin).
    type: int
    default: 5
  lock_dir:
    description: The directory of the lock file on the node (a tmpfs, emptied at boot).
    type: path
    default: /run/lock
  owner:
    description: This run (set by the action plugin; not to be given).
    type: dict
  take_over:
    description: The run id of a holder the controller found gone (set by the action plugin; not to be given).
    type: str
"""

EXAMPLES = r"""
- name: Take the run's lock on the container's node
  kpro.gpu_serving.run_lock:
    vmid: "{{ pve_vmid }}"
  delegate_to: "{{ pve_node_host }}"
"""

RETURN = r"""
taken:
  description: Whether this run holds the lock now (V(taken)).
  returned: always
  type: bool
released:
  description: Whether this run's lock was freed (V(released)).
  returned: always
  type: bool
holder:
  description: The holder found before (controller, pid, started, run_id, taken_at); null when the lock was free.
  returned: always
  type: dict
took_over:
  description: Why a stale lock was taken over (its holder named), else null.
  returned: always
  type: str
path:
  description: The lock file.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import run_lock as rl
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vmid=dict(type="int", required=True),
            state=dict(type="str", choices=["taken", "released"], default="taken"),
            max_age=dict(type="int", default=21600),
            wait=dict(type="int", default=120),
            poll=dict(type="int", default=5),
            lock_dir=dict(type="path", default=rl.LOCK_DIR),
            owner=dict(type="dict"),
            take_over=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path = rl.lock_path(p["vmid"], p["lock_dir"])
    result = dict(changed=False, taken=False, released=False, holder=None, took_over=None, path=path)
    try:
        if not p["owner"] or not p["owner"].get("run_id"):
            raise Failure("bad_input", "owner is set by the action plugin kpro.gpu_serving.run_lock",
                          remedy="use the module as a task (its action plugin runs on the controller), not with ansible -m")
        if not module.check_mode:  # a check-mode run changes nothing, the lock file included
            result.update(rl.apply(p["state"], path, p["owner"], p["max_age"], p["take_over"]))
    except Failure as f:
        fail(module, f, **result)
    if result["took_over"]:
        module.warn("took over a stale lock of container %s: %s" % (p["vmid"], result["took_over"]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
