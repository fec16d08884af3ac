#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Report PCI GPUs (driver binding, IOMMU groups) and what NVML says about them
version_added: "0.1.0"
description:
  - Reads every PCI function from sysfs and selects the GPUs, by default every NVIDIA display-class function or
    the functions with the given O(vendor_device_ids), together with the other functions of their slot (the HDMI
    audio function) and the other non-bridge members of their IOMMU groups. For each it reports the bound
    driver, C(driver_override) and the IOMMU group.
  - Asks NVML (pynvml) for the driver version, the GPUs, their memory and the processes using them, and falls
    back to C(nvidia-smi) when pynvml is not installed on the target. A driver that is not loaded, a
    driver/library version mismatch or a missing library is reported as a named state in RV(nvml.reason),
    not as a failure.
  - Also reads the loaded kernel module's version from C(/proc/driver/nvidia/version).
  - Read-only; sets the fact C(kpro_gpus).
author:
  - kpro.gpu_serving developers (!UNKNOWN)
options:
  vendor_device_ids:
    description:
      - PCI C(vendor:device) ids that select the GPUs, for example C(10de:2230) (RTX A6000).
      - Default is every NVIDIA (vendor C(10de)) display-class function.
    type: list
    elements: str
  include_iommu_group:
    description: Also select the other non-bridge functions of the selected functions' IOMMU groups.
    type: bool
    default: true
  nvml:
    description: Query NVML (pynvml, else C(nvidia-smi)). With V(false) only sysfs is read.
    type: bool
    default: true
  sysfs_root:
    description: Internal, for tests only (do not set) - the root of sysfs.
    type: path
    default: /sys
  proc_root:
    description: Internal, for tests only (do not set) - the root of procfs.
    type: path
    default: /proc
extends_documentation_fragment: []
requirements:
  - nvidia-ml-py (module C(pynvml)) on the target for NVML; without it C(nvidia-smi) is used.
attributes:
  check_mode:
    support: full
    description: The module only reads; it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is nothing to diff.
  facts:
    support: full
    description: Sets C(kpro_gpus).
notes:
  - Inside an LXC container NVML reports host PIDs; the name and command line of a process in RV(nvml.gpus) are
    then only known when the PID is visible in the container.
seealso:
  - name: sysfs-bus-pci ABI
    description: The kernel's sysfs PCI attributes this module reads.
    link: https://www.kernel.org/doc/Documentation/ABI/testing/sysfs-bus-pci
"""

EXAMPLES = r"""
- name: Show the GPUs and their driver binding
  kpro.gpu_serving.gpu_facts:
  register: gpu

- name: Only the RTX A6000s (and their audio functions)
  kpro.gpu_serving.gpu_facts:
    vendor_device_ids: ["10de:2230"]

- name: Fail unless both GPUs are on the nvidia driver
  ansible.builtin.assert:
    that:
      - ansible_facts.kpro_gpus.gpus | selectattr('id', 'equalto', '10de:2230') | map(attribute='driver') | unique == ['nvidia']
      - ansible_facts.kpro_gpus.nvml.available
      - ansible_facts.kpro_gpus.nvml.driver_version == '580.126.09'
    fail_msg: "{{ ansible_facts.kpro_gpus.nvml.msg | default('GPUs are not on the nvidia driver') }}"
"""

RETURN = r"""
extends_documentation_fragment:
  - kpro.gpu_serving.failure
pci_devices:
  description: Every PCI function of the machine, sorted by address.
  returned: always
  type: list
  elements: dict
  contains:
    bdf:
      description: Address C(domain:bus:device.function).
      type: str
      sample: "0000:17:00.0"
    slot:
      description: C(domain:bus:device), shared by the functions of one card.
      type: str
      sample: "0000:17:00"
    function:
      description: Function number.
      type: int
      sample: 0
    vendor:
      description: Vendor id, 4 hex digits.
      type: str
      sample: "10de"
    device:
      description: Device id, 4 hex digits.
      type: str
      sample: "2230"
    id:
      description: C(vendor:device).
      type: str
      sample: "10de:2230"
    class:
      description: PCI class code as sysfs shows it.
      type: str
      sample: "0x030000"
    class_name:
      description: Name of the class (base class and subclass), when known.
      type: str
      sample: VGA compatible controller
    subsystem_vendor:
      description: Subsystem vendor id.
      type: str
      sample: "10de"
    subsystem_device:
      description: Subsystem device id.
      type: str
      sample: "1459"
    subsystem_id:
      description: C(subsystem_vendor:subsystem_device).
      type: str
      sample: "10de:1459"
    name:
      description: Device name for the ids the collection knows, else C(vendor:device).
      type: str
      sample: NVIDIA RTX A6000
    chip:
      description: Chip name for the ids the collection knows.
      type: str
      sample: GA102GL
    driver:
      description: Bound driver, or null.
      type: str
      sample: vfio-pci
    driver_override:
      description: The device's C(driver_override), or null when unset.
      type: str
      sample: null
    iommu_group:
      description: IOMMU group number, or null when the IOMMU is off.
      type: int
      sample: 27
    iommu_group_members:
      description: Addresses of every function in the same IOMMU group (this one included).
      type: list
      elements: str
      sample: ["0000:17:00.0", "0000:17:00.1"]
    is_bridge:
      description: Whether the function is a host or PCI bridge (not passed through, not selected by group).
      type: bool
      sample: false
    sysfs_path:
      description: The device's real sysfs directory.
      type: str
      sample: /sys/devices/pci0000:16/0000:16:00.0/0000:17:00.0
