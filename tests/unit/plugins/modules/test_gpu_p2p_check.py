# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_p2p_check: the check runs once per driver, kernel, GPUs and NCCL environment, check mode runs nothing, and a
failure is a phase with evidence and remedy. The venv's Python is this one with the lab's torch stand-in on PYTHONPATH
(from the server's environment), reading a temporary lab state of two GPUs."""

from __future__ import annotations

import json
import os
import sys
from unittest import mock

import pytest

from ansible_collections.kpro.gpu_serving.plugins.modules import gpu_p2p_check
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
STANDINS = os.pathsep.join(os.path.join(REPO, "tests", "lab", d) for d in ("torch_standin", "sglang_standin"))
FACTS = {"available": True, "driver_version": "580.126.09",
         "gpus": [{"uuid": "GPU-aaaa", "pci_bus_id": "00000000:41:00.0"}, {"uuid": "GPU-bbbb", "pci_bus_id": "00000000:61:00.0"}]}


@pytest.fixture
def host(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "var/lib/kpro-lab").mkdir(parents=True)
    gpus = [{"bdf": "0000:%02x:00.0" % b, "name": "NVIDIA RTX A6000", "uuid": "GPU-%d" % i, "mem_total_mib": 49140} for i, b in enumerate((0x41, 0x61))]
    (root / "var/lib/kpro-lab/state.json").write_text(json.dumps({"gpus": gpus}))
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "osrelease").write_text("6.8.12-9-pve\n")
    monkeypatch.setenv("KPRO_LAB_ROOT", str(root))
    monkeypatch.delenv("KPRO_LAB_SGLANG_DRILL", raising=False)
    venv = tmp_path / "venv"
    venv.mkdir()
    return {"venv": str(venv), "python": sys.executable, "state_dir": str(tmp_path / "state"), "proc_root": str(proc),
            "environment": {"PYTHONPATH": STANDINS}, "timeout": 5}


def _run(args, check_mode=False, fails=False):
    with mock.patch.object(gpu_p2p_check, "gpu_facts", lambda **kw: FACTS):
        with pytest.raises(AnsibleFailJson if fails else AnsibleExitJson) as e:
            run_module(gpu_p2p_check, args, check_mode=check_mode)
    return e.value.result


def test_check_mode_says_it_would_run_and_runs_nothing(host):
    r = _run(host, check_mode=True)
    assert r["changed"] and r["would_run"] and not r["ran"] and "check" not in r
    assert not os.path.exists(r["stamp"])
    assert r["key"]["kernel"] == "6.8.12-9-pve" and r["key"]["driver"] == "580.126.09" and len(r["key"]["gpus"]) == 2


def test_a_pass_is_stamped_and_the_rerun_runs_nothing(host):
    r = _run(host)
    assert r["changed"] and r["ran"] and r["check"]["device_count"] == 2 and "passed" in r["msg"]
    assert json.load(open(r["stamp"]))["key"] == r["key"]
    again = _run(host)
    assert not again["changed"] and not again["ran"] and not again["would_run"] and "not run" in again["msg"]
    assert not _run(host, check_mode=True)["changed"]
    # another NCCL environment, or force: it runs again
    other = _run(dict(host, environment=dict(host["environment"], NCCL_P2P_DISABLE="1")))
    assert other["ran"] and other["check"]["copy_path"] == "host" and other["key"]["environment"] == {"NCCL_P2P_DISABLE": "1"}
    assert _run(dict(host, force=True))["ran"]


def test_failures_name_their_phase_and_stamp_nothing(host, monkeypatch):
    monkeypatch.setenv("KPRO_LAB_SGLANG_DRILL", "p2p_wrong_sum")
    r = _run(host, fails=True)
    assert r["phase"] == "gpu_p2p_wrong_result" and r["msg"].startswith("gpu_p2p_wrong_result: the two-GPU check got wrong data")
    assert "Remedy: NCCL_P2P_DISABLE" in r["msg"] and r["ran"] and not r["changed"] and r["check"]["copies"]["0->1"]["wrong"]
    assert any(e.startswith("environment: ") and "PYTHONPATH" in e for e in r["evidence"])
    assert not os.path.exists(r["stamp"])
    monkeypatch.setenv("KPRO_LAB_SGLANG_DRILL", "p2p_hang")
    r = _run(dict(host, timeout=2), fails=True)
    assert r["phase"] == "gpu_p2p_hang" and "within 2 s" in r["msg"] and not os.path.exists(r["stamp"])
    # the remedy in the server's environment cures both
    monkeypatch.setenv("KPRO_LAB_SGLANG_DRILL", "p2p_hang p2p_wrong_sum")
    assert _run(dict(host, environment=dict(host["environment"], NCCL_P2P_DISABLE="1")))["ran"]


def test_one_gpu_visible_is_no_check_and_no_stamp(host):
    r = _run(dict(host, environment=dict(host["environment"], CUDA_VISIBLE_DEVICES="1")))
    assert r["ran"] and not r["changed"] and r["check"]["device_count"] == 1 and not os.path.exists(r["stamp"])
