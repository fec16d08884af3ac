# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
from types import SimpleNamespace

import pynvml
import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import nvml

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "nvidia-smi")
MIB = 1024 * 1024

OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.126.09  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Thu Jan  8 03:51:30 UTC 2026\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n")
PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.126.09  Thu Jan  8 03:26:22 UTC 2026\n"
               "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n")


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


@pytest.fixture
def proc(tmp_path):
    """A procfs with the driver's version file and the two TP schedulers of an SGLang server."""
    root = tmp_path / "proc"
    (root / "driver" / "nvidia").mkdir(parents=True)
    (root / "driver" / "nvidia" / "version").write_text(OPEN)
    for pid, title in ((41873, "sglang::scheduler_TP0"), (41874, "sglang::scheduler_TP1")):
        (root / str(pid)).mkdir()
        (root / str(pid) / "comm").write_text(title[:15] + "\n")
        (root / str(pid) / "cmdline").write_bytes(title.encode() + b"\0")
    return str(root)


# ------------------------------------------------------------------ /proc/driver/nvidia/version


def test_parse_proc_open_and_proprietary():
    o = nvml.parse_proc_driver_version(OPEN)
    assert (o["version"], o["type"], o["arch"]) == ("580.126.09", "open", "x86_64")
    assert o["gcc_version"].startswith("gcc version 12.2.0")
    p = nvml.parse_proc_driver_version(PROPRIETARY)
    assert (p["version"], p["type"], p["arch"]) == ("580.126.09", "proprietary", "x86_64")


