# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU facts from NVML (pynvml), with an ``nvidia-smi`` fallback, and the kernel module's version.

Every failure is a named state, never an exception, so that gates can decide on it:

    {"available": False, "reason": <reason>, "msg": <cause and fix>, "source": "pynvml"|"nvidia-smi"}

Reasons: ``pynvml_not_installed``, ``library_not_found``, ``driver_not_loaded``,
``version_mismatch``, ``no_permission``, ``no_devices``, ``not_installed`` (no nvidia-smi),
``nvml_error`` / ``smi_error`` (anything else, with the text).

Success:

    {"available": True, "source": ..., "driver_version": "580.126.09", "nvml_version": "13.580.126.09",
     "cuda_driver_version": "13.0", "gpu_count": 2,
     "gpus": [{"index": 0, "name": "NVIDIA RTX A6000", "uuid": "GPU-...", "pci_bus_id": "00000000:17:00.0",
               "bdf": "0000:17:00.0", "memory_total_mib": 49140, "memory_used_mib": 4,
               "processes": [{"pid": 4242, "used_mib": 22810, "name": "python3", "cmdline": "..."}]}]}

Both carry ``kernel_module`` (:func:`read_proc_driver_version`, or None).
"""

from __future__ import annotations

import os
import re

try:
    import pynvml
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError as _e:  # pragma: no cover - depends on the target
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = str(_e)

MIB = 1024 * 1024

SMI_GPU_FIELDS = ["index", "name", "driver_version", "memory.total", "memory.used", "pci.bus_id", "uuid"]
SMI_APP_FIELDS = ["pid", "process_name", "used_memory", "gpu_bus_id"]
SMI_GPU_ARGS = ["--query-gpu=" + ",".join(SMI_GPU_FIELDS), "--format=csv,noheader,nounits"]
SMI_APP_ARGS = ["--query-compute-apps=" + ",".join(SMI_APP_FIELDS), "--format=csv,noheader,nounits"]

MESSAGES = {
    "pynvml_not_installed": "the Python NVML bindings (nvidia-ml-py, module pynvml) are not installed for the module's Python",
    "library_not_found": ("libnvidia-ml.so.1 was not found: the NVIDIA driver's userspace is not installed "
                          "(install the driver; in a container, the userspace of the host's exact version with --no-kernel-modules)"),
    "driver_not_loaded": ("NVML cannot communicate with the NVIDIA kernel module: it is not loaded (modprobe nvidia; check "
                          "dmesg for NVRM errors or an unsigned module under Secure Boot), or /dev/nvidiactl is missing "
                          "(in a container: pass /dev/nvidia* through)"),
    "version_mismatch": ("Driver/library version mismatch: the NVML library and the loaded kernel module are different "
                         "versions; install the userspace of the kernel module's exact version, or reload the module / "
                         "reboot after a driver upgrade"),
    "no_permission": "no permission to open /dev/nvidia*: run as root or fix the device node modes",
    "no_devices": ("the driver is loaded but sees no GPU: the GPUs are still bound to another driver (vfio-pci?) "
                   "or fell off the bus (see dmesg)"),
    "not_installed": "nvidia-smi is not installed (no NVIDIA driver userspace on this machine)",
}


def _text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def normalize_bus_id(bus_id):
    """NVML's ``00000000:17:00.0`` -> sysfs's ``0000:17:00.0`` (None when it does not parse)."""
    m = re.match(r"^\s*([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\s*$", _text(bus_id) or "")
    if not m:
        return None
    return "%04x:%s:%s.%s" % (int(m.group(1), 16), m.group(2).lower(), m.group(3).lower(), m.group(4))


def cuda_version_string(value):
    """NVML's integer CUDA driver version (13000) -> ``13.0``."""
    if value is None:
        return None
    value = int(value)
    return "%d.%d" % (value // 1000, (value % 1000) // 10)


# --------------------------------------------------------------------------- /proc


_PROC_OPEN_RE = re.compile(r"NVRM version:\s+NVIDIA UNIX Open Kernel Module(?:\s+for\s+(\S+))?\s+(\d+\.\d+(?:\.\d+)?)")
_PROC_PROP_RE = re.compile(r"NVRM version:\s+NVIDIA UNIX\s+(?:(\S+)\s+)?Kernel Module\s+(\d+\.\d+(?:\.\d+)?)")
_PROC_ANY_RE = re.compile(r"\b(\d{3,}\.\d+(?:\.\d+)?)\b")


def parse_proc_driver_version(text):
    """Parse ``/proc/driver/nvidia/version``.

    Open modules:        ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.126.09  Release Build  (dvs-builder@...)  <date>``
    Proprietary modules: ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.126.09  <date>``

    Returns ``{"version", "type" ("open"|"proprietary"|None), "arch", "banner", "gcc_version"}``
    or None when no version is in the text.
    """
    if not text:
        return None
    lines = text.splitlines()
    banner = next((line.strip() for line in lines if line.startswith("NVRM version:")), None)
    gcc = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("GCC version:")), None)
    if banner is None:
        return None
    m = _PROC_OPEN_RE.search(banner)
    kind = "open"
    if not m:
        m = _PROC_PROP_RE.search(banner)
        kind = "proprietary"
    if m:
        return {"version": m.group(2), "type": kind, "arch": m.group(1), "banner": banner, "gcc_version": gcc}
    m = _PROC_ANY_RE.search(banner)
    if m:
        return {"version": m.group(1), "type": None, "arch": None, "banner": banner, "gcc_version": gcc}
    return None


