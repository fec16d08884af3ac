#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver
short_description: Install the NVIDIA driver from the official .run installer, on a Proxmox host or in a container
version_added: "0.1.0"
description:
  - In C(host) mode, installs the requested driver version with DKMS (headers for the running kernel first,
    nouveau disabled), loads it, installs and enables C(nvidia-persistenced) and a oneshot unit that creates
    C(/dev/nvidia*), C(/dev/nvidia-uvm*) at boot before C(pve-guests.service), and verifies through NVML that
    exactly the requested version runs on the expected GPUs.
  - After a kernel change (host rebuild or upgrade) with the driver still registered in DKMS, only the kernel
    module is rebuilt for the new kernel; the installer is not run again.
  - A driver of the requested version that DKMS does not know (installed without C(--dkms), or the installer's DKMS
    registration failed, which it reports only as a warning) is registered from the installer's sources in
    C(/usr/src/nvidia-<version>) (C(dkms install --force), past DKMS's refusal to replace the installer's module of the
    same version), so that later kernels get the module; without those sources the installer runs again with C(--dkms).
  - In C(userspace) mode (inside an LXC container), installs the same version's userspace only
    (C(--no-kernel-modules)); the version defaults to the host's, read from C(/proc/driver/nvidia/version).
    Done when NVML in the container reports the host's exact version.
  - In C(host) mode, also makes sure the module is built and installed through DKMS for every kernel that can boot
    (C(proxmox-boot-tool kernel list) and its pins, else the images in C(/boot)), the next-boot kernel included,
    installing C(proxmox-headers-<kernel>) where they are missing (O(install_headers)); RV(kernels) reports each kernel.
  - Under Secure Boot, or wherever O(module_signing_key)/O(module_signing_cert) are given, DKMS's
    C(mok_signing_key)/C(mok_certificate) in C(/etc/dkms/framework.conf) are set to that key first, before anything is
    built (the old file is kept as C(framework.conf.kpro-gpu-serving.bak)), so that every DKMS build, the kernel hook's
    included, is signed with it; each kernel's module is then verified from its own signature (C(modinfo)
    C(signer)/C(sig_key) against the certificate's issuer and serial) and rebuilt when signed by another key, the running
    kernel's too when the kernel refused it.
  - Does nothing when the requested state is already there.
author:
  - kpro.gpu_serving developers (!UNKNOWN)
