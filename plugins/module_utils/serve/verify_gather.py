# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the verify run reads on its target, and nothing it writes: NVML's health counters, the NVIDIA userspace's
version, the kernel log's Xid lines, the model files against the kept listing, the unit's files, the live server.
The decisions are verify.py's and verify_state.py's.
"""

from __future__ import annotations

import glob
import os
import re
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import nvml
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import load_json, read_text
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su

# where the driver's userspace puts libnvidia-ml.so.1 -> libnvidia-ml.so.<version> (Debian multiarch, the .run default)
NVML_LIB_GLOBS = ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1", "/usr/lib/libnvidia-ml.so.1")
_LIB_VERSION_RE = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")


def userspace_version(paths=NVML_LIB_GLOBS):
    """The version in the file name libnvidia-ml.so.1 points to (None when none is installed)."""
    for pattern in paths:
        for path in sorted(glob.glob(pattern)):
            m = _LIB_VERSION_RE.search(os.path.realpath(path))
            if m:
                return m.group(1)
    return None


def nvml_health():
    """[{index, temperature_c, throttle_reasons, ecc_uncorrected}] (a value NVML does not give is None)."""
    p = nvml.pynvml
    if p is None:
        return []
    try:
        p.nvmlInit()
    except p.NVMLError:
        return []
    try:
        out = []
        for i in range(p.nvmlDeviceGetCount()):
            h = p.nvmlDeviceGetHandleByIndex(i)
            out.append({"index": i, "temperature_c": _opt(p.nvmlDeviceGetTemperature, h, p.NVML_TEMPERATURE_GPU),
                        "throttle_reasons": _opt(p.nvmlDeviceGetCurrentClocksThrottleReasons, h),
                        "ecc_uncorrected": _opt(p.nvmlDeviceGetTotalEccErrors, h, p.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, p.NVML_VOLATILE_ECC)})
        return out
    except p.NVMLError:
        return []
    finally:
        try:
            p.nvmlShutdown()
        except p.NVMLError:
            pass


# nvidia-smi's names for what nvml_health asks NVML (nvidia-smi --help-query-gpu); the mask is hex ("0x...08")
SMI_HEALTH_ARGS = ["--query-gpu=index,temperature.gpu,clocks_throttle_reasons.active,ecc.errors.uncorrected.volatile.total",
                   "--format=csv,noheader,nounits"]


def smi_health(run_command, smi_path):
    """nvml_health's list from nvidia-smi, where pynvml is not installed ([] without nvidia-smi or when it fails)."""
    if not smi_path:
        return []
    code, out, _err = run_command([smi_path] + SMI_HEALTH_ARGS)
    gpus = []
    for line in (out or "").splitlines() if code == 0 else ():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            mask = nvml.smi_value(parts[2]) or ""
            gpus.append({"index": int(parts[0]), "temperature_c": nvml.smi_int(parts[1]),
                         "throttle_reasons": int(mask, 16) if mask.lower().startswith("0x") else nvml.smi_int(mask),
                         "ecc_uncorrected": nvml.smi_int(parts[3])})
    return gpus


def _opt(func, *args):
    try:
        return func(*args)
    except nvml.pynvml.NVMLError:   # not supported (ECC off, an old GPU): no finding from it
        return None


def kernel_log(path, run_command, journalctl):
    """The kernel log's lines: ``path`` (rsyslog's kern.log) when it exists, else this boot's ``journalctl -k``."""
    text = read_text(path) if path else None
    if text is None and journalctl:
        rc, text, _err = run_command([journalctl, "-k", "-b", "--no-pager", "-o", "short-iso"])
        text = text if rc == 0 else ""
    return (text or "").splitlines()


def model_files(model_dir, revision, verify_hashes):
    """(listing, {path: size or None}, {path: (algorithm, digest)}) of the pinned revision kept by hf_model."""
    found = sorted(glob.glob(hf.tree_cache_path(model_dir, "*", revision))) if revision else []
    data = load_json(found[0]) if found else None
    listing = data.get("files") if isinstance(data, dict) and data.get("commit") == revision else None
    sizes, hashes = {}, {}
    for e in listing or ():
        path = os.path.join(model_dir, hf.safe_relpath(e["path"]))
        sizes[e["path"]] = os.path.getsize(path) if os.path.isfile(path) else None
        algo = hf.expected_digest(e)[0]
        if verify_hashes and algo and sizes[e["path"]] == e["size"]:
            hashes[e["path"]] = (algo, hf.hash_file(path, algo, e["size"]).hexdigest())
    return listing, sizes, hashes


def unit_state(unit, state_dir, unit_dir="/etc/systemd/system"):
    """(the last launch sglang_service recorded, the fingerprint of the unit's files now), as sglang_service computes it."""
    stem = su.unit_stem(unit)
    env = os.path.join(su.ENV_FILE_DIR, "%s.env" % stem)
    secret = read_text(os.path.join(su.ENV_FILE_DIR, "%s-secrets.yaml" % stem)) or ""
    fingerprint = su.config_fingerprint((read_text(os.path.join(unit_dir, unit)) or "") + su.LAUNCHER_SCRIPT, (read_text(env) or "") + secret)
    return load_json(os.path.join(state_dir, "%s.json" % stem)), fingerprint


def timed(func, *args):
    """(func's result, seconds it took)."""
    t0 = time.time()
    result = func(*args)
    return result, time.time() - t0
