#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_p2p_check
short_description: Check, before a tensor-parallel launch, that the GPUs really talk to each other (peer access, copy, NCCL all-reduce)
version_added: "0.2.0"
description:
  - "Runs C(<venv>/bin/python -c <script>) with the server's environment (O(environment): C(NCCL_P2P_DISABLE),
    C(CUDA_VISIBLE_DEVICES)...; the module's own NCCL/CUDA variables are not passed on). The script, real PyTorch in one
    process, counts the GPUs (C(torch.cuda.device_count())), asks C(torch.cuda.can_device_access_peer(i, j)) for each
    pair, copies 4 MiB from each GPU to the next (directly, or through host memory when C(NCCL_P2P_DISABLE=1)) and
    compares it on the host, and sums one tensor per GPU with an NCCL all-reduce (C(torch.cuda.nccl.all_reduce)),
    compared with the expected sum."
  - "Bounded by O(timeout): a check that does not finish is killed (its process group, by the child's PID) and the
    module fails with phase V(gpu_p2p_hang); wrong data fails with V(gpu_p2p_wrong_result). Both name the evidence (peer
    access per pair, the copies, the sums, the elapsed time, the environment used) and the remedies (C(NCCL_P2P_DISABLE=1),
    ACS off in the BIOS or C(pcie_acs_override), C(iommu=pt)). TP over PCIe with ACS or the IOMMU in the way hangs NCCL or
    copies zeros (NVIDIA/nccl issues 2079 and 631); without this check the launch's gate waits out its stall budget."
  - "A pass is stamped in O(state_dir) (C(gpu-p2p.json)), keyed by the driver version (C(/proc/driver/nvidia/version)),
    the kernel release, the GPUs' bus ids and UUIDs (NVML), the NCCL/CUDA environment and the venv's lock. While the
    stamp matches the check is not run (C(changed) false): it runs before the first launch and again when the driver,
    the kernel, the GPUs, that environment or the venv changed."
author:
  - kpro.gpu_serving developers (!UNKNOWN)