options:
  version:
    description:
      - "Driver version, for example C(580.126.09): C(<branch>.<minor>[.<patch>]), branch 3 digits, minor 2 or 3,
        patch 2 (NVIDIA's numbering, for example C(550.54.14), C(550.142)); anything else fails C(bad_version)."
      - In C(userspace) mode, C(auto) (the default there) takes the host kernel module's version.
    type: str
  state:
    version_added: "0.2.0"
    description:
      - C(present) installs and verifies the driver. C(fetched) only makes sure the installer is on the target
        (downloaded into O(download_dir) if need be), has O(installer_checksum) and is the installer of O(version)
        (makeself C(--info)); nothing else changes. Run it before any host change (stage 1).
    type: str
    choices: [present, fetched]
    default: present
  mode:
    description: Where the module runs.
    type: str
    choices: [host, userspace]
    default: host
  installer_path:
    description:
      - Path of the C(.run) installer on the target. Used as is when it exists (air-gapped sites); otherwise
        it is where O(installer_url) is downloaded to. Given without O(installer_url), it must exist
        (C(installer_missing)).
      - Defaults to O(download_dir)/C(NVIDIA-Linux-x86_64-<version>.run).
    type: path
  installer_url:
    description: URL of the installer. Defaults to NVIDIA's download server for O(version).
    type: str
  installer_checksum:
    description:
      - Expected checksum of the installer, C(sha256:<hex>) or plain hex. Required when downloading.
    type: str
  download_dir:
    description: Where the installer is kept on the target.
    type: path
    default: /var/cache/kpro-gpu-serving
  kernel_module_type:
    description: Open or proprietary kernel modules (host mode).
    type: str
    choices: [open, proprietary]
    default: open
  dkms:
    description: Register the module with DKMS so that it can be rebuilt for new kernels (host mode).
    type: bool
    default: true
  install_headers:
    description: Install C(proxmox-headers-<running kernel>) with apt when the kernel's headers are missing.
    type: bool
    default: true
  persistenced:
    description: Install and enable C(nvidia-persistenced.service) (host mode).
    type: bool
    default: true
  device_nodes_unit:
    description: Install and enable C(nvidia-device-nodes.service), ordered before C(pve-guests.service) (host mode).
    type: bool
    default: true
  expected_gpu_count:
    description: Fail unless NVML reports this many GPUs.
    type: int
  expected_gpu_name:
    description: Fail unless every GPU NVML reports has this name, for example C(NVIDIA RTX A6000).
    type: str
  module_signing_key:
    description: Private key to sign the kernel module with when Secure Boot is on (path on the target).
    type: path
  module_signing_cert:
    description: Public certificate matching O(module_signing_key) (enrolled as a MOK), PEM or DER.
    type: path
  all_kernels:
    version_added: "0.2.0"
    description:
      - Build (and under Secure Boot verify) the module for every kernel that can boot, not only the running one
        (host mode). A kernel without headers that cannot be installed fails C(boot_kernel_headers_missing), a failed
        build C(dkms_build_failed) with the end of DKMS's make.log.
    type: bool
    default: true
  dkms_tree:
    version_added: "0.2.0"
    description: Internal, for tests only (do not set) - DKMS's tree.
    type: path
    default: /var/lib/dkms
  proc_root:
    description: Internal, for tests only (do not set) - the root of procfs.
    type: path
    default: /proc
  efivars_dir:
    description: EFI variables directory, read for the Secure Boot state.
    type: path
    default: /sys/firmware/efi/efivars
  systemd_dir:
    description: Where unit files are written.
    type: path
    default: /etc/systemd/system
  timeout:
    description: Seconds allowed for the download and for the installer to run.
    type: int
    default: 1800
  release_look:
    version_added: "0.2.0"
    description:
      - With O(mode=host) in check mode, first look at the release of the GPUs from vfio-pci as
        M(kpro.gpu_serving.vfio_release) in check mode does, with these options of it (its defaults for the others),
        in one read-only module call for both looks of the gpu_host stage.
      - A refusal of the release (a running VM or process holds the GPUs) fails the module with the release's phase and
        message, before the driver is looked at; the result has no RV(release) then.
      - Outside check mode the module fails (C(bad_input)); the release itself is M(kpro.gpu_serving.vfio_release)'s.
    type: dict
attributes:
  check_mode:
    support: full
    description: Reports the action it would take (C(install), C(rebuild_module), C(resign_module), C(register_dkms),
      C(load)) and changes nothing.
  diff_mode:
    support: partial
    description: The systemd units it writes (the device-node unit, nvidia-persistenced) are returned as a diff, in check
      mode too; the driver's own files (the installer's) are not.
notes:
  - Named failures (C(phase), also in RV(failure)) are C(bad_version), C(bad_checksum), C(installer_missing), C(installer_version),
    C(secure_boot_unsigned_module), C(headers_unavailable), C(installer_failed), C(checksum_mismatch),
    C(driver_not_loaded), C(version_mismatch), C(gpu_mismatch), C(boot_kernel_headers_missing), C(dkms_build_failed),
    C(module_unsigned), C(module_wrong_key).
extends_documentation_fragment:
  - kpro.gpu_serving.kernel_roots
"""

EXAMPLES = r"""
- name: Install driver 580.126.09 on the Proxmox host
  kpro.gpu_serving.nvidia_driver:
    version: 580.126.09
    installer_checksum: "sha256:0123..."
    expected_gpu_count: 2
    expected_gpu_name: NVIDIA RTX A6000

- name: Matching userspace inside container 129
  kpro.gpu_serving.nvidia_driver:
    mode: userspace
    installer_path: /root/NVIDIA-Linux-x86_64-580.126.09.run
    expected_gpu_count: 2
"""

RETURN = r"""
extends_documentation_fragment:
  - kpro.gpu_serving.failure
