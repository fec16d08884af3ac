"""The fake libnvidia-ml.so.1 driven through the REAL pynvml, and the nvidia-smi stand-in on top of it."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import LAB, RELEASE, UUIDS, VERSION, base_state, lablib

SMI = os.path.join(LAB, "nvidia", "payload", "nvidia-smi")
pytest.importorskip("pynvml")


def loaded_state(version=VERSION, procs=None, persistenced=False):
    st = base_state()
    st["modules"]["loaded"] += ["nvidia", "nvidia_uvm", "nvidia_modeset"]
    st["nvidia"]["kernel_modules"] = {RELEASE: {"version": version, "type": "open", "signed": False, "dkms": True}}
    for bdf in ("0000:01:00.0", "0000:02:00.0"):
        st["pci"]["devices"][bdf]["driver"] = "nvidia"
    if procs:
        st["gpus"][0]["processes"] = procs
    if persistenced:
        st["nvidia"]["persistenced"] = {"pid": 4321, "persistence_mode": True, "user": "root"}
    return st


class Lib(object):
    """The library where the installer puts it, with a config rendered from a state."""

    def __init__(self, tmp_path, nvbuild, lib_version=VERSION):
        self.dir = tmp_path / "lib"
        self.dir.mkdir()
        if lib_version:
            shutil.copy(str(nvbuild["lib"]), str(self.dir / ("libnvidia-ml.so." + lib_version)))
            os.symlink("libnvidia-ml.so." + lib_version, str(self.dir / "libnvidia-ml.so.1"))
        self.conf = tmp_path / "nvml.conf"

    def render(self, state):
        nvml_render = lablib("nvml_render")
        self.conf.write_text(nvml_render.render_text(state))

    def env(self):
        env = dict(os.environ)
        env.update({"LD_LIBRARY_PATH": str(self.dir), "FAKE_NVML_CONFIG": str(self.conf), "PYTHONDONTWRITEBYTECODE": "1"})
        return env

    def py(self, code):
        prog = "import json, pynvml\nout = {}\ntry:\n" + "".join("    " + ln + "\n" for ln in code.splitlines()) + \
               "except pynvml.NVMLError as e:\n    out['error'] = type(e).__name__\n    out['code'] = e.value\n" \
               "print(json.dumps(out))\n"
        r = subprocess.run([sys.executable, "-c", prog], env=self.env(), capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
        import json
        return json.loads(r.stdout.strip().splitlines()[-1])

    def smi(self, *args):
        return subprocess.run([sys.executable, SMI] + list(args), env=self.env(), capture_output=True, text=True, check=False)


QUERY = """
pynvml.nvmlInit()
out['driver'] = pynvml.nvmlSystemGetDriverVersion()
out['nvml'] = pynvml.nvmlSystemGetNVMLVersion()
out['cuda'] = pynvml.nvmlSystemGetCudaDriverVersion()
out['cuda2'] = pynvml.nvmlSystemGetCudaDriverVersion_v2()
out['count'] = pynvml.nvmlDeviceGetCount()
out['gpus'] = []
for i in range(out['count']):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    m = pynvml.nvmlDeviceGetMemoryInfo(h)
    m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    pci = pynvml.nvmlDeviceGetPciInfo(h)
    out['gpus'].append({
        'name': pynvml.nvmlDeviceGetName(h), 'uuid': pynvml.nvmlDeviceGetUUID(h),
        'minor': pynvml.nvmlDeviceGetMinorNumber(h), 'pm': pynvml.nvmlDeviceGetPersistenceMode(h),
        'total': m.total, 'used': m.used, 'free': m.free, 'reserved2': m2.reserved, 'used2': m2.used,
        'bus': pci.busId, 'pci_id': pci.pciDeviceId, 'sub_id': pci.pciSubSystemId,
        'procs': [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)],
        'procs2': [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)],
        'gfx': len(pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)),
        'cc': list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
    })
