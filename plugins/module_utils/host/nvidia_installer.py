# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA driver (the official ``.run`` installer) on a Proxmox host or in a container.

Pure functions: observe (``dkms status``, efivars; the loaded module comes from nvml.py),
decide (:func:`plan_host`, :func:`plan_userspace`), and build the installer command
line and the systemd units. The module ``nvidia_driver`` runs the commands.
Flags: NVIDIA/nvidia-installer 580.119.02 option_table.h (booleans also take ``--no-``: common-utils/nvgetopt.c);
DKMS registration and the nouveau blacklist: misc.c.
"""

from __future__ import annotations

import os
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.device_nodes import boot_commands
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

# The unit that creates /dev/nvidia-uvm* (and the GPU nodes) at every boot, before PVE
# autostarts guests: a devN entry for a missing node stops the container from starting.
DEVICE_NODES_UNIT = "nvidia-device-nodes.service"
PERSISTENCED_UNIT = "nvidia-persistenced.service"


class InstallerError(Failure):
    """An error with a name (``kind``, its phase) the operator can look up."""

    def __init__(self, kind, msg):
        super(InstallerError, self).__init__(kind, msg)
        self.kind = kind


# NVIDIA's Linux driver versions: <branch>.<minor>[.<patch>], branch 3 digits, minor 2-3, patch 2 (580.126.09,
# 550.54.14, 550.100, 535.98, 390.157, 470.256.02). A two-part version with a three-digit minor is real (550.142,
# 570.169), so "580.126" passes the format and is caught by the installer's own identification (installer_version).
VERSION_RE = re.compile(r"^[1-9][0-9]{2}\.[0-9]{2,3}(\.[0-9]{2})?$")
ARCH_RE = re.compile(r"^(x86_64|aarch64)$")


def check_version(version):
    """Raise ``bad_version`` unless ``version`` is an NVIDIA driver version (it goes into a URL and a file name)."""
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        raise InstallerError("bad_version", "version %r is not an NVIDIA driver version: expected <branch>.<minor>[.<patch>] "
                             "such as 580.126.09, 550.142 (branch 3 digits, minor 2-3, patch 2 digits), exactly as in "
                             "the installer's name NVIDIA-Linux-x86_64-<version>.run" % (version,))
    return version


def makeself_version(info_text):
    """The driver version from ``sh NVIDIA-Linux-*.run --info`` (makeself-header.sh prints ``Identification: <label>``,
    NVIDIA's label ends with the version: "NVIDIA Accelerated Graphics Driver for Linux-x86_64 580.126.09")."""
    for line in (info_text or "").splitlines():
        if line.strip().startswith("Identification:"):
            words = line.split()
            if words and VERSION_RE.match(words[-1]):
                return words[-1]
    return None


def check_installer_version(want, info_text, path):
    """Raise ``installer_version`` when the installer file is another release than ``want``."""
    got = makeself_version(info_text)
    if got is None:
        raise InstallerError("installer_version", "%s is not an NVIDIA .run installer (its --info names no driver "
                             "version): %s" % (path, (info_text or "").strip()[:200]))
    if got != want:
        raise InstallerError("installer_version", "%s is the installer of driver %s, not of the requested %s: set "
                             "the version to %s or point installer_path at NVIDIA-Linux-x86_64-%s.run"
                             % (path, got, want, got, want))
    return got


def parse_checksum(text):
    """``sha256:<hex>`` or ``<hex>`` -> lower-case hex, None when empty; ``bad_checksum`` for anything else."""
    if not text:
        return None
    algo, _sep, value = text.rpartition(":")
    if algo not in ("", "sha256") or not re.match(r"^[0-9a-fA-F]{64}$", value):
        raise InstallerError("bad_checksum", "installer_checksum %r is not a sha256 (sha256:<64 hex digits>)" % (text,))
    return value.lower()


def parse_dkms_status(text):
    """Parse ``dkms status`` lines ("nvidia/580.126.09, 6.8.12-9-pve, x86_64: installed")."""
    entries = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or ":" not in line:
            continue
        head, state = line.rsplit(":", 1)
        parts = [p.strip() for p in head.split(",")]
        if "/" in parts[0]:
            module, version = parts[0].split("/", 1)
        elif len(parts) > 1:  # old dkms: "nvidia, 580.126.09, 6.8..., x86_64: installed"
            module, version = parts[0], parts.pop(1)
        else:
            continue
        entries.append({
            "module": module,
            "version": version,
            "kernel": parts[1] if len(parts) > 1 else None,
            "arch": parts[2] if len(parts) > 2 else None,
            "state": state.strip().split(" ")[0],
        })
    return entries


def dkms_installed_for(entries, version, kernel):
    """DKMS installed nvidia ``version`` for ``kernel`` (only "built" is not in /lib/modules: modprobe finds nothing)."""
    return any(e["module"] == "nvidia" and e["version"] == version and e["kernel"] == kernel
               and e["state"] == "installed" for e in entries)


def dkms_has_source(entries, version):
    return any(e["module"] == "nvidia" and e["version"] == version for e in entries)


def module_sources(version):
    """Where nvidia-installer puts the module sources and dkms.conf, with or without --dkms (DEFAULT_KERNEL_MODULE_SRC_PREFIX
    /usr/src, dir nvidia-<version>: nvidia-installer 580 nvidia-installer.h:525, files.c:534-561)."""
    return "/usr/src/nvidia-%s" % version


def secure_boot_enabled(efivars_dir="/sys/firmware/efi/efivars"):
    """True/False from the SecureBoot EFI variable (4 attribute bytes, then the value); None if not UEFI."""
    path = os.path.join(efivars_dir, SECURE_BOOT_VAR)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (IOError, OSError):
        return None
    return len(data) >= 5 and data[4] == 1


def loaded_modules(proc_modules_text):
    return set(line.split(" ", 1)[0] for line in (proc_modules_text or "").splitlines() if line.strip())


def installer_args(mode, kernel_module_type="open", dkms=True, kernel_release=None,
                   signing_key=None, signing_cert=None, extra=None):
    """The installer's command-line flags (nvidia-installer option_table.h) for ``host`` or ``userspace`` mode."""
    args = ["--silent", "--no-x-check"]
    if mode == "userspace":
        # The container shares the host kernel: userspace only, nothing built or loaded.
        args += ["--no-kernel-modules", "--no-dkms", "--no-nouveau-check"]
    else:
        args += ["--kernel-module-type=%s" % kernel_module_type,
                 "--dkms" if dkms else "--no-dkms",
                 "--disable-nouveau",
                 # The collection regenerates the initramfs once itself (vfio_release).
                 "--no-rebuild-initramfs"]
        if kernel_release:
            args.append("--kernel-name=%s" % kernel_release)
        if signing_key and signing_cert:
            args += ["--module-signing-secret-key=%s" % signing_key,
                     "--module-signing-public-key=%s" % signing_cert]
    return args + list(extra or [])


def plan_host(version, loaded, dkms_entries, kernel_release, headers_present, on_disk=None, sources=True, dkms=True,
              wrong_key=False):
    """Decide what the host needs.

    ``loaded``: nvml.read_proc_driver_version() of the running module, or None. ``on_disk``: the version of the nvidia
    module the running kernel would load (modinfo), ``sources``: the installer's /usr/src/nvidia-<version>/dkms.conf is
    there, ``dkms``: the module is wanted under DKMS, ``wrong_key``: under Secure Boot, the running kernel's module is
    signed by another key than the enrolled one (the kernel refuses it).
    Returns (action, reason) with action one of: none, load, rebuild_module, resign_module, register_dkms, install.
    """
    if loaded and loaded["version"] != version:
        return "install", "kernel module %s is loaded, %s requested" % (loaded["version"], version)
    if dkms and on_disk == version and not dkms_installed_for(dkms_entries, version, kernel_release):
        # installed without --dkms, or the installer's DKMS registration failed (only a warning): dkms install of the
        # same version dies in check_version_sanity, and no new kernel would get the module
        if not sources:
            return "install", "driver %s is not registered with DKMS and %s/dkms.conf is missing: reinstalled with --dkms" % (
                version, module_sources(version))
        return "register_dkms", "driver %s for kernel %s was installed without DKMS (dkms status has no installed " \
            "nvidia/%s for it): its sources in %s are registered with DKMS" % (
                version, kernel_release, version, module_sources(version))
    if loaded:
        return "none", "NVIDIA kernel module %s is loaded" % version
    if wrong_key:
        return "resign_module", "the module %s for kernel %s is signed by a key that is not the enrolled one" % (
            version, kernel_release)
    if dkms_installed_for(dkms_entries, version, kernel_release):
        return "load", "module %s is built for %s but not loaded" % (version, kernel_release)
    if dkms_has_source(dkms_entries, version):
        # A host rebuild or kernel upgrade: the driver is installed, its module is not
        # built for the kernel that now runs. DKMS rebuilds only the module.
        return "rebuild_module", "driver %s is registered with DKMS but not installed for kernel %s%s" % (
            version, kernel_release, "" if headers_present else " (headers missing)")
    return "install", "no NVIDIA driver %s on this host" % version


def plan_userspace(host_version, nvml_version, nvml_reason):
    """Decide for a container: (action, reason). ``nvml_version`` is what NVML reports in the container."""
    if not host_version:
        raise InstallerError(
            "driver_not_loaded",
            "/proc/driver/nvidia/version is not readable in the container: the host has no NVIDIA kernel module "
            "loaded, or the container does not see it. Run the gpu_host stage first.")
    if nvml_version == host_version:
        return "none", "NVML in the container reports %s, the host's version" % host_version
    if nvml_reason in ("library_not_found", "not_installed", "pynvml_not_installed"):
        return "install", "no NVIDIA userspace in the container"
    return "install", "container userspace (%s) does not match the host kernel module %s" % (
        nvml_version or nvml_reason, host_version)


def device_nodes_unit(gpu_count):
    """The unit's text; its nvidia-modprobe lines come from device_nodes.boot_commands, the list the passthrough reads."""
    execs = "".join("ExecStart=/usr/bin/nvidia-modprobe %s\n" % " ".join(args) for args, _nodes in boot_commands(gpu_count))
    return (
        "# Managed by kpro.gpu_serving (nvidia_driver): create the NVIDIA device nodes at boot,\n"
        "# before Proxmox starts guests whose devN entries need them.\n"
        "[Unit]\n"
        "Description=Create NVIDIA device nodes for LXC guests\n"
        "After=local-fs.target systemd-modules-load.service\n"
        "Before=pve-guests.service\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        "%s"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n" % execs
    )


def persistenced_unit():
    return (
        "# Managed by kpro.gpu_serving (nvidia_driver).\n"
        "[Unit]\n"
        "Description=NVIDIA Persistence Daemon\n"
        "Wants=syslog.target\n"
        "Before=pve-guests.service\n"
        "\n"
        "[Service]\n"
        "Type=forking\n"
        "ExecStart=/usr/bin/nvidia-persistenced --user root --persistence-mode\n"
        "ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def installer_filename(version, arch="x86_64"):
    return "NVIDIA-Linux-%s-%s.run" % (arch, version)


def default_url(version, arch="x86_64"):
    check_version(version)
    return "https://us.download.nvidia.com/XFree86/Linux-%s/%s/%s" % (arch, version, installer_filename(version, arch))


def headers_packages(kernel_release):
    """Candidates in order (pve-kernel debian/control.in: proxmox-headers-<kver> Provides pve-headers-<kver>): the
    exact kernel's headers, then the transitional name."""
    return ["proxmox-headers-%s" % kernel_release, "pve-headers-%s" % kernel_release]
