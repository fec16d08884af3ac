# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import shutil

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_log
from ansible_collections.kpro.gpu_serving.plugins.modules import sglang_diagnose
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "sglang_logs")


def run(args, check_mode=False):
    with pytest.raises(AnsibleExitJson) as e:
        run_module(sglang_diagnose, args, check_mode=check_mode)
    return e.value.result


def test_init_failed_before_gpu_ad_hoc_style_args(tmp_path):
    log = tmp_path / "sglang-serve.log"
    shutil.copy(os.path.join(FIX, "synthetic_init_failed_before_gpu.log"), str(log))
    before = log.read_bytes()
    res = run({"log_path": str(log), "gpu_used_mib": "[0,0]", "exit_status": 137})
    assert res["changed"] is False and res["log_found"] is True
    assert res["phase"] == "init_failed_before_gpu"
    assert res["facts"]["exception"].startswith("OSError")
    assert "GPU memory used (MiB): 0, 0 (every GPU at baseline)" in res["evidence"]
    assert log.read_bytes() == before


def test_launch_id_selects_the_launch_and_check_mode(tmp_path):
    log = tmp_path / "x.log"
    shutil.copy(os.path.join(FIX, "synthetic_two_launches.log"), str(log))
    res = run({"log_path": str(log), "launch_id": "20260301T094000-seed", "gpu_used_mib": [0, 0], "exit_status": 137},
              check_mode=True)
    assert res["phase"] == "kv_cache_oom" and res["changed"] is False
    res = run({"log_path": str(log), "launch_id": "20260301T100500-e5f6", "process_alive": True, "gpu_used_mib": "20000, 20000"})
    assert res["phase"] == "loading" and res["facts"]["gpu_used_mib"] == [20000.0, 20000.0]
    res = run({"log_path": str(log), "launch_id": "another"})
    assert res["phase"] == "not_started" and res["log_found"] is False


def test_missing_log_is_not_started(tmp_path):
    res = run({"log_path": str(tmp_path / "nope.log")})
    assert res["phase"] == "not_started" and res["log_found"] is False and res["changed"] is False


def test_ready_with_planned_weights(tmp_path):
    log = os.path.join(FIX, "synthetic_ready_tp2_nextn.log")
    res = run({"log_path": log, "process_alive": True, "gpu_used_mib": [45000, 45100], "planned_weights_mib": 26512})
    assert res["phase"] == "ready" and res["facts"]["kv_tokens"] == 398784 and res["remedy"] == ""


def test_bad_gpu_list_fails(tmp_path):
    with pytest.raises(AnsibleFailJson) as e:
        run_module(sglang_diagnose, {"log_path": str(tmp_path / "x"), "gpu_used_mib": "[a,b]"})
    res = e.value.result
    assert res["phase"] == "bad_input" and res["msg"].startswith("bad_input: gpu_used_mib: ")
    assert res["known_failure"]["msg"].startswith("gpu_used_mib: ") and "[0, 0]" in res["remedy"]


def test_an_unreadable_log_is_bad_input(tmp_path):
    with pytest.raises(AnsibleFailJson) as e:
        run_module(sglang_diagnose, {"log_path": str(tmp_path)})     # a directory: exists, cannot be read as a file
    assert e.value.result["phase"] == "bad_input" and "cannot read the server log" in e.value.result["msg"]


@pytest.mark.parametrize("value,expected", [(None, None), ([1, "2"], [1.0, 2.0]), ("[0,0]", [0.0, 0.0]), ("0 5", [0.0, 5.0]),
                                            (7, [7.0]), ("[]", [])])
def test_mib_list(value, expected):
    assert sglang_log.mib_list(value) == expected


def test_a_published_log_alone_is_diagnosed():
    # no exit status, no process state, no GPU numbers: what a careful operator reads from the log
    res = run({"log_path": os.path.join(FIX, "host_oom_killed_gpustack_3848.log")})
    assert res["phase"] == "host_oom_killed" and res["facts"]["scheduler_exit_code"] == -9
    assert res["former_phase"] == res["facts"]["former_phase"] == "weights_oom"
    assert "dmesg -T | grep -i oom" in res["remedy"]
    res = run({"log_path": os.path.join(FIX, "not_started_sglang_12818.log")})
    assert res["phase"] == "not_started" and res["facts"]["failure"] == "argparse"
    res = run({"log_path": os.path.join(FIX, "weights_load_failed_sglang_9747.log")})
    assert res["phase"] == "weights_load_failed" and res["facts"]["failure"] == "weights_load_failed"
    assert res["former_phase"] == "init_failed_before_gpu"
