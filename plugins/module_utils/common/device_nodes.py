# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA device nodes made at every boot, declared once: the device-node unit (nvidia-device-nodes.service,
kpro.gpu_serving.nvidia_driver) renders its ``ExecStart=`` lines from `boot_commands`, and the container passthrough
(lxc_gpu_passthrough) passes only nodes `made_at_boot`.

Why one list: PVE starts a container only when each ``devN`` node exists: pve-container src/PVE/LXC.pm ``vm_start``
calls ``update_lxc_config``, which dies with "Device <path> does not exist" (src/PVE/LXC/Tools.pm:163,
``get_device_mode_and_rdev``; 5.2.6 and 6.1.x alike), before src/lxc-pve-prestart-hook's own "Could not get mode or
device ID of <path>" (line 144 in 5.2.6, 167 in 6.1.x). After a reboot /dev holds only what something made since. The capability nodes
/dev/nvidia-caps/nvidia-cap<N> are made on demand (``nvidia-modprobe -f /proc/driver/nvidia/capabilities/...``,
nvidia-modprobe.c and modprobe-utils/nvidia-modprobe-utils.c ``nvidia_cap_mknod``; NVIDIA's user-space components
fork/exec nvidia-modprobe when needed, nvidia-modprobe(1)): present after nvidia-smi ran, gone after a reboot. They
grant MIG capabilities (mig/config, mig/monitor), which a container using whole GPUs does not need, so the unit does
not make them and they are not passed.
"""

from __future__ import annotations

import re


def boot_commands(gpu_count):
    """[(nvidia-modprobe arguments, the nodes they make)] of the unit: ``-c N`` makes /dev/nvidiaN (255:
    /dev/nvidiactl), ``-u -c 0`` /dev/nvidia-uvm and -uvm-tools (nvidia_uvm_mknod), ``-m`` /dev/nvidia-modeset."""
    gpus = range(gpu_count)
    return [
        (["-c %d" % i for i in gpus] + ["-c 255"], ["/dev/nvidia%d" % i for i in gpus] + ["/dev/nvidiactl"]),
        (["-u", "-c 0"], ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]),
        (["-m"], ["/dev/nvidia-modeset"]),
    ]


def boot_nodes(gpu_count):
    """The nodes the unit for ``gpu_count`` GPUs makes at boot."""
    return [node for _args, nodes in boot_commands(gpu_count) for node in nodes]


def made_at_boot(path):
    """Whether the unit makes ``path`` at boot. A GPU node /dev/nvidiaN counts as made (the unit's GPU count is
    gpu_host_expected_gpu_count, checked against the container's entries before a reboot: gpu_reboot_check)."""
    m = re.match(r"^/dev/nvidia(\d+)$", path or "")
    return path in boot_nodes(int(m.group(1)) + 1 if m else 0)
