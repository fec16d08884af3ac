#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_diagnose
short_description: Diagnose one launch of an SGLang server from its log and the GPUs' memory
version_added: "0.1.0"
description:
  - Reads the SGLang server log of one launch and names the phase the launch is in or failed in, with the
    evidence (the log lines of this launch, per-GPU MiB, exit status) and the remedy (the flag to change).
  - "The phase is one of the collection's diagnosis vocabulary: V(ready), V(loading), V(not_started),
    V(init_failed_before_gpu), V(weights_oom), V(kv_cache_oom), V(nccl_error), V(runtime_toolchain_missing), V(cuda_graph_failed),
    V(port_in_use), V(warmup_failed), V(degenerate_output), V(gpu_memory_held), V(version_mismatch),
    V(known_bad_version), V(timeout)."
  - "With O(launch_id), only the part of the log under the header line C(# kpro-launch-id: <launch_id>) is
    read, so an older launch's error can never be taken for this one's; a log without that header counts
    as no log (V(not_started))."
  - "Given only the log (no O(exit_status), O(process_alive) or GPU numbers), the log decides: a traceback at the end,
    an argparse error or a scheduler reported dead ends the launch, and the phase follows from where the startup
    stopped and what was raised. Published or cut logs (a missing head or tail) are read the same way."
  - Only reads; never changes anything on the target.
author:
  - kpro.gpu_serving contributors (!UNKNOWN)
options:
  log_path:
    description:
      - Path of the server log on the target. A missing file gives V(not_started).
    type: path
    required: true
  launch_id:
    description:
      - "The launch whose part of the log is read (the C(# kpro-launch-id:) header our unit writes)."
      - When omitted, the last launch in the file is read (the whole file when it has no header).
    type: str
  gpu_used_mib:
    description:
      - Per-GPU memory used now, in MiB (NVML C(memory.used)).
      - A list of numbers, or a string such as V([0,0]) or V(0,0) (so that it can be given as C(key=value) ad hoc).
    type: raw
  gpu_baseline_mib:
    description:
      - Per-GPU memory used before the launch, in MiB, in the same forms as O(gpu_used_mib). Defaults to 0 for every GPU.
    type: raw
  exit_status:
    description:
      - Exit status of the server's main process when it has exited (a failed startup ends with 137, SIGKILL).
      - Omit while it runs.
    type: int
  process_alive:
    description: Whether the server's main process (or its unit) is alive. Omit when unknown.
    type: bool
  planned_weights_mib:
    description:
      - The memory plan's weights per GPU, in MiB. A server that says it is ready while a GPU holds less than
        90% of this is not taken as ready.
    type: float
extends_documentation_fragment: []
attributes:
  check_mode:
    support: full
    description: Only reads; the result is the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing, so there is no diff.
notes:
  - The log format is SGLang 0.5.x's (C([YYYY-MM-DD HH:MM:SS TPn] message)) and uvicorn's; log collector
    prefixes of docker compose and journald are tolerated.
  - The HTTP and content checks of the completion gate are not done here; this module reads the log and the
    numbers it is given.
seealso:
  - name: SGLang server arguments
    description: The flags the remedies name.
    link: https://docs.sglang.io/advanced_features/server_arguments.html
"""

EXAMPLES = r"""
- name: Diagnose the current launch of the server
  kpro.gpu_serving.sglang_diagnose:
    log_path: /var/log/sglang/sglang-{{ launch_id }}.log
    launch_id: "{{ launch_id }}"
    gpu_used_mib: "{{ gpus | map(attribute='memory_used_mib') | list }}"
    gpu_baseline_mib: [0, 0]
    exit_status: 137
  register: diag

- name: Stop with the diagnosis
  ansible.builtin.fail:
    msg: "{{ diag.phase }}: {{ diag.remedy }} Evidence: {{ diag.evidence | join(' | ') }}"
  when: diag.phase not in ['ready', 'loading']