gpus:
  description:
    - The selected functions (RV(pci_devices) entries) with how they were selected, and, for the functions NVML
      knows, its view of them.
  returned: always
  type: list
  elements: dict
  contains:
    selected_by:
      description: C(id) (matched the ids or the NVIDIA display class), C(slot) (another function of the card) or
        C(iommu_group).
      type: str
      sample: id
    nvml:
      description: The RV(nvml.gpus) entry with the same address, when NVML reported one.
      type: dict
      sample: {"index": 0, "name": "NVIDIA RTX A6000", "memory_total_mib": 49140, "memory_used_mib": 4}
  sample:
    - {"bdf": "0000:17:00.0", "id": "10de:2230", "name": "NVIDIA RTX A6000", "driver": "vfio-pci", "iommu_group": 27,
       "iommu_group_members": ["0000:17:00.0", "0000:17:00.1"], "selected_by": "id"}
    - {"bdf": "0000:17:00.1", "id": "10de:1aef", "name": "GA102 High Definition Audio Controller", "driver": "vfio-pci",
       "iommu_group": 27, "iommu_group_members": ["0000:17:00.0", "0000:17:00.1"], "selected_by": "slot"}
drivers:
  description: Bound driver (or null) of each selected function, by address.
  returned: always
  type: dict
  sample: {"0000:17:00.0": "vfio-pci", "0000:17:00.1": "vfio-pci"}
nvml:
  description: What NVML (or nvidia-smi) reports; with RV(nvml.available) false, why not.
  returned: always
  type: dict
  contains:
    available:
      description: Whether NVML answered.
      type: bool
      sample: true
    reason:
      description:
        - When not available, one of C(disabled), C(pynvml_not_installed), C(library_not_found), C(driver_not_loaded),
          C(version_mismatch), C(no_permission), C(no_devices), C(not_installed), C(nvml_error), C(smi_error).
      type: str
      sample: driver_not_loaded
    msg:
      description: When not available, the cause and the fix.
      type: str
    source:
      description: C(pynvml) or C(nvidia-smi).
      type: str
      sample: nvidia-smi
    driver_version:
      description: Driver version.
      type: str
      sample: "580.126.09"
    nvml_version:
      description: NVML library version (pynvml only).
      type: str
      sample: "13.580.126.09"
    cuda_driver_version:
      description: Highest CUDA version the driver supports (pynvml only).
      type: str
      sample: "13.0"
    kernel_module:
      description: The loaded kernel module from C(/proc/driver/nvidia/version), or null when not loaded.
      type: dict
      sample: {"version": "580.126.09", "type": "open", "arch": "x86_64"}
    gpu_count:
      description: Number of GPUs NVML sees.
      type: int
      sample: 2
    gpus:
      description: The GPUs in NVML index order.
      type: list
      elements: dict
      sample:
        - {"index": 0, "name": "NVIDIA RTX A6000", "uuid": "GPU-8d0c4d6e-5b2a-7f1e-3c9a-4e6b1d2f0a11",
           "pci_bus_id": "00000000:17:00.0", "bdf": "0000:17:00.0", "memory_total_mib": 49140, "memory_used_mib": 22815,
           "processes": [{"pid": 41873, "used_mib": 22808, "name": "sglang::schedul", "cmdline": "sglang::scheduler_TP0"}]}
source:
  description: Where the NVML facts came from, C(pynvml), C(nvidia-smi) or C(none).
  returned: always
  type: str
  sample: nvidia-smi
ansible_facts:
  description: Facts set by the module.
  returned: always
  type: dict
  contains:
    kpro_gpus:
      description: The same RV(pci_devices), RV(gpus), RV(drivers), RV(nvml) and RV(source).
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import nvml as nvml_utils
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pci
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import root_options

ROOTS = dict(sysfs_root="/sys", proc_root="/proc")  # test-only roots, documented as internal


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vendor_device_ids=dict(type="list", elements="str"),
            include_iommu_group=dict(type="bool", default=True),
            nvml=dict(type="bool", default=True),
            **root_options(ROOTS)
        ),
        supports_check_mode=True,
    )
    p = module.params
    ids = p["vendor_device_ids"] or None
    if ids:
        try:
            ids = ["%s:%s" % pci.parse_id(i) for i in ids]
        except ValueError as e:
            fail(module, Failure("bad_input", "vendor_device_ids: %s" % e, remedy="Give PCI vendor:device ids such as 10de:2230."))

    devices = pci.list_devices(p["sysfs_root"])
    gpus = pci.select_gpus(devices, ids=ids, include_group=p["include_iommu_group"])

    if p["nvml"]:
        smi_path = module.get_bin_path("nvidia-smi")
        facts = nvml_utils.gpu_facts(run_command=module.run_command, smi_path=smi_path, proc_root=p["proc_root"])
        source = facts.get("source", "none")
    else:
        facts = nvml_utils.unavailable("disabled", "none", msg="NVML not queried (nvml: false)",
                                       kernel_module=nvml_utils.read_proc_driver_version(p["proc_root"]))
        source = "none"

    by_bdf = dict((g.get("bdf"), g) for g in facts.get("gpus", []) if g.get("bdf"))
    for g in gpus:
        if g["bdf"] in by_bdf:
            g["nvml"] = by_bdf[g["bdf"]]
    drivers = dict((g["bdf"], g["driver"]) for g in gpus)

    result = dict(pci_devices=devices, gpus=gpus, drivers=drivers, nvml=facts, source=source)
    module.exit_json(changed=False, ansible_facts=dict(kpro_gpus=dict(result)), **result)


if __name__ == "__main__":
    main()
