#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vfio_release
short_description: Release GPUs from vfio-pci on a Proxmox VE host, persistently and at runtime
version_added: "0.1.0"
description:
  - Selects GPUs by PCI vendor:device id (default every NVIDIA display function), plus the other functions of
    their slots (HDMI audio) and every non-bridge function of their IOMMU groups.
  - Refuses, changing nothing, while a B(running) VM references any selected function through a C(hostpciN)
    line (by address or through a PCI resource mapping in C(/etc/pve/mapping/pci.cfg)), or while a process holds
    C(/dev/vfio/<group>) open.
  - Reports stopped VMs that reference them (they would take the GPUs back when they start; with C(onboot=1)
    at the next boot) and, only when asked with O(detach_stopped_vms), removes the C(hostpciN) lines and/or sets
    C(onboot) to 0, after a backup.
  - Removes only the managed ids from every persistent binding, keeping every other token and line byte for byte.
  - The kernel command line in C(/etc/kernel/cmdline) and in C(GRUB_CMDLINE_LINUX[_DEFAULT]) of C(/etc/default/grub) and
    C(/etc/default/grub.d/*.cfg) (C(vfio-pci.ids=), C(vfio_pci.ids=), NVIDIA modules in C(modprobe.blacklist=)).
  - C(/etc/modprobe.d/*.conf) (C(options vfio-pci ids=), the vfio-pci softdep of the GPU drivers, C(blacklist nvidia*),
    C(install nvidia* /bin/false)).
  - The vfio lines of C(/etc/modules), C(/etc/modules-load.d/*.conf) and C(/etc/initramfs-tools/modules), only when no
    other device stays on vfio-pci (see O(vfio_modules)).
  - C(blacklist nouveau) is kept on purpose (the NVIDIA driver needs nouveau off), as are C(blacklist nvidiafb),
    C(intel_iommu=on) and C(iommu=pt). When no modprobe.d file blacklists nouveau, one is added (see O(disable_nouveau)).
  - Regenerates the initramfs and refreshes the boot entries once, and only when a file they depend on changed
    (or a previous run changed files and its regeneration failed).
  - At runtime, removes the managed ids from vfio-pci's dynamic ids until the kernel answers ENODEV (Proxmox adds
    them with C(new_id) at VM start, and the kernel adds those of C(vfio-pci.ids=) / C(options vfio-pci ids=) the
    same way when vfio-pci loads), then for each selected function on vfio-pci clears a vfio-pci C(driver_override),
    unbinds it and asks the kernel to probe a driver for it (C(drivers_probe)), except where nouveau would take it.
  - Never leaves the GPUs on nouveau (see O(disable_nouveau)).
  - Reports honestly whether a reboot is still needed, see RV(reboot_required).
author:
  - kpro.gpu_serving contributors (!UNKNOWN)
options:
  ids:
    description:
      - PCI vendor:device ids of the GPUs to release, for example C(10de:2230).
      - Default is every NVIDIA (vendor C(10de)) display-class function on the host.
      - The functions of the same slots and IOMMU groups are always added, and their ids are managed too.
    type: list
    elements: str
  include_iommu_group:
    description: Add every non-bridge function of the selected functions' IOMMU groups (Proxmox binds whole groups).
    type: bool
    default: true
  detach_stopped_vms:
    description:
      - What to do with stopped VMs whose config still references a selected function.
      - C(none) reports them in RV(stopped_vms_referencing) and warns.
      - C(hostpci) removes the referencing C(hostpciN) lines (main and pending sections; snapshots are left as
        they are), C(onboot) sets C(onboot) to 0, C(both) does both.
      - A backup of each changed config is written under O(backup_dir) (outside C(/etc/pve)).
    type: str
    choices: [none, hostpci, onboot, both]
    default: none
  vm_status_method:
    description:
      - How to tell whether a VM runs. C(pidfile) is Proxmox's own check (C(/run/qemu-server/<vmid>.pid) names a
        live process started with that C(-pidfile)); C(qm) runs C(qm status <vmid>).
      - Live entries in C(/run/qemu-server/pci-id-reservations) count as running in both cases.
    type: str
    choices: [pidfile, qm]
    default: pidfile
  node:
    description: Proxmox node name, to pick this node's entries of PCI resource mappings. Default is the short host name.
    type: str
  runtime_unbind:
    description: Release the selected functions from vfio-pci now, through sysfs. When false, only files change.
    type: bool
    default: true
  regenerate_initramfs:
    description: Run O(update_initramfs_cmd) when a modprobe.d or modules file changed.
    type: bool
    default: true
  refresh_boot:
    description: Run O(boot_refresh_cmd) when a kernel command line file changed.
    type: bool
    default: true
  update_initramfs_cmd:
    description: Command (argv) that regenerates the initramfs. Default C(update-initramfs -u -k all).
    type: list
    elements: str
  boot_refresh_cmd:
    description:
      - Command (argv) that applies a kernel command line change to the boot entries.
      - Default C(proxmox-boot-tool refresh) when C(<etc_root>/kernel/proxmox-boot-uuids) exists, else C(update-grub).
    type: list
    elements: str
  drop_framebuffer_tokens:
    description:
      - Also remove the passthrough-only command line tokens C(video=efifb:off), C(video=vesafb:off),
        C(video=simplefb:off), C(nofb), C(nomodeset) and C(initcall_blacklist=sysfb_init).
    type: bool
    default: false
  remove_nvidia_blacklist:
    description:
      - Remove C(blacklist nvidia*), C(install nvidia* /bin/false), C(alias nvidia* off) lines, the vfio-pci softdep of
        the GPU drivers and NVIDIA modules in C(modprobe.blacklist=) (the host driver needs them gone).
    type: bool
    default: true
  disable_nouveau:
    description:
      - Keep nouveau off the GPUs, which the NVIDIA driver needs. A host that does not blacklist nouveau has it loaded
        from boot (udev loads it for the GPU's alias even while vfio-pci holds the GPU), and the probe after the
        release would hand the GPUs to it.
      - Adds C(<etc_root>/modprobe.d/kpro-gpu-serving-nouveau.conf) (C(blacklist nouveau), C(options nouveau modeset=0),
        what nvidia-installer writes) when no modprobe.d file blacklists nouveau, and regenerates the initramfs.
      - At runtime unbinds selected functions from nouveau, unloads nouveau (C(modprobe -r nouveau)) when no other
        device uses it, and does not probe a display function that nouveau could still take.
    type: bool
    default: true
  vfio_modules:
    description:
      - The vfio lines of C(/etc/modules) and friends. C(auto) removes them only when no id is left in any vfio-pci
        binding and no VM references another PCI device; C(keep) never removes them; C(remove) always does.
      - The softdep of C(snd_hda_intel) on vfio-pci follows the same decision.
    type: str
    choices: [auto, keep, remove]
    default: auto
  backup_dir:
    description: Where backups of changed files go (a tree mirroring their paths, with a timestamp suffix).
    type: path
    default: /var/backups/kpro-gpu-serving
  sysfs_root:
    description: Root of sysfs (tests use a fake tree).
    type: path
    default: /sys
  etc_root:
    description: The directory used as C(/etc), including C(pve/qemu-server) and C(pve/mapping).
    type: path
    default: /etc
  proc_root:
    description: Root of procfs (C(cmdline), VM processes).
    type: path
    default: /proc
  run_root:
    description: The directory used as C(/run) (VM pidfiles, PCI reservations, locks).
    type: path
    default: /run
  dev_root:
    description: The directory used as C(/dev) (C(/dev/vfio/<group>) holders).
    type: path
    default: /dev
attributes:
  check_mode:
    support: full
    description: Can run in check_mode and return changed status prediction without modifying target.
    details: Computes every change, runs no command and writes nothing; runtime steps are reported as they would happen.
  diff_mode:
    support: full
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    details: Before/after of every file and VM config it changes.
notes:
  - Run on the Proxmox host as root. Stage 1 of the kpro.gpu_serving migration; the NVIDIA driver is installed afterwards
    (M(kpro.gpu_serving.nvidia_driver)), so RV(bound_after) is often V(null) for the GPU functions, which is fine.
  - Only the local node's VM configs (C(/etc/pve/qemu-server)) are read.
seealso:
  - module: kpro.gpu_serving.nvidia_driver
"""

EXAMPLES = r"""
- name: Release every NVIDIA GPU from vfio-pci
  kpro.gpu_serving.vfio_release:
  register: release

- name: Release the RTX A6000s, turning off autostart of stopped VMs that still reference them
  kpro.gpu_serving.vfio_release:
    ids: ["10de:2230"]
    detach_stopped_vms: onboot

- name: Reboot when the running kernel still binds them
  ansible.builtin.reboot:
  when: release.reboot_required and allow_reboot | default(false)

- name: See what would change
  kpro.gpu_serving.vfio_release:
  check_mode: true
  diff: true
"""

RETURN = r"""
selected:
  description: The functions released (or that would be), with their driver before the run.
  returned: always
  type: list
  elements: dict
  sample: [{"bdf": "0000:17:00.0", "id": "10de:2230", "name": "NVIDIA RTX A6000", "driver": "vfio-pci",
            "iommu_group": 42, "selected_by": "id"}]
managed_ids:
  description: The vendor:device ids removed from the bindings.
  returned: always
  type: list
  elements: str
  sample: ["10de:1aef", "10de:2230"]
stopped_vms_referencing:
  description: Stopped VMs whose config references a selected function.
  returned: always
  type: list
  elements: dict
  sample: [{"vmid": 105, "name": "win-gaming", "onboot": true, "references": [{"key": "hostpci0", "section": "main",
            "value": "0000:17:00,pcie=1", "bdfs": ["0000:17:00.0", "0000:17:00.1"], "via": "host"}]}]
detached:
  description: VM configs changed (or that would be) by O(detach_stopped_vms), with what changed.
  returned: always
  type: list
  elements: dict
  sample: [{"vmid": 105, "path": "/etc/pve/qemu-server/105.conf", "changes": ["onboot: 1 -> onboot: 0"],
            "backup": "/var/backups/kpro-gpu-serving/etc/pve/qemu-server/105.conf.20260102T030405"}]
files:
  description: Every file that was (or would be) changed, with the line-level changes.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/kernel/cmdline", "kind": "kernel_cmdline", "backup": null,
            "changes": [{"line": 1, "action": "modified", "detail": "removed 10de:2230,10de:1aef from vfio-pci.ids"}]}]
remaining_vfio_ids:
  description: Ids that stay in some vfio-pci binding (other passed-through devices).
  returned: always
  type: list
  elements: str
  sample: ["1b21:1242"]
keep_vfio_modules:
  description: Whether the vfio module lines were kept (some other device still uses vfio-pci, or O(vfio_modules=keep)).
  returned: always
  type: bool
commands:
  description: The commands run (or that would be), each at most once.
  returned: always
  type: list
  elements: list
  sample: [["update-initramfs", "-u", "-k", "all"], ["proxmox-boot-tool", "refresh"]]
removed_dynamic_ids:
  description:
    - Ids removed from vfio-pci's dynamic ids (C(remove_id), repeated until the kernel answers ENODEV); in check mode,
      those that would be tried.
  returned: always
  type: list
  elements: str
unbound:
  description: Functions taken off vfio-pci (would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["0000:17:00.0", "0000:17:00.1"]
bound_after:
  description:
    - Driver of each selected function after the run (V(null) when none claims it, normal before the NVIDIA driver
      is installed). In check mode, the current driver.
  returned: always
  type: dict
  sample: {"0000:17:00.0": null, "0000:17:00.1": "snd_hda_intel"}
runtime_actions:
  description: The sysfs steps taken, in order.
  returned: always
  type: list
  elements: str
runtime_errors:
  description: Runtime steps that failed (the persistent changes are still made; a reboot finishes the job).
  returned: always
  type: list
  elements: dict
nouveau:
  description:
    - C(blacklist) is the modprobe.d file written (would be, in check mode) to keep nouveau off, or V(null) when one
      already did. C(loaded) whether nouveau was loaded before the runtime step, C(unbound) the selected functions
      taken off it, C(unloaded) whether it was unloaded, C(not_probed) the functions left unbound because nouveau,
      still loaded, would have taken them.
  returned: always
  type: dict
  sample: {"blacklist": "/etc/modprobe.d/kpro-gpu-serving-nouveau.conf", "loaded": true, "unbound": [], "unloaded": true,
           "not_probed": []}
boot_vfio_ids:
  description:
    - Managed ids that C(vfio-pci.ids=) on C(/proc/cmdline) gave vfio-pci at boot. The kernel adds them as dynamic ids,
      so they are removed at runtime like Proxmox's; a reboot is not needed for them.
  returned: always
  type: list
  elements: str
reboot_required:
  description:
    - True only when the runtime state could not be made right without a reboot, that is when after the runtime
      step a selected function is still on vfio-pci or nouveau, removing a dynamic id or releasing a function failed,
      nouveau stays loaded, C(/proc/cmdline) blacklists an NVIDIA module, or the runtime step was skipped
      (O(runtime_unbind=false)) while a function is on vfio-pci. C(vfio-pci.ids=) on C(/proc/cmdline) alone is not a
      reason (see RV(boot_vfio_ids)).
  returned: always
  type: bool
reboot_reasons:
  description: Why RV(reboot_required) is true.
  returned: always
  type: list
  elements: str
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils import bootcfg
from ansible_collections.kpro.gpu_serving.plugins.module_utils import pci
from ansible_collections.kpro.gpu_serving.plugins.module_utils import pve_guests
from ansible_collections.kpro.gpu_serving.plugins.module_utils import vfio_runtime

PENDING_MARKER = "regeneration-pending"


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (IOError, OSError):
        return None


def _device_label(bdfs, by_bdf):
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


def _public_vm(vm):
    return {"vmid": vm["vmid"], "name": vm["name"], "onboot": vm["onboot"], "path": vm["path"],
            "references": vm["references"]}


def _other_vfio_users(etc_root, selected, mappings):
    """(vmid, key) of hostpci entries in any VM that cover a device outside the selection."""
    sel = set(d["bdf"] for d in selected)
    slots = set(d["slot"] for d in selected)
    out = []
    for vmid, path in pve_guests.list_vm_configs(etc_root):
        cfg = pve_guests.parse_vm_config(_read(path) or "")
        for key, value in sorted(cfg["main"].items()):
            if not key.startswith("hostpci"):
                continue
            parsed = pve_guests.parse_hostpci(value)
            ids = parsed["host"] if parsed["mapping"] is None else mappings.get(parsed["mapping"], [])
            for i in ids:
                ours = (i in sel) if "." in i else (i in slots)
                if not ours:
                    out.append((vmid, key))
                    break
    return out


def _runtime(module, p, selected, managed, result, warnings):
    """The runtime release (vfio_runtime.release) and the reboot verdict; returns the reboot reasons."""
    check, sysfs_root = module.check_mode, p["sysfs_root"]
    live_cmdline = _read(os.path.join(p["proc_root"], "cmdline")) or ""
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

    rep = vfio_runtime.release(selected, managed, sysfs_root, check, live_cmdline, p["disable_nouveau"], unload)
    result["bound_after"] = vfio_runtime.verdict(selected, sysfs_root, rep, check)
    for key in ("removed_dynamic_ids", "unbound", "runtime_actions", "runtime_errors"):
        result[key] = rep[key]
    result["nouveau"].update(rep["nouveau"])
    warnings.extend(rep["warnings"] + [e["msg"] for e in rep["runtime_errors"]])
    result["changed"] = result["changed"] or rep["changed"]
    return reasons + rep["reasons"]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ids=dict(type="list", elements="str"),
            include_iommu_group=dict(type="bool", default=True),
            detach_stopped_vms=dict(type="str", default="none", choices=["none", "hostpci", "onboot", "both"]),
            vm_status_method=dict(type="str", default="pidfile", choices=["pidfile", "qm"]),
            node=dict(type="str"),
            runtime_unbind=dict(type="bool", default=True),
            regenerate_initramfs=dict(type="bool", default=True),
            refresh_boot=dict(type="bool", default=True),
            update_initramfs_cmd=dict(type="list", elements="str"),
            boot_refresh_cmd=dict(type="list", elements="str"),
            drop_framebuffer_tokens=dict(type="bool", default=False),
            remove_nvidia_blacklist=dict(type="bool", default=True),
            disable_nouveau=dict(type="bool", default=True),
            vfio_modules=dict(type="str", default="auto", choices=["auto", "keep", "remove"]),
            backup_dir=dict(type="path", default="/var/backups/kpro-gpu-serving"),
            sysfs_root=dict(type="path", default="/sys"),
            etc_root=dict(type="path", default="/etc"),
            proc_root=dict(type="path", default="/proc"),
            run_root=dict(type="path", default="/run"),
            dev_root=dict(type="path", default="/dev"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    check = module.check_mode
    sysfs_root, etc_root, proc_root, run_root = p["sysfs_root"], p["etc_root"], p["proc_root"], p["run_root"]
    warnings = []
    result = dict(changed=False, selected=[], managed_ids=[], stopped_vms_referencing=[], detached=[], files=[],
                  remaining_vfio_ids=[], keep_vfio_modules=True, commands=[], removed_dynamic_ids=[], unbound=[],
                  bound_after={}, runtime_actions=[], runtime_errors=[], reboot_required=False, reboot_reasons=[],
                  boot_vfio_ids=[], nouveau={"blacklist": None, "loaded": pci.module_loaded(pci.NOUVEAU_DRIVER, sysfs_root),
                                             "unbound": [], "unloaded": False, "not_probed": []})

    # ------------------------------------------------------------------ selection
    try:
        wanted = sorted(bootcfg.norm_ids(p["ids"]))
    except ValueError as e:
        module.fail_json(msg="ids: %s" % e, **result)
    devices = pci.list_devices(sysfs_root)
    selected = pci.select_gpus(devices, ids=wanted or None, include_group=p["include_iommu_group"])
    by_bdf = dict((d["bdf"], d) for d in selected)
    managed = sorted(set(wanted) | set(d["id"] for d in selected))
    keys = ("bdf", "id", "name", "class_name", "driver", "driver_override", "iommu_group", "selected_by")
    result["selected"] = [dict((k, d.get(k)) for k in keys) for d in selected]
    result["managed_ids"] = managed
    if not managed:
        module.warn("no NVIDIA display function found under %s/bus/pci/devices and no ids given: nothing to release" % sysfs_root)
        module.exit_json(**result)
    if wanted and not selected:
        warnings.append("no PCI function with id %s is present; only the persistent bindings are cleaned" % ", ".join(wanted))

    # ------------------------------------------------------------------ VMs
    node = p["node"] or socket.gethostname().split(".")[0]
    try:
        mappings = pve_guests.read_pci_mappings(os.path.join(etc_root, "pve", "mapping", "pci.cfg"), node)
    except (IOError, OSError) as e:
        module.fail_json(msg="cannot read the PCI resource mappings: %s" % e, **result)
    vms = pve_guests.find_references(etc_root, [d["bdf"] for d in selected], mappings)
    if p["vm_status_method"] == "qm":
        qm = module.get_bin_path("qm", required=True)
        is_running = pve_guests.make_qm_status_checker(module.run_command, qm)
    else:
        def is_running(vmid):
            return pve_guests.pidfile_running(vmid, run_root, proc_root)
    reservations = pve_guests.pci_reservations(run_root, proc_root)
    refusals = []
    stopped = []
    for vm in vms:
        try:
            running = is_running(vm["vmid"])
        except pve_guests.GuestError as e:
            module.fail_json(msg=str(e), **result)
        reserved = [pid_ for pid_, vmid in reservations.items() if vmid == vm["vmid"]]
        if running or reserved:
            for ref in vm["references"]:
                refusals.append("VM %s (%s) is %s with %s = %s (%s); stop it or remove the device first" % (
                    vm["vmid"], vm["name"] or "no name", "running" if running else "starting",
                    ref["key"] if ref["section"] == "main" else "%s [PENDING]" % ref["key"],
                    ref["value"], _device_label(ref["bdfs"], by_bdf)))
        else:
            stopped.append(vm)
    # reservations by a VM whose config does not reference the device (hand-made qemu start, another node's config)
    for pciid, vmid in sorted(reservations.items()):
        hit = [b for b in by_bdf if pve_guests.pciid_covers(pciid, b)]
        if hit and vmid not in [v["vmid"] for v in vms]:
            refusals.append("VM %s holds a PCI reservation for %s (%s) in %s/qemu-server/pci-id-reservations; stop it first" % (
                vmid, pciid, _device_label(hit, by_bdf), run_root))
    if p["runtime_unbind"]:
        groups = sorted(set(d["iommu_group"] for d in selected if d["iommu_group"] is not None and d["driver"] == pci.VFIO_DRIVER))
        for g in groups:
            holders = pci.vfio_group_holders(g, proc_root, p["dev_root"])
            if holders:
                members = [d["bdf"] for d in selected if d["iommu_group"] == g]
                refusals.append("%s/vfio/%s (IOMMU group %s: %s) is held open by PID %s (a VM or other vfio user); "
                                "stop it first" % (p["dev_root"], g, g, ", ".join(members), ", ".join(str(x) for x in holders)))
    if refusals:
        module.fail_json(msg="refusing to release %s, nothing was changed: %s" % (", ".join(sorted(by_bdf)), "; ".join(refusals)),
                         refusals=refusals, **result)

    result["stopped_vms_referencing"] = [_public_vm(v) for v in stopped]
    mode = p["detach_stopped_vms"]
    diffs = []
    detach_plan = []
    for vm in stopped:
        refs = ", ".join("%s = %s" % (r["key"], r["value"]) for r in vm["references"])
        if mode == "none":
            warnings.append("VM %s (%s) is stopped but references the GPUs (%s)%s: it takes them back when it starts; "
                            "remove the device or set detach_stopped_vms" % (
                                vm["vmid"], vm["name"] or "no name", refs, " and has onboot: 1" if vm["onboot"] else ""))
            continue
        remove_keys = [(r["section"], r["key"]) for r in vm["references"]] if mode in ("hostpci", "both") else []
        before = _read(vm["path"]) or ""
        after, changes = pve_guests.detach_text(before, remove_keys, set_onboot_zero=mode in ("onboot", "both"))
        if mode == "onboot":
            warnings.append("VM %s (%s) keeps %s: starting it by hand takes the GPUs back" % (vm["vmid"], vm["name"] or "no name", refs))
        if after != before:
            detach_plan.append((vm, before, after, remove_keys, changes))
            diffs.append({"before_header": vm["path"], "after_header": vm["path"], "before": before, "after": after})

    # ------------------------------------------------------------------ files
    extra_users = _other_vfio_users(etc_root, selected, mappings)
    try:
        plan = bootcfg.plan(managed, etc_root, drop_framebuffer_tokens=p["drop_framebuffer_tokens"],
                            remove_nvidia_blacklist=p["remove_nvidia_blacklist"], vfio_modules=p["vfio_modules"],
                            extra_vfio_users=bool(extra_users), blacklist_nouveau=p["disable_nouveau"])
    except (IOError, OSError) as e:
        module.fail_json(msg="cannot read a boot configuration file: %s" % e, **result)
    result["remaining_vfio_ids"] = plan["remaining_vfio_ids"]
    result["nouveau"]["blacklist"] = plan["nouveau_blacklist"]
    result["keep_vfio_modules"] = plan["keep_vfio_modules"]
    for f in plan["files"]:
        for c in f["changes"]:
            if c["action"] == "warning":
                warnings.append("%s line %s: %s" % (f["path"], c["line"], c["detail"]))
    changed_files = [f for f in plan["files"] if f["changed"]]
    for f in changed_files:
        diffs.append({"before_header": f["path"], "after_header": f["path"], "before": f["before"], "after": f["after"]})

    marker = os.path.join(p["backup_dir"], PENDING_MARKER)
    pending = set((_read(marker) or "").split())
    need_initramfs = p["regenerate_initramfs"] and (plan["initramfs_changed"] or "initramfs" in pending)
    need_boot = p["refresh_boot"] and (plan["boot_cmdline_changed"] or "boot" in pending)
    commands = []
    if need_initramfs:
        commands.append(("initramfs", p["update_initramfs_cmd"] or ["update-initramfs", "-u", "-k", "all"]))
    if need_boot:
        default = (["proxmox-boot-tool", "refresh"] if os.path.exists(os.path.join(etc_root, "kernel", "proxmox-boot-uuids"))
                   else ["update-grub"])
        commands.append(("boot", p["boot_refresh_cmd"] or default))
    result["commands"] = [c for _k, c in commands]

    changed = bool(changed_files or detach_plan or commands)

    # ------------------------------------------------------------------ apply
    if not check:
        try:
            for vm, before, _after, remove_keys, _changes in detach_plan:
                with pve_guests.ConfigLock(vm["vmid"], os.path.join(run_root, "lock", "qemu-server")):
                    if is_running(vm["vmid"]):
                        module.fail_json(msg="VM %s (%s) started while this ran; nothing more was changed: stop it and re-run" % (
                            vm["vmid"], vm["name"]), **result)
                    current = _read(vm["path"]) or ""
                    new, changes = pve_guests.detach_text(current, remove_keys, set_onboot_zero=mode in ("onboot", "both"))
                    backup = pve_guests.backup_file(vm["path"], p["backup_dir"])
                    pve_guests.atomic_write(vm["path"], new.encode("utf-8", "surrogateescape"), preserve_mode=False)
                result["detached"].append({"vmid": vm["vmid"], "path": vm["path"], "changes": changes, "backup": backup})
            kinds = set(k for k, _c in commands)
            if kinds:
                os.makedirs(p["backup_dir"], 0o700, exist_ok=True)
                with open(marker, "w") as fh:
                    fh.write("\n".join(sorted(kinds | pending)) + "\n")
            for f in changed_files:
                backup = pve_guests.backup_file(f["path"], p["backup_dir"]) if os.path.exists(f["path"]) else None
                pve_guests.atomic_write(f["path"], f["after"].encode("utf-8", "surrogateescape"), preserve_mode=True)
                result["files"].append({"path": f["path"], "kind": f["kind"], "backup": backup, "changes": f["changes"]})
        except (IOError, OSError, pve_guests.GuestError) as e:
            module.fail_json(msg="writing failed: %s" % e, **result)
        for kind, cmd in commands:
            argv = list(cmd)
            if not os.path.isabs(argv[0]):
                found = module.get_bin_path(argv[0])
                if not found:
                    module.fail_json(msg="%s not found: install it, or set %s" % (
                        argv[0], "update_initramfs_cmd" if kind == "initramfs" else "boot_refresh_cmd"), **result)
                argv[0] = found
            rc, out, err = module.run_command(argv)
            if rc != 0:
                module.fail_json(msg="%s failed (rc=%s); the files are changed, re-run to retry: %s" % (
                    " ".join(cmd), rc, (err or out).strip()[-2000:]), rc=rc, stdout=out, stderr=err, **result)
            pending.discard(kind)
        if commands:
            left = pending - set(k for k, _c in commands)
            if left:
                with open(marker, "w") as fh:
                    fh.write("\n".join(sorted(left)) + "\n")
            elif os.path.exists(marker):
                os.unlink(marker)
    else:
        result["detached"] = [{"vmid": vm["vmid"], "path": vm["path"], "changes": ch, "backup": None}
                              for vm, _b, _a, _k, ch in detach_plan]
        result["files"] = [{"path": f["path"], "kind": f["kind"], "backup": None, "changes": f["changes"]} for f in changed_files]

    # ------------------------------------------------------------------ runtime
    reasons = _runtime(module, p, selected, managed, result, warnings)
    result["reboot_required"] = bool(reasons)
    result["reboot_reasons"] = reasons
    result["changed"] = result["changed"] or changed
    if module._diff and diffs:
        result["diff"] = diffs
    for w in warnings:
        module.warn(w)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
