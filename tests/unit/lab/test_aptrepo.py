"""The lab's package mirror: Proxmox header stand-ins with the real meta packages' dependency chain."""

import os
import subprocess
import sys


LAB = os.path.join(os.path.dirname(__file__), "..", "..", "lab")
sys.path.insert(0, LAB)

import aptrepo  # noqa: E402


def test_pve_repository_headers_and_meta_packages(tmp_path):
    aptrepo.build_pve(str(tmp_path), ["6.8.12-4-pve", "6.8.12-9-pve"])
    repo = tmp_path / "build" / "apt" / "pve"
    index = (repo / "Packages").read_text()
    stanzas = {s.split("\n")[0].split(": ")[1]: s for s in index.strip().split("\n\n")}
    assert sorted(stanzas) == ["proxmox-default-headers", "proxmox-headers-6.8", "proxmox-headers-6.8.12-4-pve",
                               "proxmox-headers-6.8.12-9-pve"]
    # default-headers -> headers-6.8 -> the newest release, as Proxmox's meta packages chain them
    assert "Depends: proxmox-headers-6.8\n" in stanzas["proxmox-default-headers"]
    assert "Depends: proxmox-headers-6.8.12-9-pve\n" in stanzas["proxmox-headers-6.8"]
    assert "Release" in os.listdir(repo) and "SHA256:" in (repo / "Release").read_text()
    files = subprocess.run(["dpkg-deb", "-c", str(repo / "proxmox-headers-6.8.12-9-pve.deb")], check=True,
                           capture_output=True, text=True).stdout
    assert "./usr/src/linux-headers-6.8.12-9-pve/Makefile" in files
    assert "./lib/modules/6.8.12-9-pve/build -> /usr/src/linux-headers-6.8.12-9-pve" in files
    # no compiler comes with the headers (proxmox-headers-* depend on no toolchain)
    assert "Depends:" not in stanzas["proxmox-headers-6.8.12-9-pve"]
