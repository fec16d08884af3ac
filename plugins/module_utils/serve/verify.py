# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verify run's checks of the GPUs: pure functions from gathered facts to findings.

A finding is what a failed run reports, for a run that does not stop: ``{check, phase, severity (error|warning),
evidence, remedy}``. :data:`CHECKS` is the order the findings come in (and the metrics' ``check`` label): the driver,
GPU memory held by others, the GPUs' health; verify_upgrade's kernels and packages (what the next boot or upgrade would
break); then verify_state's deployment, model and live server checks.
Standard library only; Python 3.9+.
"""

from __future__ import annotations

import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_restart as sr

CHECKS = ("driver", "memory", "health", "kernels", "packages", "deployment", "model", "live")
# the checks against the deployment record (verify_state)
SERVE_CHECKS = ("deployment", "model", "live")
SEVERITIES = ("error", "warning")

# nvmlClocksThrottleReason* (nvidia-ml-py pynvml.py): the bits that mean the GPU is slowed by heat or by its hardware.
# GpuIdle, ApplicationsClocksSetting, SwPowerCap (normal under full load), SyncBoost and DisplayClockSetting are not.
THROTTLE_BITS = {0x8: "HwSlowdown", 0x20: "SwThermalSlowdown", 0x40: "HwThermalSlowdown", 0x80: "HwPowerBrakeSlowdown"}
# "NVRM: Xid (PCI:0000:17:00): 79, pid=..., GPU has fallen off the bus." (the kernel log line operators read)
XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),\s*(.*)$")


def finding(check, phase, evidence, remedy, severity="error"):
    return {"check": check, "phase": phase, "severity": severity, "evidence": list(evidence), "remedy": remedy}


def driver(kernel_module, userspace, nvml_reason=None, wanted=None):
    """The loaded kernel module (its version, None when not loaded) against the NVIDIA userspace here (the version of
    libnvidia-ml this target loads) and the driver version the deployment asks for (``wanted``; None: not compared)."""
    ev = ["kernel module: %s (/proc/driver/nvidia/version)" % (kernel_module or "not loaded"),
          "userspace: libnvidia-ml %s" % (userspace or "not found")]
    if not kernel_module:
        return [finding("driver", "driver_not_loaded", ev, "Load the module (modprobe nvidia) or reboot into a kernel that has it; "
                        "re-run the deploy playbook's gpu_host stage when it was never built for this kernel.")]
    out = []
    if nvml_reason == "version_mismatch" or (userspace and userspace != kernel_module):
        out.append(finding("driver", "version_mismatch", ev + ["NVML: %s" % (nvml_reason or "answers")],
                           "The userspace was changed without the module (an apt or unattended upgrade?): install the userspace "
                           "of the module's exact version %s (the deploy playbook's container stage), or reboot when the host's "
                           "driver was upgraded and the old module is still loaded." % kernel_module))
    if wanted and wanted != kernel_module:
        out.append(finding("driver", "deployment_drift", ev + ["deployment asks for driver %s" % wanted],
                           "The loaded module is not the driver the deployment asks for: run the deploy playbook (gpu_host stage), "
                           "or set the inventory's driver version to the one meant to serve."))
    return out


def memory(holders, ours, used_mib=None, unavailable=None):
    """GPU memory held by processes that are not the unit's (``holders``: sglang_unit.gpu_holders); ``unavailable``: why
    NVML could not be asked (a warning: the check could not look)."""
    if unavailable:
        return [finding("memory", "nvml_unavailable", ["NVML: %s" % unavailable], "Install the NVML bindings (nvidia-ml-py) for the "
                        "module's Python, or fix what the evidence names; the driver check says more.", "warning")]
    held = sr.foreign_holders(holders, ours)
    if not held:
        return []
    f = sr.held_refusal(held, used_mib, "GPU memory is held by processes that are not the server's")
    return [finding("memory", f.phase, f.evidence, f.remedy)]


def xid_events(lines):
    """[(pci, xid, text)] of the ``NVRM: Xid`` lines of a kernel log."""
    out = []
    for line in lines or ():
        m = XID_RE.search(line)
        if m:
            out.append((m.group(1), int(m.group(2)), m.group(3).strip()))
    return out


def health(gpus, kernel_log_lines=(), max_temp_c=85):
    """NVML's temperature, throttle reasons and ECC counts per GPU (``gpus``: gather's health list), and Xid lines."""
    out = []
    xids = xid_events(kernel_log_lines)
    if xids:
        ev = ["Xid %d on %s: %s" % (x, pci, text) for pci, x, text in xids]
        out.append(finding("health", "gpu_xid_error", ev, "Look the Xid codes up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors): "
                           "79 (fallen off the bus), 48/63/64/94/95 (memory errors) need the host drained and the GPU checked; "
                           "others often a restart of the server. The finding stays until the kernel log rotates or the host reboots."))
    for g in gpus or ():
        name = "GPU %s" % g.get("index")
        if g.get("ecc_uncorrected"):
            out.append(finding("health", "gpu_ecc_errors", ["%s: %s uncorrected ECC errors (volatile, since the driver loaded)"
                                                            % (name, g["ecc_uncorrected"])],
                               "Uncorrected memory errors: drain the GPU, restart the server (a row remap needs a GPU reset), and have "
                               "the GPU replaced when they come back."))
        bits = [n for bit, n in sorted(THROTTLE_BITS.items()) if (g.get("throttle_reasons") or 0) & bit]
        hot = g.get("temperature_c") is not None and g["temperature_c"] >= max_temp_c
        if bits or hot:
            ev = ["%s: %s C (limit %s C)" % (name, g.get("temperature_c"), max_temp_c)]
            if bits:
                ev.append("%s: clocks throttled by %s (reasons 0x%x)" % (name, ", ".join(bits), g["throttle_reasons"]))
            out.append(finding("health", "gpu_throttled", ev, "The GPU slows down for heat or power: check the airflow, the fans and the "
                               "power supply of the host; NVML's throttle reasons say which.", severity="warning"))
    return out


def ok(findings):
    """True when no finding is an error."""
    return not [f for f in findings if f["severity"] == "error"]


def first_error(findings):
    return next((f for f in findings if f["severity"] == "error"), None)
