# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stage 1 at runtime: the GPUs off vfio-pci now, never onto nouveau, and an honest reboot verdict.

What the kernel really exposes, and what the decisions rest on (linux v6.12 line numbers; the same
code in v6.1, so in PVE 8's 6.8):

- ``vfio-pci.ids=`` (command line) and ``options vfio-pci ids=`` are one module parameter declared
  ``module_param_string(ids, ids, sizeof(ids), 0)`` (drivers/vfio/pci/vfio_pci.c:33-34): permission 0,
  so there is no ``/sys/module/vfio_pci/parameters/ids`` (include/linux/moduleparam.h:111,
  kernel/params.c:832). At load, vfio_pci_fill_ids() (vfio_pci.c:208) turns each id into a
  *dynamic* id with pci_add_dynid() (vfio_pci.c:236), exactly like Proxmox's ``new_id``. So
  ``remove_id`` undoes them, and ``/proc/cmdline`` only says what was added at boot.
- The dynamic ids are not readable. remove_id answers -ENODEV once no entry matches
  (drivers/pci/pci-driver.c:295): removing until ENODEV (pci.remove_id_all) proves them gone.
  vfio-pci's own table matches only through driver_override (vfio_pci.c:192; pci_match_device,
  pci-driver.c:190-223), so after that a probe cannot hand the device back to vfio-pci, and if
  it does anyway (pci.release_from_vfio raises) something the kernel did not tell us still binds it.
- drivers_probe attaches registered drivers only; it loads no module (drivers/base/bus.c:309-322,
  bus_rescan_devices_helper 819-833). But udev loads every module whose alias matches a device at
  its "add" event, bound or not (systemd rules.d/80-drivers.rules:5), so a host without ``blacklist
  nouveau`` has nouveau loaded from boot with its PCI driver registered, and the first probe of an
  unbound A6000 gives it to nouveau (pci.nouveau_matches); the NVIDIA installer then refuses.

Hence: remove our dynamic ids; take selected functions off nouveau and unload it when nothing else
uses it; release from vfio-pci, probing only what nouveau cannot take; a reboot is required only for
what this could not make right.
"""

from __future__ import annotations

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import bootcfg
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pci


def new_report():
    return {"removed_dynamic_ids": [], "unbound": [], "runtime_actions": [], "runtime_errors": [], "reasons": [],
            "warnings": [], "changed": False,
            "nouveau": {"loaded": False, "unbound": [], "unloaded": False, "not_probed": []}}


def _error(report, err, reason=None):
    report["runtime_errors"].append(err.to_dict())
    if reason:
        report["reasons"].append(reason)


def remove_vfio_dynids(managed, sysfs_root, check_mode, report):
    """Take every managed id out of vfio-pci's dynamic ids (boot ``ids=`` and Proxmox ``new_id`` alike)."""
    for ident in managed:
        vendor, device = ident.split(":")
        try:
            n = pci.remove_id_all(pci.VFIO_DRIVER, vendor, device, sysfs_root, check_mode)
        except pci.PciError as e:
            _error(report, e, "removing %s from vfio-pci's dynamic ids failed: %s" % (ident, e.msg))
            continue
        if n:
            report["removed_dynamic_ids"].append(ident)
            report["runtime_actions"].append("vfio-pci: remove_id %s %s%s" % (vendor, device, " (x%d)" % n if n > 1 else ""))
            report["changed"] = report["changed"] or not check_mode


