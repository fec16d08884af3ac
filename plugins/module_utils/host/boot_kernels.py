# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernels a Proxmox host can boot, and the NVIDIA DKMS module of each.

Pure functions over the real tools' output (no command runs here):

- ``proxmox-boot-tool kernel list`` (proxmox-kernel-helper 8.1.0, src/bin/proxmox-boot-tool:318-348): the blocks
  "Manually selected kernels:", "Automatically selected kernels:", then, when set, "Pinned kernel:" and
  "Kernel pinned on next-boot:"; a block with nothing in it prints "None.". The pins are the files
  /etc/kernel/proxmox-boot-pin and /etc/kernel/next-boot-pin (src/proxmox-boot/functions:7-9).
- ``dkms status`` of dkms 3.0.10 (Debian bookworm), dkms.in:1770-1790 (do_status): "nvidia/<ver>, <kernel>, <arch>:
  installed" (or "built"), optionally followed by " (WARNING! ...)", and "nvidia/<ver>: added" for a registered
  source without a build; nvidia_installer.parse_dkms_status parses it.
- A failed build leaves its log in /var/lib/dkms/<module>/<ver>/build/make.log (dkms.in:1055-1056); a good one moves
  it to /var/lib/dkms/<module>/<ver>/<kernel>/<arch>/log/make.log (dkms.in:1089-1090).
- DKMS looks for a kernel's headers at /lib/modules/<kernel>/build and needs its include/ (dkms.in:58-70,
  _check_kernel_dir), else "Your kernel headers for kernel <k> cannot be found" (dkms.in:895).
"""

from __future__ import annotations

import os
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import installer_log
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import read_text
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.nvidia_installer import headers_packages

BOOT_TOOL_BLOCKS = {
    "Manually selected kernels:": "manual",
    "Automatically selected kernels:": "auto",
    "Pinned kernel:": "pinned",
    "Kernel pinned on next-boot:": "next_boot_pin",
}
KERNEL_RE = re.compile(r"^[0-9]+\.[0-9]+[0-9A-Za-z.+~_-]*$")
DKMS_TREE = "/var/lib/dkms"


def parse_boot_tool_list(text):
    """``proxmox-boot-tool kernel list`` -> {manual: [...], auto: [...], pinned: str|None, next_boot_pin: str|None}."""
    out = {"manual": [], "auto": [], "pinned": None, "next_boot_pin": None}
    block = None
    for line in (text or "").splitlines():
        line = line.strip()
        if line in BOOT_TOOL_BLOCKS:
            block = BOOT_TOOL_BLOCKS[line]
        elif block and KERNEL_RE.match(line):  # "None." and blank lines are no kernel
            if block in ("manual", "auto"):
                out[block].append(line)
            elif out[block] is None:
                out[block] = line
    return out


def version_key(kernel):
    """Sort key in the spirit of ``sort --version-sort`` (numbers as numbers): 6.8.12-10-pve > 6.8.12-9-pve."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"([0-9]+)", kernel) if p]


def installed_kernels(boot_dir="/boot"):
    """Kernels with an image in /boot (vmlinuz-<release>): what GRUB's 10_linux offers."""
    try:
        names = os.listdir(boot_dir)
    except OSError:
        return []
    return sorted((n[len("vmlinuz-"):] for n in names if n.startswith("vmlinuz-")), key=version_key)


def next_boot_kernel(listing, installed):
    """The kernel the next boot starts: the next-boot pin, else the pin, else the newest bootable kernel (both boot
    loaders list the kernels newest first and boot the first unless pinned; proxmox-boot-tool writes the pin into
    loader.conf / the GRUB snippet /etc/default/grub.d/proxmox-kernel-pin.cfg)."""
    listing = listing or {}
    for pin in (listing.get("next_boot_pin"), listing.get("pinned")):
        if pin:
            return pin
    candidates = (listing.get("manual") or []) + (listing.get("auto") or []) or list(installed or [])
    present = [k for k in candidates if not installed or k in installed] or candidates
    return max(present, key=version_key) if present else None


def bootable_kernels(listing, installed, running):
    """Every kernel that can boot: proxmox-boot-tool's lists and pins (when it answered), else every /boot image;
    only those with an image in /boot (a listed kernel whose package is gone cannot boot). Newest first."""
    listing = listing or {}
    listed = set((listing.get("manual") or []) + (listing.get("auto") or []))
    listed.update(k for k in (listing.get("pinned"), listing.get("next_boot_pin")) if k)
    kernels = set(k for k in listed if k in installed) if listed else set(installed or [])
    if running and (running in installed or not installed):
        kernels.add(running)
    return sorted(kernels, key=version_key, reverse=True)


def headers_present(kernel, modules_root="/lib/modules"):
    """DKMS's own test: /lib/modules/<kernel>/build/include exists."""
    return os.path.isdir(os.path.join(modules_root, kernel, "build", "include"))


def dkms_state(entries, version, kernel):
    """DKMS's state of nvidia/<version> for ``kernel``: installed, built, added (source only) or None (unknown)."""
    states = [e["state"] for e in entries if e["module"] == "nvidia" and e["version"] == version and e["kernel"] == kernel]
    if states:
        return "installed" if "installed" in states else states[0]
    if any(e["module"] == "nvidia" and e["version"] == version for e in entries):
        return "added"
    return None


def failed_build(version, kernel, said, lines=20, dkms_tree=DKMS_TREE, arch="x86_64", module="nvidia"):
    """Why DKMS could not build ``module`` for ``kernel``: DKMS's make.log (the failed build's build/make.log first,
    else the kept one) read once, for its path (``make_log``), its last lines (``make_log_tail``) and the compiler's
    cause (installer_log.build_failure: cause, summary, remedy, evidence); without a known cause the summary is
    ``said`` (DKMS's own words)."""
    path, text = None, ""
    for candidate in (os.path.join(dkms_tree, module, version, "build", "make.log"),
                      os.path.join(dkms_tree, module, version, kernel, arch, "log", "make.log")):
        text = read_text(candidate)
        if text is not None:
            path = candidate
            break
    why = installer_log.build_failure(text or "") or {"cause": None, "summary": said, "remedy": "", "evidence": []}
    return dict(why, make_log=path, make_log_tail=(text or "").rstrip("\n").splitlines()[-lines:])


def kernel_report(kernels, version, entries, running, next_boot, modules_root="/lib/modules"):
    """One dict per bootable kernel: kernel, running, next_boot, headers (bool), headers_package (to install when
    missing), dkms (state). The caller adds what it built and the signature."""
    report = []
    for k in kernels:
        report.append({
            "kernel": k,
            "running": k == running,
            "next_boot": k == next_boot,
            "headers": headers_present(k, modules_root),
            "headers_package": headers_packages(k)[0],
            "dkms": dkms_state(entries, version, k),
        })
    return report


def kernels_to_build(report):
    """The kernels DKMS must still build and install nvidia for (headers or not: the caller decides what it can do)."""
    return [r for r in report if r["dkms"] != "installed"]
