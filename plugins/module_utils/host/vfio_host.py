# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The steps of kpro.gpu_serving.vfio_release, one decision each; the module calls them in order.

select -> refusals (running VMs, reservations, vfio group holders) -> detach plan (stopped VMs) -> file plan
(bootcfg) and the regeneration commands -> apply (VM configs, files, commands) -> runtime release (vfio_runtime).
A known failure is raised as ``Failure`` (failure.py); ``module`` is the AnsibleModule (run_command, get_bin_path).
"""

from __future__ import annotations

import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import bootcfg
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pci
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pve_guests
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import vfio_runtime
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import read_text

PENDING_MARKER = "regeneration-pending"
SELECTED_KEYS = ("bdf", "id", "name", "class_name", "driver", "driver_override", "iommu_group", "selected_by")


def empty_result(sysfs_root):
    return dict(changed=False, selected=[], managed_ids=[], stopped_vms_referencing=[], detached=[], files=[],
                remaining_vfio_ids=[], keep_vfio_modules=True, commands=[], removed_dynamic_ids=[], unbound=[],
                bound_after={}, runtime_actions=[], runtime_errors=[], reboot_required=False, reboot_reasons=[],
                boot_vfio_ids=[], nouveau={"blacklist": None, "loaded": pci.module_loaded(pci.NOUVEAU_DRIVER, sysfs_root),
                                           "unbound": [], "unloaded": False, "not_probed": []})


# --------------------------------------------------------------------------- selection


def select(ids, include_group, sysfs_root):
    """(wanted ids, selected functions, managed ids); ``ids`` that are not vendor:device ids are bad_input."""
    try:
        wanted = sorted(bootcfg.norm_ids(ids))
    except ValueError as e:
        raise Failure("bad_input", "ids: %s" % e, remedy="Give PCI vendor:device ids such as 10de:2230.")
    devices = pci.list_devices(sysfs_root)
    problems = pci.gpu_id_problems(wanted, devices)  # a NIC's id would hand the NIC over: refused before anything
    if problems:
        raise Failure("bad_input", "ids: %s" % "; ".join(problems),
                      remedy="Give the vendor:device ids of the NVIDIA GPUs in gpu_host_vendor_device_ids (`lspci -nn -d "
                      "10de::0300` and `lspci -nn -d 10de::0302` list them), or none for every NVIDIA GPU; nothing was changed.")
    selected = pci.select_gpus(devices, ids=wanted or None, include_group=include_group)
    managed = sorted(set(wanted) | set(d["id"] for d in selected))
    return wanted, selected, managed


def public_selected(selected):
    return [dict((k, d.get(k)) for k in SELECTED_KEYS) for d in selected]


def device_label(bdfs, by_bdf):
    names = []
    for b in bdfs:
        d = by_bdf.get(b)
        if d and d.get("selected_by") == "id" and d["name"] not in names:
            names.append(d["name"])
    if not names:
        for b in bdfs:
            d = by_bdf.get(b)
            if d and d["name"] not in names:
                names.append(d["name"])
    return ", ".join(names)


def public_vm(vm):
    return {"vmid": vm["vmid"], "name": vm["name"], "onboot": vm["onboot"], "path": vm["path"],
            "references": vm["references"]}


def read_mappings(etc_root, node):
    try:
        return pve_guests.read_pci_mappings(os.path.join(etc_root, "pve", "mapping", "pci.cfg"), node)
    except (IOError, OSError) as e:
        raise Failure("host_config_unreadable", "cannot read the PCI resource mappings: %s" % e)


def running_checker(module, method, run_root, proc_root):
    """is_running(vmid) by QEMU's pidfile, or by ``qm status``."""
    if method == "qm":
        return pve_guests.make_qm_status_checker(module.run_command, module.get_bin_path("qm", required=True))

    def is_running(vmid):
        return pve_guests.pidfile_running(vmid, run_root, proc_root)
    return is_running


