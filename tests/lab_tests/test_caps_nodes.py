"""Issue 28 (host states, caps nodes): /dev/nvidia-caps/* present when the lxc_gpu stage runs must not keep CT 129 down
after a reboot.

On a real host the capability nodes (/dev/nvidia-caps/nvidia-cap1 for mig/config, nvidia-cap2 for mig/monitor) are made
on demand: NVIDIA's user-space components fork/exec nvidia-modprobe when needed (nvidia-modprobe(1)), and
``nvidia-modprobe -f /proc/driver/nvidia/capabilities/...`` makes them (nvidia-modprobe.c, modprobe-utils
nvidia_cap_mknod). Nothing makes them at boot: the collection's nvidia-device-nodes.service runs ``-c``, ``-u -c 0``
and ``-m`` only. A devN entry for one of them makes PVE refuse the container's start after the reboot (pve-container
src/PVE/LXC.pm vm_start -> update_lxc_config -> PVE/LXC/Tools.pm get_device_mode_and_rdev: "Device <path> does not
exist"), so the stage passes only the nodes the boot unit makes.

Each test: the host stage (once for the module), the caps nodes made as NVML makes them, the lxc_gpu stage, then
``labctl reboot`` (test_reboot.py): CT 129 must be running after PVE's startall, and the run converges again with
nothing to change.
"""

from __future__ import annotations

import os

import pytest

from conftest import labctl
from test_gpu_host_stage import play, recap

CAP_FILES = ["/proc/driver/nvidia/capabilities/mig/config", "/proc/driver/nvidia/capabilities/mig/monitor"]
CAP_NODES = ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]


@pytest.fixture(scope="module")
def host_done(lab):
    """A fresh node with the host stage done, once for this module; the node is reset afterwards."""
    labctl("reset")
    r = play("--tags", "gpu_host")
    assert recap(r.stdout)["failed"] == 0, r.stdout[-3000:]
    yield lab
    labctl("reset")


def make_caps(lab):
    """The capability nodes, as nvidia-smi's NVML leaves them on a real host (it runs nvidia-modprobe -f)."""
    lab.exec("nvidia-modprobe", "-f", CAP_FILES[0], "-f", CAP_FILES[1])
    for node in CAP_NODES:
        assert os.path.exists(os.path.join(lab.root, node.lstrip("/"))), node


def devn_paths(lab):
    """The device paths of CT 129's devN entries (main section)."""
    paths = []
    with open(os.path.join(lab.root, "etc/pve/lxc/129.conf")) as f:
        for line in f:
            if line.startswith("["):
                break
            key, sep, value = line.partition(":")
            if sep and key.startswith("dev") and key[3:].isdigit():
                paths.append(value.strip().split(",")[0].replace("path=", ""))
    return paths


def reboot_and_check_ct_starts(lab):
    """``labctl reboot`` (a fresh /dev, the units, PVE's startall): CT 129 is started, not refused."""
    boots = lab.state()["kernel"]["boots"]
    out = lab.labctl("reboot").stdout
    assert "kpro5 rebooted into" in out, out
    assert lab.state()["kernel"]["boots"] == boots + 1
    assert not os.path.exists(os.path.join(lab.root, "dev/nvidia-caps")), "the caps nodes survived the reboot"
    journal = open(os.path.join(lab.root, "var/log/kpro-lab/journal.log")).read().rsplit("-- Boot", 1)[-1]
    assert "Starting CT 129" in journal, journal[-3000:]
    assert "Starting CT 129 failed" not in journal, journal[-3000:]
    assert "running" in lab.exec("pct", "status", "129").stdout


def converges_twice(lab):
    """After the reboot the host and container stages converge, and a second run changes nothing."""
    first = play("--tags", "gpu_host,lxc_gpu")
    assert recap(first.stdout)["failed"] == 0, first.stdout[-4000:]
    second = play("--tags", "gpu_host,lxc_gpu")
    assert recap(second.stdout)["failed"] == 0 and recap(second.stdout)["changed"] == 0, second.stdout[-4000:]
    assert "running" in lab.exec("pct", "status", "129").stdout


def test_caps_nodes_at_stage_3_then_reboot_ct_129_starts(host_done):
    lab = host_done
    make_caps(lab)
    r = play("--tags", "lxc_gpu")
    assert recap(r.stdout)["failed"] == 0, r.stdout[-3000:]
    passed = devn_paths(lab)
    assert "/dev/nvidia0" in passed and "/dev/nvidia-uvm" in passed, passed
    reboot_and_check_ct_starts(lab)
    assert not [p for p in devn_paths(lab) if p.startswith("/dev/nvidia-caps")], devn_paths(lab)
    converges_twice(lab)


def test_caps_entries_left_by_an_earlier_run_are_dropped_before_the_reboot(host_done):
    """A config an earlier run wrote while the caps nodes existed (kpro5's, if stage 3 ran there before the fix): the
    stage drops those entries, so the next reboot starts the container."""
    lab = host_done
    make_caps(lab)
    used = set(int(k[3:]) for k in (ln.split(":", 1)[0] for ln in open(os.path.join(lab.root, "etc/pve/lxc/129.conf")))
               if k.startswith("dev") and k[3:].isdigit())
    free = [n for n in range(256) if n not in used][:2]
    # as the earlier run left it: the entries in the main section (it restarted the container), the container running
    lab.exec("pct", "stop", "129")
    lab.exec("pct", "set", "129", "--dev%d" % free[0], CAP_NODES[0] + ",mode=0666", "--dev%d" % free[1], CAP_NODES[1] + ",mode=0666")
    lab.exec("pct", "start", "129")
    assert set(CAP_NODES) <= set(devn_paths(lab)), devn_paths(lab)
    r = play("--tags", "lxc_gpu")
    assert recap(r.stdout)["failed"] == 0, r.stdout[-3000:]
    assert not [p for p in devn_paths(lab) if p.startswith("/dev/nvidia-caps")], devn_paths(lab)
    reboot_and_check_ct_starts(lab)
    converges_twice(lab)
