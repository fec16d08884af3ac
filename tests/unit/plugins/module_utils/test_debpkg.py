# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""debpkg against real apt-get / dpkg-query output (tests/unit/fixtures/apt/README.md)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import debpkg

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
    assert "pve-no-subscription" in f.remedy and "Debian's main repository of the host's release" in f.remedy \
        and "trixie in /etc/apt/sources.list.d/debian.sources on PVE 9" in f.remedy
    assert f.evidence[0] == "E: Unable to locate package proxmox-headers-6.8.12-9-pve"


def test_install_argv_keeps_recommends_and_config_files_out():
    argv = debpkg.install_argv("/usr/bin/apt-get", ["dkms"])
    assert argv[:2] == ["/usr/bin/apt-get", "install"] and "--no-install-recommends" in argv
    assert "Dpkg::Options::=--force-confold" in argv and argv[-1] == "dkms"


def test_apt_failed_keeps_the_end_of_apts_output():
    f = debpkg.apt_failed("install", ["a", "b"], 100, "\n".join("line %d" % i for i in range(20)))
    assert f.phase == "apt_failed" and "rc 100" in f.msg and f.evidence == ["line %d" % i for i in range(10, 20)]


def test_query_shell_lists_with_this_machines_dpkg_and_listing_reads_it():
    """The probe's line run by a real shell and this machine's dpkg-query: a known package is listed, an unknown one
    prints nothing and the line still exits 0, {kernel} is the running kernel there; the listing reads it."""
    if not shutil.which("dpkg-query"):
        pytest.skip("no dpkg-query on this machine")
    names = ["bash", "kpgs-no-such-package", "kpgs-headers-{kernel}"]
    r = subprocess.run(["sh", "-c", debpkg.query_shell(names)], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stderr == ""
    assert "bash\tinstalled" in r.stdout.splitlines()
    kernel = os.uname().release
    result = debpkg.listing(names, r.stdout, kernel)
    assert result == dict(changed=False, missing=["kpgs-no-such-package", "kpgs-headers-" + kernel], would_install=[],
                          kernel=kernel)


def test_query_shell_quotes_each_name_and_asks_nothing_for_no_names():
    assert debpkg.query_shell([]) == "true"
    line = debpkg.query_shell(["a b", "c;rm -rf /"])
    assert "'a b'" in line and "'c;rm -rf /'" in line


def test_listing_counts_only_installed_as_installed():
    out = "dkms\tconfig-files\nkmod:amd64\tinstalled\nproxmox-headers-6.8.12-9-pve\tinstalled\n"
    assert debpkg.listing(["kmod", "dkms", "proxmox-headers-{kernel}"], out, "6.8.12-9-pve")["missing"] == ["dkms"]


def test_the_filters_give_the_probe_line_and_the_modules_listing():
    """plugins/filter/debpkg.py: the roles' raw probes use the same line and the same reading as the module; the
    probe's lines come as a list (stdout_lines) or as one text."""
    from ansible_collections.kpro.gpu_serving.plugins.filter import debpkg as f
    assert f.FilterModule().filters()["dpkg_query_sh"](["kmod"]) == debpkg.query_shell(["kmod"])
    lines = ["kmod\tinstalled", "dkms\tconfig-files"]
    want = dict(changed=False, missing=["dkms"], would_install=[], kernel="6.8.12-9-pve")
    assert f.dpkg_listing(["kmod", "dkms"], lines, "6.8.12-9-pve\n") == want
    assert f.dpkg_listing(["kmod", "dkms"], "\n".join(lines), "6.8.12-9-pve") == want
    assert f.dpkg_listing([], [], "6.8.12-9-pve")["missing"] == []