def other_vfio_users(etc_root, selected, mappings):
    """(vmid, key) of hostpci entries in any VM that cover a device outside the selection."""
    sel = set(d["bdf"] for d in selected)
    slots = set(d["slot"] for d in selected)
    out = []
    for vmid, path in pve_guests.list_vm_configs(etc_root):
        cfg = pve_guests.parse_vm_config(read_text(path) or "")
        for key, value in sorted(cfg["main"].items()):
            if not key.startswith("hostpci"):
                continue
            parsed = pve_guests.parse_hostpci(value)
            ids = parsed["host"] if parsed["mapping"] is None else mappings.get(parsed["mapping"], [])
            if any(not ((i in sel) if "." in i else (i in slots)) for i in ids):
                out.append((vmid, key))
    return out


# --------------------------------------------------------------------------- refusals


def split_vms(vms, is_running, reservations, by_bdf):
    """(refusals for running or starting VMs, the stopped VMs)."""
    refusals, stopped = [], []
    for vm in vms:
        running = is_running(vm["vmid"])
        reserved = [pid_ for pid_, vmid in reservations.items() if vmid == vm["vmid"]]
        if not (running or reserved):
            stopped.append(vm)
            continue
        for ref in vm["references"]:
            refusals.append("VM %s (%s) is %s with %s = %s (%s); stop it or remove the device first" % (
                vm["vmid"], vm["name"] or "no name", "running" if running else "starting",
                ref["key"] if ref["section"] == "main" else "%s [PENDING]" % ref["key"],
                ref["value"], device_label(ref["bdfs"], by_bdf)))
    return refusals, stopped


def reservation_refusals(reservations, vms, by_bdf, run_root):
    """Reservations by a VM whose config does not reference the device (hand-made qemu start, another node's config)."""
    out = []
    for pciid, vmid in sorted(reservations.items()):
        hit = [b for b in by_bdf if pve_guests.pciid_covers(pciid, b)]
        if hit and vmid not in [v["vmid"] for v in vms]:
            out.append("VM %s holds a PCI reservation for %s (%s) in %s/qemu-server/pci-id-reservations; stop it first" % (
                vmid, pciid, device_label(hit, by_bdf), run_root))
    return out


def group_holder_refusals(selected, proc_root, dev_root):
    """Processes holding /dev/vfio/<group> open for a selected group on vfio-pci."""
    out = []
    groups = sorted(set(d["iommu_group"] for d in selected if d["iommu_group"] is not None and d["driver"] == pci.VFIO_DRIVER))
    for g in groups:
        holders = pci.vfio_group_holders(g, proc_root, dev_root)
        if holders:
            members = [d["bdf"] for d in selected if d["iommu_group"] == g]
            out.append("%s/vfio/%s (IOMMU group %s: %s) is held open by PID %s (a VM or other vfio user); "
                       "stop it first" % (dev_root, g, g, ", ".join(members), ", ".join(str(x) for x in holders)))
    return out


def refuse(refusals, by_bdf):
    if refusals:
        raise Failure("gpu_in_use", "refusing to release %s, nothing was changed: %s" % (", ".join(sorted(by_bdf)), "; ".join(refusals)),
                      remedy="Stop the VMs or processes named, or remove the device from them, then re-run.",
                      evidence=refusals, refusals=refusals)


# --------------------------------------------------------------------------- plans


def detach_plan(stopped, mode, warnings):
    """[(vm, before, after, remove_keys, changes)] for the stopped VMs that O(detach_stopped_vms) changes."""
    plan = []
    for vm in stopped:
        refs = ", ".join("%s = %s" % (r["key"], r["value"]) for r in vm["references"])
        name = vm["name"] or "no name"
        if mode == "none":
            warnings.append("VM %s (%s) is stopped but references the GPUs (%s)%s: it takes them back when it starts; "
                            "remove the device or set detach_stopped_vms" % (
                                vm["vmid"], name, refs, " and has onboot: 1" if vm["onboot"] else ""))
            continue
        remove_keys = [(r["section"], r["key"]) for r in vm["references"]] if mode in ("hostpci", "both") else []
        before = read_text(vm["path"]) or ""
        after, changes = pve_guests.detach_text(before, remove_keys, set_onboot_zero=mode in ("onboot", "both"))
        if mode == "onboot":
            warnings.append("VM %s (%s) keeps %s: starting it by hand takes the GPUs back" % (vm["vmid"], name, refs))
        if after != before:
            plan.append((vm, before, after, remove_keys, changes))
    return plan


