# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sglang_gate and sglang_service against the REAL SGLang stand-in, the fake libnvidia-ml and the lab's systemctl.

The stand-in runs at KPRO_LAB_SGLANG_SPEED=20 on 127.0.0.1; see serve_lab.py for the lab.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from ansible_collections.kpro.gpu_serving.plugins.modules import sglang_gate, sglang_service
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.serve_lab import (  # noqa: F401  pylint: disable=unused-import
    BASELINE, MODEL_NAME, alive, fakenvml, serve_lab)
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

OLD_ERROR = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.99"


def gate(lab, launch_id, expect_ok, **kw):
    args = {"pid": lab.proc.pid, "log_dir": str(lab.log_dir), "launch_id": launch_id, "base_url": "http://127.0.0.1:%d" % lab.port,
            "served_model_name": MODEL_NAME, "timeout": 60, "stall_timeout": 30, "poll_interval": 0.5, "planned_weights_mib": 26417,
            "gpu_baseline_mib": [BASELINE, BASELINE]}
    args.update(kw)
    exc = AnsibleExitJson if expect_ok else AnsibleFailJson
    with pytest.raises(exc) as e:
        run_module(sglang_gate, args)
    lab.record()
    return e.value.result


def old_launch(lab):
    """An older launch's log with an error the gate must never quote."""
    (lab.log_dir / "sglang-old0001.log").write_text(
        "# kpro-launch-id: old0001\n[2026-03-01 09:41:17 TP0] Load weight end. elapsed=70.85 s, avail mem=20.70 GB, mem usage=26.50 GB.\n"
        "[2026-03-01 09:41:18 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/opt/sglang/venv/lib/python3.11/site-packages/sglang/srt/model_executor/model_runner.py", line 1, in init_memory_pool\n'
        "    raise RuntimeError(\n" + OLD_ERROR + "\n")


def assert_this_launch_only(res, launch_id):
    text = "\n".join(res["evidence"]) + res["remedy"]
    assert "0.99" not in text and "old0001" not in text
    assert res["launch_id"] == launch_id and res["log_path"].endswith("sglang-%s.log" % launch_id)


def test_good_configuration_is_ready_with_the_summary(serve_lab):
    old_launch(serve_lab)
    serve_lab.launch("good0001", api_key="s3cret-key")
    res = gate(serve_lab, "good0001", True, api_key="s3cret-key")
    assert res["phase"] == "ready" and res["changed"] is False and res["remedy"] == ""
    assert res["kv_tokens"] and res["kv_tokens"] > 65536
    assert len(res["gpu_used_mib"]) == 2 and all(u > 26417 for u in res["gpu_used_mib"])
    assert res["probe"]["tokens_per_s"] > 0 and "Paris" in res["probe"]["text"] and res["probe"]["degenerate"] is False
    assert res["time_to_ready_s"] is not None
    assert_this_launch_only(res, "good0001")
    # the per-launch log: header first, the symlink points at it, the older log is still there
    log = serve_lab.log_dir / "sglang-good0001.log"
    assert log.read_text().splitlines()[0] == "# kpro-launch-id: good0001"
    assert os.readlink(str(serve_lab.log_dir / "sglang.log")) == "sglang-good0001.log"
    # the key is not in the log the server writes (server_args would show it if on the command line... it is, as SGLang has no env var)
    assert (serve_lab.log_dir / "sglang-old0001.log").exists()


DRILLS = [
    ("kv_cache_oom", "kv_cache_oom", "--mem-fraction-static"),
    ("weights_oom", "weights_oom", "--tp-size"),
    ("init_failed_before_gpu", "init_failed_before_gpu", "before it touched the GPUs"),
    ("nccl_error", "nccl_error", "NCCL"),
    ("cuda_graph_failed", "cuda_graph_failed", "--cuda-graph-max-bs"),
    ("port_in_use", "port_in_use", "port"),
    ("warmup_failed", "warmup_failed", "warmup"),
    ("degenerate_output", "degenerate_output", "degenerate"),
]