def read_proc_driver_version(proc_root="/proc"):
    """The loaded kernel module's version from ``<proc_root>/driver/nvidia/version`` (None if absent)."""
    try:
        with open(os.path.join(proc_root, "driver", "nvidia", "version")) as f:
            return parse_proc_driver_version(f.read())
    except (IOError, OSError):
        return None


def process_info(pid, proc_root="/proc"):
    """``(name, cmdline)`` of a PID from procfs; None for what is not visible (another PID namespace)."""
    name = cmdline = None
    try:
        with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as f:
            raw = f.read()
        args = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
        if args:
            cmdline = " ".join(args)
    except (IOError, OSError):
        pass
    try:
        with open(os.path.join(proc_root, str(pid), "comm")) as f:
            name = f.read().strip() or None
    except (IOError, OSError):
        pass
    if name is None and cmdline:
        name = os.path.basename(cmdline.split(" ", 1)[0])
    return name, cmdline


def _loaded_nvml_library_version(proc_root="/proc"):
    """Version in the file name of the libnvidia-ml this process mapped (``libnvidia-ml.so.580.126.09``)."""
    try:
        with open(os.path.join(proc_root, "self", "maps")) as f:
            for line in f:
                m = re.search(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)\s*$", line)
                if m:
                    return m.group(1)
    except (IOError, OSError):
        pass
    return None


def unavailable(reason, source, msg=None, detail=None, kernel_module=None):
    out = {"available": False, "reason": reason, "source": source, "msg": msg or MESSAGES.get(reason, reason),
           "kernel_module": kernel_module}
    if detail:
        out["detail"] = detail
    return out


# --------------------------------------------------------------------------- pynvml


def classify_nvml_error(err, nvml=None):
    """Map a pynvml.NVMLError to a reason name."""
    nvml = nvml or pynvml
    value = getattr(err, "value", None)
    table = {
        getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12): "library_not_found",
        getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9): "driver_not_loaded",
        getattr(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18): "version_mismatch",
        getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4): "no_permission",
    }
    return table.get(value, "nvml_error")


def _nvml_str(err):
    try:
        return str(err)
    except Exception:  # pylint: disable=broad-except
        return "NVML error %s" % getattr(err, "value", "?")


def _nvml_call(func, *args):
    """Call an optional per-device query; None when the GPU or driver does not support it."""
    try:
        return func(*args)
    except pynvml.NVMLError:
        return None


def _nvml_processes(handle, proc_root):
    procs = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        func = getattr(pynvml, getter, None)
        if func is None:
            continue
        for p in _nvml_call(func, handle) or []:
            pid = int(p.pid)
            used = getattr(p, "usedGpuMemory", None)
            used_mib = int(used) // MIB if used is not None else None
            if pid in procs:
                if used_mib is not None and (procs[pid]["used_mib"] or 0) < used_mib:
                    procs[pid]["used_mib"] = used_mib
                continue
            name, cmdline = process_info(pid, proc_root)
            procs[pid] = {"pid": pid, "used_mib": used_mib, "name": name, "cmdline": cmdline}
    return [procs[k] for k in sorted(procs)]


