# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve stage's decisions (sglang_restart): restart or not, refused settings, GPU holders, plan refusals."""
from __future__ import annotations

import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_restart as sr
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_plan import plan

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "qwen3.6-27b")
OPTS = {"model_path": "/srv/models/Qwen3.6-27B", "tp_size": 2, "context_length": 65536, "mem_fraction_static": 0.85, "port": 30000}


def never_busy(_port):
    return False


def test_restart_reasons():
    running = {"ActiveState": "active"}
    assert sr.restart_reasons(running, "fp", "fp") == []
    assert sr.restart_reasons(running, "fp", "fp", force=True) == ["force_restart"]
    assert sr.restart_reasons(running, "old", "new") == [
        "the rendered unit, environment file or launcher differ from those the running server was started with"]
    assert sr.restart_reasons(running, None, "new")      # no state file: started by someone else
    assert sr.restart_reasons({"ActiveState": "failed"}, "fp", "fp") == ["the server is not running (failed)"]
    assert sr.restart_reasons({}, "fp", "fp") == ["the server is not running (unknown)"]
    assert sr.restart_reasons({"ActiveState": "activating"}, "fp", "fp") == []


def test_launch_baseline():
    assert sr.launch_baseline([], [], [300, 310], [1, 1], 1024) == [300, 310]          # nothing runs: measured
    assert sr.launch_baseline([{"pid": 5}], [5], [30000, 30000], [300, 310], 1024) == [300, 310]   # ours runs: stored
    assert sr.launch_baseline([{"pid": 5}], [5], [30000, 30000], None, 1024) is None
    # no process listed, but a GPU above idle: a server that just died, its memory not yet freed (the two-node lab's
    # rank 0 ended by its peer's stop): not a baseline; the stored one, else unknown
    assert sr.launch_baseline([], [], [45110, 45110], [300, 310], 1024) == [300, 310]
    assert sr.launch_baseline([], [], [300, 45110], None, 1024) is None
    assert sr.launch_baseline([], [], None, None, 1024) is None                          # NVML not available


def test_probe_regex_and_options_refusals():
    assert sr.probe_regex_refusal(None) is None and sr.probe_regex_refusal("(?i)paris") is None
    f = sr.probe_regex_refusal("(?i)par(is")
    assert isinstance(f, Failure) and f.phase == "not_started" and "sglang_server_probe.regex" in f.msg
    assert sr.options_refusal(OPTS, "key") is None
    assert "options.api_key" in sr.options_refusal(dict(OPTS, api_key="k"), None).msg
    assert "options.config" in sr.options_refusal(dict(OPTS, config="/x.yaml"), "key").msg
    assert sr.options_refusal(dict(OPTS, config="/x.yaml"), None) is None


def test_setting_problems_all_together_and_the_port_phase():
    flags = ["--model-path", "--tp-size", "--context-length", "--mem-fraction-static", "--port"]
    assert sr.setting_problems(OPTS, flags, 2, never_busy) == ([], "not_started")
    assert sr.settings_refusal([], "not_started") is None
    problems, phase = sr.setting_problems(dict(OPTS, mem_fraction_statc=0.8, tp_size=4), flags, 2, never_busy)
    assert phase == "not_started" and len(problems) == 2
    assert "did you mean mem_fraction_static?" in problems[0] and "needs 4 GPUs" in problems[1]
    problems, phase = sr.setting_problems(OPTS, flags, 2, lambda port: port == 30000)
    assert phase == "port_in_use" and "port 30000 is taken" in problems[0]
    problems, phase = sr.setting_problems(dict(OPTS, tp_size=4), flags, 2, lambda port: True)
    assert phase == "not_started" and len(problems) == 2
    # an out-of-range port is not looked up
    problems, _phase = sr.setting_problems(dict(OPTS, port=70000), None, 2, lambda port: 1 / 0)
    assert problems == ["option port=70000 is out of range; give a TCP port from 1 to 65535, e.g. 30000"]
    f = sr.settings_refusal(*sr.setting_problems(OPTS, flags, 2, lambda port: True))
    assert f.phase == "port_in_use" and f.evidence and "left serving" in f.remedy
    # the container's own checks (sglang_prestop) are reported with the others; with one, a taken port is not the phase
    problems, phase = sr.setting_problems(OPTS, flags, 2, lambda port: True, ["model_dir /x: no such directory"])
    assert phase == "not_started" and problems[0] == "model_dir /x: no such directory" and "port 30000 is taken" in problems[1]


def test_holders_and_the_held_refusal():
    holders = [{"gpu": 0, "pid": 10, "name": "python3", "used_mib": 22810, "ours": False, "visible": True},
               {"gpu": 1, "pid": 11, "name": "sglang", "used_mib": 20000, "ours": True, "visible": True},
               {"gpu": 1, "pid": 12, "name": "?", "used_mib": None, "ours": False, "visible": False}]
    assert [h["pid"] for h in sr.foreign_holders(holders)] == [10]
    assert sr.foreign_holders(holders, ours={10}) == []
    f = sr.held_refusal(holders[:1] + holders[2:], [23000, 400], "a process that is not this unit's holds GPU memory", ended={12})
    assert f.phase == "gpu_memory_held" and "never ends a process" in f.remedy and "PID 10 python3" in f.remedy
    assert f.evidence[0] == "PID 10 python3 holds 22810 MiB on GPU 0"
    assert "ended; the driver still lists its memory" in f.evidence[1] and "holds ? MiB" in f.evidence[1]
    assert f.evidence[-1] == "GPU memory used (MiB): 23000, 400"
    assert sr.busy_gpus([{"index": 0, "memory_used_mib": 2000}, {"index": 1, "memory_used_mib": 300}], 1024) == [(0, 2000)]
    f = sr.unreleased_refusal([(0, 2000)], 15)
    assert f.phase == "gpu_memory_held" and "within 15s" in f.msg and f.evidence == ["GPU 0: 2000 MiB used with no process NVML reports"]


def test_plan_refusal_names_the_phase_and_the_numbers():
    cfg, idx = os.path.join(FIX, "config.json"), os.path.join(FIX, "model.safetensors.index.json")
    fits = plan(cfg, idx, {"tp": 2, "context_length": 65536, "mem_fraction_static": 0.85, "max_running_requests": 16},
                gpu_total_mib=[49140, 49140])
    assert fits["fits"] and sr.plan_refusal(fits) is None and sr.plan_refusal(None) is None
    assert sr.stored_plan(fits) == {"fits": True, "per_gpu": fits["per_gpu"], "reason": fits["reason"]}
    # with the radix cache off (0.5.10+ refuses NEXTN on this hybrid model otherwise: init_failed_before_gpu, below)
    seed = plan(cfg, idx, {"tp": 2, "context_length": 65536, "mem_fraction_static": 0.85, "speculative_algorithm": "NEXTN",
                           "disable_radix_cache": True}, gpu_total_mib=[49140, 49140])
    f = sr.plan_refusal(seed)
    assert f.phase == "kv_cache_oom" and f.remedy == seed["remedy"] and "context_length 65536" in f.evidence[1]
    radix = sr.plan_refusal(plan(cfg, idx, {"tp": 2, "context_length": 65536, "speculative_algorithm": "NEXTN"},
                                 gpu_total_mib=[49140, 49140]))
    assert radix.phase == "init_failed_before_gpu" and "--disable-radix-cache" in radix.remedy
    weights = plan(cfg, idx, {"tp": 1, "context_length": 65536}, gpu_total_mib=[24000])
    assert sr.plan_refusal(weights).phase == "weights_oom"