@pytest.mark.parametrize("banner,version,kind", [
    ("NVRM version: NVIDIA UNIX Open Kernel Module  570.86.15  Release Build  (dvs-builder@U16)", "570.86.15", "open"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  Release Build", "580.65.06", "open"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023", "535.104.05", "proprietary"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  177.80  Wed Oct  1 14:43:46 PDT 2008", "177.80", "proprietary"),
])
def test_parse_proc_variants(banner, version, kind):
    v = nvml.parse_proc_driver_version(banner + "\n")
    assert v["version"] == version and v["type"] == kind


def test_parse_proc_garbage_and_missing(tmp_path):
    assert nvml.parse_proc_driver_version("") is None
    assert nvml.parse_proc_driver_version("hello\n") is None
    assert nvml.read_proc_driver_version(str(tmp_path)) is None


def test_read_proc(proc):
    assert nvml.read_proc_driver_version(proc)["version"] == "580.126.09"


def test_helpers():
    assert nvml.normalize_bus_id("00000000:17:00.0") == "0000:17:00.0"
    assert nvml.normalize_bus_id(b"00000000:73:00.0") == "0000:73:00.0"
    assert nvml.normalize_bus_id("[N/A]") is None
    assert nvml.cuda_version_string(13000) == "13.0"
    assert nvml.cuda_version_string(12080) == "12.8"
    assert nvml.cuda_version_string(None) is None


# ------------------------------------------------------------------ pynvml


class FakeNvml(object):
    """Two A6000s as NVML 580.126.09 reports them; installed over pynvml's functions."""

    def __init__(self, used=(4, 4), procs=None):
        self.gpus = [
            ("NVIDIA RTX A6000", "GPU-8d0c4d6e-5b2a-7f1e-3c9a-4e6b1d2f0a11", "00000000:17:00.0"),
            ("NVIDIA RTX A6000", "GPU-2f9e7a13-c4d8-61b0-95e2-7a3c8d0b4f66", "00000000:73:00.0"),
        ]
        self.used = used
        self.procs = procs or {0: [], 1: []}
        self.shutdown = 0

    def install(self, monkeypatch):
        m = monkeypatch.setattr
        m(pynvml, "nvmlInit", lambda: None)
        m(pynvml, "nvmlShutdown", self._shutdown)
        m(pynvml, "nvmlSystemGetDriverVersion", lambda: "580.126.09")
        m(pynvml, "nvmlSystemGetNVMLVersion", lambda: "13.580.126.09")
        m(pynvml, "nvmlSystemGetCudaDriverVersion", lambda: 13000)
        m(pynvml, "nvmlDeviceGetCount", lambda: len(self.gpus))
        m(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
        m(pynvml, "nvmlDeviceGetName", lambda h: self.gpus[h][0])
        m(pynvml, "nvmlDeviceGetUUID", lambda h: self.gpus[h][1])
        m(pynvml, "nvmlDeviceGetPciInfo", lambda h: SimpleNamespace(busId=self.gpus[h][2]))
        m(pynvml, "nvmlDeviceGetMemoryInfo",
          lambda h: SimpleNamespace(total=49140 * MIB, used=self.used[h] * MIB, free=(49140 - self.used[h]) * MIB))
        m(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: self.procs[h])
        m(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", lambda h: [])
        return self

    def _shutdown(self):
        self.shutdown += 1


def raiser(code):
    def f(*args):
        raise pynvml.NVMLError(code)
    return f


def test_nvml_facts_two_a6000_serving(monkeypatch, proc):
    procs = {0: [SimpleNamespace(pid=41873, usedGpuMemory=45862 * MIB)],
             1: [SimpleNamespace(pid=41874, usedGpuMemory=45856 * MIB), SimpleNamespace(pid=999999, usedGpuMemory=None)]}
    fake = FakeNvml(used=(45872, 45866), procs=procs).install(monkeypatch)
    f = nvml.nvml_facts(proc_root=proc)
    assert f["available"] is True and f["source"] == "pynvml"
    assert (f["driver_version"], f["nvml_version"], f["cuda_driver_version"]) == ("580.126.09", "13.580.126.09", "13.0")
    assert f["kernel_module"]["version"] == "580.126.09" and f["gpu_count"] == 2
    g0, g1 = f["gpus"]
    assert g0 == {"index": 0, "name": "NVIDIA RTX A6000", "uuid": "GPU-8d0c4d6e-5b2a-7f1e-3c9a-4e6b1d2f0a11",
                  "pci_bus_id": "00000000:17:00.0", "bdf": "0000:17:00.0", "memory_total_mib": 49140,
                  "memory_used_mib": 45872,
                  "processes": [{"pid": 41873, "used_mib": 45862, "name": "sglang::schedul",
                                 "cmdline": "sglang::scheduler_TP0"}]}
    assert g1["processes"] == [
        {"pid": 41874, "used_mib": 45856, "name": "sglang::schedul", "cmdline": "sglang::scheduler_TP1"},
        {"pid": 999999, "used_mib": None, "name": None, "cmdline": None},  # a host PID not visible here
    ]
    assert fake.shutdown == 1


@pytest.mark.parametrize("code,reason,text", [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "library_not_found", "libnvidia-ml.so.1"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded", "modprobe nvidia"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "version_mismatch", "kernel module 580.126.09"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "no_permission", "/dev/nvidia"),
    (pynvml.NVML_ERROR_UNKNOWN, "nvml_error", "Unknown Error"),
])
def test_nvml_init_errors_are_named(monkeypatch, proc, code, reason, text):
    monkeypatch.setattr(pynvml, "nvmlInit", raiser(code))
    f = nvml.nvml_facts(proc_root=proc)
    assert f["available"] is False
    assert f["reason"] == reason and f["source"] == "pynvml"
    assert text in f["msg"]
    assert f["kernel_module"]["version"] == "580.126.09"


def test_version_mismatch_names_library_version(monkeypatch, proc):
    monkeypatch.setattr(pynvml, "nvmlInit", raiser(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    monkeypatch.setattr(nvml, "_loaded_nvml_library_version", lambda proc_root="/proc": "580.95.05")
    f = nvml.nvml_facts(proc_root=proc)
    assert "NVML library 580.95.05, kernel module 580.126.09" in f["msg"]


def test_real_pynvml_without_library(monkeypatch, proc):
    """pynvml's own loader, on a machine without libnvidia-ml.so.1 (CI, this controller)."""
    def no_lib(name, *a, **kw):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "CDLL", no_lib)
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    f = nvml.nvml_facts(proc_root=proc)
    assert f["reason"] == "library_not_found"


def test_one_lost_gpu_does_not_hide_the_other(monkeypatch, proc):
    fake = FakeNvml().install(monkeypatch)
    orig = pynvml.nvmlDeviceGetMemoryInfo

    def mem(h):
        if h == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return orig(h)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", mem)
    f = nvml.nvml_facts(proc_root=proc)
    assert f["available"] and f["gpus"][0]["memory_total_mib"] == 49140
    assert f["gpus"][1]["error"] == "GPU is lost" and f["gpus"][1]["reason"] == "nvml_error"
    assert fake.shutdown == 1


def test_query_error_after_init_still_shuts_down(monkeypatch, proc):
    fake = FakeNvml().install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", raiser(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    f = nvml.nvml_facts(proc_root=proc)
    assert f["reason"] == "driver_not_loaded" and fake.shutdown == 1


def test_pynvml_not_importable(monkeypatch, proc):
    monkeypatch.setattr(nvml, "HAS_PYNVML", False)
    assert nvml.nvml_facts(proc_root=proc)["reason"] == "pynvml_not_installed"


# ------------------------------------------------------------------ nvidia-smi


class Smi(object):
    def __init__(self, gpu=(0, "query-gpu-idle.csv"), apps=(0, "query-compute-apps-idle.csv")):
        self.gpu, self.apps = gpu, apps
        self.calls = []

    def __call__(self, args):
        self.calls.append(args)
        rc, name = self.gpu if args[1].startswith("--query-gpu") else self.apps
        return rc, fixture(name), ""


def test_smi_command_lines():
    smi = Smi()
    nvml.smi_facts(smi, "/usr/bin/nvidia-smi")
    assert smi.calls == [
        ["/usr/bin/nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,memory.used,pci.bus_id,uuid",
         "--format=csv,noheader,nounits"],
        ["/usr/bin/nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id",
         "--format=csv,noheader,nounits"],
    ]


def test_smi_idle(proc):
    f = nvml.smi_facts(Smi(), proc_root=proc)
    assert f["available"] and f["source"] == "nvidia-smi" and f["driver_version"] == "580.126.09"
    assert f["gpu_count"] == 2 and f["kernel_module"]["type"] == "open"
    assert [(g["index"], g["bdf"], g["memory_total_mib"], g["memory_used_mib"], g["processes"]) for g in f["gpus"]] == [
        (0, "0000:17:00.0", 49140, 4, []), (1, "0000:73:00.0", 49140, 4, [])]
    assert f["gpus"][1]["uuid"] == "GPU-2f9e7a13-c4d8-61b0-95e2-7a3c8d0b4f66"


def test_smi_serving_processes(proc):
    f = nvml.smi_facts(Smi(gpu=(0, "query-gpu-serving.csv"), apps=(0, "query-compute-apps-serving.csv")), proc_root=proc)
    assert [g["memory_used_mib"] for g in f["gpus"]] == [45872, 45866]
    assert f["gpus"][0]["processes"] == [
        {"pid": 41873, "used_mib": 45862, "name": "sglang::schedul", "cmdline": "sglang::scheduler_TP0"}]
    assert f["gpus"][1]["processes"][0]["pid"] == 41874


def test_smi_in_container_pids_not_visible(tmp_path):
    f = nvml.smi_facts(Smi(gpu=(0, "query-gpu-serving.csv"), apps=(0, "query-compute-apps-in-container.csv")),
                       proc_root=str(tmp_path))
    assert f["gpus"][0]["processes"] == [{"pid": 3011, "used_mib": 45862, "name": None, "cmdline": None}]
    assert f["kernel_module"] is None


@pytest.mark.parametrize("rc,name,reason", [
    (9, "driver-not-loaded.txt", "driver_not_loaded"),
    (18, "version-mismatch.txt", "version_mismatch"),
    (6, "no-devices.txt", "no_devices"),
])
def test_smi_failures(proc, rc, name, reason):
    f = nvml.smi_facts(Smi(gpu=(rc, name)), proc_root=proc)
    assert f["available"] is False and f["reason"] == reason and f["source"] == "nvidia-smi"
    assert f["detail"] == fixture(name).strip()
    if reason == "version_mismatch":
        assert "NVML library 580.126, kernel module 580.126.09" in f["msg"]


def test_smi_not_installed(proc):
    assert nvml.smi_facts(Smi(), smi_path=None, proc_root=proc)["reason"] == "not_installed"

    def missing(args):
        raise OSError(2, "No such file or directory")

    assert nvml.smi_facts(missing, proc_root=proc)["reason"] == "not_installed"
    assert nvml.classify_smi_failure(127, "", "/bin/sh: nvidia-smi: command not found") == "not_installed"


def test_smi_comma_in_names():
    gpus = nvml.parse_smi_gpus("0, NVIDIA RTX A6000, Rev 2, 580.126.09, 49140, 4, 00000000:17:00.0, GPU-x\n")
    assert gpus[0]["name"] == "NVIDIA RTX A6000, Rev 2" and gpus[0]["uuid"] == "GPU-x"
    apps = nvml.parse_smi_apps("7, python3 -c a,b, 100, 00000000:17:00.0\n")
    assert apps[0]["process_name"] == "python3 -c a, b" and apps[0]["used_mib"] == 100


# ------------------------------------------------------------------ gpu_facts: the choice


def test_gpu_facts_prefers_pynvml(monkeypatch, proc):
    FakeNvml().install(monkeypatch)
    smi = Smi()
    f = nvml.gpu_facts(run_command=smi, proc_root=proc)
    assert f["source"] == "pynvml" and smi.calls == []


def test_gpu_facts_falls_back_to_smi_without_pynvml(monkeypatch, proc):
    monkeypatch.setattr(nvml, "HAS_PYNVML", False)
    f = nvml.gpu_facts(run_command=Smi(), proc_root=proc)
    assert f["source"] == "nvidia-smi" and f["available"]


def test_gpu_facts_named_state_is_not_hidden_by_fallback(monkeypatch, proc):
    monkeypatch.setattr(pynvml, "nvmlInit", raiser(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    smi = Smi()
    f = nvml.gpu_facts(run_command=smi, proc_root=proc)
    assert f["reason"] == "driver_not_loaded" and f["source"] == "pynvml" and smi.calls == []


def test_gpu_facts_library_not_found_tries_smi(monkeypatch, proc):
    monkeypatch.setattr(pynvml, "nvmlInit", raiser(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    f = nvml.gpu_facts(run_command=Smi(gpu=(9, "driver-not-loaded.txt")), proc_root=proc)
    assert f["source"] == "nvidia-smi" and f["reason"] == "driver_not_loaded"
    assert f["nvml_attempt"]["reason"] == "library_not_found"
    f = nvml.gpu_facts(run_command=Smi(), smi_path=None, proc_root=proc)
    assert f["source"] == "pynvml" and f["reason"] == "library_not_found"


def test_gpu_facts_without_anything(monkeypatch, proc):
    monkeypatch.setattr(nvml, "HAS_PYNVML", False)
    assert nvml.gpu_facts(run_command=None, proc_root=proc)["reason"] == "pynvml_not_installed"
    assert nvml.gpu_facts(run_command=Smi(), smi_path=None, proc_root=proc)["reason"] == "not_installed"