def nvml_facts(proc_root="/proc"):
    """GPU facts through pynvml; a named unavailable state on every failure."""
    kmod = read_proc_driver_version(proc_root)
    if not HAS_PYNVML:
        return unavailable("pynvml_not_installed", "pynvml", detail=PYNVML_IMPORT_ERROR, kernel_module=kmod)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        reason = classify_nvml_error(e)
        msg = MESSAGES.get(reason)
        if reason == "version_mismatch":
            lib = _loaded_nvml_library_version()
            msg = "%s (NVML library %s, kernel module %s)" % (msg, lib or "unknown", kmod["version"] if kmod else "not loaded")
        elif reason == "nvml_error":
            msg = "nvmlInit failed: %s" % _nvml_str(e)
        return unavailable(reason, "pynvml", msg=msg, detail=_nvml_str(e), kernel_module=kmod)
    try:
        try:
            out = {
                "available": True,
                "source": "pynvml",
                "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
                "nvml_version": _text(_nvml_call(pynvml.nvmlSystemGetNVMLVersion)),
                "cuda_driver_version": cuda_version_string(_nvml_call(pynvml.nvmlSystemGetCudaDriverVersion)),
                "kernel_module": kmod,
                "gpus": [],
            }
            count = pynvml.nvmlDeviceGetCount()
            for index in range(count):
                gpu = {"index": index}
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    gpu["name"] = _text(pynvml.nvmlDeviceGetName(handle))
                    gpu["uuid"] = _text(pynvml.nvmlDeviceGetUUID(handle))
                    pci = pynvml.nvmlDeviceGetPciInfo(handle)
                    gpu["pci_bus_id"] = _text(pci.busId)
                    gpu["bdf"] = normalize_bus_id(gpu["pci_bus_id"])
                    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                    gpu["memory_total_mib"] = int(mem.total) // MIB
                    gpu["memory_used_mib"] = int(mem.used) // MIB
                    gpu["processes"] = _nvml_processes(handle, proc_root)
                except pynvml.NVMLError as e:  # one lost GPU must not hide the others
                    gpu["error"] = _nvml_str(e)
                    gpu["reason"] = classify_nvml_error(e)
                out["gpus"].append(gpu)
            out["gpu_count"] = len(out["gpus"])
            return out
        except pynvml.NVMLError as e:
            reason = classify_nvml_error(e)
            return unavailable(reason, "pynvml", msg="NVML query failed: %s" % _nvml_str(e) if reason == "nvml_error" else None,
                               detail=_nvml_str(e), kernel_module=kmod)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


# --------------------------------------------------------------------------- nvidia-smi


def _smi_value(value):
    value = value.strip()
    if value in ("", "[N/A]", "N/A", "[Not Supported]", "[Not Found]", "[Unknown Error]", "[Insufficient Permissions]"):
        return None
    return value


def _smi_int(value):
    value = _smi_value(value)
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


# for other nvidia-smi queries (verify_gather's health): its "[N/A]" and friends are None
smi_value, smi_int = _smi_value, _smi_int


def _split_csv(line, nfields):
    # Only the name fields can hold a comma; nvidia-smi does not quote. Split from both ends around them.
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < nfields:
        return None
    return parts


def parse_smi_gpus(text):
    gpus = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        parts = _split_csv(line, len(SMI_GPU_FIELDS))
        if parts is None:
            continue
        if len(parts) > len(SMI_GPU_FIELDS):  # a comma in the name
            extra = len(parts) - len(SMI_GPU_FIELDS)
            parts = [parts[0], ", ".join(parts[1:2 + extra])] + parts[2 + extra:]
        index, name, driver, total, used, bus_id, uuid = parts
        gpus.append({
            "index": _smi_int(index),
            "name": _smi_value(name),
            "driver_version": _smi_value(driver),
            "memory_total_mib": _smi_int(total),
            "memory_used_mib": _smi_int(used),
            "pci_bus_id": _smi_value(bus_id),
            "bdf": normalize_bus_id(bus_id),
            "uuid": _smi_value(uuid),
            "processes": [],
        })
    return gpus


def parse_smi_apps(text):
    apps = []
    for line in (text or "").splitlines():
        if not line.strip() or line.strip().startswith("No running"):
            continue
        parts = _split_csv(line, len(SMI_APP_FIELDS))
        if parts is None:
            continue
        if len(parts) > len(SMI_APP_FIELDS):  # a comma in the process name
            parts = [parts[0], ", ".join(parts[1:-2])] + parts[-2:]
        pid, pname, used, bus_id = parts
        if _smi_int(pid) is None:
            continue
        apps.append({"pid": _smi_int(pid), "process_name": _smi_value(pname), "used_mib": _smi_int(used),
                     "gpu_bus_id": _smi_value(bus_id), "bdf": normalize_bus_id(bus_id)})
    return apps


