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
    the installed SGLang's own flags (C(<venv>/bin/python) lists C(ServerArgs.add_cli_args)), value ranges
    (C(mem_fraction_static) in (0, 1), C(port) in 1-65535, ...), C(tp_size) against the GPUs NVML sees, the port against
    listening sockets that are not this unit's (C(/proc/net/tcp), C(tcp6)), O(probe_regex); control characters in option
    and environment values are refused. All problems are reported together and the old server keeps serving."
  - The server is (re)started only when it is not running, when the rendered unit, environment file or launcher differ
    from those it was started with (a fingerprint kept in O(state_dir)), or with O(force_restart).
  - "Before a (re)start: every process holding GPU memory is listed (PID, name, MiB). Processes of this unit (its
    cgroup, from C(systemctl show -p ControlGroup); else its C(MainPID) and descendants) are ended by stopping the unit;
    the module then waits, polling NVML, until the memory is released (bounded by O(release_timeout), not a fixed
    sleep). Any other holder fails with phase V(gpu_memory_held) and is never signalled."
  - "Before a (re)start the memory-fit plan (the model's C(config.json) and C(model.safetensors.index.json), the NVML
    totals, the options) is checked; when the KV cache cannot hold one C(context_length) of O(options) request the module
    fails with phase V(kv_cache_oom) (V(weights_oom) when the weights alone do not fit), the numbers and the flag to
    change, and nothing is changed."
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
    description: Further environment variables of the server (for example V(NCCL_P2P_DISABLE)), in the unit file.
    type: dict
    default: {}
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
    description: The unit's C(Restart=); V(on-failure) brings a crashed server back.
    type: str
    choices: ["no", on-failure, on-abnormal, always]
    default: on-failure
  restart_sec:
    description: The unit's C(RestartSec=) (seconds before an automatic restart).
    type: int
    default: 30
  start_limit_interval_sec:
    description: The unit's C(StartLimitIntervalSec=); with O(start_limit_burst) it bounds automatic restarts.
    type: int
    default: 3600
  start_limit_burst:
    description: The unit's C(StartLimitBurst=). The module's own starts reset the count (C(systemctl reset-failed)).
    type: int
    default: 3
  probe_regex:
    description:
      - The gate's probe regex (O(kpro.gpu_serving.sglang_gate#module:expected_probe_regex)).
      - Checked to compile before anything is touched.
    type: str
  secret_file:
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
  - Run M(kpro.gpu_serving.sglang_gate) next with RV(launch_id) and RV(log_path).
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
    planned_weights_mib: "{{ server.plan.per_gpu.weights_mib }}"
    api_key: "{{ vault_sglang_api_key }}"

- name: Stop it and wait until the GPUs are free
  kpro.gpu_serving.sglang_service:
    options: {}
    state: stopped
"""

RETURN = r"""
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
log_path:
  description: This launch's log file.
  returned: when the server runs
  type: str
  sample: /var/log/sglang/sglang-6f1c2d0a9b8e4f3c8d7e6f5a4b3c2d1e.log
unit_path:
  description: The unit file.
  returned: always
  type: str
  sample: /etc/systemd/system/sglang.service
nrestarts:
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
  description: The memory-fit plan (sglang_plan.plan()) - C(fits), C(per_gpu) (C(weights_mib), C(kv_tokens), ...), C(reason), C(remedy).
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
  description: On failure, the diagnosis phase (V(gpu_memory_held), V(kv_cache_oom), V(weights_oom), V(not_started), V(version_mismatch)).
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

import json
import os
import re
import signal
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils import sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.nvml import gpu_facts
from ansible_collections.kpro.gpu_serving.plugins.module_utils.sglang_plan import load_json, plan as memory_plan


class Failure(Exception):
    def __init__(self, msg, **kw):
        super(Failure, self).__init__(msg)
        self.msg = msg
        self.kw = kw


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except (IOError, OSError):
        return None


