# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One verify run on its target: gather (verify_gather), decide (verify, verify_state), and the result as data, JSON and a
Prometheus textfile. Reads only; the module writes the two result files.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import nvml
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import read_text
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import deployment as dp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import known_answer as ka
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import metrics_textfile as mt
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_ready as sready
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import verify as v
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import verify_gather as g
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import verify_state as vs

LATENCY_PROMPT = {"prompt": "The capital city of France is", "max_tokens": 8, "temperature": 0}


def gpu_findings(p, run_command, props):
    """The driver, memory and health checks (those in ``p["checks"]``), and what NVML showed (its source or why not, and
    every process on a GPU with whether it is the unit's); the unit's PIDs are its cgroup's."""
    wants_nvml = set(p["checks"]) & {"driver", "memory"}
    facts = nvml.gpu_facts(run_command=run_command, smi_path=p.get("nvidia_smi")) if wants_nvml else {}
    kmod = (facts.get("kernel_module") or {}).get("version")
    out, seen = [], {"nvml": facts.get("source") if facts.get("available") else facts.get("reason")}
    if "driver" in p["checks"]:
        out += v.driver(kmod, g.userspace_version(), facts.get("reason"), p["driver_version"])
    if "memory" in p["checks"]:
        ours = su.unit_pids(props)[0] if props else []
        seen["gpu_processes"] = su.gpu_holders(facts, ours)
        out += v.memory(seen["gpu_processes"], ours, su.used_mib(facts), None if facts.get("available") else facts.get("msg"))
    if "health" in p["checks"]:
        gpus = g.nvml_health() if nvml.pynvml is not None else g.smi_health(run_command, p.get("nvidia_smi"))
        out += v.health(gpus, g.kernel_log(p["kernel_log"], run_command, p["journalctl"]), p["max_temp_c"])
    return out, seen


def serve_findings(p, good):
    """The deployment, model and live checks against the record's deployment that passed the gate (``good``)."""
    service = (good or {}).get("service") or {}
    out = []
    if "deployment" in p["checks"]:
        launched, fingerprint = g.unit_state(p["unit"], p["state_dir"])
        out += vs.deployment(good, dp.venv_identity(service.get("venv") or ""), launched, fingerprint)
    if "model" in p["checks"] and good:
        out += vs.model(*g.model_files(service.get("model_dir"), good.get("model_revision"), p["verify_hashes"]))
    live = {}
    if "live" in p["checks"] and good:
        live = ask(p, service)
        out += vs.live(live["health"], live["answers"], live["latency_s"], p["max_latency_s"], service.get("options"))
    return out, live


def ask(p, service):
    """GET /health, the known-answer checks, and one short completion's time, with the key of the server's --config file."""
    key = p["api_key"]
    model = p["served_model_name"] or (service.get("options") or {}).get("served_model_name") or ""

    def post(path, body):
        return sready.http("POST", p["base_url"] + path, key, body, p["http_timeout"])

    health = sready.http("GET", p["base_url"] + "/health", key, None, p["http_timeout"])[0]
    if health != 200:
        return {"health": health, "answers": None, "latency_s": None}
    checks = ka.DEFAULT_CHECKS if p["known_answer_checks"] is None else p["known_answer_checks"]
    kwargs = ka.DEFAULT_CHAT_TEMPLATE_KWARGS if p["chat_template_kwargs"] is None else p["chat_template_kwargs"]
    answers = ka.run_checks(post, checks, model, kwargs)
    (status, _resp), took = g.timed(post, "/v1/completions", dict(LATENCY_PROMPT, model=model))
    return {"health": health, "answers": answers, "latency_s": round(took, 3) if status == 200 else None}


def api_key(p):
    """The server's API key from its --config file (the option's, else sglang_service's default path); "" when none."""
    path = p["api_key_file"] or os.path.join(su.ENV_FILE_DIR, "%s-secrets.yaml" % su.unit_stem(p["unit"]))
    return su.api_key_from_config(read_text(path) or "") or ""


def run(p, run_command, props, upgrade=()):
    """The result: findings in check order (``upgrade``: verify_upgrade's), ok, and the JSON and textfile texts."""
    good = dp.load(dp.record_path(p["state_dir"], p["unit"])).get("good") if set(p["checks"]) & set(v.SERVE_CHECKS) else None
    findings, seen = gpu_findings(p, run_command, props)
    more, live = serve_findings(p, good)
    findings = sorted(findings + list(upgrade) + more, key=lambda f: v.CHECKS.index(f["check"]))
    now = time.time()
    answers = live.get("answers")
    gauges = {"verify_ok": v.ok(findings), "verify_timestamp_seconds": round(now, 3), "verify_findings": len(findings),
              "known_answer_ok": answers["passed"] if answers else None, "request_latency_seconds": live.get("latency_s")}
    result = {"ok": v.ok(findings), "findings": findings, "checks": list(p["checks"]), "timestamp": now, "host": p["host"],
              "known_answer_ok": gauges["known_answer_ok"], "request_latency_s": live.get("latency_s")}
    result.update(seen)
    return result, json.dumps(result, indent=1, sort_keys=True) + "\n", mt.render(p["host"], findings, gauges)


def failure(result):
    """The Failure of a run with error findings: the first error's phase, every finding in the evidence."""
    first = v.first_error(result["findings"])
    ev = ["%s (%s, %s): %s" % (f["check"], f["phase"], f["severity"], "; ".join(f["evidence"])) for f in result["findings"]]
    return Failure(first["phase"], "verify found %d finding(s), the first error in check %s" % (len(result["findings"]), first["check"]),
                   remedy=first["remedy"], evidence=ev, findings=result["findings"])
