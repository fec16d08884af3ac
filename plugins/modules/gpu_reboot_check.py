#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_reboot_check
short_description: Read-only check that the next boot of a Proxmox host brings the NVIDIA GPUs and the GPU container back
version_added: "0.2.0"
description:
  - Before a planned reboot (or from a schedule), checks without changing anything that the kernel the next boot starts
    (C(proxmox-boot-tool kernel list) and its pins, else the newest image in C(/boot)) has a loadable C(nvidia) module
    of the requested version (C(modinfo -k <kernel>)), signed by the enrolled certificate when Secure Boot is on
    (C(modinfo) C(signer)/C(sig_key), C(mokutil --test-key)); that the device-node unit is enabled and ordered before
    C(pve-guests.service); that every C(devN) entry of the GPU container names a node that unit creates at boot; and
    that no VM with C(onboot 1) references a GPU function (C(hostpciN), directly or through a PCI resource mapping),
    which C(pve-guests.service) would start at boot, binding the GPUs to vfio-pci, away from the container.
  - Succeeds with C(msg) "ready to reboot into <kernel>", or fails naming the kernel, the missing piece and the command
    that fixes it; every problem found is in RV(problems).
author:
  - kpro.gpu_serving developers (!UNKNOWN)
options:
  version:
    description: The NVIDIA driver version the module must be (C(gpu_host_driver_version)).
    type: str
    required: true
  vmid:
    description: The GPU container whose C(devN) entries must resolve at boot; omitted, no container is checked.
    type: int
  ids:
    description:
      - PCI vendor:device ids of the GPUs (C(gpu_host_vendor_device_ids)); empty, every NVIDIA display function.
      - The functions of the same slots and IOMMU groups count too, as in M(kpro.gpu_serving.vfio_release).
    type: list
    elements: str
    default: []
  node:
    description: Proxmox node name, to pick this node's entries of PCI resource mappings. Default is the short host name.
    type: str
  module_signing_cert:
    description: The enrolled certificate (PEM or DER) the module must be signed with under Secure Boot.
    type: path
  device_nodes_unit:
    description: The unit that creates the device nodes at boot.
    type: str
    default: nvidia-device-nodes.service
  config_dir:
    description: Where the container configs live (pmxcfs).
    type: path
    default: /etc/pve/lxc
  systemd_dir:
    description: Where the device-node unit file is.
    type: path
    default: /etc/systemd/system
  efivars_dir:
    description: EFI variables directory, read for the Secure Boot state.
    type: path
    default: /sys/firmware/efi/efivars
  proc_root:
    description: Internal, for tests only (do not set) - the root of procfs.
    type: path
    default: /proc
  sysfs_root:
    description: Internal, for tests only (do not set) - the root of sysfs.
    type: path
    default: /sys
  etc_root:
    description: Internal, for tests only (do not set) - the directory used as C(/etc) (VM configs, PCI mappings).
    type: path
    default: /etc
attributes:
  check_mode:
    support: full
    description: The module never changes anything.
  diff_mode:
    support: none
    description: Nothing is changed, so there is nothing to show.
notes:
  - Named failures (C(phase)) are C(next_boot_module_missing), C(module_unsigned), C(module_wrong_key),
    C(signing_key_not_enrolled), C(device_nodes_unit_not_ready), C(ct_passthrough_unresolvable) and
    C(guest_takes_gpus_at_boot) (also C(bad_input) for bad O(ids), C(host_config_unreadable) for unreadable mappings).
  - Only the local node's VM configs (C(/etc/pve/qemu-server)) are read.
extends_documentation_fragment:
  - kpro.gpu_serving.kernel_roots
"""

EXAMPLES = r"""
- name: Ready to reboot?
  kpro.gpu_serving.gpu_reboot_check:
    version: 580.126.09
    vmid: 129
"""

RETURN = r"""
extends_documentation_fragment:
  - kpro.gpu_serving.failure
msg:
  description: C(ready to reboot into <kernel>), or the failure.
  returned: always
  type: str
  sample: ready to reboot into 6.8.12-10-pve
next_boot_kernel:
  description: The kernel the next boot starts.
  returned: always
  type: str
  sample: 6.8.12-10-pve
facts:
  description: What was read - C(running_kernel), C(module) (modinfo's fields), C(headers), C(headers_package),
    C(secure_boot), C(dkms_signing_key), C(enrolled), C(unit) (systemctl's UnitFileState and Before), C(ct_devices),
    C(gpu_functions) (the GPU functions and companions), C(vms_referencing_gpus) (C(vmid), C(name), C(onboot),
    C(path), C(references)).
  returned: always
  type: dict
problems:
  description: Every problem found (C(phase), C(msg), C(remedy)).
  returned: failure
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import root_options
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.reboot_check import check_host, verdict

ROOTS = dict(dkms_framework_conf="/etc/dkms/framework.conf", boot_dir="/boot", modules_root="/lib/modules", proc_root="/proc",
             sysfs_root="/sys", etc_root="/etc")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            version=dict(type="str", required=True),
            vmid=dict(type="int"),
            ids=dict(type="list", elements="str", default=[]),
            node=dict(type="str"),
            module_signing_cert=dict(type="path"),
            device_nodes_unit=dict(type="str", default="nvidia-device-nodes.service"),
            config_dir=dict(type="path", default="/etc/pve/lxc"),
            systemd_dir=dict(type="path", default="/etc/systemd/system"),
            efivars_dir=dict(type="path", default="/sys/firmware/efi/efivars"),
            **root_options(ROOTS)
        ),
        supports_check_mode=True,
    )
    facts, problems = check_host(module)
    try:
        msg = verdict(facts["next_boot_kernel"], problems)
    except Failure as e:
        fail(module, e, changed=False, facts=facts)
    module.exit_json(changed=False, msg=msg, next_boot_kernel=facts["next_boot_kernel"], facts=facts)


if __name__ == "__main__":
    main()