# ad hoc:
# ansible localhost -m kpro.gpu_serving.sglang_diagnose -a "log_path=/root/sglang-serve.log gpu_used_mib=[0,0]"
"""

RETURN = r"""
phase:
  description: The phase of the launch (the collection's diagnosis vocabulary).
  returned: always
  type: str
  sample: kv_cache_oom
evidence:
  description: Lines of this launch's log (milestones reached, the error, the traceback's end) and the numbers that show the phase.
  returned: always
  type: list
  elements: str
  sample:
    - "[2026-03-01 09:41:17 TP0] Load weight end. elapsed=70.85 s, type=Qwen3_5ForConditionalGeneration, dtype=torch.bfloat16,
      avail mem=20.70 GB, mem usage=26.50 GB."
    - "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: self.server_args.mem_fraction_static=0.85"
remedy:
  description: What to change, naming the flag (empty when V(ready)).
  returned: always
  type: str
  sample: "The KV-cache pool does not fit (...): lower --max-running-requests (now 48 ...), e.g. 8; ..."
facts:
  description:
    - Numbers read from the log, when present.
    - "Keys include C(kv_tokens) (the KV pool's token count), C(weights_gib) (weights per GPU), C(avail_before_weights_gib),
      C(avail_after_weights_gib), C(max_mamba_cache_size), C(max_total_num_tokens), C(context_len), C(time_to_ready_s),
      C(load_weights_s), C(stage) (how far startup got), C(last_milestone), C(exception), C(server_args) (the resolved
      values of the C(server_args=) line), C(ranks_seen), C(log_lines)."
    - "On a failure also C(failed_stage) (where the startup stopped) and, where the phase alone does not say it,
      C(failure): V(argparse), V(import_error), V(unsupported_architecture), V(invalid_configuration), V(model_files),
      V(weights_load_failed), V(kv_pool_failed), V(scheduler_init_failed), V(graph_capture_failed),
      V(distributed_init_failed), V(scheduler_killed), V(scheduler_exited); for a dead scheduler
      C(scheduler_rank) and C(scheduler_exit_code)."
  returned: always
  type: dict
  sample: {"kv_tokens": 398784, "weights_gib": 26.5, "stage": "serving", "time_to_ready_s": 114.0}
log_found:
  description: Whether the log file exists and has a part for this launch.
  returned: always
  type: bool
  sample: true
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.sglang_log import diagnose, select_launch


def mib_list(value):
    """A list of per-GPU MiB from a list, a number, or a string "[0,0]" / "0, 0" / "0 0"."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, str):
        value = [v for v in value.strip().strip("[]").replace(",", " ").split() if v]
    if not isinstance(value, (list, tuple)):
        raise ValueError("not a list: %r" % (value,))
    return [float(v) for v in value]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            log_path=dict(type="path", required=True),
            launch_id=dict(type="str"),
            gpu_used_mib=dict(type="raw"),
            gpu_baseline_mib=dict(type="raw"),
            exit_status=dict(type="int"),
            process_alive=dict(type="bool"),
            planned_weights_mib=dict(type="float"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for key in ("gpu_used_mib", "gpu_baseline_mib"):
        try:
            p[key] = mib_list(p[key])
        except ValueError as e:
            module.fail_json(msg="%s: %s; give a list of MiB per GPU, for example [0, 0]" % (key, e))
    text = None
    if os.path.exists(p["log_path"]):
        try:
            with open(p["log_path"], "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
        except (IOError, OSError) as e:
            module.fail_json(msg="Cannot read the server log %s: %s" % (p["log_path"], e))
    part = select_launch(text, p["launch_id"]) if text is not None else None
    result = diagnose(
        text,
        gpu_used_mib=p["gpu_used_mib"],
        gpu_baseline_mib=p["gpu_baseline_mib"],
        exit_status=p["exit_status"],
        process_alive=p["process_alive"],
        planned_weights_mib=p["planned_weights_mib"],
        launch_id=p["launch_id"],
    )
    module.exit_json(changed=False, log_found=bool(part and part.strip()), phase=result["phase"], evidence=result["evidence"],
                     remedy=result["remedy"], facts=result["facts"])


if __name__ == "__main__":
    main()