@pytest.mark.parametrize("drill,phase,remedy_word", DRILLS, ids=[d[0] for d in DRILLS])
def test_drill_fails_with_the_matching_phase(serve_lab, drill, phase, remedy_word):
    old_launch(serve_lab)
    lid = "drill-%s" % drill.replace("_", "")
    serve_lab.launch(lid, drill=drill)
    t0 = time.time()
    res = gate(serve_lab, lid, False)
    assert res["phase"] == phase, (res["phase"], res["evidence"], res["remedy"])
    assert res["failed"] is True and res["changed"] is False
    assert remedy_word.lower() in res["remedy"].lower(), res["remedy"]
    assert res["evidence"] and res["msg"].startswith(phase)
    assert_this_launch_only(res, lid)
    assert time.time() - t0 < 30
    if phase == "init_failed_before_gpu":
        assert any("every GPU at baseline" in e for e in res["evidence"]), res["evidence"]
        assert all(u <= 400 for u in res["gpu_used_mib"])


def test_hang_is_a_timeout(serve_lab):
    serve_lab.launch("hang0001", drill="hang")
    res = gate(serve_lab, "hang0001", False, stall_timeout=2, timeout=20)
    assert res["phase"] == "timeout"
    assert "No progress" in res["remedy"] and res["facts"]["stalled_s"] >= 2
    assert alive(serve_lab.proc.pid)          # the gate observes; it never kills


def test_no_log_for_this_launch_is_not_started(serve_lab, tmp_path):
    proc = subprocess.Popen(["sleep", "0.2"])
    serve_lab.started.append(proc.pid)
    serve_lab.proc = proc
    old_launch(serve_lab)
    proc.wait()
    res = gate(serve_lab, "never", False)
    assert res["phase"] == "not_started"


# ---- sglang_service + gate through the lab's systemctl (the production path) ---------------

def service_args(lab, **kw):
    args = {"unit": "sglang.service", "venv": "/nonexistent", "python": __import__("sys").executable, "options": lab.options(),
            "api_key": "s3cret-key", "environment": lab.server_env(), "model_dir": str(lab.model), "log_dir": str(lab.log_dir),
            "launcher": str(lab.launcher), "root": str(lab.root), "secret_file": str(lab.root / "etc/kpro-gpu-serving/sglang-secrets.yaml"),
            "systemctl": lab.systemctl, "cgroup_root": str(lab.root / "sys/fs/cgroup"), "release_timeout": 15}
    args.update(kw)
    return args


def service(lab, expect_ok=True, check_mode=False, **kw):
    exc = AnsibleExitJson if expect_ok else AnsibleFailJson
    with pytest.raises(exc) as e:
        run_module(sglang_service, service_args(lab, **kw), check_mode=check_mode)
    return e.value.result


def unit_gate(lab, res, expect_ok=True):
    args = {"unit": "sglang.service", "systemctl": lab.systemctl, "log_path": res["log_path"], "launch_id": res["launch_id"],
            "base_url": "http://127.0.0.1:%d" % lab.port, "served_model_name": MODEL_NAME, "api_key": "s3cret-key",
            "plan": res["plan"], "gpu_baseline_mib": res["gpu_used_mib"], "timeout": 60, "poll_interval": 0.5}
    with pytest.raises(AnsibleExitJson if expect_ok else AnsibleFailJson) as e:
        run_module(sglang_gate, args)
    return e.value.result


def main_pid(lab):
    r = subprocess.run([lab.systemctl, "show", "-p", "MainPID", "--value", "sglang.service"], capture_output=True, text=True,
                       env=dict(os.environ), check=False)
    return int(r.stdout.strip() or 0)


def reaper(lab, stop):
    """The driver frees a dead process's memory at once; the stand-in only when one of its processes next writes the
    state. Stand in for the driver: reap dead stand-in PIDs from the lab state while the test runs."""
    env = dict(os.environ, **lab.server_env())
    while not stop.is_set():
        subprocess.run([__import__("sys").executable, "-m", "sglang.srt._kpro_lab.gpustate", "reap"], env=env, check=False,
                       capture_output=True)
        stop.wait(0.3)