def write_atomic(path, text, mode):
    d = os.path.dirname(path)
    if not os.path.isdir(d):
        os.makedirs(d, 0o755)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=d)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Service(object):
    def __init__(self, module):
        self.m = module
        p = module.params
        self.p = p
        self.unit = p["unit"] if "." in p["unit"] else p["unit"] + ".service"
        self.stem = su.unit_stem(self.unit)
        self.systemctl = p["systemctl"] or module.get_bin_path("systemctl", required=True)
        self.env_file = p["env_file"] or os.path.join(su.ENV_FILE_DIR, "%s.env" % self.stem)
        self.unit_path = self.rooted(os.path.join(p["unit_dir"], self.unit))
        self.env_path = self.rooted(self.env_file)
        self.secret_file = p["secret_file"] or os.path.join(su.ENV_FILE_DIR, "%s-secrets.yaml" % self.stem)
        self.secret_path = self.secret_file     # read by the server's process: not moved under root
        self.state_dir = self.rooted(p["state_dir"])
        self.state_file = os.path.join(self.state_dir, "%s.json" % self.stem)
        self.result = {"changed": False, "restarted": False, "reasons": [], "files_changed": [], "gpu_processes": [],
                       "ended_pids": [], "unit_path": self.unit_path}

    # ---- helpers --------------------------------------------------------------------
    def rooted(self, path):
        return os.path.join(self.p["root"], path.lstrip("/")) if self.p["root"] not in (None, "", "/") else path

    def run(self, args):
        return self.m.run_command(args)

    def show(self):
        props = su.systemctl_show(self.run, self.systemctl, self.unit)
        if "_error" in props:
            raise Failure("systemctl show %s failed (rc=%s): %s" % (self.unit, props["_rc"], props["_error"]), phase="not_started",
                          remedy="The module needs systemd in the container (systemctl); check that systemd runs as PID 1.")
        return props

    def nvml(self):
        facts = gpu_facts(run_command=self.m.run_command)
        if not facts.get("available"):
            phase = "version_mismatch" if facts.get("reason") == "version_mismatch" else "not_started"
            raise Failure("NVML is not available: %s" % facts.get("msg"), phase=phase, evidence=[facts.get("msg", "")],
                          remedy=facts.get("msg", ""), nvml_reason=facts.get("reason"))
        return facts

    def stored(self):
        try:
            with open(self.state_file) as f:
                return json.load(f)
        except (IOError, OSError, ValueError):
            return {}

    # ---- rendering ------------------------------------------------------------------
    def render(self):
        p = self.p
        opts = dict(p["options"] or {})
        if opts.get("api_key") not in (None, False):
            raise Failure("options.api_key: pass the API key as the module's api_key (no_log), not in options",
                          remedy="Move the key to api_key: it then stays out of the unit file and the logs.")
        if p["api_key"] and opts.get("config") not in (None, False):
            raise Failure("options.config: SGLang takes one --config file, and it carries the API key (api_key)",
                          phase="not_started", remedy="Move the settings of your config file into options, or leave api_key empty.")
        secret = su.secret_config(p["api_key"] or None)
        env = {}
        nofile = p["limit_nofile"]
        try:
            with open(self.rooted("/proc/1/limits")) as f:
                hard = su.hard_nofile(f.read())
        except (IOError, OSError):
            hard = None
        if nofile and hard is not None and nofile > hard:
            self.m.warn("limit_nofile %d is above the hard limit of the container's init (%d): LimitNOFILE=%d is used "
                        "(raise the container's limit, e.g. lxc.prlimit.nofile, to get more)" % (nofile, hard, hard))
            nofile = hard
        try:
            secret_file = self.secret_file if secret else None
            restart = dict((k, p[k]) for k in su.RESTART_DEFAULTS)
            unit_text = su.render_unit(self.unit, p["venv"], opts, env_file=self.env_file, launcher=p["launcher"],
                                       log_dir=p["log_dir"], environment=p["environment"], timeout_stop_sec=p["timeout_stop_sec"],
                                       user=p["user"], python=p["python"], limit_nofile=nofile, secret_file=secret_file, restart=restart)
            env_text = su.render_env(env)
            line = su.exec_start(p["venv"], opts, self.stem, launcher=p["launcher"], log_dir=p["log_dir"], python=p["python"],
                                 secret_file=secret_file)[1]
        except su.OptionError as e:
            raise Failure(str(e), phase="not_started",
                          remedy="Fix the value it names (sglang_server_options or sglang_server_environment); nothing was changed.")
        self.opts = opts
        self.unit_text, self.env_text, self.exec_line, self.secret_text = unit_text, env_text, line, secret
        self.fingerprint = su.config_fingerprint(unit_text + su.LAUNCHER_SCRIPT, env_text + (secret or ""))
        self.result["exec_start"] = line

    # ---- validation (before the running server is touched) --------------------------
    def check_probe_regex(self):
        rx = self.p["probe_regex"]
        if rx:
            try:
                re.compile(rx)
            except re.error as e:
                raise Failure("sglang_server_probe.regex %r does not compile: %s" % (rx, e), phase="not_started",
                              remedy="Fix sglang_server_probe.regex (a Python regular expression); nothing was changed.")

    def known_flags(self):
        py = self.p["python"] or os.path.join(self.p["venv"], "bin", "python")
        rc, out, err = self.run([py, "-c", su.FLAGS_PROBE])
        try:
            return json.loads(out.strip().splitlines()[-1]) if rc == 0 else None
        except (ValueError, IndexError):
            rc, err = 1, out
        self.m.warn("option names not checked: %s -c could not list the installed SGLang's flags: %s" % (py, (err or "").strip()[-300:]))
        return None

    def validate(self, facts, our_pids):
        """Every check that needs no change: option names against the installed SGLang, value ranges, GPUs for tp,
        the port; all problems in one failure, before the old server is stopped."""
        opts, problems, phase = self.opts, [], "not_started"
        flags = self.known_flags()
        for key, flag, close in su.unknown_options(opts, flags) if flags else []:
            problems.append("option %s: the installed SGLang has no %s%s" % (key, flag, (" (did you mean %s?)" % ", ".join(close)) if close else ""))
        problems += ["option %s" % msg for _key, msg in su.range_problems(opts)]
        need = su.gpus_needed(opts)
        if need > len(facts["gpus"]):
            problems.append("option tp_size: the server needs %d GPUs (tp_size x pp_size x dp_size from base_gpu_id) but NVML sees %d "
                            "in this container; lower tp_size or pass more GPUs to the container" % (need, len(facts["gpus"])))
        port = opts.get("port", 30000)
        if not any(k == "port" for k, _m in su.range_problems(opts)) and self.port_busy(port, our_pids):
            problems.append("option port: port %s is taken by another process (not this unit's server): stop it (ss -ltnp "
                            "sport = :%s finds it) or choose another port" % (port, port))
            phase = "port_in_use" if len(problems) == 1 else phase
        if problems:
            raise Failure("invalid server settings, refused before the running server was touched: %s" % "; ".join(problems),
                          phase=phase, evidence=problems,
                          remedy="Fix each setting named in sglang_server_options and re-run; the running server was left serving.")

    def port_busy(self, port, our_pids):
        listeners = []
        for name in ("tcp", "tcp6"):
            listeners += su.parse_proc_net_tcp(read_text("/proc/net/%s" % name))
        return su.port_taken(port, listeners, su.socket_inodes(our_pids))

    # ---- the plan -------------------------------------------------------------------
    def compute_plan(self, facts, baseline):
        p = self.p
        if not p["plan"]:
            return None
        model_dir = p["model_dir"] or self.opts.get("model_path")
        if not model_dir or not os.path.isdir(model_dir):
            self.m.warn("memory plan skipped: model directory %r not found (set model_dir)" % model_dir)
            return None
        cfg_path = os.path.join(model_dir, "config.json")
        idx_path = os.path.join(model_dir, "model.safetensors.index.json")
        if not os.path.isfile(cfg_path):
            self.m.warn("memory plan skipped: %s not found" % cfg_path)
            return None
        if os.path.isfile(idx_path):
            index = load_json(idx_path)
        else:
            index = sum(os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir) if f.endswith(".safetensors"))
        totals = [g.get("memory_total_mib") for g in facts["gpus"]]
        tp = int(self.opts.get("tp_size") or 1)
        base_gpu = int(self.opts.get("base_gpu_id") or 0)
        sel = list(range(base_gpu, min(len(totals), base_gpu + tp))) or list(range(len(totals)))
        popts = su.plan_options(self.opts)
        popts.update(p["plan_overrides"] or {})
        try:
            res = memory_plan(load_json(cfg_path), index, popts, gpu_total_mib=[totals[i] for i in sel],
                              gpu_baseline_mib=[baseline[i] for i in sel] if baseline else None)
        except (ValueError, KeyError, TypeError) as e:
            self.m.warn("memory plan failed: %s" % e)
            return None
        res.pop("model", None)
        return res

    def refuse_plan(self, plan):
        pg = plan["per_gpu"]
        weights_only = pg["weights_mib"] > pg["free_mib"]
        phase = plan.get("phase") or ("weights_oom" if weights_only else "kv_cache_oom")
        ev = [plan["reason"],
              "per GPU: total %s MiB, free %s MiB, weights %s MiB, static pool %s MiB (mem_fraction_static %s), reserve %s MiB, "
              "GDN/mamba state %s MiB, speculative reservation %s MiB, KV budget %s MiB = %s tokens, context_length %s"
              % (pg["total_mib"], pg["free_mib"], pg["weights_mib"], pg["static_pool_mib"], plan["options"].get("mem_fraction_static"),
                 pg["reserve_mib"], pg["mamba_state_mib"], pg["spec_reservation_mib"], pg["kv_budget_mib"], pg["kv_tokens"],
                 plan["context_length"])]
        raise Failure("%s: the memory plan refuses this launch before starting it. %s %s" % (phase, plan["reason"], plan["remedy"]),
                      phase=phase, evidence=ev, remedy=plan["remedy"], plan=plan)

    # ---- processes and memory -------------------------------------------------------
    def holders(self, facts, props):
        ours, source = su.unit_pids(props, self.p["cgroup_root"])
        self.our_source = source
        return su.gpu_holders(facts, ours), ours

    def fail_held(self, held, facts, why, ended=()):
        ev = []
        for h in held:
            where = "" if h["visible"] else " (not visible in this PID namespace: a host PID)"
            if h["pid"] in ended:
                where = " (a process of this unit, ended; the driver still lists its memory)"
            mib = h["used_mib"] if h["used_mib"] is not None else "?"
            ev.append("PID %s %s holds %s MiB on GPU %s%s" % (h["pid"], h["name"], mib, h["gpu"], where))
        used = su.used_mib(facts)
        if used is not None:
            ev.append("GPU memory used (MiB): %s" % ", ".join(str(u) for u in used))
        raise Failure("gpu_memory_held: %s. %s" % (why, "; ".join(ev)), phase="gpu_memory_held", evidence=ev,
                      remedy="GPU memory is held by processes that are not this unit's (%s): stop them yourself (this module "
                             "never ends a process that is not in the unit's cgroup) or wait until they exit, then re-run."
                             % ", ".join(sorted(set("PID %s %s" % (h["pid"], h["name"]) for h in held))),
                      gpu_processes=self.result["gpu_processes"])

    def busy(self, facts):
        """GPUs not free: (processes, [(gpu, used)] above idle_used_mib)."""
        procs = su.gpu_holders(facts)
        over = [(g.get("index"), g.get("memory_used_mib")) for g in facts["gpus"]
                if (g.get("memory_used_mib") or 0) > self.p["idle_used_mib"]]
        return procs, over

    def stop_and_release(self, props, our_pids):
        """Stop the unit (control-group kill), end survivors of its cgroup by PID, wait until NVML shows the memory released."""
        t0 = time.time()
        ended = list(our_pids)
        if props.get("ActiveState") in su.ALIVE_STATES or our_pids:
            rc, out, err = self.run([self.systemctl, "stop", self.unit])
            if rc != 0:
                raise Failure("systemctl stop %s failed (rc=%s): %s" % (self.unit, rc, (err or out).strip()), phase="gpu_memory_held",
                              remedy="Stop the unit by hand (systemctl stop %s) and re-run." % self.unit)
            left, _src = su.unit_pids(self.show(), self.p["cgroup_root"])
            for pid in left:
                if pid in our_pids or _src == "cgroup":
                    try:
                        os.kill(pid, signal.SIGKILL)
                        ended.append(pid)
                    except OSError:
                        pass
        self.result["ended_pids"] = sorted(set(ended))
        deadline = t0 + self.p["release_timeout"]
        ours = set(ended)
        while True:
            facts = self.nvml()
            procs, over = self.busy(facts)
            foreign_visible = [h for h in procs if h["visible"] and h["pid"] not in ours]
            if foreign_visible:
                self.fail_held(foreign_visible, facts, "a process that is not this unit's holds GPU memory")
            if not procs and not over:
                self.result["released_after_s"] = round(time.time() - t0, 2)
                return facts
            if time.time() >= deadline:
                if procs:
                    self.fail_held(procs, facts, "GPU memory still held %ss after this unit was stopped" % self.p["release_timeout"], ours)
                ev = ["GPU %s: %s MiB used with no process NVML reports" % o for o in over]
                raise Failure("gpu_memory_held: GPU memory was not released within %ss: %s" % (self.p["release_timeout"], "; ".join(ev)),
                              phase="gpu_memory_held", evidence=ev,
                              remedy="Something NVML does not attribute (inside LXC: a host process) holds the memory: find it on the "
                                     "host (nvidia-smi there), stop it, and re-run; raise idle_used_mib if this is the idle usage.")
            time.sleep(0.25)

    # ---- files ----------------------------------------------------------------------
    def write_files(self):
        changed = []
        cur_unit = read_text(self.unit_path)
        if cur_unit != self.unit_text:
            changed.append(self.unit_path)
            self.result["diff"] = {"before": cur_unit or "", "after": self.unit_text, "before_header": self.unit_path,
                                   "after_header": self.unit_path}
        if read_text(self.env_path) != self.env_text:
            changed.append(self.env_path)
        if read_text(self.secret_path) != self.secret_text:
            changed.append(self.secret_path)
        if read_text(self.p["launcher"]) != su.LAUNCHER_SCRIPT or (os.path.exists(self.p["launcher"]) and not os.access(self.p["launcher"], os.X_OK)):
            changed.append(self.p["launcher"])
        self.result["files_changed"] = changed
        if self.m.check_mode or not changed:
            return changed
        if self.env_path in changed:
            d = os.path.dirname(self.env_path)
            if not os.path.isdir(d):
                os.makedirs(d, 0o700)
            write_atomic(self.env_path, self.env_text, 0o600)
        if self.secret_path in changed:
            if self.secret_text is None:
                os.unlink(self.secret_path)
            else:
                if not os.path.isdir(os.path.dirname(self.secret_path)):
                    os.makedirs(os.path.dirname(self.secret_path), 0o700)
                write_atomic(self.secret_path, self.secret_text, 0o600)
        if self.p["launcher"] in changed:
            write_atomic(self.p["launcher"], su.LAUNCHER_SCRIPT, 0o755)
        if self.unit_path in changed:
            write_atomic(self.unit_path, self.unit_text, 0o644)
            rc, out, err = self.run([self.systemctl, "daemon-reload"])
            if rc != 0:
                raise Failure("systemctl daemon-reload failed: %s" % (err or out).strip())
        return changed

    def save_state(self, launch_id, plan, baseline):
        data = {"fingerprint": self.fingerprint, "launch_id": launch_id, "baseline_mib": baseline, "started": time.time(),
                "plan": {"fits": plan["fits"], "per_gpu": plan["per_gpu"], "reason": plan["reason"]} if plan else None}
        d = self.state_dir
        if not os.path.isdir(d):
            os.makedirs(d, 0o755)
        write_atomic(self.state_file, json.dumps(data, sort_keys=True) + "\n", 0o600)

    def launch_id_after_start(self, props, old_target, timeout=15.0):
        lid = props.get("InvocationID")
        if lid:
            return lid
        # no InvocationID (an old systemd, or a systemctl stand-in): the launcher made an id itself; read its header
        link = os.path.join(self.p["log_dir"], "%s.log" % self.stem)
        deadline = time.time() + timeout
        while time.time() < deadline:
            target = os.path.realpath(link) if os.path.lexists(link) else None
            if target and target != old_target:
                lid = su.read_launch_header(target)
                if lid:
                    return lid
            time.sleep(0.05)
        return None

    # ---- main -----------------------------------------------------------------------
    def started(self):
        self.check_probe_regex()
        self.render()
        props = self.show()
        running = props.get("ActiveState") in ("active", "activating", "reloading")
        facts = self.nvml()
        holders, ours = self.holders(facts, props)
        self.result["gpu_processes"] = holders
        self.result["gpu_used_mib"] = su.used_mib(facts)
        stored = self.stored()
        reasons = []
        if self.p["force_restart"]:
            reasons.append("force_restart")
        if not running:
            reasons.append("the server is not running (%s)" % (props.get("ActiveState") or "unknown"))
        elif stored.get("fingerprint") != self.fingerprint:
            reasons.append("the rendered unit, environment file or launcher differ from those the running server was started with")
        self.result["reasons"] = reasons
        self.result["nrestarts"] = su.nrestarts(props)
        if not reasons:
            changed = self.write_files()
            self.result["changed"] = bool(changed)
            lid = props.get("InvocationID") or stored.get("launch_id")
            self.result["launch_id"] = lid
            self.result["log_path"] = su.launch_log_path(self.p["log_dir"], self.unit, lid) if lid else None
            if stored.get("plan"):
                self.result["plan"] = stored["plan"]
            return
        # a (re)start is needed: refuse early, before touching the running server
        self.validate(facts, ours)
        foreign = [h for h in holders if h["visible"] and not h["ours"]]
        if foreign:
            self.fail_held(foreign, facts, "a process that is not this unit's holds GPU memory")
        baseline = None
        if not ours and not holders:
            baseline = su.used_mib(facts)
        elif stored.get("baseline_mib"):
            baseline = stored["baseline_mib"]
        plan = self.compute_plan(facts, baseline)
        if plan is not None:
            self.result["plan"] = plan
            if not plan["fits"]:
                self.refuse_plan(plan)
        self.write_files()
        self.result["changed"] = True
        self.result["restarted"] = True
        if self.m.check_mode:
            return
        link = os.path.join(self.p["log_dir"], "%s.log" % self.stem)
        old_target = os.path.realpath(link) if os.path.lexists(link) else None
        facts = self.stop_and_release(props, ours)
        self.result["gpu_used_mib"] = su.used_mib(facts)
        # a start of ours must not count against StartLimitBurst= (systemd 252 src/core/unit.c unit_reset_failed()
        # resets the start rate limit); a failed state from an earlier launch is cleared with it
        self.run([self.systemctl, "reset-failed", self.unit])
        rc, out, err = self.run([self.systemctl, "start", self.unit])
        if rc != 0:
            raise Failure("systemctl start %s failed (rc=%s): %s" % (self.unit, rc, (err or out).strip()), phase="not_started",
                          remedy="See systemctl status %s and journalctl -u %s; check the ExecStart (venv, launcher)." % (self.unit, self.unit))
        props = self.show()
        lid = self.launch_id_after_start(props, old_target)
        if not lid:
            raise Failure("the unit %s started but no launch id was found (no InvocationID, no new log under %s)" % (self.unit, self.p["log_dir"]),
                          phase="not_started", remedy="Check the launcher %s and the log directory." % self.p["launcher"])
        self.result["launch_id"] = lid
        self.result["log_path"] = su.launch_log_path(self.p["log_dir"], self.unit, lid)
        self.save_state(lid, plan, su.used_mib(facts))
        if self.p["enabled"] is not None:
            self.enable(self.p["enabled"])

    def enable(self, want):
        rc, out, _err = self.run([self.systemctl, "is-enabled", self.unit])
        is_on = rc == 0 and out.strip() == "enabled"
        if is_on != want:
            self.result["changed"] = True
            if not self.m.check_mode:
                self.run([self.systemctl, "enable" if want else "disable", self.unit])

    def stopped(self):
        props = self.show()
        facts = self.nvml()
        holders, ours = self.holders(facts, props)
        self.result["gpu_processes"] = holders
        if props.get("ActiveState") in su.ALIVE_STATES or ours:
            self.result["changed"] = True
            if not self.m.check_mode:
                facts = self.stop_and_release(props, ours)
        self.result["gpu_used_mib"] = su.used_mib(facts)
        if self.p["enabled"] is not None:
            self.enable(self.p["enabled"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", default="sglang.service"),
            venv=dict(type="path", default="/opt/sglang/venv"),
            python=dict(type="path"),
            options=dict(type="dict", required=True),
            api_key=dict(type="str", no_log=True),
            environment=dict(type="dict", default={}),
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
        ),
        supports_check_mode=True,
    )
    svc = Service(module)
    try:
        if module.params["state"] == "stopped":
            svc.stopped()
        else:
            svc.started()
    except Failure as e:
        out = dict(svc.result)
        out.update(e.kw)
        out.setdefault("phase", None)
        out.setdefault("evidence", [])
        out.setdefault("remedy", "")
        out.pop("diff", None)
        module.fail_json(msg=e.msg, **out)
    if not module._diff:
        svc.result.pop("diff", None)
    module.exit_json(**svc.result)


if __name__ == "__main__":
    main()