def keep_off_nouveau(selected, sysfs_root, check_mode, unload, report):
    """Unbind selected functions from nouveau, then unload nouveau when no device is left on it.

    ``unload(name)`` runs ``modprobe -r`` and returns ``(ok, message)``. Returns whether nouveau's
    PCI driver is still registered afterwards (then no selected display function may be probed).
    """
    info = report["nouveau"]
    info["loaded"] = pci.module_loaded(pci.NOUVEAU_DRIVER, sysfs_root)
    for d in selected:
        if d["driver"] != pci.NOUVEAU_DRIVER:
            continue
        try:
            pci.unbind(d["bdf"], sysfs_root, check_mode, driver=pci.NOUVEAU_DRIVER)
        except pci.PciError as e:
            _error(report, e, "%s is on nouveau and unbinding it failed: %s" % (d["bdf"], e.msg))
            continue
        info["unbound"].append(d["bdf"])
        report["runtime_actions"].append("%s: unbound from nouveau" % d["bdf"])
        report["changed"] = True
    if not info["loaded"]:
        return pci.driver_loaded(pci.NOUVEAU_DRIVER, sysfs_root)
    others = [d["bdf"] for d in pci.list_devices(sysfs_root)
              if d["driver"] == pci.NOUVEAU_DRIVER and not (check_mode and d["bdf"] in info["unbound"])]
    if others:
        report["warnings"].append("nouveau stays loaded: it drives %s, not selected" % ", ".join(others))
    elif check_mode:
        info["unloaded"] = True
        report["runtime_actions"].append("modprobe -r nouveau")
        return False
    else:
        ok, msg = unload(pci.NOUVEAU_DRIVER)
        info["unloaded"] = ok and not pci.module_loaded(pci.NOUVEAU_DRIVER, sysfs_root)
        report["runtime_actions"].append("modprobe -r nouveau -> %s" % ("unloaded" if info["unloaded"] else msg or "still loaded"))
        report["changed"] = report["changed"] or info["unloaded"]
    if pci.module_loaded(pci.NOUVEAU_DRIVER, sysfs_root) and not info["unloaded"]:
        report["reasons"].append("nouveau is loaded and could not be unloaded%s (the NVIDIA installer refuses while it "
                                 "is); the nouveau blacklist takes effect at the next boot" % (
                                     " (it drives %s)" % ", ".join(others) if others else ""))
    return pci.driver_loaded(pci.NOUVEAU_DRIVER, sysfs_root) and not (check_mode and info["unloaded"])


def release_functions(on_vfio, nouveau_registered, sysfs_root, check_mode, report):
    """Release each function from vfio-pci; probe it unless nouveau would take it."""
    for d in on_vfio:
        probe = not (nouveau_registered and pci.nouveau_matches(d))
        try:
            if pci.release_from_vfio(d["bdf"], sysfs_root=sysfs_root, check_mode=check_mode, probe=probe,
                                     actions=report["runtime_actions"]):
                report["changed"] = True
                if d["driver"] == pci.VFIO_DRIVER:
                    report["unbound"].append(d["bdf"])
        except pci.PciError as e:
            _error(report, e, "releasing %s at runtime failed: %s" % (d["bdf"], e.msg))
            continue
        if not probe:
            report["nouveau"]["not_probed"].append(d["bdf"])
            report["runtime_actions"].append("%s: not probed (nouveau would take it); left unbound for the NVIDIA driver"
                                             % d["bdf"])


def release(selected, managed, sysfs_root="/sys", check_mode=False, proc_cmdline="", disable_nouveau=True, unload=None):
    """The whole runtime step. ``selected``: pci.select_gpus() dicts as read before; ``managed``: their ids.

    Returns the report (see :func:`new_report`); ``reasons`` are why a reboot is still needed.
    """
    report = new_report()
    remove_vfio_dynids(managed, sysfs_root, check_mode, report)
    registered = False
    if disable_nouveau:
        registered = keep_off_nouveau(selected, sysfs_root, check_mode, unload or (lambda name: (False, "no unload")), report)
    # functions just taken off nouveau are probed too (by the NVIDIA driver when it is there), unless nouveau stays
    todo = [d for d in selected if d["driver"] == pci.VFIO_DRIVER or d["driver_override"] == pci.VFIO_DRIVER
            or d["bdf"] in report["nouveau"]["unbound"]]
    release_functions(todo, registered, sysfs_root, check_mode, report)
    boot_ids = sorted(bootcfg.cmdline_vfio_ids(proc_cmdline) & set(managed))
    if boot_ids and not pci.driver_loaded(pci.VFIO_DRIVER, sysfs_root):
        report["warnings"].append(
            "vfio-pci is not loaded and /proc/cmdline has vfio-pci.ids=%s: loading it before the next boot (a VM start "
            "with a hostpci device) adds them again and takes the GPUs if no driver holds them" % ",".join(boot_ids))
    return report


def verdict(selected, sysfs_root, report, check_mode):
    """Driver of each selected function after the run, and the reasons left over for a reboot."""
    bound = dict((d["bdf"], pci.current_driver(d["bdf"], sysfs_root)) for d in selected)
    if not check_mode:
        for drv, what in ((pci.VFIO_DRIVER, "still bound to vfio-pci"), (pci.NOUVEAU_DRIVER, "bound to nouveau")):
            left = sorted(b for b, now in bound.items() if now == drv)
            if left and not report["runtime_errors"]:
                report["reasons"].append("%s %s after the release" % (", ".join(left), what))
    return bound
