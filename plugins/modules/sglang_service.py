#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_service
short_description: Run the SGLang server as a systemd unit, restarted only when its configuration changed
version_added: "0.1.0"
description:
  - "Renders a systemd unit whose C(ExecStart) is built from one dict of SGLang options (O(options)), an
    C(EnvironmentFile) (mode 0600), the server's C(--config) YAML file (mode 0600, O(secret_file)) holding the API key,
    and the launcher script that gives every launch its own log
    C(<log_dir>/<stem>-<InvocationID>.log) (stem = the unit's name without C(.service)), headed by
    C(# kpro-launch-id: <InvocationID>), with C(<log_dir>/<stem>.log) pointing at the newest. The launcher masks secrets
    (C(api_key='...'), Bearer tokens) in the log."
  - "The unit has C(Type=simple), C(KillMode=control-group) (stopping it ends the scheduler and detokenizer children
    too), C(Restart=on-failure) with a bounded rate (O(restart_sec), O(start_limit_interval_sec), O(start_limit_burst))
    and O(timeout_stop_sec)."
  - "Before a (re)start, and before the running server is touched, the settings are validated: option names against
    the installed SGLang's own flags (C(<venv>/bin/python) lists C(ServerArgs.add_cli_args)), the types, ranges and
    choices of the options the collection's option table knows (C(mem_fraction_static) in (0, 1), C(port) in 1-65535,
    C(disable_radix_cache) true or false, ...), C(tp_size) x C(pp_size) against the GPUs NVML sees, the port against
    listening sockets that are not this unit's (C(/proc/net/tcp), C(tcp6)), O(probe_regex); control characters in option
    and environment values are refused. The model directory must exist and hold C(config.json); C(host) must be an
    address or host name the container can bind; O(environment) may not replace what the unit needs (C(PATH),
    C(CUDA_HOME), C(VIRTUAL_ENV), C(PYTHONHOME), C(CUDA_VISIBLE_DEVICES)); the whole argument vector (options and
    C(extra)) is parsed by the installed SGLang's own parser, without starting it, in the call that lists its flags.
    All problems are reported together and the old server keeps serving."
  - The server is (re)started only when it is not running, when the rendered unit, environment file or launcher differ
    from those it was started with (a fingerprint kept in O(state_dir)), or with O(force_restart).
  - "Before a (re)start: every process holding GPU memory is listed (PID, name, MiB). Processes of this unit (its
    cgroup, from C(systemctl show -p ControlGroup); else its C(MainPID) and descendants) are ended by stopping the unit;
    the module then waits, polling NVML, until the memory is released (bounded by O(release_timeout), not a fixed
    sleep). Any other holder fails with phase V(gpu_memory_held) and is never signalled."
  - "Before a (re)start the memory-fit plan (the model's C(config.json) and C(model.safetensors.index.json), the NVML
    totals, the options) is checked; when the KV cache cannot hold one C(context_length) of O(options) request the module
    fails with phase V(kv_cache_oom) (V(weights_oom) when the weights alone do not fit), the numbers and the flag to
    change, and nothing is changed. The plan reads the options the option table marks as changing memory (C(tp_size),
    C(pp_size), C(max_total_tokens), C(mem_fraction_static), ...); an option it does not account for is named in a
    warning."
author:
  - kpro.gpu_serving contributors (!UNKNOWN)
