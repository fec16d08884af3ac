"""Render the lab state into what the fake NVIDIA driver stack reads.

``render(root, state)`` is a labstate renderer (``labstate.register_renderer``): it writes
``<root>/var/lib/kpro-lab/nvml.conf``, the key=value file the fake libnvidia-ml.so.1
(tests/lab/nvml/fakenvml.c) re-reads on every call, and which nvidia-smi reads through
that library. Standard library only; no import of labstate (labstate imports us).

State read (see tests/lab/README.md):
- ``modules.loaded``: "nvidia" present = the kernel module is loaded;
- ``kernel.release`` and ``nvidia.kernel_modules[release]`` = {version, type, signed}:
  the nvidia module built for that kernel (installer / dkms write it), so the version
  of the loaded module is the one built for the running kernel;
- ``pci.devices[bdf]``: vendor/device/subsystem ids and ``driver`` ("nvidia" = NVML sees it);
- ``gpus``: [{bdf, name, uuid, mem_total_mib, mem_reserved_mib, mem_used_mib, processes}];
  used memory is ``mem_used_mib`` when set, else ``mem_reserved_mib`` + the processes';
- ``nvidia.persistenced``: {pid, persistence_mode} while the daemon runs -> persistence mode.

:func:`proc_version_text` gives the text of /proc/driver/nvidia/version for the
/proc renderer (or None when the module is not loaded).
"""

import os

CONF_REL = "var/lib/kpro-lab/nvml.conf"
MIB = 1024 * 1024
# NVML version = CUDA major + driver version; 580 ships CUDA 13.0.
CUDA_DRIVER_VERSION = 13000
BUILD_STAMP = "(dvs-builder@U22-I3-AM02-24-3)  Wed Jan  7 22:51:36 UTC 2026"


def _hexid(value, default=0):
    if value is None:
        return default
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    try:
        return int(text, 16)
    except ValueError:
        return default


def nvml_bus_id(bdf):
    """"0000:01:00.0" -> NVML's "00000000:01:00.0" (8-digit domain, upper-case hex)."""
    parts = bdf.split(":")
    if len(parts) == 2:
        parts = ["0000"] + parts
    dom, bus, rest = parts
    dev, fn = rest.split(".")
    return "%08X:%02X:%02X.%X" % (int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16))


def driver_loaded(state):
    return "nvidia" in (state.get("modules") or {}).get("loaded", [])


def loaded_module(state):
    """{version, type, ...} of the loaded nvidia module, or None."""
    if not driver_loaded(state):
        return None
    release = (state.get("kernel") or {}).get("release")
    info = ((state.get("nvidia") or {}).get("kernel_modules") or {}).get(release)
    return info or None


def bound_gpus(state):
    """(minor, gpu) for the state's GPUs bound to the nvidia driver, in NVML index order."""
    devices = (state.get("pci") or {}).get("devices") or {}
    out = []
    for minor, gpu in enumerate(state.get("gpus") or []):
        dev = devices.get(gpu.get("bdf")) or {}
        if dev.get("driver") == "nvidia":
            out.append((minor, gpu))
    return out


def used_mib(gpu):
    if gpu.get("mem_used_mib") is not None:
        return int(gpu["mem_used_mib"])
    return int(gpu.get("mem_reserved_mib") or 0) + sum(int(p.get("used_mib") or 0) for p in gpu.get("processes") or [])


