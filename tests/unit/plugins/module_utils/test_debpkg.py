# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""debpkg against real apt-get / dpkg-query output (tests/unit/fixtures/apt/README.md)."""
from __future__ import annotations

import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils import debpkg

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "apt")


def fixture(name):
    with open(os.path.join(FIX, name)) as f:
        return f.read()


def test_expand_names_the_running_kernel():
    assert debpkg.expand(["dkms", "proxmox-headers-{kernel}"], "6.8.12-9-pve") == ["dkms", "proxmox-headers-6.8.12-9-pve"]


def test_installed_reads_dpkg_status_only_installed_counts():
    out = fixture("dpkg-query.out") + "dkms\tconfig-files\nkmod:amd64\tinstalled\n"
    assert debpkg.installed(out) == {"bash", "libc6-dev", "kmod"}
    assert debpkg.missing(["bash", "dkms", "nosuchpkg"], debpkg.installed(out)) == ["dkms", "nosuchpkg"]


def test_simulation_lists_apt_plan_with_dependencies():
    sim = debpkg.simulation(fixture("sim-dkms.out"), fixture("sim-dkms.err"))
    names = [p["name"] for p in sim["new"]]
    assert "dkms" in names and sim["unavailable"] == []
    assert all(p["version"] for p in sim["new"])


def test_simulation_names_each_package_apt_cannot_find_once():
    sim = debpkg.simulation(fixture("sim-noheaders.out"), fixture("sim-noheaders.err"))
    # apt also prints "Couldn't find any package by glob/regex" for names with dots: not counted twice.
    assert sim["unavailable"] == ["proxmox-headers-6.8.12-9-pve", "proxmox-default-headers"]


def test_unavailable_failure_names_the_repository_per_package():
    err = fixture("sim-noheaders.err")
    f = debpkg.unavailable_failure(["proxmox-headers-6.8.12-9-pve", "dkms"], err, refreshed=True)
    assert f.phase == "packages_unavailable" and "after apt-get update" in f.msg
    assert "pve-no-subscription" in f.remedy and "Debian's bookworm main" in f.remedy
    assert f.evidence[0] == "E: Unable to locate package proxmox-headers-6.8.12-9-pve"


def test_install_argv_keeps_recommends_and_config_files_out():
    argv = debpkg.install_argv("/usr/bin/apt-get", ["dkms"])
    assert argv[:2] == ["/usr/bin/apt-get", "install"] and "--no-install-recommends" in argv
    assert "Dpkg::Options::=--force-confold" in argv and argv[-1] == "dkms"


def test_apt_failed_keeps_the_end_of_apts_output():
    f = debpkg.apt_failed("install", ["a", "b"], 100, "\n".join("line %d" % i for i in range(20)))
    assert f.phase == "apt_failed" and "rc 100" in f.msg and f.evidence == ["line %d" % i for i in range(10, 20)]
