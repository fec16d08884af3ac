# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verify run's look at what the next boot or the next upgrade would break (checks ``kernels`` and ``packages``).

- ``kernels`` (a Proxmox host): every kernel that can boot (boot_kernels.bootable_kernels: proxmox-boot-tool's lists and
  pins, else /boot's images) has the NVIDIA module, as the pre-reboot check asks it of the next boot's
  (reboot_check.module_problems): the next boot's missing is an error, another bootable kernel's a warning.
- ``packages``: the apt holds and the unattended-upgrades blacklist the gpu_host stage set are still there, and (a
  container whose NVIDIA userspace came from the .run installer) no apt package of NVIDIA userspace is installed.
  ``dpkg-query -W -f '${Package}\\t${Status}\\n'`` prints "<want> <eflag> <status>" per package (dpkg's
  src/query/main.c; ``apt-mark hold`` sets the want to "hold", apt-private/private-mark.cc through dpkg --set-selections).
  unattended-upgrades reads Unattended-Upgrade::Package-Blacklist as a list of Python regular expressions matched with
  re.match, so anchored at the start only (mvo5/unattended-upgrades 2.13, unattended-upgrade is_pkgname_in_blacklist).
"""

from __future__ import annotations

import os
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import read_text
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import boot_kernels as bk
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import driver_kernels as dk
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import reboot_check as rc
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.nvidia_installer import headers_packages
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.verify import finding

# apt packages that bring NVIDIA's userspace (Debian's nvidia-driver family, NVIDIA's CUDA repository's): an upgrade of
# any of them writes libnvidia-ml.so.1 & co over the .run installer's and no longer matches the host's module
NVIDIA_USERSPACE_RE = re.compile(r"^(libnvidia-|nvidia-|libcuda1|libnvcuvid1|libnvoptix1|xserver-xorg-video-nvidia)")
_LIST_ITEM_RE = re.compile(r'"((?:[^"\\]|\\.)*)"\s*;')


def kernels(module, version, proc_root="/proc", boot_dir="/boot", modules_root="/lib/modules"):
    """The findings of every kernel that can boot without the NVIDIA module (``version``: the driver's; None: any)."""
    running = (read_text(os.path.join(proc_root, "sys/kernel/osrelease")) or os.uname()[2]).strip()
    installed = bk.installed_kernels(boot_dir)
    listing = dk.boot_listing(module)
    nxt = bk.next_boot_kernel(listing, installed) or running
    out = []
    for k in bk.bootable_kernels(listing, installed, running):
        fields = dk.modinfo(module, k)
        boot = "next boot" if k == nxt else "can boot"
        for phase, msg, remedy in rc.module_problems(k, version or fields.get("version"), fields, headers_packages(k)[0],
                                                     bk.headers_present(k, modules_root), boot):
            out.append(finding("kernels", phase if k == nxt else "kernel_module_missing", [msg],
                               "Before rebooting: %s; dkms autoinstall builds every kernel with headers." % remedy,
                               "error" if k == nxt else "warning"))
    return out


def dpkg_packages(run_command, dpkg_query):
    """{package: want} of the installed packages (want: install, hold...); {} without dpkg-query."""
    if not dpkg_query:
        return {}
    code, out, _err = run_command([dpkg_query, "-W", "-f", "${Package}\t${Status}\n"], environ_update={"LC_ALL": "C"})
    pkgs = {}
    for line in (out or "").splitlines() if code == 0 else ():
        name, _sep, status = line.partition("\t")
        words = status.split()
        if len(words) == 3 and words[2] == "installed":
            pkgs[name.split(":")[0]] = words[0]
    return pkgs


def blacklist_entries(text):
    """The quoted entries of an apt.conf file's lists (our file holds only the blacklist)."""
    return [m.group(1).replace("\\\\", "\\") for m in _LIST_ITEM_RE.finditer(re.sub(r"(?m)//.*$", "", text or ""))]


def packages(pkgs, holds=(), blacklist=(), blacklist_file=None, blacklist_text=None, installer_userspace=False):
    """Holds gone, blacklist entries gone (only where unattended-upgrades is installed), NVIDIA apt userspace."""
    out = []
    gone = [n for n in holds if n in pkgs and pkgs[n] != "hold"]
    if gone:
        out.append(finding("packages", "deployment_drift", ["%s: dpkg selection %s, not hold" % (n, pkgs[n]) for n in gone],
                           "The gpu_host stage holds them so that a new kernel series arrives only when planned: re-run it, or "
                           "set gpu_host_apt_hold_kernel_meta: false when the unhold is meant (docs/verify.md).", "warning"))
    missing = [e for e in blacklist if e not in blacklist_entries(blacklist_text)]
    if "unattended-upgrades" in pkgs and blacklist_file and missing:
        out.append(finding("packages", "deployment_drift", ["%s lacks Unattended-Upgrade::Package-Blacklist entries %s" % (
            blacklist_file, ", ".join('"%s"' % e for e in missing))], "unattended-upgrades may install a kernel or headers "
            "unplanned: re-run the gpu_host stage (it writes the file again).", "warning"))
    apt = sorted(n for n in pkgs if installer_userspace and NVIDIA_USERSPACE_RE.match(n))
    if apt:
        out.append(finding("packages", "nvidia_apt_userspace", ["installed from apt: %s" % ", ".join(apt)],
                           "The NVIDIA userspace here comes from the .run installer; these apt packages replace its libraries at "
                           "their next upgrade (unattended-upgrades included): apt-get purge them, then re-run the container stage."))
    return out


def run(module, p):
    """The ``kernels`` and ``packages`` findings of ``p["checks"]`` (gpu_verify's parameters)."""
    out = kernels(module, p["driver_version"]) if "kernels" in p["checks"] else []
    if "packages" in p["checks"]:
        pkgs = dpkg_packages(module.run_command, module.get_bin_path("dpkg-query"))
        text = read_text(p["apt_blacklist_file"]) if p["apt_blacklist_file"] else None
        out += packages(pkgs, p["apt_holds"], p["apt_blacklist"], p["apt_blacklist_file"], text, p["installer_userspace"])
    return out
