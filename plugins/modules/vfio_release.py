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
      - Default C(proxmox-boot-tool refresh) when C(/etc/kernel/proxmox-boot-uuids) exists, else C(update-grub).
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
    version_added: "0.2.0"
    description:
      - Keep nouveau off the GPUs, which the NVIDIA driver needs. A host that does not blacklist nouveau has it loaded
        from boot (udev loads it for the GPU's alias even while vfio-pci holds the GPU), and the probe after the
        release would hand the GPUs to it.
      - Adds C(/etc/modprobe.d/kpro-gpu-serving-nouveau.conf) (C(blacklist nouveau), C(options nouveau modeset=0),
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
    description: Internal, for tests only (do not set) - the root of sysfs.
    type: path
    default: /sys
  etc_root:
    description: Internal, for tests only (do not set) - the directory used as C(/etc).
    type: path
    default: /etc
  proc_root:
    description: Internal, for tests only (do not set) - the root of procfs.
    type: path
    default: /proc
  run_root:
    description: Internal, for tests only (do not set) - the directory used as C(/run).
    type: path
    default: /run
  dev_root:
    description: Internal, for tests only (do not set) - the directory used as C(/dev).
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
extends_documentation_fragment:
  - kpro.gpu_serving.failure
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
would_change:
  version_added: "0.2.0"
  description:
    - In check mode, whether a run would change anything (the same as C(changed)); false after a run. The gpu_host role's
      read-only check before any change (C(check_mode=true), C(changed_when=false)) reads it to skip the release itself
      when there is nothing to release and no reboot is required.
  returned: success
  type: bool
  sample: false
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
  version_added: "0.2.0"
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
  version_added: "0.2.0"
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import vfio_run
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import vfio_host as vh
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail


def main():
    module = AnsibleModule(argument_spec=vfio_run.ARGUMENT_SPEC, supports_check_mode=True)
    warnings = []
    result = vh.empty_result(module.params["sysfs_root"])
    try:
        diffs = vfio_run.release(module, module.params, result, warnings)
    except Failure as e:
        fail(module, e, **result)
    if module._diff and diffs:
        result["diff"] = diffs
    for w in warnings:
        module.warn(w)
    # check mode's changed, kept where a role's read-only probe reports changed=false (changed_when)
    result["would_change"] = bool(module.check_mode and result["changed"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