options:
  venv:
    description: The SGLang venv; its C(bin/python) runs the check (torch must be importable there).
    type: path
    required: true
  python:
    description: The interpreter to run instead of C(<venv>/bin/python).
    type: path
  environment:
    description: The server's environment (the role's C(sglang_server_environment)); values are passed as strings.
    type: dict
    default: {}
  options:
    description: The server's SGLang options (C(tp_size), C(pp_size), C(dp_size), C(nnodes), ...); a server that uses
      fewer than two GPUs on this node needs no check (nothing runs, nothing is stamped). Unset - always checked.
    type: dict
  timeout:
    description: Seconds the check may take (CUDA and NCCL init included) before it counts as hung.
    type: int
    default: 60
  force:
    description: Run the check even when a matching pass is stamped.
    type: bool
    default: false
  state_dir:
    description: Where the pass is stamped (the directory of M(kpro.gpu_serving.sglang_service)'s state).
    type: path
    default: /var/lib/kpro-gpu-serving
  proc_root:
    description: Internal, for tests only (do not set) - the root of procfs.
    type: path
    default: /proc
attributes:
  check_mode:
    support: full
    description: Reports whether the check would run (RV(would_run), and C(changed) as it would be); runs nothing and writes nothing.
  diff_mode:
    support: none
    description: The stamp is the module's own state; nothing to show.
requirements:
  - PyTorch with CUDA and NCCL in O(venv) (SGLang brings it).
notes:
  - Other failures are V(nccl_error) (the script raised, for example an NCCL or CUDA error) and V(library_missing) (the
    venv's Python cannot run or import torch).
  - Fewer than two GPUs visible to torch is not a failure; nothing is checked and nothing is stamped.
seealso:
  - module: kpro.gpu_serving.sglang_service
"""

EXAMPLES = r"""
- name: Check that the GPUs really talk before the first TP launch
  kpro.gpu_serving.gpu_p2p_check:
    venv: /opt/sglang/venv
    environment: "{{ sglang_server_environment }}"
    timeout: 60

- name: The same on a host with ACS in the way, all-reduce through host memory
  kpro.gpu_serving.gpu_p2p_check:
    venv: /opt/sglang/venv
    environment:
      NCCL_P2P_DISABLE: "1"
"""

RETURN = r"""
extends_documentation_fragment:
  - kpro.gpu_serving.failure
msg:
  description: What happened (passed, not run because a pass is stamped, would run).
  returned: always
  type: str
  sample: the two-GPU check passed in 3.2 s (2 GPUs)
ran:
  description: Whether the check ran in this call.
  returned: always
  type: bool
would_run:
  description: Whether the check runs (ran, or would run in check mode) because no matching pass is stamped (or O(force)).
  returned: always
  type: bool
stamp:
  description: The stamp file.
  returned: always
  type: str
  sample: /var/lib/kpro-gpu-serving/gpu-p2p.json
key:
  description: What a pass depends on - C(driver), C(kernel), C(gpus) (bus id and UUID), C(environment) (NCCL/CUDA), C(venv_lock).
  returned: always
  type: dict
environment:
  description: The environment the check ran with - C(nccl_cuda) (names and values) and C(others) (names only).
  returned: always
  type: dict
check:
  description:
    - The script's result - C(torch), C(device_count), C(peer_access) (C(i->j) to bool), C(copies) (C(i->j) to
      C(expected), C(wrong), C(first)), C(copy_path) (C(direct) or C(host)), C(all_reduce) (per GPU C(expected),
      C(wrong), C(first)), C(elapsed_s), C(steps).
    - Also on failure, as far as the script got.
  returned: when the check ran
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import gpu_p2p as gp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.deployment import STATE_DIR, venv_lock
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.nvml import gpu_facts
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_unit import gpus_needed


def main():
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path", required=True),
            python=dict(type="path"),
            environment=dict(type="dict", default={}),
            options=dict(type="dict"),
            timeout=dict(type="int", default=60),
            force=dict(type="bool", default=False),
            state_dir=dict(type="path", default=STATE_DIR),
            proc_root=dict(type="path", default="/proc"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["options"] is not None and gpus_needed(p["options"]) - int(p["options"].get("base_gpu_id") or 0) < 2:
        module.exit_json(changed=False, ran=False, would_run=False, msg="the server uses one GPU on this node: nothing to check")
    driver, kernel, gpus = gp.host_identity(p["proc_root"], gpu_facts(run_command=module.run_command, proc_root=p["proc_root"]))
    key = gp.stamp_key(driver, kernel, gpus, p["environment"], venv_lock(p["venv"]))
    result = dict(changed=False, ran=False, would_run=False, stamp=gp.stamp_path(p["state_dir"]), key=key,
                  environment=gp.shown_environment(p["environment"]))
    if not p["force"] and gp.stamp_matches(result["stamp"], key):
        module.exit_json(msg="the two-GPU check passed before with this driver, kernel, GPUs and environment: not run", **result)
    result.update(would_run=True, changed=True)
    if module.check_mode:
        module.exit_json(msg="the two-GPU check would run (no pass stamped for this driver, kernel, GPUs and environment)", **result)
    try:
        check = gp.check(p["python"] or os.path.join(p["venv"], "bin", "python"), p["environment"], p["timeout"], os.environ)
    except Failure as e:
        result.update(ran=True, changed=False)
        fail(module, e, **result)
    result.update(ran=True, check=check)
    if check.get("device_count", 0) < 2:
        result["changed"] = False
        module.exit_json(msg="fewer than 2 GPUs visible to torch: nothing to check, nothing stamped", **result)
    gp.write_stamp(result["stamp"], key, check)
    module.exit_json(msg="the two-GPU check passed in %.1f s (%d GPUs)" % (check.get("elapsed_s") or 0, check["device_count"]), **result)


if __name__ == "__main__":
    main()
