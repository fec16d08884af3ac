# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve stage's last step, the readiness gate (the work behind the sglang_gate module).

:class:`Gate` watches one launch until it really serves or fails: this launch's log (:class:`LogReader`,
only the part under its launch header), the unit's process state, NVML's per-GPU memory, and once the log shows
uvicorn running ``/health``, ``/v1/models`` and a content probe; :func:`sglang_log.diagnose` names the phase.
The weights each GPU must hold come from the memory plan sglang_service made (:func:`planned_weights_mib`):
the plan is not made again here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.six.moves import http_client
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import known_answer as ka
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_multinode
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import toolchain
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.degenerate import detect as detect_degenerate
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import load_json
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.nvml import gpu_facts
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_log import diagnose, parse_log, select_launch, unfinished_traceback

# sglang_gate's options (the module's argument spec), and sglang_service's look (look_once): one spec for both.
GATE_SPEC = dict(
    unit=dict(type="str"),
    systemctl=dict(type="path"),
    pid=dict(type="int"),
    log_path=dict(type="path"),
    log_dir=dict(type="path"),
    launch_id=dict(type="str"),
    base_url=dict(type="str", default="http://127.0.0.1:30000"),
    served_model_name=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    api_key_file=dict(type="path"),
    plan=dict(type="dict"),
    planned_weights_mib=dict(type="float"),
    gpu_baseline_mib=dict(type="list", elements="float"),
    timeout=dict(type="int", default=1800),
    stall_timeout=dict(type="int", default=600),
    poll_interval=dict(type="float", default=1.0),
    http_timeout=dict(type="float", default=5.0),
    # /health silent (no answer within http_timeout) this many times in a row while the process lives: unresponsive
    unresponsive_after=dict(type="int", default=3),
    probe_prompt=dict(type="str", default=ka.PROBE_PROMPT),
    probe_max_tokens=dict(type="int", default=16, no_log=False),
    probe_timeout=dict(type="float", default=120),
    fatal_grace=dict(type="float", default=5.0),
    node_rank=dict(type="int", default=0),
    expected_probe_regex=dict(type="str", default=ka.PROBE_REGEX),
    known_answer_checks=dict(type="list", elements="dict", options=dict(
        name=dict(type="str"), endpoint=dict(type="str", choices=["chat", "completions"], default="chat"),
        prompt=dict(type="str", required=True), expected=dict(type="str", required=True),
        match=dict(type="str", choices=["exact", "lines", "number", "word"], default="exact"),
        max_tokens=dict(type="int", default=64, no_log=False), min_mean_logprob=dict(type="float"),
        chat_template_kwargs=dict(type="dict"))),
    chat_template_kwargs=dict(type="dict"),
    sglang_version=dict(type="str"),
    model_dir=dict(type="path"),
    compile_cache_dir=dict(type="path"),
    compile_cache_files=dict(type="int"),
)
GATE_REQUIRED_ONE_OF = [("unit", "pid"), ("log_path", "log_dir")]
GATE_MUTUALLY_EXCLUSIVE = [("unit", "pid")]
# what sglang_service's look may set: the launch's own (unit, log, launch id, key, plan, timeout) come from the converge
LOOK_KEYS = ("base_url", "served_model_name", "http_timeout", "probe_prompt", "probe_max_tokens", "probe_timeout", "stall_timeout",
             "expected_probe_regex", "known_answer_checks", "chat_template_kwargs", "sglang_version", "model_dir", "node_rank",
             "unresponsive_after")


