#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_gate
short_description: Wait until one launch of an SGLang server really serves, or say why it does not
version_added: "0.1.0"
description:
  - The completion gate of the serve stage. Polls about once a second (O(poll_interval)) and returns as soon as
    the outcome is known.
  - "Each tick it reads this launch's log (incrementally; only the part under C(# kpro-launch-id: <launch_id>), so an
    older launch's error is never quoted), the process state (C(systemctl show -p
    ActiveState,SubState,ExecMainStatus,ExecMainCode,MainPID) of O(unit)), NVML per-GPU memory.used, and, once the log
    shows uvicorn running, C(GET /health) and C(GET /v1/models); it names the phase with the collection's diagnosis
    (the same as M(kpro.gpu_serving.sglang_diagnose))."
  - "Ready means: the process is alive, every GPU holds at least 90% of the planned weights share
    (O(plan), O(planned_weights_mib)), C(/health) answers 200, C(/v1/models) lists O(served_model_name), and a deterministic
    completion (temperature 0, O(probe_max_tokens)) is not degenerate (empty, a run of newlines, a loop) and matches
    O(expected_probe_regex), and every known-answer check (O(known_answer_checks)) gets its exact answer."
  - "The known-answer check asks, concurrently and at temperature 0, prompts with exact answers through the endpoints users
    call: C(/v1/chat/completions) (the model's chat template, the server's reasoning parser; the answer must be in
    C(content), not only in C(reasoning_content)) and C(/v1/completions). By default: counting from 1 to 20 one number per
    line (a dropped or duplicated draft token shows), a multi-digit sum, a fact, an instruction with an exact output
    format, the mean log-probability of a greedy answer (measured; a check when C(min_mean_logprob) is set), and a chat
    question asked as an ordinary client asks (no C(chat_template_kwargs)): a thinking model's thinking must come back in
    C(reasoning_content), not in C(content) (Qwen3: C(--reasoning-parser qwen3)). A wrong
    answer fails with V(wrong_answer) (garbage with V(degenerate_output)): the prompt, the expected and the received
    text, and the suspects in order - speculative decoding when on (with how to turn it off), the SGLang version against
    the compatibility table (O(sglang_version), the architecture from O(model_dir)), tp > 1."
  - "On failure the task fails with RV(phase) (V(not_started), V(init_failed_before_gpu), V(host_oom_killed), V(weights_oom),
    V(weights_load_failed), V(kv_cache_oom), V(kv_pool_init_failed), V(scheduler_init_failed), V(nccl_error), V(peer_missing),
    V(runtime_toolchain_missing), V(cuda_graph_failed), V(port_in_use), V(warmup_failed), V(crashed_after_ready), V(degenerate_output),
    V(wrong_answer), V(unresponsive), V(version_mismatch), V(known_bad_version), V(timeout)), RV(evidence) (this launch's log lines, per-GPU MiB,
    exit status) and RV(remedy); RV(known_failure) holds the same as data, which M(kpro.gpu_serving.sglang_deployment) reads."
  - On success it returns the time to ready, per-GPU MiB, the KV cache tokens from the log and the probe's tokens/s.
  - Only observes; never changes anything (C(changed) is always false).
author:
  - kpro.gpu_serving contributors (!UNKNOWN)