def file_plan(p, managed, extra_users, warnings):
    """bootcfg's plan of the persistent bindings; its warnings go to ``warnings``."""
    try:
        plan = bootcfg.plan(managed, p["etc_root"], drop_framebuffer_tokens=p["drop_framebuffer_tokens"],
                            remove_nvidia_blacklist=p["remove_nvidia_blacklist"], vfio_modules=p["vfio_modules"],
                            extra_vfio_users=bool(extra_users), blacklist_nouveau=p["disable_nouveau"])
    except (IOError, OSError) as e:
        raise Failure("host_config_unreadable", "cannot read a boot configuration file: %s" % e)
    for f in plan["files"]:
        for c in f["changes"]:
            if c["action"] == "warning":
                warnings.append("%s line %s: %s" % (f["path"], c["line"], c["detail"]))
    return plan


def pending_kinds(backup_dir):
    return set((read_text(os.path.join(backup_dir, PENDING_MARKER)) or "").split())


def commands(p, plan, pending):
    """[(kind, argv)]: the initramfs and boot refreshes that a changed file (or a failed earlier run) calls for."""
    out = []
    if p["regenerate_initramfs"] and (plan["initramfs_changed"] or "initramfs" in pending):
        out.append(("initramfs", p["update_initramfs_cmd"] or ["update-initramfs", "-u", "-k", "all"]))
    if p["refresh_boot"] and (plan["boot_cmdline_changed"] or "boot" in pending):
        default = (["proxmox-boot-tool", "refresh"] if os.path.exists(os.path.join(p["etc_root"], "kernel", "proxmox-boot-uuids"))
                   else ["update-grub"])
        out.append(("boot", p["boot_refresh_cmd"] or default))
    return out


def diffs(detach, changed_files):
    out = [{"before_header": vm["path"], "after_header": vm["path"], "before": before, "after": after}
           for vm, before, after, _k, _c in detach]
    return out + [{"before_header": f["path"], "after_header": f["path"], "before": f["before"], "after": f["after"]}
                  for f in changed_files]


# --------------------------------------------------------------------------- apply


def apply_detach(p, detach, is_running, out):
    """Detach the stopped VMs under their config locks, after a backup; each one done is added to ``out``."""
    set_onboot_zero = p["detach_stopped_vms"] in ("onboot", "both")
    for vm, _before, _after, remove_keys, _changes in detach:
        with pve_guests.ConfigLock(vm["vmid"], os.path.join(p["run_root"], "lock", "qemu-server")):
            if is_running(vm["vmid"]):
                raise Failure("gpu_in_use", "VM %s (%s) started while this ran; nothing more was changed: stop it and re-run" % (
                    vm["vmid"], vm["name"]))
            new, changes = pve_guests.detach_text(read_text(vm["path"]) or "", remove_keys, set_onboot_zero=set_onboot_zero)
            backup = pve_guests.backup_file(vm["path"], p["backup_dir"])
            pve_guests.atomic_write(vm["path"], new.encode("utf-8", "surrogateescape"), preserve_mode=False)
        out.append({"vmid": vm["vmid"], "path": vm["path"], "changes": changes, "backup": backup})


def write_marker(backup_dir, kinds):
    marker = os.path.join(backup_dir, PENDING_MARKER)
    if kinds:
        os.makedirs(backup_dir, 0o700, exist_ok=True)
        with open(marker, "w") as fh:
            fh.write("\n".join(sorted(kinds)) + "\n")
    elif os.path.exists(marker):
        os.unlink(marker)


def apply_files(changed_files, backup_dir, out):
    """Write the changed boot files after a backup; each one written is added to ``out``."""
    for f in changed_files:
        backup = pve_guests.backup_file(f["path"], backup_dir) if os.path.exists(f["path"]) else None
        pve_guests.atomic_write(f["path"], f["after"].encode("utf-8", "surrogateescape"), preserve_mode=True)
        out.append({"path": f["path"], "kind": f["kind"], "backup": backup, "changes": f["changes"]})