def http(method, url, api_key=None, body=None, timeout=5.0):
    """(status, parsed JSON or text); (None, None) when the connection fails (refused, unreachable), (None, "no answer
    within <timeout>s") when the connection was made but nothing answered in time (a hung or stopped server)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer %s" % api_key
    data = json.dumps(body).encode("utf-8") if body is not None else None
    try:
        # ansible.module_utils.urls, as modules should; loopback: never through a proxy
        resp = open_url(url, data=data, headers=headers, method=method, timeout=timeout, use_proxy=False)
        status, raw = resp.getcode(), resp.read()
    except HTTPError as e:
        status, raw = e.code, e.read()
    except (URLError, OSError, ValueError, http_client.HTTPException) as e:
        # a broken answer (IncompleteRead, BadStatusLine) is a failed exchange, as a refused connection; the kernel
        # accepts a stopped server's connections: only the read times out
        if isinstance(getattr(e, "reason", e), (socket.timeout, TimeoutError)):
            return None, "no answer within %gs" % timeout
        return None, None
    try:
        return status, json.loads(raw.decode("utf-8", "replace")) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def proc_state(pid, proc_root="/proc"):
    """The "State:" line of /proc/<pid>/status ("T (stopped)", "S (sleeping)"), or None when it cannot be read."""
    try:
        with open("%s/%d/status" % (proc_root, int(pid))) as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split(":", 1)[1].strip()
    except (IOError, OSError, ValueError):
        pass
    return None


def planned_weights_mib(plan, planned=None):
    """The weights per GPU (MiB) ready requires: ``planned`` when given, else the plan's ``per_gpu.weights_mib``
    (sglang_service's result carries the plan), else None (not checked)."""
    if planned is not None:
        return planned
    return ((plan or {}).get("per_gpu") or {}).get("weights_mib")


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
    def __init__(self, module, params=None):
        """``params``: the gate's options (GATE_SPEC), validated; the module's own by default (sglang_gate)."""
        self.m = module
        p = params if params is not None else module.params
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
        self.planned = planned_weights_mib(p["plan"], p["planned_weights_mib"])
        self.last_probe = None
        self.last_known_answer = None
        self.http_state = None
        self.gpu_used = None
        self.exit_status = None
        self.nrestarts = None
        self.silent = []          # the times of this run of /health checks that got no answer at all, in a row
        self.follower = bool(p.get("node_rank"))     # a node of rank >= 1: NVML and its health server, no endpoint

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
        health, said = http("GET", self.base + "/health", self.p["api_key"], timeout=self.p["http_timeout"])
        out = {"health": health, "models": None, "expected_model": self.p["served_model_name"]}
        if health is None and said:
            out["no_answer"] = said
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
        res = detect_degenerate(text, prompt=self.p["probe_prompt"])
        out["degenerate"], out["reason"] = res["degenerate"], res["reason"]
        rx = self.p["expected_probe_regex"]
        # readable text that misses the regex is a wrong answer (the known-answer check reports it), not garbage
        out["matches"] = out["degenerate"] or not rx or bool(re.search(rx, text or ""))
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

    def settle_log(self, quiet_s=0.3, max_s=2.0, unfinished_max_s=10.0):
        """Wait until the log has not grown for quiet_s (at most max_s), longer (at most unfinished_max_s) while it
        ends inside a traceback with no exception line yet: on a loaded host the rest of a dying process's last write
        can come later than quiet_s, and the exception line is what names the failure."""
        start = time.time()
        size, since = self.reader.size(), start
        while True:
            time.sleep(0.05)
            now, now_size = time.time(), self.reader.size()
            if now_size != size:
                size, since = now_size, now
            quiet = now - since >= quiet_s
            unfinished = quiet and unfinished_traceback(self.reader.read())
            if (quiet and not unfinished) or now - start >= (unfinished_max_s if unfinished else max_s):
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
            if "uvicorn_running" in ms or "ready" in ms or (self.follower and "weights_end" in ms):
                http_state = self.check_http()
        self.http_state = http_state
        self.silent = self.silent + [now] if (http_state or {}).get("no_answer") else []
        elapsed = now - self.t0
        stalled = now - self.last_progress
        kw = dict(gpu_used_mib=self.gpu_used, gpu_baseline_mib=p["gpu_baseline_mib"], exit_status=self.exit_status,
                  process_alive=alive, planned_weights_mib=self.planned, http=http_state, launch_id=p["launch_id"])
        if alive and len(self.silent) >= p["unresponsive_after"]:
            return self.unresponsive(diagnose(text, elapsed_s=elapsed, timeout_s=p["timeout"], stalled_s=stalled, **kw), now)
        if alive and stalled >= p["stall_timeout"]:
            # out of time for this launch: the stall budget, not the overall one, ran out
            res = diagnose(text, elapsed_s=elapsed, timeout_s=elapsed, stalled_s=None, **kw)
            if res["phase"] in ("timeout", "ready"):
                res = self.stalled(res, stalled)
            return res
        res = diagnose(text, elapsed_s=elapsed, timeout_s=p["timeout"], stalled_s=stalled, **kw)
        if self.follower and res["phase"] in ("loading", "ready"):
            ok, ev = sglang_multinode.follower_ready(parse_log(part)["milestones"] if part else {}, http_state, self.gpu_used, self.planned)
            if ok:
                self.last_probe = {"text": "", "tokens_per_s": None, "skipped": "node rank %s: the probe is rank 0's" % p["node_rank"]}
                return dict(res, phase="ready", evidence=res["evidence"] + ev)
            if res["phase"] == "ready":
                return None
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
            return self.known_answer(res, probe) if res["phase"] == "ready" else res
        if res["phase"] == "loading":
            return self.fatal_in_log(text, kw, elapsed, stalled, now)
        return res

    def stalled(self, res, stalled):
        """The stall budget ran out (``res``: the diagnosis then): a timeout with what /health last said, never "ready"
        (a log that says ready is not a server that answers: only a probe shows that)."""
        if res["phase"] == "ready":
            health = (self.http_state or {}).get("health")
            res = dict(res, phase="timeout", remedy="The log says ready, but GET /health never answered 200 (last: %s). "
                       % (health if health is not None else (self.http_state or {}).get("no_answer") or "no connection"))
        res["remedy"] = ("No progress for %ds (no new log line, no change of GPU memory): " % stalled) + res["remedy"]
        res["facts"]["stalled_s"] = round(stalled, 1)
        return res

    def unresponsive(self, res, now):
        """/health got no answer at all unresponsive_after times in a row while the process lives and the log shows the
        HTTP server up: the server is alive but answers nothing (stopped by SIGSTOP, or hung). ``res``: the diagnosis."""
        pid, since = self.main_pid, now - self.silent[0] + self.p["http_timeout"]
        state = proc_state(pid) if pid else None
        ev = ["GET %s/health: %s, %d times in a row over %.0fs; the process is alive and the log shows the HTTP server up"
              % (self.base, self.http_state["no_answer"], len(self.silent), since),
              "main process %s: State: %s (/proc/%s/status)" % (pid, state or "unknown", pid)]
        why = ("it is stopped (SIGSTOP or a debugger): kill -CONT %s resumes it" % pid if (state or "").startswith(("T", "t"))
               else "it hangs: py-spy dump --pid %s shows where" % pid)
        remedy = ("The server accepts connections but answers nothing; %s. Restart it (systemctl restart %s); the serve stage "
                  "restarts it itself when sglang_server_restart_unresponsive is true and this run did not change the unit."
                  % (why, self.p["unit"] or "the server"))
        facts = dict(res.get("facts") or {}, process_state=state, main_pid=pid, unresponsive_s=round(since, 1))
        return dict(res, phase="unresponsive", evidence=ev + res["evidence"], remedy=remedy, facts=facts)

    def model_config(self):
        """The model's config.json (the compatibility table's architecture and conditions), or None."""
        if not self.p.get("model_dir"):
            return None
        cfg = load_json(os.path.join(self.p["model_dir"], "config.json"))
        return cfg if isinstance(cfg, dict) else None

    def known_answer(self, res, probe=None):
        """``res`` (ready) when the probe matched its regex and every known-answer check passes, else the failure
        (wrong_answer, degenerate_output)."""
        checks = ka.DEFAULT_CHECKS if self.p.get("known_answer_checks") is None else self.p["known_answer_checks"]
        missed = probe is not None and probe.get("matches") is False
        if not checks and not missed:
            return res
        kwargs = self.p.get("chat_template_kwargs")

        def post(path, body):
            return http("POST", self.base + path, self.p["api_key"], body=body, timeout=self.p["probe_timeout"])

        result = ka.run_checks(post, checks, self.p["served_model_name"], ka.DEFAULT_CHAT_TEMPLATE_KWARGS if kwargs is None else kwargs)
        if missed:
            result["checks"].insert(0, ka.probe_check(self.p["probe_prompt"], self.p["expected_probe_regex"], probe.get("text")))
            result["passed"] = False
        self.last_known_answer = result
        if result["passed"]:
            res["evidence"].append("known-answer checks passed: %d in %.2fs" % (len(result["checks"]), result["elapsed_s"]))
            return res
        cfg = self.model_config()
        arch = ((cfg or {}).get("architectures") or [None])[0]
        bad = ka.failure(result, (res.get("facts") or {}).get("server_args"), self.p.get("sglang_version"), arch, cfg)
        return dict(res, phase=bad["phase"], evidence=bad["evidence"] + res["evidence"], remedy=bad["remedy"])

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
        while True:
            res = self.tick()
            if res is not None:
                return res
            self.wait_tick()

    def summary(self, res):
        """The module's result for the diagnosis ``res``."""
        facts = res.get("facts") or {}
        out = dict(changed=False, phase=res["phase"], evidence=res["evidence"], remedy=res["remedy"], facts=facts,
                   waited_s=round(time.time() - self.t0, 2), gpu_used_mib=self.gpu_used, exit_status=self.exit_status,
                   endpoint={"base_url": self.base, "served_model_name": self.p["served_model_name"]}, launch_id=self.p["launch_id"],
                   log_path=self.log_path, probe=self.last_probe, known_answer=self.last_known_answer, kv_tokens=facts.get("kv_tokens"),
                   nrestarts=self.nrestarts)
        if facts.get("former_phase"):   # 0.1.0's name of a renamed failure, for one release (failure.FORMER_PHASES)
            out["former_phase"] = facts["former_phase"]
        if res["phase"] == "ready":
            out["time_to_ready_s"] = facts.get("time_to_ready_s", out["waited_s"])
            out["compile_cache"] = toolchain.cache_report(self.p["compile_cache_dir"], self.p["compile_cache_files"])
        return out


def look_options(look):
    """sglang_service's look, checked before the converge changes anything: the keys a look may set (LOOK_KEYS; a null
    one is left out), else a ``bad_input`` Failure."""
    look = dict((k, v) for k, v in look.items() if v is not None)
    extra = sorted(set(look) - set(LOOK_KEYS))
    if extra:
        raise Failure("bad_input", "look: %s not allowed (the launch's own come from the converge); allowed: %s"
                      % (", ".join(extra), ", ".join(LOOK_KEYS)))
    return look


def look_once(module, look, unit, systemctl, converged, api_key=None):
    """One gate check, in the converge's own module run, of the server it did not restart (the idempotent re-run): the
    gate's code with a timeout of 1 s and the converge's launch (``converged``: its result: log, launch id, plan). A
    server that is ready and answers right is done; else the gate module waits for it. The gate's result (``phase``
    and the rest), never a failure of the converge: the gate that waits is the one that reports.

    ``look``: from look_options; checked with the gate's own spec (ArgumentSpecValidator, as AnsibleModule does)."""
    params = dict(look, unit=unit, systemctl=systemctl, log_path=converged.get("log_path"), launch_id=converged.get("launch_id"),
                  api_key=api_key, plan=converged.get("plan"), timeout=1)
    checked = ArgumentSpecValidator(GATE_SPEC, mutually_exclusive=GATE_MUTUALLY_EXCLUSIVE).validate(params)
    if checked.error_messages:
        raise Failure("bad_input", "look: %s" % "; ".join(checked.error_messages))
    gate = Gate(module, checked.validated_parameters)
    return gate.summary(gate.run())
