# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pre-reboot check (kpro.gpu_serving.gpu_reboot_check): will the next boot bring the GPUs and container back?

Pure decisions over what the module read (nothing here changes the host):

- the next-boot kernel has a loadable nvidia module of the requested version: ``modinfo -k <kernel> nvidia`` finds it
  (kmod resolves it through that kernel's modules.dep, which ``dkms install`` refreshes), its ``version`` is the
  requested one and its ``vermagic`` names that kernel; under Secure Boot it is signed by the enrolled certificate
  (module_signing.check_signature) and that certificate is enrolled (``mokutil --test-key``);
- the device-node unit is enabled and ordered before pve-guests.service (``systemctl show -p UnitFileState -p Before``
  prints ``Key=value`` lines);
- each ``devN`` entry of the container names a node the device-node unit creates at boot: nvidia-modprobe ``-c N``
  makes /dev/nvidiaN (255: /dev/nvidiactl), ``-u -c M`` makes /dev/nvidia-uvm and /dev/nvidia-uvm-tools (minor M+1;
  nvidia-modprobe's modprobe-utils/nvidia-modprobe-utils.c, nvidia_uvm_mknod), ``-m`` makes /dev/nvidia-modeset.
  PVE refuses to start a container whose devN node is missing (pve-container 6.1.10, src/PVE/LXC.pm update_lxc_config
  calls src/PVE/LXC/Tools.pm get_device_mode_and_rdev, which dies "Device <path> does not exist");
- no VM with ``onboot: 1`` references a GPU function (``hostpciN``, directly or through a PCI mapping): at boot
  pve-guests.service runs ``pvesh create /nodes/localhost/startall``, which starts every onboot guest that HA does not
  manage (pve-manager 9.2.11, services/pve-guests.service, PVE/API2/Nodes.pm get_start_stop_list), and a VM start
  binds every non-bridge function of each hostpci device's IOMMU group to vfio-pci (qemu-server 9.2.6,
  src/PVE/QemuServer/PCI.pm prepare_pci_device; pve-common 9.2.1, src/PVE/SysFSTools.pm pci_dev_group_bind_to_vfio,
  which writes "<vendor> <device>" to vfio-pci/new_id), taking the GPUs from the container. The
  GPU functions are the NVIDIA display functions (or ``ids``) and their slot and IOMMU-group companions, as
  vfio_release selects them (vfio_host.select, pve_guests.find_references).
"""

from __future__ import annotations

import os
import re
import socket

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import boot_kernels as bk
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import driver_kernels as dk
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import module_signing as ms
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pve_guests
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import vfio_host as vh
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import read_text
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.lxc_config import parse_dev_value
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.nvidia_installer import headers_packages, secure_boot_enabled

GUESTS_UNIT = "pve-guests.service"
_DEVN_RE = re.compile(r"^dev([0-9]+):\s*(.+)$")


def parse_systemctl_show(text):
    """``systemctl show UNIT -p A -p B`` -> {A: value, B: value}."""
    out = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def unit_nodes(unit_text):
    """The /dev nodes the device-node unit's nvidia-modprobe lines create."""
    nodes = set()
    for line in (unit_text or "").splitlines():
        line = line.strip()
        if not line.startswith("ExecStart=") or "nvidia-modprobe" not in line:
            continue
        args = line.split("=", 1)[1].replace("=", " ").split()
        minors = [int(args[i + 1]) for i, a in enumerate(args[:-1])
                  if a in ("-c", "--create-nvidia-device-file") and args[i + 1].isdigit()]
        if "-u" in args or "--unified-memory" in args:
            for m in minors:
                nodes.update(["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] if m == 0 else [])
        else:
            nodes.update("/dev/nvidiactl" if m == 255 else "/dev/nvidia%d" % m for m in minors)
        if "-m" in args or "--modeset" in args:
            nodes.add("/dev/nvidia-modeset")
    return nodes


def devn_paths(conf_text):
    """The device paths of the container config's devN entries (the main section, before any [snapshot])."""
    paths = []
    for line in (conf_text or "").splitlines():
        if line.startswith("["):
            break
        m = _DEVN_RE.match(line.strip())
        if m:
            path = parse_dev_value(m.group(2)).get("path")
            if path:
                paths.append(path)
    return paths


def module_problems(kernel, version, fields, headers_package, headers, boot="next boot"):
    """The next-boot kernel's module (``boot``: the kernel's role, in the words): present, of ``version``, built for
    ``kernel``."""
    build = "dkms install -m nvidia -v %s -k %s" % (version, kernel)
    if not fields.get("filename"):
        if not headers:
            return [("next_boot_module_missing", "kernel %s (%s) has no nvidia module and no headers: %s is not "
                     "installed, so DKMS cannot build it" % (kernel, boot, headers_package),
                     "apt-get install %s && %s (or run the gpu_host stage)" % (headers_package, build))]
        return [("next_boot_module_missing", "kernel %s (%s) has no nvidia module" % (kernel, boot),
                 "%s (or run the gpu_host stage)" % build)]
    problems = []
    if fields.get("version") != version:
        problems.append(("next_boot_module_missing", "the nvidia module for kernel %s (%s) is version %s, not %s" % (
            kernel, boot, fields.get("version"), version), "%s (or run the gpu_host stage)" % build))
    vermagic = (fields.get("vermagic") or "").split()
    if vermagic and vermagic[0] != kernel:
        problems.append(("next_boot_module_missing", "the nvidia module found for kernel %s was built for %s" % (
            kernel, vermagic[0]), "%s (or run the gpu_host stage)" % build))
    return problems


def signing_problems(kernel, fields, cert, cert_path, dkms_key, enrolled):
    """Under Secure Boot: the module's signature and the certificate's enrolment."""
    problems = []
    try:
        ms.check_signature(kernel, fields, cert or {"serial": None}, cert_path or "(no certificate given)", dkms_key)
    except Failure as e:
        if e.phase == "module_wrong_key" or cert or not fields.get("signer"):
            problems.append((e.phase, e.msg, e.remedy))
    if cert_path and enrolled is False:
        problems.append(("signing_key_not_enrolled", "%s is not an enrolled MOK (mokutil --test-key): the kernel will "
                         "refuse modules signed with it" % cert_path,
                         "mokutil --import %s, then confirm the enrolment in MokManager at the next boot's console" % cert_path))
    return problems


def unit_problems(unit, show, unit_text):
    """The device-node unit: installed, enabled, ordered before pve-guests.service."""
    fix = "run the gpu_host stage (it installs and enables %s)" % unit
    if not unit_text:
        return [("device_nodes_unit_not_ready", "%s is not installed" % unit, fix)]
    problems = []
    if show.get("UnitFileState") != "enabled":
        problems.append(("device_nodes_unit_not_ready", "%s is %s, not enabled: it will not run at boot" % (
            unit, show.get("UnitFileState") or "unknown"), "systemctl enable %s" % unit))
    # the next boot reads the unit file: its [Unit] Before= counts as well as systemd's loaded view (which also holds
    # an After= of pve-guests.service and drop-ins)
    before = (show.get("Before") or "").split() + [u for line in unit_text.splitlines() if line.strip().startswith("Before=")
                                                   for u in line.split("=", 1)[1].split()]
    if GUESTS_UNIT not in before:
        problems.append(("device_nodes_unit_not_ready", "%s is not ordered before %s: PVE may start the container before "
                         "the nodes exist" % (unit, GUESTS_UNIT), fix))
    return problems


def ct_problems(vmid, paths, nodes):
    """Each devN path of the container is a node the unit creates at boot."""
    missing = [p for p in paths if p.startswith("/dev/nvidia") and p not in nodes]
    if not missing:
        return []
    return [("ct_passthrough_unresolvable", "CT %s has devN entries for %s, which nothing creates at boot (the device-node "
             "unit makes %s): PVE will refuse to start it" % (vmid, ", ".join(missing), ", ".join(sorted(nodes)) or "nothing"),
             "set gpu_host_expected_gpu_count to the GPUs passed and re-run the gpu_host stage, or drop the entries "
             "(lxc_gpu stage)")]


def onboot_vm_problems(vms, by_bdf):
    """Each VM of ``vms`` (pve_guests.find_references) with onboot 1: its GPU references, one problem per VM."""
    problems = []
    for vm in vms:
        if not vm["onboot"]:
            continue
        refs = "; ".join("%s: %s%s (%s)" % (r["key"], r["value"], "" if r["section"] == "main" else " [%s]" % r["section"],
                                            vh.device_label(r["bdfs"], by_bdf) + " at " + ", ".join(r["bdfs"]))
                         for r in vm["references"])
        problems.append(("guest_takes_gpus_at_boot", "VM %s (%s) has onboot 1 and %s: at boot pve-guests.service starts it "
                         "and qemu-server binds those GPU functions to vfio-pci, away from the container" % (
                             vm["vmid"], vm["name"] or "no name", refs),
                         "set gpu_host_detach_stopped_vms: onboot and re-run the gpu_host stage, or qm set %s --onboot 0"
                         % vm["vmid"]))
    return problems


def guest_problems(p, facts):
    """The onboot VMs that reference a GPU function (sysfs's NVIDIA display functions or ``ids``, with companions)."""
    try:
        _wanted, selected, _managed = vh.select(p["ids"], True, p["sysfs_root"])
        mappings = vh.read_mappings(p["etc_root"], p["node"] or socket.gethostname().split(".")[0])
    except Failure as e:
        return [(e.phase, e.msg, e.remedy)]
    by_bdf = dict((d["bdf"], d) for d in selected)
    vms = pve_guests.find_references(p["etc_root"], sorted(by_bdf), mappings)
    facts["gpu_functions"] = sorted(by_bdf)
    facts["vms_referencing_gpus"] = [vh.public_vm(vm) for vm in vms]
    return onboot_vm_problems(vms, by_bdf)


def verdict(kernel, problems):
    """"ready to reboot into <kernel>", or the Failure of the first problem with all of them as evidence."""
    if not problems:
        return "ready to reboot into %s" % kernel
    phase, msg, remedy = problems[0]
    raise Failure(phase, "not ready to reboot into %s: %s" % (kernel, msg), remedy=remedy,
                  evidence=["%s: %s (fix: %s)" % p for p in problems], next_boot_kernel=kernel,
                  problems=[{"phase": p, "msg": m, "remedy": r} for p, m, r in problems])


def enrolled(module, cert_path):
    """mokutil --test-key on the certificate: True, False, or None (no mokutil, or no answer)."""
    mokutil = module.get_bin_path("mokutil")
    if not (mokutil and cert_path):
        return None
    rc, out, err = module.run_command([mokutil, "--test-key", cert_path])
    return ms.mok_enrolled(rc, (out or "") + (err or ""))


def check_host(module):
    """Read everything (read-only) and return (facts, problems) for the next boot."""
    p = module.params
    running = (read_text(os.path.join(p["proc_root"], "sys/kernel/osrelease")) or os.uname()[2]).strip()
    installed = bk.installed_kernels(p["boot_dir"])
    kernel = bk.next_boot_kernel(dk.boot_listing(module), installed) or running
    fields = dk.modinfo(module, kernel)
    headers = bk.headers_present(kernel, p["modules_root"])
    facts = {"next_boot_kernel": kernel, "running_kernel": running, "module": fields, "headers": headers,
             "headers_package": headers_packages(kernel)[0]}
    problems = module_problems(kernel, p["version"], fields, facts["headers_package"], headers)
    facts["secure_boot"] = secure_boot_enabled(p["efivars_dir"])
    if facts["secure_boot"] and fields.get("filename"):
        cert, error = dk.read_certificate(p["module_signing_cert"]) if p["module_signing_cert"] else (None, None)
        if error:
            problems.append(("module_wrong_key", "the enrolled certificate cannot be read: %s" % error,
                             "point gpu_host_module_signing_cert at the enrolled certificate"))
        dkms_key = ms.framework_settings(dk.framework_texts(p["dkms_framework_conf"]))["mok_signing_key"][0]
        facts.update(dkms_signing_key=dkms_key, enrolled=enrolled(module, p["module_signing_cert"]))
        problems += signing_problems(kernel, fields, cert, p["module_signing_cert"], dkms_key, facts["enrolled"])
    unit = p["device_nodes_unit"]
    unit_text = read_text(os.path.join(p["systemd_dir"], unit))
    systemctl = module.get_bin_path("systemctl")
    show = parse_systemctl_show(module.run_command([systemctl, "show", unit, "-p", "UnitFileState", "-p", "Before"])[1]) \
        if systemctl else {}
    facts["unit"] = show
    problems += unit_problems(unit, show, unit_text)
    if p["vmid"] is not None:
        conf = read_text(os.path.join(p["config_dir"], "%d.conf" % p["vmid"]))
        if conf is None:
            problems.append(("ct_passthrough_unresolvable", "CT %d's config %s/%d.conf cannot be read" % (
                p["vmid"], p["config_dir"], p["vmid"]), "check the vmid (pct list) and run the check on the container's node"))
        facts["ct_devices"] = devn_paths(conf)
        problems += ct_problems(p["vmid"], facts["ct_devices"], unit_nodes(unit_text))
    problems += guest_problems(p, facts)
    return facts, problems