out['by_uuid'] = pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(out['gpus'][1]['uuid']))
out['by_bus'] = pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId('0000:02:00.0'))
pynvml.nvmlShutdown()
"""


def test_driver_loaded_two_a6000(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild)
    lib.render(loaded_state(procs=[{"pid": 81234, "name": "python3", "used_mib": 44000}], persistenced=True))
    out = lib.py(QUERY)
    assert "error" not in out, out
    assert out["driver"] == VERSION
    assert out["nvml"] == "13." + VERSION
    assert out["cuda"] == out["cuda2"] == 13000
    assert out["count"] == 2
    g0, g1 = out["gpus"]
    assert [g0["name"], g1["name"]] == ["NVIDIA RTX A6000"] * 2
    assert [g0["uuid"], g1["uuid"]] == UUIDS
    assert [g0["bus"], g1["bus"]] == ["00000000:01:00.0", "00000000:02:00.0"]
    assert g0["pci_id"] == 0x223010DE and g0["sub_id"] == 0x145910DE
    assert [g0["minor"], g1["minor"]] == [0, 1]
    assert g0["pm"] == g1["pm"] == 1
    mib = 1024 * 1024
    assert g0["total"] == 49140 * mib
    assert g0["used"] == (390 + 44000) * mib and g0["free"] == g0["total"] - g0["used"]
    assert g0["reserved2"] == 390 * mib and g0["used2"] == 44000 * mib
    assert g1["used"] == 390 * mib
    assert g0["procs"] == g0["procs2"] == [[81234, 44000 * mib]]
    assert g1["procs"] == [] and g0["gfx"] == 0
    assert g0["cc"] == [8, 6]
    assert out["by_uuid"] == 1 and out["by_bus"] == 1


HEALTH = """
pynvml.nvmlInit()
out['gpus'] = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    out['gpus'].append({
        'temp': pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        'throttle': pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        'events': pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        'ecc': [pynvml.nvmlDeviceGetTotalEccErrors(h, t, c) for t in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED) for c in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC)],
    })
pynvml.nvmlShutdown()
"""


def test_health_counters_throttle_reasons_and_ecc(tmp_path, nvbuild):
    """gpu_verify's health check reads these: an idle GPU throttles for GpuIdle only; a drill sets thermal slowdown and ECC."""
    lib = Lib(tmp_path, nvbuild)
    st = loaded_state(procs=[{"pid": 81234, "name": "python3", "used_mib": 44000}])
    st["gpus"][1].update(throttle_reasons=0x40, ecc_corrected=3, ecc_uncorrected=2, temp_c=91)
    lib.render(st)
    out = lib.py(HEALTH)
    assert "error" not in out, out
    g0, g1 = out["gpus"]
    assert (g0["temp"], g0["throttle"], g0["ecc"]) == (46, 0, [0, 0, 0, 0])
    assert (g1["temp"], g1["throttle"], g1["events"], g1["ecc"]) == (91, 0x40, 0x40, [3, 3, 2, 2])
    lib.render(loaded_state())
    assert [g["throttle"] for g in lib.py(HEALTH)["gpus"]] == [1, 1]   # idle: nvmlClocksThrottleReasonGpuIdle