def classify_smi_failure(rc, out, err):
    """Map a failed nvidia-smi run to a reason name."""
    text = "%s\n%s" % (out or "", err or "")
    if "couldn't communicate with the NVIDIA driver" in text or rc == 9:
        return "driver_not_loaded"
    if "Driver/library version mismatch" in text or rc == 18:
        return "version_mismatch"
    if "No devices were found" in text or rc == 6:
        return "no_devices"
    if "Insufficient Permissions" in text or rc == 4:
        return "no_permission"
    if "NVML Shared Library Not Found" in text or "libnvidia-ml.so" in text or rc == 12:
        return "library_not_found"
    if rc == 127 or "command not found" in text or "No such file or directory" in text:
        return "not_installed"
    return "smi_error"


def _run(run_command, args):
    try:
        return run_command(args)
    except (IOError, OSError) as e:
        return 127, "", str(e)


def smi_facts(run_command, smi_path="nvidia-smi", proc_root="/proc"):
    """GPU facts from ``nvidia-smi`` CSV queries.

    ``run_command(args) -> (rc, stdout, stderr)`` (AnsibleModule.run_command fits);
    ``smi_path`` None means it is not installed.
    """
    kmod = read_proc_driver_version(proc_root)
    if not smi_path:
        return unavailable("not_installed", "nvidia-smi", kernel_module=kmod)
    rc, out, err = _run(run_command, [smi_path] + SMI_GPU_ARGS)
    if rc != 0:
        reason = classify_smi_failure(rc, out, err)
        text = ((out or "") + (err or "")).strip()
        msg = MESSAGES.get(reason, "nvidia-smi failed (rc=%s): %s" % (rc, text))
        if reason == "version_mismatch":
            m = re.search(r"NVML library version:\s*(\S+)", text)
            msg = "%s (NVML library %s, kernel module %s)" % (
                msg, m.group(1) if m else "unknown", kmod["version"] if kmod else "not loaded")
        return unavailable(reason, "nvidia-smi", msg=msg, detail=text, kernel_module=kmod)
    gpus = parse_smi_gpus(out)
    rc2, out2, err2 = _run(run_command, [smi_path] + SMI_APP_ARGS)
    apps = parse_smi_apps(out2) if rc2 == 0 else []
    by_bdf = dict((g["bdf"], g) for g in gpus)
    for app in apps:
        gpu = by_bdf.get(app["bdf"])
        if gpu is None:
            continue
        name, cmdline = process_info(app["pid"], proc_root)
        if name is None and app["process_name"]:
            name = os.path.basename(app["process_name"])
        gpu["processes"].append({"pid": app["pid"], "used_mib": app["used_mib"], "name": name, "cmdline": cmdline})
    driver_versions = sorted(set(g["driver_version"] for g in gpus if g["driver_version"]))
    for g in gpus:
        g.pop("driver_version", None)
        g["processes"].sort(key=lambda p: p["pid"])
    result = {
        "available": True,
        "source": "nvidia-smi",
        "driver_version": driver_versions[0] if driver_versions else None,
        "nvml_version": None,
        "cuda_driver_version": None,
        "kernel_module": kmod,
        "gpu_count": len(gpus),
        "gpus": gpus,
    }
    if rc2 != 0:
        result["processes_error"] = ((out2 or "") + (err2 or "")).strip()
    return result


def gpu_facts(run_command=None, smi_path="nvidia-smi", proc_root="/proc", use_nvml=True):
    """pynvml when importable (and ``use_nvml``), else nvidia-smi; ``source`` says which answered.

    When pynvml is importable but finds no libnvidia-ml, nvidia-smi is tried too (and
    reports not_installed or its own state); the first answer is kept in ``nvml_attempt``.
    """
    if use_nvml and HAS_PYNVML:
        facts = nvml_facts(proc_root=proc_root)
        if facts.get("available") or facts.get("reason") != "library_not_found" or run_command is None:
            return facts
        smi = smi_facts(run_command, smi_path, proc_root)
        if smi.get("available") or smi.get("reason") != "not_installed":
            smi["nvml_attempt"] = {"reason": facts["reason"], "msg": facts["msg"]}
            return smi
        return facts
    if run_command is None:
        return unavailable("pynvml_not_installed" if use_nvml else "not_installed", "none",
                           kernel_module=read_proc_driver_version(proc_root))
    return smi_facts(run_command, smi_path, proc_root)