options:
  unit:
    description:
      - The systemd service of the server; its state is the process state. This is the production path.
      - One of O(unit) and O(pid) is required.
    type: str
  systemctl:
    description: The C(systemctl) to run for O(unit). Defaults to the one in C(PATH).
    type: path
  pid:
    description:
      - The server's main PID instead of O(unit), for a server started by hand (ad hoc diagnosis, tests). Only whether it
        is alive is known, not its exit status.
    type: int
  log_path:
    description:
      - This launch's log (as returned by M(kpro.gpu_serving.sglang_service)), or the log that holds it.
      - With O(launch_id) only that launch's part is read; without it, the last launch in the file.
    type: path
  log_dir:
    description: Directory of the per-launch logs; with O(launch_id) the log is C(<log_dir>/<unit name without .service>-<launch_id>.log).
    type: path
  launch_id:
    description: The launch to gate (the unit's InvocationID, the log's C(# kpro-launch-id:) header).
    type: str
  base_url:
    description: Where the server answers (loopback).
    type: str
    default: http://127.0.0.1:30000
  served_model_name:
    description: The model id C(/v1/models) must list and the probe asks for.
    type: str
    required: true
  api_key:
    description: The server's API key (sent as C(Authorization Bearer)).
    type: str
  api_key_file:
    version_added: "0.2.0"
    description:
      - The server's C(--config) file holding the API key (RV(kpro.gpu_serving.sglang_service#module:secret_file)), read
        here instead of O(api_key), so that the key is no argument of the task (the role runs the gate in the background,
        whose arguments Ansible keeps in a file on the target). Ignored when O(api_key) is set.
    type: path
  plan:
    version_added: "0.2.0"
    description:
      - The memory plan of this launch, as M(kpro.gpu_serving.sglang_service) returns it (RV(kpro.gpu_serving.sglang_service#module:plan));
        ready requires every GPU to hold at least 90% of its C(per_gpu.weights_mib). The plan is not made again here.
    type: dict
  planned_weights_mib:
    description:
      - The weights per GPU (MiB) instead of O(plan) (a server started by hand); ready requires every GPU to hold at least 90% of it.
      - Without O(plan) and O(planned_weights_mib) the weights are not checked.
    type: float
  gpu_baseline_mib:
    description: Per-GPU memory.used before the launch (MiB). Defaults to 0 per GPU.
    type: list
    elements: float
  timeout:
    description: Seconds to wait for readiness in all.
    type: int
    default: 1800
  stall_timeout:
    description: Seconds without progress (no new log line, no change of GPU memory) after which the launch counts as hung (V(timeout)).
    type: int
    default: 600
  poll_interval:
    description: Seconds between full checks (log, process, NVML, HTTP). Between them the log and the main PID are watched every 0.1 s.
    type: float
    default: 1.0
  http_timeout:
    description: Seconds for each HTTP request of the checks.
    type: float
    default: 5.0
  unresponsive_after:
    version_added: "0.2.0"
    description:
      - "The number of C(GET /health) checks in a row that get no answer at all within O(http_timeout) (the connection is
        accepted, nothing answers; a refused connection does not count) while the process lives and the log shows the HTTP
        server up, after which the server is V(unresponsive) (stopped by SIGSTOP, or hung): about 20 s with the defaults."
    type: int
    default: 3
  probe_prompt:
    description: The prompt of the content probe (C(POST /v1/completions), temperature 0).
    type: str
    default: The capital city of France is
  probe_max_tokens:
    description: Tokens the probe generates.
    type: int
    default: 16
  probe_timeout:
    description: Seconds the probe may take.
    type: float
    default: 120
  fatal_grace:
    version_added: "0.2.0"
    description:
      - Seconds without progress (no new log line, no change of GPU memory) after this launch's log shows a fatal error
        (a traceback, a dead scheduler) before the gate fails while the process is still alive; the log alone then
        decides.
    type: float
    default: 5.0
  node_rank:
    version_added: "0.2.0"
    description:
      - This node's rank of a server over several nodes (SGLang's C(--node-rank)).
      - A rank of 1 or more serves no endpoint (real SGLang runs only a health server there). It is ready when its log
        is past the KV pool, C(/health) answers 200 and every GPU holds the planned weights (NVML). The endpoint,
        C(/v1/models) and the probe are rank 0's.
    type: int
    default: 0
  expected_probe_regex:
    description: A regular expression the probe's text must match (searched). Empty for none.
    type: str
    default: "(?i)paris"
  known_answer_checks:
    version_added: "0.2.0"
    description:
      - The known-answer checks, asked concurrently after the content probe passed (the probe's O(probe_timeout) each).
        Default (not given) the collection's six (counting 1 to 20, 4823 + 7619, the capital of Japan, C([READY]), the
        mean logprob of the answer to C(The capital city of France is), and C(plain_chat), the capital of Italy asked with no
        C(chat_template_kwargs), so without the thinking turned off); an empty list turns the check off.
    type: list
    elements: dict
    suboptions:
      name:
        description: A short name for the evidence.
        type: str
      endpoint:
        description: C(chat) (C(/v1/chat/completions), chat template and reasoning parser) or C(completions) (C(/v1/completions), raw text).
        type: str
        choices: [chat, completions]
        default: chat
      prompt:
        description: The user message (chat) or the prompt (completions).
        type: str
        required: true
      expected:
        description: The expected answer (for C(lines), one line per expected line).
        type: str
        required: true
      match:
        description:
          - How the answer is compared after removing a closed thinking block, surrounding whitespace, a code fence, bold
            markers or quotes and a trailing period.
          - C(exact) equal; C(lines) line by line (empty lines, trailing punctuation, list bullets and a leading line ending
            in a colon ignored); C(number) the first number not in the prompt (thousands separators allowed); C(word) a
            whole word, case-insensitively.
        type: str
        choices: [exact, lines, number, word]
        default: exact
      max_tokens:
        description: Tokens the answer may take.
        type: int
        default: 64
      min_mean_logprob:
        description: When set, the mean log-probability of the answer's tokens must be at least this (SGLang returns logprobs).
        type: float
      chat_template_kwargs:
        description:
          - This chat check's C(chat_template_kwargs), instead of O(chat_template_kwargs); C({}) sends none, as an ordinary
            client does (the default check C(plain_chat)).
          - A chat answer whose C(content) holds the model's thinking (a C(<think>) or C(</think>) tag) fails (kind
            V(thinking_in_content), phase C(wrong_answer), the remedy naming C(--reasoning-parser)).
        type: dict
  chat_template_kwargs:
    version_added: "0.2.0"
    description:
      - "The C(chat_template_kwargs) of the chat checks (what the model's chat template understands). Default
        C({enable_thinking: false}) (Qwen3 answers without a thinking block); C({}) for none."
    type: dict
  sglang_version:
    version_added: "0.2.0"
    description: The installed SGLang version, for the compatibility table among the suspects of a wrong answer.
    type: str
  model_dir:
    description: The model snapshot; its C(config.json) gives the architecture the compatibility table is asked about.
    type: path
  compile_cache_dir:
    version_added: "0.2.0"
    description: The server's compile caches (M(kpro.gpu_serving.sglang_service)'s O(kpro.gpu_serving.sglang_service#module:compile_cache_dir)).
    type: path
  compile_cache_files:
    version_added: "0.2.0"
    description: The files in O(compile_cache_dir) before the launch (the converge's RV(kpro.gpu_serving.sglang_service#module:compile_cache_files));
      with both, RV(compile_cache) says whether the launch compiled anything.
    type: int
extends_documentation_fragment: []
attributes:
  check_mode:
    support: full
    description: Only observes, the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing.
requirements:
  - nvidia-ml-py (module C(pynvml)) on the target; without it C(nvidia-smi) is used.
notes:
  - The probe uses C(/v1/completions) (raw text), not chat, so that a reasoning model's thinking does not use up the tokens.
  - SGLang's own warmup only checks for HTTP 200; the probe checks the content (the seed's MTP C(\n\n) output).
seealso:
  - module: kpro.gpu_serving.sglang_service
  - module: kpro.gpu_serving.sglang_diagnose
"""

EXAMPLES = r"""
- name: Gate the launch that sglang_service started
  kpro.gpu_serving.sglang_gate:
    unit: sglang.service
    log_path: "{{ server.log_path }}"
    launch_id: "{{ server.launch_id }}"
    base_url: http://127.0.0.1:30000
    served_model_name: qwen3.6-27b
    api_key: "{{ vault_sglang_api_key }}"
    plan: "{{ server.plan | default(omit) }}"
    timeout: 1800
  register: gate

- name: Summary
  ansible.builtin.debug:
    msg: "ready in {{ gate.time_to_ready_s }} s, GPUs {{ gate.gpu_used_mib }} MiB, KV {{ gate.kv_tokens }} tokens,
      {{ gate.probe.tokens_per_s }} tokens/s"

# ad hoc, a server started by hand:
# ansible localhost -m kpro.gpu_serving.sglang_gate -a "pid=12345 log_path=/root/sglang.log served_model_name=qwen3.6-27b"
"""

RETURN = r"""
phase:
  description: The outcome (V(ready) on success; on failure the diagnosis phase).
  returned: always
  type: str
  sample: ready
evidence:
  description: Lines of this launch's log, per-GPU MiB, exit status, HTTP results that show the phase.
  returned: always
  type: list
  elements: str
remedy:
  description: What to change (empty when ready).
  returned: always
  type: str
known_failure:
  version_added: "0.2.0"
  description: The failure as data (C(phase), C(msg) without the phase and the remedy, C(evidence), C(remedy)).
  returned: failure
  type: dict
former_phase:
  version_added: "0.2.0"
  description: The name 0.1.0 gave this failure, kept for one release where the phase was renamed (docs/troubleshooting.md,
    Renamed phases).
  returned: when the phase was renamed
  type: str
  sample: weights_oom
time_to_ready_s:
  description: Seconds from the launch's first log line to ready (from the log), else the gate's own wait.
  returned: success
  type: float
  sample: 114.0
waited_s:
  description: Seconds the gate waited.
  returned: always
  type: float
gpu_used_mib:
  description: Per-GPU memory.used at the end (MiB).
  returned: always
  type: list
  elements: int
  sample: [45210, 45188]
nrestarts:
  version_added: "0.2.0"
  description: The unit's C(NRestarts) (automatic restarts by C(Restart=on-failure) since the last manual start).
  returned: with O(unit)
  type: int
  sample: 0
kv_tokens:
  description: The KV cache pool's token count, from the log line that says the KV Cache is allocated.
  returned: success
  type: int
  sample: 242894
known_answer:
  version_added: "0.2.0"
  description:
    - The known-answer check - C(passed), C(elapsed_s), C(checks) (each C(name), C(endpoint), C(prompt), C(expected), C(received),
      C(ok), C(kind) (V(wrong), V(degenerate), V(reasoning_only), V(thinking_in_content), V(low_logprob), V(http)), C(why), C(mean_logprob)).
  returned: when the content probe passed
  type: dict
probe:
  description: The content probe - C(text), C(completion_tokens), C(elapsed_s), C(tokens_per_s), C(degenerate), C(reason).
  returned: when the server got as far as answering
  type: dict
exit_status:
  description: The main process's exit status (137 = SIGKILL) when it exited.
  returned: always
  type: int
endpoint:
  description: The base URL and the served model.
  returned: always
  type: dict
launch_id:
  description: The launch gated.
  returned: always
  type: str
log_path:
  description: The log read.
  returned: always
  type: str
compile_cache:
  version_added: "0.2.0"
  description: Whether this launch compiled anything (O(compile_cache_dir) and O(compile_cache_files) given) - the
    files in the compile caches before the launch and at ready; V(warm) true when it added none.
  returned: when ready and the cache was counted before the launch
  type: dict
  sample: {dir: /srv/models/sglang-compile-cache, files_before: 48, files_after: 48, warm: true}
facts:
  description: Numbers from the log (see M(kpro.gpu_serving.sglang_diagnose)).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import read_text
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_ready import GATE_MUTUALLY_EXCLUSIVE, GATE_REQUIRED_ONE_OF, GATE_SPEC, Gate


def main():
    module = AnsibleModule(
        argument_spec=GATE_SPEC,
        required_one_of=GATE_REQUIRED_ONE_OF,
        mutually_exclusive=GATE_MUTUALLY_EXCLUSIVE,
        supports_check_mode=True,
    )
    if module.params["api_key_file"] and not module.params["api_key"]:
        key = su.api_key_from_config(read_text(module.params["api_key_file"]))
        if key:
            module.no_log_values.add(key)
            module.params["api_key"] = key
    gate = Gate(module)
    res = gate.run()
    out = gate.summary(res)
    if res["phase"] == "ready":
        module.exit_json(**out)
    who = module.params["unit"] or "PID %s" % module.params["pid"]
    what = "answers, but fails the known-answer check" if out.get("known_answer") and not out["known_answer"]["passed"] else "did not become ready"
    known = failure.Failure(res["phase"], "launch %s of %s %s" % (out["launch_id"] or "?", who, what),
                            remedy=res["remedy"], evidence=res["evidence"])
    failure.fail(module, known, **out)


if __name__ == "__main__":
    main()