def test_smi_health_query_answers_from_the_same_state_as_nvml(tmp_path, nvbuild):
    """gpu_verify's health without pynvml: nvidia-smi's fields, parsed by verify_gather, give what NVML gives."""
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import verify_gather as g
    lib = Lib(tmp_path, nvbuild)
    st = loaded_state(procs=[{"pid": 81234, "name": "python3", "used_mib": 44000}])
    st["gpus"][1].update(throttle_reasons=0x40, ecc_uncorrected=2, temp_c=91)
    lib.render(st)
    r = lib.smi(*g.SMI_HEALTH_ARGS)
    assert r.returncode == 0 and parse_csv(r.stdout) == [["0", "46", "0x0000000000000000", "0"], ["1", "91", "0x0000000000000040", "2"]]
    r = lib.smi("--query-gpu=clocks_event_reasons.active,ecc.errors.uncorrected.volatile.total", "--format=csv")
    assert parse_csv(r.stdout)[0] == ["clocks_event_reasons.active", "ecc.errors.uncorrected.volatile.total"]

    def run(argv):
        done = subprocess.run([sys.executable] + argv, env=lib.env(), capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr
    got = g.smi_health(run, SMI)
    assert got == [{"index": 0, "temperature_c": 46, "throttle_reasons": 0, "ecc_uncorrected": 0},
                   {"index": 1, "temperature_c": 91, "throttle_reasons": 0x40, "ecc_uncorrected": 2}]
    nv = lib.py(HEALTH)["gpus"]
    assert [(x["temp"], x["throttle"], x["ecc"][2]) for x in nv] == [(n["temperature_c"], n["throttle_reasons"], n["ecc_uncorrected"]) for n in got]


def test_only_gpus_bound_to_nvidia_are_seen(tmp_path, nvbuild):
    st = loaded_state()
    st["pci"]["devices"]["0000:01:00.0"]["driver"] = "vfio-pci"
    lib = Lib(tmp_path, nvbuild)
    lib.render(st)
    out = lib.py("pynvml.nvmlInit()\nh = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
                 "out['count'] = pynvml.nvmlDeviceGetCount()\nout['bus'] = pynvml.nvmlDeviceGetPciInfo(h).busId\n"
                 "out['minor'] = pynvml.nvmlDeviceGetMinorNumber(h)\n")
    assert out == {"count": 1, "bus": "00000000:02:00.0", "minor": 1}


def test_memory_is_live_under_a_held_handle(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild)
    lib.render(loaded_state())
    st2 = loaded_state(procs=[{"pid": 9, "name": "sglang::scheduler_TP0", "used_mib": 30000}])
    nvml_render = lablib("nvml_render")
    code = ("pynvml.nvmlInit()\nh = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
            "out['before'] = pynvml.nvmlDeviceGetMemoryInfo(h).used // 1048576\n"
            "open(%r, 'w').write(%r)\n"
            "out['after'] = pynvml.nvmlDeviceGetMemoryInfo(h).used // 1048576\n"
            "out['name'] = pynvml.nvmlSystemGetProcessName(9)\n") % (str(lib.conf), nvml_render.render_text(st2))
    assert lib.py(code) == {"before": 390, "after": 30390, "name": "sglang::scheduler_TP0"}


def test_driver_not_loaded(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild)
    lib.render(base_state())  # library installed, nvidia module not loaded
    assert lib.py("pynvml.nvmlInit()") == {"error": "NVMLError_DriverNotLoaded", "code": 9}
    lib.conf.unlink()  # no config at all: same answer
    assert lib.py("pynvml.nvmlInit()")["error"] == "NVMLError_DriverNotLoaded"


def test_library_missing(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild, lib_version=None)
    lib.render(loaded_state())
    out = lib.py("pynvml.nvmlInit()")
    # on a machine with a real driver installed, the system library would be found instead
    if not os.path.exists("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"):
        assert out == {"error": "NVMLError_LibraryNotFound", "code": 12}


def test_version_mismatch(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild, lib_version="580.159")  # container userspace from another release
    lib.render(loaded_state(version=VERSION))
    assert lib.py("pynvml.nvmlInit()") == {"error": "NVMLError_LibRmVersionMismatch", "code": 18}


def test_uninitialized_and_bad_index(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild)
    lib.render(loaded_state())
    assert lib.py("pynvml.nvmlInit()\npynvml.nvmlDeviceGetHandleByIndex(5)")["error"] == "NVMLError_InvalidArgument"


# --- nvidia-smi ------------------------------------------------------------------------

def parse_csv(text):
    return [[c.strip() for c in line.split(",")] for line in text.strip().splitlines()]


def test_smi_query_gpu_matches_state(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild)
    lib.render(loaded_state(procs=[{"pid": 81234, "name": "python3", "used_mib": 44000}]))
    r = lib.smi("--query-gpu=index,name,driver_version,memory.total,memory.used,pci.bus_id,uuid", "--format=csv")
    assert r.returncode == 0, r.stdout
    rows = parse_csv(r.stdout)
    assert rows[0] == ["index", "name", "driver_version", "memory.total [MiB]", "memory.used [MiB]", "pci.bus_id", "uuid"]
    assert rows[1] == ["0", "NVIDIA RTX A6000", VERSION, "49140 MiB", "44390 MiB", "00000000:01:00.0", UUIDS[0]]
    assert rows[2] == ["1", "NVIDIA RTX A6000", VERSION, "49140 MiB", "390 MiB", "00000000:02:00.0", UUIDS[1]]
    r = lib.smi("--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits")
    assert parse_csv(r.stdout) == [["44390", "49140"], ["390", "49140"]]


def test_smi_query_compute_apps(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild)
    lib.render(loaded_state(procs=[{"pid": 81234, "name": "python3", "used_mib": 44000}]))
    r = lib.smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id", "--format=csv,noheader")
    assert r.returncode == 0
    assert parse_csv(r.stdout) == [["81234", "python3", "44000 MiB", UUIDS[0], "00000000:01:00.0"]]
    r = lib.smi("--query-compute-apps=pid,used_memory", "--format=csv")
    assert parse_csv(r.stdout) == [["pid", "used_gpu_memory [MiB]"], ["81234", "44000 MiB"]]
    lib.render(loaded_state())
    r = lib.smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader")
    assert r.returncode == 0 and r.stdout == ""


def test_smi_table_and_list(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild)
    lib.render(loaded_state(procs=[{"pid": 81234, "name": "python3", "used_mib": 44000}], persistenced=True))
    r = lib.smi()
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert all(len(ln) == 91 for ln in lines[1:] if ln)
    assert "NVIDIA-SMI %s" % VERSION in r.stdout and "Driver Version: %s" % VERSION in r.stdout
    assert "CUDA Version: 13.0" in r.stdout
    assert "44390MiB /  49140MiB" in r.stdout and "81234" in r.stdout
    assert "NVIDIA RTX A6000               On" in r.stdout
    r = lib.smi("-L")
    assert r.stdout.splitlines() == ["GPU %d: NVIDIA RTX A6000 (UUID: %s)" % (i, u) for i, u in enumerate(UUIDS)]


def test_smi_failures(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild)
    lib.render(base_state())
    r = lib.smi()
    assert r.returncode == 9
    assert r.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                               "Make sure that the latest NVIDIA driver is installed and running.")
    r = lib.smi("--query-gpu=bogus", "--format=csv")
    assert r.returncode == 9  # NVML init fails first
    lib.render(loaded_state())
    r = lib.smi("--query-gpu=bogus", "--format=csv")
    assert r.returncode == 2 and 'Field "bogus" is not a valid field to query.' in r.stdout


def test_smi_version_mismatch(tmp_path, nvbuild):
    lib = Lib(tmp_path, nvbuild, lib_version="580.159")
    lib.render(loaded_state())
    r = lib.smi()
    assert r.returncode == 18
    assert r.stdout.splitlines()[:2] == ["Failed to initialize NVML: Driver/library version mismatch",
                                         "NVML library version: 580.159"]


def test_smi_without_library(tmp_path, nvbuild):
    if os.path.exists("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"):
        pytest.skip("a real NVIDIA library is installed on this machine")
    lib = Lib(tmp_path, nvbuild, lib_version=None)
    r = lib.smi()
    assert r.returncode == 12 and "couldn't find libnvidia-ml.so library" in r.stdout


def test_renderer_proc_version_text():
    nvml_render = lablib("nvml_render")
    assert nvml_render.proc_version_text(base_state()) is None
    text = nvml_render.proc_version_text(loaded_state())
    assert text.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build" % VERSION)
