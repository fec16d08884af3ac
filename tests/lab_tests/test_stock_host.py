"""A stock node converges (issue 11): what a fresh PVE 8 install lacks, the collection installs, through the
real apt and dpkg against the lab's mirror; what it cannot install, the preflight names with the fix.

Each test starts from a fresh node (`labctl reset`) of the session's release ($KPGS_LAB_RELEASE, default pve8;
`make lab-test-pve9` runs this file on a PVE 9 node too).
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


# What a fresh node of each release lacks beyond the build tools and headers, and what it has instead
# (tests/lab/stock/pve8.txt, pve9.txt): PVE 9 has no python3-requests (no glusterfs-client any more) and trixie's
# proxmoxer is 2.2.0; its Proxmox repository is the deb822 file pve-docs names.
STOCK = {
    "pve8": {"also": "", "proxmoxer": "1.2.0", "pve_repo": "/etc/apt/sources.list.d/pve-no-subscription.list"},
    "pve9": {"also": ", python3-requests", "proxmoxer": "2.2.0", "pve_repo": "/etc/apt/sources.list.d/proxmox.sources"},
}


def has(lab, probe):
    return lab.sh(probe, check=False).returncode == 0


def test_stock_node_gets_compiler_dkms_headers_and_proxmoxer(fresh):
    lab = fresh
    stock, kernel = STOCK[lab.release], lab.state()["kernel"]["release"]
    # a fresh PVE 8 or 9 install: no compiler, no dkms, no proxmoxer, no headers
    assert not has(lab, "command -v cc || command -v make || command -v dkms")
    assert not has(lab, "python3 -c 'import proxmoxer'")
    assert not has(lab, "test -e /lib/modules/%s/build" % kernel)
    out = play("--tags", "gpu_host,lxc_gpu").stdout
    assert recap(out)["failed"] == 0, out[-4000:]
    assert "the run installs build-essential, dkms, proxmox-headers-%s, proxmox-default-headers, " \
           "python3-proxmoxer%s (" % (kernel, stock["also"]) in " ".join(out.split()), out[-4000:]
    assert has(lab, "command -v cc && command -v make && command -v ld && test -f /usr/include/stdio.h")
    assert lab.sh("dkms --version").returncode == 0
    assert lab.sh("python3 -c 'import proxmoxer; print(proxmoxer.__version__)'").stdout.strip() == stock["proxmoxer"]
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
    lab.sh("rm %s && apt-get update -qq" % STOCK[lab.release]["pve_repo"])
    before = lab.sh("dpkg-query -W -f '${Package}\\n' | sort").stdout
    out = play("--tags", "preflight").stdout
    flat = " ".join(out.split())
    assert recap(out)["failed"] == 1, out[-4000:]
    kernel = lab.state()["kernel"]["release"]
    assert "packages_unavailable" in flat and "proxmox-headers-%s" % kernel in flat and "proxmox-default-headers" in flat
    assert "pve-no-subscription" in flat
    assert lab.sh("dpkg-query -W -f '${Package}\\n' | sort").stdout == before  # nothing installed
