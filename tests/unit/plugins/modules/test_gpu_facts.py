# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os

import pytest
from ansible.module_utils import basic

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import nvml
from ansible_collections.kpro.gpu_serving.plugins.modules import gpu_facts
from ansible_collections.kpro.gpu_serving.tests.unit.plugins import fake_sysfs
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "nvidia-smi")
GPU0, AUD0, GPU1, AUD1, USB = "0000:17:00.0", "0000:17:00.1", "0000:73:00.0", "0000:73:00.1", "0000:03:00.0"


def read(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


@pytest.fixture
def roots(tmp_path):
    sysfs = fake_sysfs.build(tmp_path)
    proc = tmp_path / "proc"
    (proc / "driver" / "nvidia").mkdir(parents=True)
    (proc / "driver" / "nvidia" / "version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.126.09  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Thu Jan  8 03:51:30 UTC 2026\n")
    return {"sysfs_root": sysfs, "proc_root": str(proc)}


@pytest.fixture
def smi(monkeypatch):
    """No pynvml on the target (the lab node): nvidia-smi answers from the captured fixtures."""
    monkeypatch.setattr(nvml, "HAS_PYNVML", False)
    outputs = {"gpu": (0, read("query-gpu-idle.csv"), ""), "apps": (0, read("query-compute-apps-idle.csv"), "")}
    calls = []

    def run_command(self, args, **kwargs):
        calls.append(args)
        return outputs["gpu" if args[1].startswith("--query-gpu") else "apps"]

    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **kw: "/usr/bin/" + name)
    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    return outputs, calls


def run(args, check_mode=False):
    with pytest.raises(AnsibleExitJson) as e:
        run_module(gpu_facts, args, check_mode=check_mode)
    return e.value.result


def test_sysfs_only(roots):
    r = run(dict(roots, nvml=False))
    assert r["changed"] is False
    assert [(g["bdf"], g["selected_by"], g["driver"], g["iommu_group"]) for g in r["gpus"]] == [
        (GPU0, "id", "vfio-pci", 27), (AUD0, "slot", "vfio-pci", 27), (GPU1, "id", "vfio-pci", 75), (AUD1, "slot", "vfio-pci", 75)]
    assert r["gpus"][1]["iommu_group_members"] == [GPU0, AUD0]
    assert r["drivers"] == {GPU0: "vfio-pci", AUD0: "vfio-pci", GPU1: "vfio-pci", AUD1: "vfio-pci"}
    assert len(r["pci_devices"]) == len(fake_sysfs.KPRO5)
    assert r["nvml"]["available"] is False and r["nvml"]["reason"] == "disabled"
    assert r["nvml"]["kernel_module"]["version"] == "580.126.09"
    assert r["source"] == "none"
    facts = r["ansible_facts"]["kpro_gpus"]
    assert facts["gpus"] == r["gpus"] and facts["drivers"] == r["drivers"] and facts["source"] == "none"


def test_nvidia_smi_fallback_attaches_nvml_view(roots, smi):
    r = run(roots)
    assert r["source"] == "nvidia-smi" and r["nvml"]["available"] and r["nvml"]["driver_version"] == "580.126.09"
    by = dict((g["bdf"], g) for g in r["gpus"])
    assert by[GPU0]["nvml"]["index"] == 0 and by[GPU1]["nvml"]["index"] == 1
    assert by[GPU0]["nvml"]["memory_total_mib"] == 49140
    assert "nvml" not in by[AUD0]
    assert smi[1][0][0] == "/usr/bin/nvidia-smi"


def test_driver_not_loaded_is_a_state_not_a_failure(roots, smi):
    smi[0]["gpu"] = (9, read("driver-not-loaded.txt"), "")
    r = run(roots)
    assert r.get("failed") is not True
    assert r["nvml"]["reason"] == "driver_not_loaded" and "modprobe nvidia" in r["nvml"]["msg"]
    assert r["source"] == "nvidia-smi"
    assert all("nvml" not in g for g in r["gpus"])


def test_check_mode_same_answer(roots, smi):
    assert run(roots, check_mode=True)["gpus"] == run(roots)["gpus"]


def test_ids_select_other_devices(roots):
    r = run(dict(roots, nvml=False, vendor_device_ids=["0x1B21:0x1242"]))
    assert [g["bdf"] for g in r["gpus"]] == [USB]


def test_bad_ids_fail_with_a_message(roots):
    with pytest.raises(AnsibleFailJson) as e:
        run_module(gpu_facts, dict(roots, nvml=False, vendor_device_ids=["A6000"]))
    assert "vendor_device_ids" in e.value.result["msg"] and "10de:2230" in e.value.result["msg"]


def test_pynvml_preferred(roots, monkeypatch, smi):
    monkeypatch.setattr(nvml, "HAS_PYNVML", True)
    monkeypatch.setattr(nvml, "nvml_facts", lambda proc_root="/proc": {
        "available": True, "source": "pynvml", "driver_version": "580.126.09", "gpu_count": 1,
        "gpus": [{"index": 0, "bdf": GPU1, "name": "NVIDIA RTX A6000"}]})
    r = run(roots)
    assert r["source"] == "pynvml" and smi[1] == []
    assert [g["bdf"] for g in r["gpus"] if "nvml" in g] == [GPU1]


def test_phase_bad_input_for_ids_that_are_not_pci_ids(roots):
    with pytest.raises(AnsibleFailJson) as e:
        run_module(gpu_facts, dict(roots, nvml=False, vendor_device_ids=["A6000"]))
    r = e.value.result
    assert r["phase"] == "bad_input" and r["msg"].startswith("bad_input: vendor_device_ids") and r["remedy"]