def test_service_launch_gate_rerun_and_stop(serve_lab):
    lab = serve_lab
    stop = threading.Event()
    threading.Thread(target=reaper, args=(lab, stop), daemon=True).start()
    try:
        res = service(lab, check_mode=True)
        assert res["changed"] is True and res["restarted"] is True and not os.path.exists(res["unit_path"])
        res = service(lab)
        assert res["changed"] is True and res["restarted"] is True and res["plan"]["fits"] is True
        unit = open(res["unit_path"]).read()
        assert "s3cret-key" not in unit and "s3cret-key" not in res["exec_start"] and "--api-key" not in unit
        assert "--config %s" % (lab.root / "etc/kpro-gpu-serving/sglang-secrets.yaml") in unit
        assert "KillMode=control-group" in unit and "Restart=on-failure" in unit
        secrets = lab.root / "etc/kpro-gpu-serving/sglang-secrets.yaml"
        assert oct(secrets.stat().st_mode & 0o777) == "0o600" and "s3cret-key" in secrets.read_text()
        assert "s3cret-key" not in (lab.root / "etc/kpro-gpu-serving/sglang.env").read_text()
        assert res["log_path"].endswith("sglang-%s.log" % res["launch_id"])
        pid1 = main_pid(lab)
        lab.started.append(pid1)
        g = unit_gate(lab, res)
        lab.record()
        assert g["phase"] == "ready" and g["kv_tokens"] > 0 and g["probe"]["tokens_per_s"] > 0
        # re-run: nothing changed, no restart, the same process; the gate passes again on the same launch
        res2 = service(lab)
        assert res2["changed"] is False and res2["restarted"] is False and res2["launch_id"] == res["launch_id"]
        assert main_pid(lab) == pid1
        assert unit_gate(lab, res2)["phase"] == "ready"
        # an option change restarts it, after the old tree's memory is released
        res3 = service(lab, options=lab.options(max_running_requests=8))
        assert res3["restarted"] is True and res3["launch_id"] != res["launch_id"]
        assert set(res3["ended_pids"]) >= {pid1} and res3["released_after_s"] is not None
        assert all(u <= 400 for u in res3["gpu_used_mib"])
        lab.started.append(main_pid(lab))
        lab.record()
        # stopped: waits on NVML until released
        res4 = service(lab, state="stopped")
        assert res4["changed"] is True and all(u <= 400 for u in res4["gpu_used_mib"])
    finally:
        stop.set()
        lab.record()
        subprocess.run([lab.systemctl, "stop", "sglang.service"], env=dict(os.environ), check=False, capture_output=True)


def test_service_refuses_the_seed_nextn_plan_with_numbers(serve_lab):
    opts = serve_lab.options(max_running_requests=None, speculative_algorithm="NEXTN", speculative_num_steps=3,
                             speculative_eagle_topk=1, speculative_num_draft_tokens=4, disable_radix_cache=True)
    res = service(serve_lab, expect_ok=False, options=opts)
    assert res["phase"] == "kv_cache_oom"
    assert "--max-running-requests" in res["remedy"] and "MiB" in res["evidence"][0]
    assert res["plan"]["fits"] is False and res["plan"]["per_gpu"]["kv_tokens"] < 65536
    assert not os.path.exists(res["unit_path"])       # refused before anything was written or launched


def test_service_reports_a_foreign_gpu_holder_and_never_kills_it(serve_lab):
    lab = serve_lab
    foreign = subprocess.Popen(["sleep", "300"])
    lab.started.append(foreign.pid)
    with lab.labstate.modify(str(lab.root)) as st:
        st["gpus"][1]["processes"].append({"pid": foreign.pid, "name": "sleep", "used_mib": 22810})
        st["gpus"][1]["mem_used_mib"] += 22810
    res = service(lab, expect_ok=False)
    assert res["phase"] == "gpu_memory_held"
    assert any("PID %d sleep holds 22810 MiB on GPU 1" % foreign.pid in e for e in res["evidence"]), res["evidence"]
    assert "never" in res["remedy"]
    assert [h for h in res["gpu_processes"] if h["pid"] == foreign.pid][0]["ours"] is False
    time.sleep(0.2)
    assert alive(foreign.pid)
    assert not os.path.exists(res["unit_path"])
