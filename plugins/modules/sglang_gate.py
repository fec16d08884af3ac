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
    (O(planned_weights_mib)), C(/health) answers 200, C(/v1/models) lists O(served_model_name), and a deterministic
    completion (temperature 0, O(probe_max_tokens)) is not degenerate (empty, a run of newlines, a loop) and matches
    O(expected_probe_regex)."
  - "On failure the task fails with RV(phase) (V(not_started), V(init_failed_before_gpu), V(weights_oom),
    V(kv_cache_oom), V(nccl_error), V(cuda_graph_failed), V(port_in_use), V(warmup_failed), V(degenerate_output),
    V(version_mismatch), V(timeout)), RV(evidence) (this launch's log lines, per-GPU MiB, exit status) and RV(remedy)."
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
  planned_weights_mib:
    description: The memory plan's weights per GPU (MiB); ready requires every GPU to hold at least 90% of it.
    type: float
  model_dir:
    description:
      - Directory with C(model.safetensors.index.json); without O(planned_weights_mib) the weights share is its
        C(total_size) / O(tp_size).
    type: path
  tp_size:
    description: Tensor parallel size for O(model_dir).
    type: int
    default: 1
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
    description:
      - Seconds without progress (no new log line, no change of GPU memory) after this launch's log shows a fatal error
        (a traceback, a dead scheduler) before the gate fails while the process is still alive; the log alone then
        decides.
    type: float
    default: 5.0
  expected_probe_regex:
    description: A regular expression the probe's text must match (searched). Empty for none.
    type: str
    default: "(?i)paris"
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
    planned_weights_mib: "{{ server.plan.per_gpu.weights_mib }}"
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
  description: The unit's C(NRestarts) (automatic restarts by C(Restart=on-failure) since the last manual start).
  returned: with O(unit)
  type: int
  sample: 0
kv_tokens:
  description: The KV cache pool's token count, from the log line that says the KV Cache is allocated.
  returned: success
  type: int
  sample: 242894
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
facts:
  description: Numbers from the log (see M(kpro.gpu_serving.sglang_diagnose)).
  returned: always
  type: dict
"""

import json
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.six.moves.urllib.request import Request, build_opener, ProxyHandler

from ansible_collections.kpro.gpu_serving.plugins.module_utils import sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.degenerate import detect as detect_degenerate
from ansible_collections.kpro.gpu_serving.plugins.module_utils.nvml import gpu_facts
from ansible_collections.kpro.gpu_serving.plugins.module_utils.sglang_log import diagnose, parse_log, select_launch
from ansible_collections.kpro.gpu_serving.plugins.module_utils.sglang_plan import weights_total_bytes

MIB = 1 << 20
_OPENER = build_opener(ProxyHandler({}))   # loopback: never through a proxy


def http(method, url, api_key=None, body=None, timeout=5.0):
    """(status or None when nothing answers, parsed JSON or text)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer %s" % api_key
    data = json.dumps(body).encode("utf-8") if body is not None else None
    req = Request(url, data=data, headers=headers)
    req.get_method = lambda: method
    try:
        resp = _OPENER.open(req, timeout=timeout)
        status, raw = resp.getcode(), resp.read()
    except HTTPError as e:
        status, raw = e.code, e.read()
    except (URLError, OSError, ValueError):
        return None, None
    try:
        return status, json.loads(raw.decode("utf-8", "replace")) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", "replace")


class LogReader(object):
    """Incremental reader of one log file; the text so far (restarts when the file is replaced or truncated)."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.ino = None
        self.chunks = []

    def size(self):
        try:
            return os.stat(self.path).st_size
        except OSError:
            return -1

    def read(self):
        try:
            st = os.stat(self.path)
        except OSError:
            return None if not self.chunks else "".join(self.chunks)
        if self.ino is not None and (st.st_ino != self.ino or st.st_size < self.offset):
            self.offset, self.chunks = 0, []
        self.ino = st.st_ino
        if st.st_size > self.offset:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(st.st_size - self.offset)
            # keep a partial last line for the next read
            cut = data.rfind(b"\n") + 1
            if cut:
                self.chunks.append(data[:cut].decode("utf-8", "replace"))
                self.offset += cut
        return "".join(self.chunks)


class Gate(object):
    def __init__(self, module):
        self.m = module
        p = module.params
        self.p = p
        self.t0 = time.time()
        self.base = p["base_url"].rstrip("/")
        self.systemctl = (p["systemctl"] or module.get_bin_path("systemctl", required=True)) if p["unit"] else None
        self.log_path = self.resolve_log()
        self.reader = LogReader(self.log_path) if self.log_path else None
        self.last_progress = self.t0
        self.last_size = -1
        self.last_used = None
        self.main_pid = None
        self.planned = p["planned_weights_mib"]
        if self.planned is None and p["model_dir"]:
            idx = os.path.join(p["model_dir"], "model.safetensors.index.json")
            if os.path.isfile(idx):
                self.planned = round(weights_total_bytes(idx) / float(p["tp_size"] or 1) / MIB)
        self.http_state = None
        self.gpu_used = None
        self.exit_status = None
        self.nrestarts = None

    def resolve_log(self):
        p = self.p
        if p["log_dir"] and p["launch_id"]:
            return su.launch_log_path(p["log_dir"], p["unit"] or "sglang.service", p["launch_id"])
        if p["log_path"]:
            return p["log_path"]
        if p["log_dir"] and p["unit"]:
            return os.path.join(p["log_dir"], "%s.log" % su.unit_stem(p["unit"]))
        return None

    # ---- observations ---------------------------------------------------------------
    def process(self):
        """(alive, exit_status)."""
        if self.p["unit"]:
            props = su.systemctl_show(self.m.run_command, self.systemctl, self.p["unit"])
            if "_error" in props:
                return None, None
            try:
                self.main_pid = int(props.get("MainPID") or 0) or None
            except ValueError:
                self.main_pid = None
            self.nrestarts = su.nrestarts(props)
            alive = props.get("ActiveState") in su.ALIVE_STATES and props.get("ActiveState") != "deactivating"
            if alive and self.p["launch_id"] and props.get("InvocationID") and props["InvocationID"] != self.p["launch_id"]:
                # the unit was restarted by someone else: this launch is over
                return False, None
            return alive, (None if alive else su.exit_status(props))
        alive = su.pid_alive(self.p["pid"])
        self.main_pid = self.p["pid"] if alive else None
        return alive, None

    def gpus(self):
        facts = gpu_facts(run_command=self.m.run_command)
        if not facts.get("available"):
            self.nvml_msg = facts.get("msg")
            return None
        return su.used_mib(facts)

    def check_http(self):
        health = http("GET", self.base + "/health", self.p["api_key"], timeout=self.p["http_timeout"])[0]
        out = {"health": health, "models": None, "expected_model": self.p["served_model_name"]}
        if health == 200:
            status, body = http("GET", self.base + "/v1/models", self.p["api_key"], timeout=self.p["http_timeout"])
            out["models_status"] = status
            if status == 200 and isinstance(body, dict):
                out["models"] = [d.get("id") for d in body.get("data") or [] if isinstance(d, dict)]
        return out

    def probe(self):
        body = {"model": self.p["served_model_name"], "prompt": self.p["probe_prompt"], "max_tokens": self.p["probe_max_tokens"],
                "temperature": 0, "stream": False}
        t = time.time()
        status, resp = http("POST", self.base + "/v1/completions", self.p["api_key"], body=body, timeout=self.p["probe_timeout"])
        elapsed = time.time() - t
        out = {"status": status, "elapsed_s": round(elapsed, 3)}
        if status != 200 or not isinstance(resp, dict):
            out.update(text=None, error=str(resp)[:300] if resp is not None else "no answer")
            return out
        choices = resp.get("choices") or [{}]
        text = choices[0].get("text") if isinstance(choices[0], dict) else None
        ctoks = (resp.get("usage") or {}).get("completion_tokens")
        out.update(text=text, completion_tokens=ctoks, finish_reason=choices[0].get("finish_reason") if isinstance(choices[0], dict) else None)
        out["tokens_per_s"] = round(ctoks / elapsed, 1) if ctoks and elapsed > 0 else None
        res = detect_degenerate(text)
        out["degenerate"], out["reason"] = res["degenerate"], res["reason"]
        rx = self.p["expected_probe_regex"]
        if not out["degenerate"] and rx and not re.search(rx, text or ""):
            out["degenerate"], out["reason"] = True, "the text does not match %r" % rx
        return out

    # ---- the loop -------------------------------------------------------------------
    def wait_tick(self):
        """Sleep until the next full check, waking early when the log grows or the main process is gone."""
        end = time.time() + self.p["poll_interval"]
        size0 = self.reader.size() if self.reader else -1
        while True:
            now = time.time()
            if now >= end:
                return
            time.sleep(min(0.1, end - now))
            if self.reader and self.reader.size() != size0:
                return
            if self.main_pid and not su.pid_alive(self.main_pid):
                return

    def settle_log(self, quiet_s=0.3, max_s=2.0):
        end = time.time() + max_s
        size, since = self.reader.size(), time.time()
        while time.time() < end:
            time.sleep(0.05)
            now_size = self.reader.size()
            if now_size != size:
                size, since = now_size, time.time()
            elif time.time() - since >= quiet_s:
                return

    def tick(self):
        p = self.p
        now = time.time()
        alive, status = self.process()
        if status is not None:
            self.exit_status = status
        if alive is False and self.reader:
            # the launcher's log writer can still be flushing the last lines (uvicorn's bind error comes after
            # the scheduler's): read only once the log has stopped growing, so the diagnosis sees them
            self.settle_log()
        text = self.reader.read() if self.reader else None
        self.gpu_used = self.gpus()
        size = len(text) if text else 0
        if size != self.last_size or (self.gpu_used and self.last_used and any(abs(a - b) > 64 for a, b in zip(self.gpu_used, self.last_used))):
            self.last_progress = now
        self.last_size = size
        self.last_used = self.gpu_used
        part = select_launch(text, p["launch_id"]) if text is not None else None
        http_state = None
        if alive and part:
            ms = parse_log(part)["milestones"]
            if "uvicorn_running" in ms or "ready" in ms:
                http_state = self.check_http()
        self.http_state = http_state
        elapsed = now - self.t0
        stalled = now - self.last_progress
        kw = dict(gpu_used_mib=self.gpu_used, gpu_baseline_mib=p["gpu_baseline_mib"], exit_status=self.exit_status,
                  process_alive=alive, planned_weights_mib=self.planned, http=http_state, launch_id=p["launch_id"])
        if alive and stalled >= p["stall_timeout"]:
            # out of time for this launch: the stall budget, not the overall one, ran out
            res = diagnose(text, elapsed_s=elapsed, timeout_s=elapsed, stalled_s=None, **kw)
            if res["phase"] == "timeout":
                res["remedy"] = ("No progress for %ds (no new log line, no change of GPU memory): " % stalled) + res["remedy"]
                res["facts"]["stalled_s"] = round(stalled, 1)
            return res
        res = diagnose(text, elapsed_s=elapsed, timeout_s=p["timeout"], stalled_s=stalled, **kw)
        if res["phase"] == "ready":
            if http_state is None or http_state.get("health") != 200:
                return None     # the log says ready; wait for /health to agree
            if http_state.get("models") is not None and p["served_model_name"] not in http_state["models"]:
                res["phase"] = "warmup_failed"
                res["evidence"].append("GET /v1/models lists %s, not %s" % (http_state["models"], p["served_model_name"]))
                res["remedy"] = ("The server answers but serves %s: set served_model_name in the options (--served-model-name) to "
                                 "%s, or make sure no other server answers on %s." % (http_state["models"], p["served_model_name"], self.base))
                return res
            probe = self.probe()
            self.last_probe = probe
            if probe.get("text") is None:
                res = dict(res, phase="warmup_failed", evidence=res["evidence"] + ["probe POST /v1/completions: HTTP %s %s"
                                                                                   % (probe.get("status"), probe.get("error"))],
                           remedy="The server is healthy but the completion probe failed (HTTP %s): check the served model name, "
                                  "the API key and the server log." % probe.get("status"))
                return res
            res = diagnose(text, probe={"text": probe["text"], "degenerate": probe["degenerate"], "reason": probe["reason"]}, elapsed_s=elapsed,
                           timeout_s=p["timeout"], stalled_s=stalled, **kw)
            return res
        if res["phase"] == "loading":
            return self.fatal_in_log(text, kw, elapsed, stalled, now)
        return res

    def fatal_in_log(self, text, kw, elapsed, stalled, now):
        """A fatal error this launch's log shows while the process still lives (a child hangs on, or the unit restarted
        it under a launch id we cannot see): sglang_log decides from the log alone (process_alive=None) once neither
        the log nor GPU memory moved for fatal_grace seconds, so the gate ends in seconds, not at the stall timeout."""
        if now - self.last_progress < self.p["fatal_grace"]:
            return None     # still progressing: a traceback the startup goes on past is not fatal
        res = diagnose(text, elapsed_s=elapsed, timeout_s=self.p["timeout"], stalled_s=stalled,
                       **dict(kw, process_alive=None, http=None))
        if res["phase"] in ("loading", "ready", "timeout"):
            return None
        res["evidence"].append("the process is still alive, but this launch's log shows the failure above and neither the log nor "
                               "GPU memory moved for %.0fs" % (now - self.last_progress))
        return res

    def run(self):
        self.last_probe = None
        while True:
            res = self.tick()
            if res is not None:
                return res
            self.wait_tick()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str"),
            systemctl=dict(type="path"),
            pid=dict(type="int"),
            log_path=dict(type="path"),
            log_dir=dict(type="path"),
            launch_id=dict(type="str"),
            base_url=dict(type="str", default="http://127.0.0.1:30000"),
            served_model_name=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            planned_weights_mib=dict(type="float"),
            model_dir=dict(type="path"),
            tp_size=dict(type="int", default=1),
            gpu_baseline_mib=dict(type="list", elements="float"),
            timeout=dict(type="int", default=1800),
            stall_timeout=dict(type="int", default=600),
            poll_interval=dict(type="float", default=1.0),
            http_timeout=dict(type="float", default=5.0),
            probe_prompt=dict(type="str", default="The capital city of France is"),
            probe_max_tokens=dict(type="int", default=16, no_log=False),
            probe_timeout=dict(type="float", default=120),
            fatal_grace=dict(type="float", default=5.0),
            expected_probe_regex=dict(type="str", default="(?i)paris"),
        ),
        required_one_of=[("unit", "pid")],
        mutually_exclusive=[("unit", "pid")],
        supports_check_mode=True,
    )
    p = module.params
    if not (p["log_path"] or p["log_dir"]):
        module.fail_json(msg="log_path or log_dir is required (the log of this launch, from sglang_service's log_path)")
    gate = Gate(module)
    res = gate.run()
    facts = res.get("facts") or {}
    probe = gate.last_probe
    out = dict(changed=False, phase=res["phase"], evidence=res["evidence"], remedy=res["remedy"], facts=facts,
               waited_s=round(time.time() - gate.t0, 2), gpu_used_mib=gate.gpu_used, exit_status=gate.exit_status,
               endpoint={"base_url": gate.base, "served_model_name": p["served_model_name"]}, launch_id=p["launch_id"],
               log_path=gate.log_path, probe=probe, kv_tokens=facts.get("kv_tokens"), nrestarts=gate.nrestarts)
    if res["phase"] == "ready":
        out["time_to_ready_s"] = facts.get("time_to_ready_s", out["waited_s"])
        module.exit_json(**out)
    module.fail_json(msg="%s: %s" % (res["phase"], res["remedy"] or "see evidence"), **out)


if __name__ == "__main__":
    main()
