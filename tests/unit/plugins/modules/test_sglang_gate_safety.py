# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 12, finding 2: a fatal error in this launch's log ends the gate within seconds, even while a process lives;
the stand-in exits where 0.5.11 exits (an OverflowError from the port bind)."""
from __future__ import annotations

import subprocess
import time

import pytest

from ansible_collections.kpro.gpu_serving.plugins.modules import sglang_gate
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.serve_lab import (  # noqa: F401  pylint: disable=unused-import
    MODEL_NAME, alive, fakenvml, serve_lab)
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleFailJson, run_module

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/opt/sglang/venv/lib/python3.11/site-packages/sglang/srt/server_args.py", line 7282, in prepare_server_args\n'
    "    argv = config_merger.merge_config_with_args(argv)\n"
    "ValueError: Config file not found: /etc/kpro-gpu-serving/sglang-secrets.yaml\n")


def _gate(lab, pid, launch_id, **kw):
    args = {"pid": pid, "log_dir": str(lab.log_dir), "launch_id": launch_id, "base_url": "http://127.0.0.1:%d" % lab.port,
            "served_model_name": MODEL_NAME, "timeout": 60, "stall_timeout": 60, "poll_interval": 0.5, "fatal_grace": 2}
    args.update(kw)
    t0 = time.time()
    with pytest.raises(AnsibleFailJson) as e:
        run_module(sglang_gate, args)
    return e.value.result, time.time() - t0


def test_traceback_in_this_launch_ends_the_wait_while_a_process_lives(serve_lab):
    lab = serve_lab
    lab.log_dir.mkdir(parents=True, exist_ok=True)
    (lab.log_dir / "sglang-L1.log").write_text("# kpro-launch-id: L1\n" + TRACEBACK)
    sleeper = subprocess.Popen(["sleep", "120"])     # a process that outlives the failure (e.g. a child hanging on)
    try:
        res, took = _gate(lab, sleeper.pid, "L1")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert took < 15, took
    assert res["phase"] == "init_failed_before_gpu"
    assert any("Config file not found" in e for e in res["evidence"])
    assert any("still alive" in e for e in res["evidence"])


def test_standin_exits_on_a_port_bind_overflow_like_0_5_11(serve_lab):
    lab = serve_lab
    proc = lab.launch("L2", port=70000)
    try:
        proc.wait(timeout=60)
    finally:
        lab.record()
    assert proc.returncode == 1
    for _attempt in range(40):
        text = (lab.log_dir / "sglang-L2.log").read_text()
        if "OverflowError" in text:
            break
        time.sleep(0.1)
    assert "OverflowError: bind(): port must be 0-65535." in text
    res, took = _gate(lab, proc.pid, "L2")
    assert res["phase"] != "timeout" and took < 15