def render_text(state):
    mod = loaded_module(state)
    lines = ["# Rendered from state.json by nvml_render.py; read by libnvidia-ml.so.1 (kpro lab). Do not edit."]
    if not mod:
        lines.append("driver_loaded=0")
        return "\n".join(lines) + "\n"
    devices = (state.get("pci") or {}).get("devices") or {}
    pers = (state.get("nvidia") or {}).get("persistenced") or {}
    persistence = 1 if pers.get("pid") and pers.get("persistence_mode", True) else 0
    gpus = bound_gpus(state)
    lines += ["driver_loaded=1",
              "kernel_module_version=%s" % mod.get("version", ""),
              "kernel_module_type=%s" % mod.get("type", "open"),
              "cuda_driver_version=%d" % CUDA_DRIVER_VERSION,
              "device_count=%d" % len(gpus)]
    for i, (minor, gpu) in enumerate(gpus):
        dev = devices.get(gpu["bdf"]) or {}
        procs = gpu.get("processes") or []
        pfx = "gpu%d." % i
        lines += [
            pfx + "name=%s" % gpu.get("name", "NVIDIA RTX A6000"),
            pfx + "uuid=%s" % gpu.get("uuid", ""),
            pfx + "pci_bus_id=%s" % nvml_bus_id(gpu["bdf"]),
            pfx + "pci_device_id=0x%04X%04X" % (_hexid(dev.get("device"), 0x2230), _hexid(dev.get("vendor"), 0x10de)),
            pfx + "pci_subsys_id=0x%04X%04X" % (_hexid(dev.get("subsystem_device"), 0x1459),
                                                _hexid(dev.get("subsystem_vendor"), 0x10de)),
            pfx + "minor=%d" % minor,
            pfx + "mem_total=%d" % (int(gpu.get("mem_total_mib") or 0) * MIB),
            pfx + "mem_reserved=%d" % (int(gpu.get("mem_reserved_mib") or 0) * MIB),
            pfx + "mem_used=%d" % (used_mib(gpu) * MIB),
            pfx + "persistence_mode=%d" % persistence,
            pfx + "temp=%d" % int(gpu.get("temp_c", 46 if procs else 30)),
            pfx + "util_gpu=%d" % int(gpu.get("util_gpu", 0)),
            pfx + "util_mem=%d" % int(gpu.get("util_mem", 0)),
            pfx + "power_mw=%d" % int(gpu.get("power_mw", 71000 if procs else 22000)),
            pfx + "power_limit_mw=%d" % int(gpu.get("power_limit_mw", 300000)),
            pfx + "fan=%d" % int(gpu.get("fan", 30)),
            pfx + "pstate=%d" % (2 if procs else 8),
            pfx + "cc=%s" % gpu.get("compute_capability", "8.6"),
            # nvmlClocksThrottleReason* bits: an idle GPU reports GpuIdle (0x1), a busy one none unless a drill sets them
            pfx + "throttle_reasons=%d" % int(gpu.get("throttle_reasons", 0 if procs else 1)),
            pfx + "ecc_corrected=%d" % int(gpu.get("ecc_corrected", 0)),
            pfx + "ecc_uncorrected=%d" % int(gpu.get("ecc_uncorrected", 0)),
            pfx + "nproc=%d" % len(procs),
        ]
        for j, proc in enumerate(procs):
            lines += [pfx + "proc%d.pid=%d" % (j, int(proc["pid"])),
                      pfx + "proc%d.used=%d" % (j, int(proc.get("used_mib") or 0) * MIB),
                      pfx + "proc%d.name=%s" % (j, str(proc.get("name") or "").replace("\n", " "))]
    return "\n".join(lines) + "\n"


def is_current(root, state):
    """True when <root>/var/lib/kpro-lab/nvml.conf is what :func:`render` would write for ``state``
    (or is absent: nothing rendered, nothing stale)."""
    try:
        with open(os.path.join(root, CONF_REL)) as f:
            return f.read() == render_text(state)
    except (IOError, OSError):
        return True


def render(root, state):
    """The labstate renderer: write <root>/var/lib/kpro-lab/nvml.conf atomically."""
    path = os.path.join(root, CONF_REL)
    text = render_text(state)
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except (IOError, OSError):
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)


def proc_version_text(state):
    """/proc/driver/nvidia/version as the loaded module prints it, or None when not loaded."""
    mod = loaded_module(state)
    if not mod:
        return None
    if mod.get("type", "open") == "open":
        first = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  %s" % (mod["version"], BUILD_STAMP)
    else:
        first = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  %s" % (mod["version"], BUILD_STAMP.split(")  ", 1)[1])
    return first + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"