release:
  version_added: "0.2.0"
  description: With O(release_look), the result of M(kpro.gpu_serving.vfio_release) in check mode (its
    RV(kpro.gpu_serving.vfio_release#module:would_change), RV(kpro.gpu_serving.vfio_release#module:reboot_required),
    RV(kpro.gpu_serving.vfio_release#module:selected) ...); its warnings are the module's.
  returned: when O(release_look) is given and the release was not refused
  type: dict
action:
  description: What was (or in check mode would be) done - C(none), C(load), C(rebuild_module), C(resign_module),
    C(register_dkms) or C(install).
  returned: always
  type: str
  sample: rebuild_module
reason:
  description: Why that action.
  returned: always
  type: str
  sample: driver 580.126.09 is registered with DKMS but not built for kernel 6.8.12-10-pve
kernel_release:
  description: The running kernel.
  returned: always
  type: str
  sample: 6.8.12-9-pve
host_version:
  description: Version of the loaded kernel module (from /proc/driver/nvidia/version), after the run.
  returned: always
  type: str
  sample: 580.126.09
nvml:
  description: NVML facts after the run (see gpu_facts), or the reason NVML is unavailable.
  returned: always
  type: dict
kernels:
  version_added: "0.2.0"
  description:
    - One entry per kernel that can boot, newest first - C(kernel), C(running), C(next_boot), C(headers) (present),
      C(headers_package), C(dkms) (C(installed), C(built), C(added), C(failed) or null), C(action) (C(build),
      C(install_headers), C(resign), C(none)) where one was taken, C(make_log)/C(make_log_tail) for a failed build,
      C(signer)/C(sig_key) under Secure Boot.
    - Also returned with a failure of this list.
  returned: host mode
  type: list
  elements: dict
  sample: [{"kernel": "6.8.12-10-pve", "running": false, "next_boot": true, "headers": true,
            "headers_package": "proxmox-headers-6.8.12-10-pve", "dkms": "installed", "action": "build"}]
would_change:
  version_added: "0.2.0"
  description:
    - In check mode, whether a run would change anything (the same as C(changed)); false after a run. A role's read-only probe
      (C(check_mode=true) with C(changed_when=false)) reads it to decide whether the install runs at all.
  returned: host mode
  type: bool
  sample: false
next_boot_kernel:
  version_added: "0.2.0"
  description: The kernel the next boot starts (the next-boot pin, else the pin, else the newest).
  returned: host mode
  type: str
  sample: 6.8.12-10-pve
failure:
  description: The failure's old name, kept for playbooks that read it; the same as C(phase) except for an NVML reason
    (C(phase) C(nvml_unavailable), this field the reason).
  returned: failure
  type: str
  sample: version_mismatch
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import root_options
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.nvidia_host import Driver
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import vfio_run

ROOTS = dict(proc_root="/proc", dkms_framework_conf="/etc/dkms/framework.conf", boot_dir="/boot", modules_root="/lib/modules", dkms_tree="/var/lib/dkms")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            version=dict(type="str"),
            mode=dict(type="str", choices=["host", "userspace"], default="host"),
            state=dict(type="str", choices=["present", "fetched"], default="present"),
            installer_path=dict(type="path"),
            installer_url=dict(type="str"),
            installer_checksum=dict(type="str"),
            download_dir=dict(type="path", default="/var/cache/kpro-gpu-serving"),
            kernel_module_type=dict(type="str", choices=["open", "proprietary"], default="open"),
            dkms=dict(type="bool", default=True),
            install_headers=dict(type="bool", default=True),
            persistenced=dict(type="bool", default=True),
            device_nodes_unit=dict(type="bool", default=True),
            expected_gpu_count=dict(type="int"),
            expected_gpu_name=dict(type="str"),
            module_signing_key=dict(type="path", no_log=False),
            module_signing_cert=dict(type="path"),
            all_kernels=dict(type="bool", default=True),
            efivars_dir=dict(type="path", default="/sys/firmware/efi/efivars"),
            systemd_dir=dict(type="path", default="/etc/systemd/system"),
            timeout=dict(type="int", default=1800),
            release_look=dict(type="dict"),
            **root_options(ROOTS)
        ),
        supports_check_mode=True,
    )
    driver = Driver(module)
    try:
        if module.params["release_look"] is not None:   # vfio_release's refusal first, as when it was a task of its own
            if (module.params["mode"], module.params["state"]) != ("host", "present"):
                raise Failure("bad_input", "release_look goes with mode=host and state=present (the gpu_host stage's look).")
            driver.extra["release"] = vfio_run.look(module, module.params["release_look"])
        if module.params["state"] == "fetched":
            result = driver.fetched()
        elif module.params["mode"] == "host":
            result = driver.host()
        else:
            result = driver.userspace()
    except Failure as e:
        fail(module, e, steps=driver.log, **driver.extra)   # a failed driver look keeps the release look's result
    else:
        module.exit_json(**result)


if __name__ == "__main__":
    main()