def apply_writes(p, detach, changed_files, cmds, pending, is_running, result):
    """VM configs, the pending marker (before the files, so a failed regeneration is retried), the boot files."""
    try:
        apply_detach(p, detach, is_running, result["detached"])
        if cmds:
            write_marker(p["backup_dir"], set(k for k, _c in cmds) | pending)
        apply_files(changed_files, p["backup_dir"], result["files"])
    except (IOError, OSError, pve_guests.GuestError) as e:
        raise Failure("host_write_failed", "writing failed: %s" % e)


def run_commands(module, p, cmds, pending):
    """Run the regeneration commands; the marker keeps what is still pending."""
    for kind, cmd in cmds:
        argv = list(cmd)
        if not os.path.isabs(argv[0]):
            found = module.get_bin_path(argv[0])
            if not found:
                raise Failure("boot_refresh_failed", "%s not found: install it, or set %s" % (
                    argv[0], "update_initramfs_cmd" if kind == "initramfs" else "boot_refresh_cmd"))
            argv[0] = found
        rc, out, err = module.run_command(argv)
        if rc != 0:
            raise Failure("boot_refresh_failed", "%s failed (rc=%s); the files are changed, re-run to retry: %s" % (
                " ".join(cmd), rc, (err or out).strip()[-2000:]), rc=rc, stdout=out, stderr=err)
        pending.discard(kind)
    if cmds:
        write_marker(p["backup_dir"], pending - set(k for k, _c in cmds))


def check_mode_report(detach, changed_files, result):
    result["detached"] = [{"vmid": vm["vmid"], "path": vm["path"], "changes": ch, "backup": None}
                          for vm, _b, _a, _k, ch in detach]
    result["files"] = [{"path": f["path"], "kind": f["kind"], "backup": None, "changes": f["changes"]} for f in changed_files]


# --------------------------------------------------------------------------- runtime


def runtime(module, p, selected, managed, result, warnings):
    """The runtime release (vfio_runtime.release) and the reboot verdict; returns the reboot reasons."""
    sysfs_root = p["sysfs_root"]
    live_cmdline = read_text(os.path.join(p["proc_root"], "cmdline")) or ""
    # the running kernel's own blacklist of the NVIDIA modules lasts until it is rebooted without it
    reasons = []
    blk = sorted(bootcfg.cmdline_blacklisted_nvidia(live_cmdline))
    if blk and p["remove_nvidia_blacklist"]:
        reasons.append("the running kernel was booted with modprobe.blacklist=%s" % ",".join(blk))
    result["boot_vfio_ids"] = sorted(bootcfg.cmdline_vfio_ids(live_cmdline) & set(managed))
    if not p["runtime_unbind"]:
        on_vfio = [d["bdf"] for d in selected if pci.VFIO_DRIVER in (d["driver"], d["driver_override"])]
        if on_vfio:
            reasons.append("runtime_unbind is false and %s %s on vfio-pci" % (", ".join(on_vfio), "is" if len(on_vfio) == 1 else "are"))
        result["bound_after"] = dict((d["bdf"], pci.current_driver(d["bdf"], sysfs_root)) for d in selected)
        return reasons

    def unload(name):
        rc, out, err = module.run_command([module.get_bin_path("modprobe") or "modprobe", "-r", name])
        return rc == 0, (err or out).strip()[-500:]

    rep = vfio_runtime.release(selected, managed, sysfs_root, module.check_mode, live_cmdline, p["disable_nouveau"], unload)
    result["bound_after"] = vfio_runtime.verdict(selected, sysfs_root, rep, module.check_mode)
    for key in ("removed_dynamic_ids", "unbound", "runtime_actions", "runtime_errors"):
        result[key] = rep[key]
    result["nouveau"].update(rep["nouveau"])
    warnings.extend(rep["warnings"] + [e["msg"] for e in rep["runtime_errors"]])
    result["changed"] = result["changed"] or rep["changed"]
    return reasons + rep["reasons"]
