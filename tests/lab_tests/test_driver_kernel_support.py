"""Issue 28: a kernel newer than the pinned NVIDIA release builds its module for is refused by the preflight, before
anything is built or installed, naming the release that builds for it (plugins/module_utils/host/driver_support.py).

The node (either release; on PVE 9.1 this is what `apt full-upgrade` brings once Proxmox switches the default kernel
to 7.0, pve-kernel master) has 7.0 installed next to the kernel it runs. Without the preflight, the gpu_host stage
changes the host and then fails in DKMS's build for 7.0: the lab's module source knows the kernel APIs 580.126.09
knows (tests/lab/rootfs/usr/lib/kpro-lab/kernel_api.py), so the build fails in the compiler as the real one does.
"""

from __future__ import annotations

import os

import pytest

from conftest import labctl
from test_gpu_host_stage import play, recap

NEW = "7.0.14-1-pve"  # proxmox-kernel-7.0 (pve-kernel master, changelog 7.0.14-1, 2026-07-01)


@pytest.fixture
def upgraded(lab):
    """A fresh node that installed kernel 7.0 (with its headers in the repository) and has not rebooted yet."""
    labctl("reset")
    lab.labctl("publish-kernel", NEW)
    up = lab.sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get full-upgrade -y -q 2>&1")
    assert "Setting up proxmox-kernel-%s" % NEW in up.stdout, up.stdout[-3000:]
    yield lab
    labctl("reset")


def test_preflight_refuses_a_kernel_newer_than_the_driver_builds_for(upgraded):
    lab = upgraded
    running = lab.state()["kernel"]["release"]
    before = lab.sh("dpkg-query -W -f '${Package} ${Version}\\n' | sort").stdout
    out = play("--tags", "preflight").stdout
    flat = " ".join(out.split())
    assert recap(out)["failed"] == 1, out[-4000:]
    assert ("kernel %s is newer than NVIDIA 580.126.09 builds its module for (up to 6.18, plugins/module_utils/host/"
            "driver_support.py): set gpu_host_driver_version to 580.142 or newer (the first release that builds for "
            "7.0)" % NEW) in flat, out[-4000:]
    assert "kernel %s is newer" % running not in flat
    # nothing built or installed: no package, no DKMS tree, no driver, no installer fetched
    assert lab.sh("dpkg-query -W -f '${Package} ${Version}\\n' | sort").stdout == before
    assert not os.path.exists(os.path.join(lab.root, "var/lib/dkms/nvidia"))
    assert lab.state()["nvidia"]["installed"] is None
    assert not os.path.exists(os.path.join(lab.root, "var/cache/kpro-gpu-serving"))


def test_without_the_preflight_the_stage_fails_in_the_build_for_that_kernel(upgraded):
    out = play("--tags", "gpu_host", "--skip-tags", "preflight").stdout
    flat = " ".join(out.split())
    assert recap(out)["failed"] == 1, out[-4000:]
    # the cause read from make.log's compiler error, after the stage changed the host (packages, the driver)
    assert ("dkms_build_failed: dkms install -m nvidia -v 580.126.09 -k %s failed (rc=10): the driver's source does "
            "not build against this kernel (its API changed: zone_device_page_init)" % NEW) in flat, out[-4000:]
    assert recap(out)["changed"] > 0
