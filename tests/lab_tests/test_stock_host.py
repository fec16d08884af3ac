"""A stock node converges (issue 11): what a fresh PVE 8 install lacks, the collection installs, through the
real apt and dpkg against the lab's mirror; what it cannot install, the preflight names with the fix.

Each test starts from a fresh node (`labctl reset`).
"""

from __future__ import annotations

import pytest

from conftest import labctl
from test_gpu_host_stage import play, recap


@pytest.fixture
def fresh(lab):
    labctl("reset")
    yield lab
    labctl("reset")


def has(lab, probe):
    return lab.sh(probe, check=False).returncode == 0


def test_stock_node_gets_compiler_dkms_headers_and_proxmoxer(fresh):
    lab = fresh
    # a fresh PVE 8 install: no compiler, no dkms, no proxmoxer, no headers
    assert not has(lab, "command -v cc || command -v make || command -v dkms")
    assert not has(lab, "python3 -c 'import proxmoxer'")
    assert not has(lab, "test -e /lib/modules/6.8.12-9-pve/build")
    out = play("--tags", "gpu_host,lxc_gpu").stdout
    assert recap(out)["failed"] == 0, out[-4000:]
    assert "the run installs build-essential, dkms, proxmox-headers-6.8.12-9-pve, proxmox-default-headers, " \
           "python3-proxmoxer (" in " ".join(out.split())
    assert has(lab, "command -v cc && command -v make && command -v ld && test -f /usr/include/stdio.h")
    assert lab.sh("dkms --version").returncode == 0
    assert lab.sh("python3 -c 'import proxmoxer; print(proxmoxer.__version__)'").stdout.strip() == "1.2.0"
    assert lab.sh("dpkg-query -W -f '${db:Status-Status}' proxmox-default-headers").stdout == "installed"
    again = play("--tags", "gpu_host,lxc_gpu").stdout
    assert recap(again)["changed"] == 0 and recap(again)["failed"] == 0, again[-4000:]
    assert "the run installs no packages" in " ".join(again.split())


def test_installer_refuses_without_a_compiler(fresh):
    """What the lab catches now: without the packages step, the installer refuses as the real one does."""
    out = play("--tags", "gpu_host", "--skip-tags", "preflight", "-e", '{"gpu_host_packages": []}').stdout
    assert recap(out)["failed"] == 1
    assert "installer_failed" in out and "Unable to find the development tool `cc`" in out, out[-4000:]
    flat = " ".join(out.split())  # the cause, read from the installer's words, and what to do
    assert "a tool the module build needs is missing (cc) (build_tools_missing)" in flat, out[-4000:]
    assert "apt-get install build-essential" in flat, out[-4000:]


def test_preflight_names_the_missing_proxmox_repository(fresh):
    lab = fresh
    lab.sh("rm /etc/apt/sources.list.d/pve-no-subscription.list && apt-get update -qq")
    before = lab.sh("dpkg-query -W -f '${Package}\\n' | sort").stdout
    out = play("--tags", "preflight").stdout
    flat = " ".join(out.split())
    assert recap(out)["failed"] == 1, out[-4000:]
    assert "packages_unavailable" in flat and "proxmox-headers-6.8.12-9-pve" in flat and "proxmox-default-headers" in flat
    assert "pve-no-subscription" in flat
    assert lab.sh("dpkg-query -W -f '${Package}\\n' | sort").stdout == before  # nothing installed
