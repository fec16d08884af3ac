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
    V(init_failed_before_gpu), V(host_oom_killed), V(weights_oom), V(weights_load_failed), V(kv_cache_oom),
    V(kv_pool_init_failed), V(scheduler_init_failed), V(nccl_error), V(peer_missing), V(runtime_toolchain_missing),
    V(cuda_graph_failed), V(port_in_use), V(warmup_failed), V(crashed_after_ready), V(degenerate_output), V(gpu_memory_held),
    V(version_mismatch), V(known_bad_version), V(timeout)."
  - "A failure is named by where the start stopped and what the evidence shows: a SIGKILL without an error of its own is
    V(host_oom_killed) (host RAM, not GPU memory); a non-OOM error while loading the weights, building the KV pool or
    setting up the scheduler is V(weights_load_failed), V(kv_pool_init_failed) or V(scheduler_init_failed). 0.1.0 named
    these V(weights_oom) and V(init_failed_before_gpu); for one release RV(former_phase) carries that name."
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
      V(distributed_init_failed), V(scheduler_killed), V(killed), V(scheduler_exited); for a dead scheduler
      C(scheduler_rank) and C(scheduler_exit_code)."
  returned: always
  type: dict
  sample: {"kv_tokens": 398784, "weights_gib": 26.5, "stage": "serving", "time_to_ready_s": 114.0}
former_phase:
  version_added: "0.2.0"
  description: The name 0.1.0 gave this failure, kept for one release where the phase was renamed (docs/troubleshooting.md,
    Renamed phases).
  returned: when the phase was renamed
  type: str
  sample: init_failed_before_gpu
log_found:
  description: Whether the log file exists and has a part for this launch.
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_log import diagnose_file


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
    try:
        result = diagnose_file(**module.params)
    except Failure as e:
        fail(module, e)
    else:
        module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
