# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kpro.gpu_serving.vfio_release's whole run (its argument spec, the guests' refusal, the release), for the module and
for nvidia_driver's ``release_look``: the gpu_host stage's read-only look at both in one module call (look()).
The steps themselves are vfio_host.py's.
"""

from __future__ import annotations

import socket

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pve_guests
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import vfio_host as vh
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import root_options

ARGUMENT_SPEC = dict(
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
)
ROOTS = dict(sysfs_root="/sys", etc_root="/etc", proc_root="/proc", run_root="/run", dev_root="/dev")  # test-only roots, documented as internal
ARGUMENT_SPEC.update(root_options(ROOTS))


def check_guests(module, p, selected, by_bdf, result):
    """Refuse while a VM or process holds the GPUs; returns (PCI mappings, is_running, the stopped VMs)."""
    mappings = vh.read_mappings(p["etc_root"], p["node"] or socket.gethostname().split(".")[0])
    vms = pve_guests.find_references(p["etc_root"], [d["bdf"] for d in selected], mappings)
    is_running = vh.running_checker(module, p["vm_status_method"], p["run_root"], p["proc_root"])
    reservations = pve_guests.pci_reservations(p["run_root"], p["proc_root"])
    refusals, stopped = vh.split_vms(vms, is_running, reservations, by_bdf)
    refusals += vh.reservation_refusals(reservations, vms, by_bdf, p["run_root"])
    if p["runtime_unbind"]:
        refusals += vh.group_holder_refusals(selected, p["proc_root"], p["dev_root"])
    vh.refuse(refusals, by_bdf)
    result["stopped_vms_referencing"] = [vh.public_vm(v) for v in stopped]
    return mappings, is_running, stopped


def release(module, p, result, warnings):
    """The whole run; returns the diffs. Raises Failure for a known failure."""
    wanted, selected, managed = vh.select(p["ids"], p["include_iommu_group"], p["sysfs_root"])
    by_bdf = dict((d["bdf"], d) for d in selected)
    result.update(selected=vh.public_selected(selected), managed_ids=managed)
    if not managed:
        module.warn("no NVIDIA display function found under %s/bus/pci/devices and no ids given: nothing to release" % p["sysfs_root"])
        return []
    if wanted and not selected:
        warnings.append("no PCI function with id %s is present; only the persistent bindings are cleaned" % ", ".join(wanted))
    mappings, is_running, stopped = check_guests(module, p, selected, by_bdf, result)
    detach = vh.detach_plan(stopped, p["detach_stopped_vms"], warnings)
    plan = vh.file_plan(p, managed, vh.other_vfio_users(p["etc_root"], selected, mappings), warnings)
    result.update(remaining_vfio_ids=plan["remaining_vfio_ids"], keep_vfio_modules=plan["keep_vfio_modules"])
    result["nouveau"]["blacklist"] = plan["nouveau_blacklist"]
    changed_files = [f for f in plan["files"] if f["changed"]]
    pending = vh.pending_kinds(p["backup_dir"])
    cmds = vh.commands(p, plan, pending)
    result["commands"] = [c for _k, c in cmds]
    if module.check_mode:
        vh.check_mode_report(detach, changed_files, result)
    else:
        vh.apply_writes(p, detach, changed_files, cmds, pending, is_running, result)
        vh.run_commands(module, p, cmds, pending)
    reasons = vh.runtime(module, p, selected, managed, result, warnings)
    result.update(reboot_required=bool(reasons), reboot_reasons=reasons)
    result["changed"] = result["changed"] or bool(changed_files or detach or cmds)
    return vh.diffs(detach, changed_files)


def look(module, args):
    """The release run read-only (the module must be in check mode) with ``args`` over vfio_release's defaults: the
    refusal (a running VM or process holds the GPUs) is raised as vfio_release raises it; returns vfio_release's result
    (with would_change; its warnings are the module's)."""
    if not module.check_mode:
        raise Failure("bad_input", "release_look is read-only: run the task in check mode (check_mode: true).")
    checked = ArgumentSpecValidator(ARGUMENT_SPEC).validate(dict((k, v) for k, v in (args or {}).items() if v is not None))
    if checked.error_messages:
        raise Failure("bad_input", "release_look: %s" % "; ".join(checked.error_messages))
    p, warnings = checked.validated_parameters, []
    result = vh.empty_result(p["sysfs_root"])
    release(module, p, result, warnings)
    for w in warnings:
        module.warn(w)
    result["would_change"] = bool(result["changed"])
    return result