options:
  unit:
    description: Name of the systemd service.
    type: str
    default: sglang.service
  venv:
    description: The virtual environment SGLang is installed in; C(<venv>/bin/python -m sglang.launch_server) is run.
    type: path
    default: /opt/sglang/venv
  python:
    description: The interpreter to run instead of C(<venv>/bin/python).
    type: path
  options:
    description:
      - The SGLang options, by SGLang's own names with underscores (C(model_path), C(served_model_name), C(tp_size),
        C(context_length), C(mem_fraction_static), C(max_running_requests), C(speculative_algorithm),
        C(speculative_num_steps), C(speculative_eagle_topk), C(speculative_num_draft_tokens), C(host), C(port),
        C(trust_remote_code), ...).
      - V(null) and V(false) are left out, V(true) is a bare flag, a list gives the flag followed by its values.
        C(extra) is a list of arguments appended verbatim.
      - Do not put the API key here; use O(api_key).
    type: dict
    required: true
  api_key:
    description:
      - The API key clients must send (from the vault). It is written to O(secret_file) (mode 0600) only, which the
        server reads at start through C(--config); the unit file, the process's command line, the logs and the module's
        output never contain it.
    type: str
  environment:
    description:
      - Further environment variables of the server (for example V(NCCL_P2P_DISABLE)), in the unit file.
      - They go over the runtime environment the module always sets for what SGLang compiles at its first forward pass
        (M(kpro.gpu_serving.sglang_toolchain)) - C(PATH) with C(<venv>/bin) and C(<venv>/cuda/bin) first, C(CUDA_HOME)
        C(<venv>/cuda) - and, with O(compile_cache_dir), the compile caches.
    type: dict
    default: {}
  compile_cache_dir:
    version_added: "0.2.0"
    description:
      - One directory for every compile cache of the server (C(TRITON_CACHE_DIR), C(FLASHINFER_WORKSPACE_BASE),
        C(TORCHINDUCTOR_CACHE_DIR), C(CUDA_CACHE_PATH) below it), so that a restart or a rebuilt container compiles
        nothing again. The number of files in it before a launch is returned as RV(compile_cache_files).
      - Unset - the libraries' own defaults (under the service's home).
    type: path
  model_dir:
    description:
      - Directory with the model's C(config.json) and C(model.safetensors.index.json) for the memory plan.
      - Defaults to C(model_path) of O(options) when that is a directory.
    type: path
  plan:
    description: Check the memory-fit plan before a (re)start. With V(false) the plan is not computed.
    type: bool
    default: true
  plan_overrides:
    description: "Extra arguments of the plan, for example V({context_overhead_mib: 1000})."
    type: dict
    default: {}
  state:
    description: V(started) converges and runs the server; V(stopped) stops it and waits until the GPU memory is released.
    type: str
    choices: [started, stopped]
    default: started
  force_restart:
    description: Restart even when nothing changed.
    type: bool
    default: false
  enabled:
    description: Enable the unit at boot. Omit to leave as is.
    type: bool
  release_timeout:
    description: Seconds to wait, polling NVML, until the GPU memory of a stopped server is released.
    type: int
    default: 120
  idle_used_mib:
    description: Per-GPU memory.used (MiB) up to which a GPU with no processes counts as free (driver context, persistence).
    type: int
    default: 1024
  timeout_stop_sec:
    description: The unit's C(TimeoutStopSec) (SIGTERM, then SIGKILL to the whole cgroup).
    type: int
    default: 120
  limit_nofile:
    description:
      - The unit's C(LimitNOFILE=) (SGLang opens many sockets and files). V(0) leaves systemd's default.
      - Capped, with a warning, at the hard limit of the container's init (C(/proc/1/limits)); above it systemd
        would fail the start at step LIMITS (exit status 205).
    type: int
    default: 65536
  restart:
    version_added: "0.2.0"
    description: The unit's C(Restart=); V(on-failure) brings a crashed server back.
    type: str
    choices: ["no", on-failure, on-abnormal, always]
    default: on-failure
  restart_sec:
    version_added: "0.2.0"
    description: The unit's C(RestartSec=) (seconds before an automatic restart).
    type: int
    default: 30
  start_limit_interval_sec:
    version_added: "0.2.0"
    description: The unit's C(StartLimitIntervalSec=); with O(start_limit_burst) it bounds automatic restarts.
    type: int
    default: 3600
  start_limit_burst:
    version_added: "0.2.0"
    description: The unit's C(StartLimitBurst=). The module's own starts reset the count (C(systemctl reset-failed)).
    type: int
    default: 3
  probe_regex:
    version_added: "0.2.0"
    description:
      - The gate's probe regex (O(kpro.gpu_serving.sglang_gate#module:expected_probe_regex)).
      - Checked to compile before anything is touched.
    type: str
  secret_file:
    version_added: "0.2.0"
    description:
      - The server's C(--config) YAML file holding the API key (mode 0600). Defaults to
        C(/etc/kpro-gpu-serving/<stem>-secrets.yaml).
      - The server reads it, so O(root) does not move it (like O(launcher)).
    type: path
  user:
    description: The unit's C(User=). Omit to run as root.
    type: str
  log_dir:
    description: Directory of the per-launch logs.
    type: path
    default: /var/log/sglang
  launcher:
    description: Path of the launcher script (written by this module).
    type: path
    default: /usr/local/lib/kpro-gpu-serving/sglang-launch
  env_file:
    description: Path of the environment file. Defaults to C(/etc/kpro-gpu-serving/<unit>.env).
    type: path
  unit_dir:
    description: Directory of the unit file.
    type: path
    default: /etc/systemd/system
  state_dir:
    description: Directory where the fingerprint and plan of the running launch are kept.
    type: path
    default: /var/lib/kpro-gpu-serving
  systemctl:
    description: The C(systemctl) to run. Defaults to the one in C(PATH).
    type: path
  root:
    description:
      - Directory the unit file, the environment file and the state file are written under (O(unit_dir), O(env_file) and
        O(state_dir) are paths inside it, and the unit names them so). For tests against a systemctl stand-in; the
        launcher and the logs are used by the server's processes and are not moved.
    type: path
    default: /
  cgroup_root:
    description: Root of the cgroup file system (tests).
    type: path
    default: /sys/fs/cgroup
  deployment_check:
    version_added: "0.2.0"
    description:
      - Before anything else, the step of M(kpro.gpu_serving.sglang_deployment) with O(kpro.gpu_serving.sglang_deployment#module:state=checked)
        on the deployment record of O(unit), so that the idempotent re-run pays one module call instead of two.
      - When the wanted deployment is the one that failed its gate and was rolled back, and O(deployment_check.retry) is
        not set, the module fails with that failure's phase and diagnosis and changes nothing.
      - Otherwise RV(deployment_recorded) says whether recording the deployment as good would change nothing.
    type: dict
    suboptions:
      service:
        description: The service arguments the deployment is recorded with (those of M(kpro.gpu_serving.sglang_deployment)).
        type: dict
        required: true
      model_revision:
        description: The model revision of the deployment.
        type: str
        default: ""
      retry:
        description: Launch a deployment that failed its gate and was rolled back anyway.
        type: bool
        default: false
      state_dir:
        description: Where the deployment records are (M(kpro.gpu_serving.sglang_deployment)'s O(kpro.gpu_serving.sglang_deployment#module:state_dir)).
        type: path
        default: /var/lib/kpro-gpu-serving
  look:
    version_added: "0.2.0"
    description:
      - "With O(state=started), when the server was not (and in check mode would not be) restarted: one check of
        M(kpro.gpu_serving.sglang_gate), its own code, with a timeout of 1 s, in this module run (the idempotent re-run
        pays one module call instead of two). The gate's result is returned as RV(look); it never fails this module."
      - "The gate's options that are not the launch's: V(base_url), V(served_model_name), V(http_timeout),
        V(probe_prompt), V(probe_max_tokens), V(probe_timeout), V(stall_timeout), V(expected_probe_regex),
        V(known_answer_checks), V(chat_template_kwargs), V(sglang_version), V(model_dir), V(node_rank) (see
        M(kpro.gpu_serving.sglang_gate)); a key set to null is left out. The unit, its log, the launch id, the API key
        and the plan are this module's. Another key fails with phase V(bad_input)."
    type: dict
extends_documentation_fragment: []
attributes:
  check_mode:
    support: full
    description: Reports whether files would change and the server would be (re)started (RV(restarted)); changes nothing and ends no process.
  diff_mode:
    support: full
    description: Shows the unit file's diff (the environment file's content is secret and never shown).
requirements:
  - systemd on the target (C(systemctl)).
  - nvidia-ml-py (module C(pynvml)) on the target; without it C(nvidia-smi) is used.
notes:
  - Inside an LXC container NVML reports host PIDs; processes that are not visible in the container are judged by
    whether their memory goes away once this unit is stopped. Memory that stays is reported as V(gpu_memory_held).
  - Run M(kpro.gpu_serving.sglang_gate) next with RV(launch_id), RV(log_path) and RV(plan).
seealso:
  - module: kpro.gpu_serving.sglang_gate
  - module: kpro.gpu_serving.sglang_diagnose
"""

EXAMPLES = r"""
- name: Run the server
  kpro.gpu_serving.sglang_service:
    unit: sglang.service
    venv: /opt/sglang/venv
    options:
      model_path: /srv/models/Qwen3.6-27B
      served_model_name: qwen3.6-27b
      tp_size: 2
      context_length: 65536
      mem_fraction_static: 0.85
      max_running_requests: 16
      host: 0.0.0.0
      port: 30000
    api_key: "{{ vault_sglang_api_key }}"
    environment:
      NCCL_P2P_DISABLE: "1"
  register: server

- name: Wait until it really serves
  kpro.gpu_serving.sglang_gate:
    unit: sglang.service
    log_path: "{{ server.log_path }}"
    launch_id: "{{ server.launch_id }}"
    served_model_name: qwen3.6-27b
    plan: "{{ server.plan | default(omit) }}"
    api_key: "{{ vault_sglang_api_key }}"

- name: Stop it and wait until the GPUs are free
  kpro.gpu_serving.sglang_service:
    options: {}
    state: stopped
"""

RETURN = r"""
look:
  version_added: "0.2.0"
  description: With O(look), the result of the one gate check (that of M(kpro.gpu_serving.sglang_gate), its
    RV(kpro.gpu_serving.sglang_gate#module:phase) V(ready) when the server serves and answers right).
  returned: when O(look) is given and the server was not restarted
  type: dict
  sample: {"phase": "ready", "time_to_ready_s": 41.2, "gpu_used_mib": [44870, 44870]}
deployment_recorded:
  version_added: "0.2.0"
  description: With O(deployment_check), whether the wanted deployment is already recorded as the good one (recording it
    again after the gate would change nothing).
  returned: when O(deployment_check) is given and does not refuse
  type: bool
  sample: true
restarted:
  description: Whether the server was (in check mode, would be) started or restarted.
  returned: always
  type: bool
  sample: true
reasons:
  description: Why it was (re)started.
  returned: always
  type: list
  elements: str
  sample: ["the rendered unit or environment changed"]
launch_id:
  description: The launch's id (the unit's InvocationID), the C(# kpro-launch-id:) header of its log.
  returned: when the server runs (not in check mode before a restart)
  type: str
  sample: 6f1c2d0a9b8e4f3c8d7e6f5a4b3c2d1e
compile_cache_files:
  version_added: "0.2.0"
  description: The files in O(compile_cache_dir) just before this run's launch (the gate compares at ready).
  returned: when the module started the server and O(compile_cache_dir) is set
  type: int
log_path:
  description: This launch's log file.
  returned: when the server runs
  type: str
  sample: /var/log/sglang/sglang-6f1c2d0a9b8e4f3c8d7e6f5a4b3c2d1e.log
secret_file:
  version_added: "0.2.0"
  description: The server's C(--config) file holding the API key (mode 0600); null without a key. The gate reads the key there.
  returned: always
  type: str
  sample: /etc/kpro-gpu-serving/sglang-secrets.yaml
unit_path:
  description: The unit file.
  returned: always
  type: str
  sample: /etc/systemd/system/sglang.service
nrestarts:
  version_added: "0.2.0"
  description: The unit's C(NRestarts) (automatic restarts since the last manual start) before this run.
  returned: when the unit is known
  type: int
exec_start:
  description: The ExecStart line (the API key is not in it; C(--config <secret_file>) is).
  returned: always
  type: str
files_changed:
  description: The files that were (would be) written.
  returned: always
  type: list
  elements: str
plan:
  description:
    - The memory-fit plan (sglang_plan.plan()) - C(fits), C(per_gpu) (C(weights_mib), C(kv_tokens), ...), C(reason), C(remedy).
    - Made once, before a (re)start; without a restart the running launch's stored C(fits), C(per_gpu) and C(reason).
    - Pass it to M(kpro.gpu_serving.sglang_gate) (O(kpro.gpu_serving.sglang_gate#module:plan)).
  returned: when O(plan) and the model files are found
  type: dict
gpu_processes:
  description: Every process holding GPU memory before the (re)start, with C(ours) (of this unit) and C(visible) (in this PID namespace).
  returned: always
  type: list
  elements: dict
  sample: [{"gpu": 0, "pid": 4242, "name": "python3", "used_mib": 22810, "ours": false, "visible": true}]
ended_pids:
  description: Processes of this unit that were ended (by stopping the unit; survivors of its cgroup by PID).
  returned: always
  type: list
  elements: int
released_after_s:
  description: Seconds until NVML showed the GPU memory released after the stop.
  returned: when the server was stopped
  type: float
gpu_used_mib:
  description: Per-GPU memory.used before the start (after the release).
  returned: when NVML answers
  type: list
  elements: int
phase:
  description: On failure, the diagnosis phase (V(gpu_memory_held), V(kv_cache_oom), V(weights_oom), V(not_started), V(port_in_use), V(version_mismatch)).
  returned: failure
  type: str
evidence:
  description: On failure, what shows the phase (PIDs, names and MiB; the plan's numbers).
  returned: failure
  type: list
  elements: str
remedy:
  description: On failure, what to do.
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import deployment as dp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import names
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_ready import look_once, look_options
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_serve import Server


ARGUMENT_SPEC = dict(
    unit=dict(type="str", default="sglang.service"),
    venv=dict(type="path", default="/opt/sglang/venv"),
    python=dict(type="path"),
    options=dict(type="dict", required=True),
    api_key=dict(type="str", no_log=True),
    environment=dict(type="dict", default={}),
    compile_cache_dir=dict(type="path"),
    model_dir=dict(type="path"),
    plan=dict(type="bool", default=True),
    plan_overrides=dict(type="dict", default={}),
    state=dict(type="str", choices=["started", "stopped"], default="started"),
    force_restart=dict(type="bool", default=False),
    enabled=dict(type="bool"),
    release_timeout=dict(type="int", default=120),
    idle_used_mib=dict(type="int", default=1024),
    timeout_stop_sec=dict(type="int", default=120),
    limit_nofile=dict(type="int", default=65536),
    restart=dict(type="str", default="on-failure", choices=["no", "on-failure", "on-abnormal", "always"]),
    restart_sec=dict(type="int", default=30),
    start_limit_interval_sec=dict(type="int", default=3600),
    start_limit_burst=dict(type="int", default=3),
    probe_regex=dict(type="str"),
    secret_file=dict(type="path"),
    user=dict(type="str"),
    log_dir=dict(type="path", default="/var/log/sglang"),
    launcher=dict(type="path", default=su.LAUNCHER_PATH),
    env_file=dict(type="path"),
    unit_dir=dict(type="path", default="/etc/systemd/system"),
    state_dir=dict(type="path", default="/var/lib/kpro-gpu-serving"),
    systemctl=dict(type="path"),
    root=dict(type="path", default="/"),
    cgroup_root=dict(type="path", default="/sys/fs/cgroup"),
    deployment_check=dict(type="dict", options=dict(
        service=dict(type="dict", required=True),
        model_revision=dict(type="str", default=""),
        retry=dict(type="bool", default=False),
        state_dir=dict(type="path", default=dp.STATE_DIR),
    )),
    look=dict(type="dict"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    server = Server(module)
    check, look = module.params["deployment_check"], module.params["look"]
    try:
        names.check_unit_name(module.params["unit"])  # it names the unit's files: refused before anything is looked at
        look = look_options(look) if look is not None else None    # a bad key: refused before anything changes
        if check:   # sglang_deployment state=checked's step, first: a refused deployment leaves everything as it is
            server.result["deployment_recorded"] = dp.refuse_rolled_back(check, module.params["unit"])
        if module.params["state"] == "stopped":
            server.stopped()
        else:
            server.started()
            if look is not None and not server.result["restarted"]:
                server.result["look"] = look_once(module, look, server.unit, server.systemctl, server.result, module.params["api_key"])
    except failure.Failure as e:
        server.result.pop("diff", None)
        failure.fail(module, e, **server.result)
    if not module._diff:
        server.result.pop("diff", None)
    module.exit_json(**server.result)


if __name__ == "__main__":
    main()
