# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""deb_packages: the commands it runs and what it reports, with apt's real output (fixtures/apt)."""
from __future__ import annotations

import os
from unittest import mock

import pytest

from ansible.module_utils import basic

from ansible_collections.kpro.gpu_serving.plugins.modules import deb_packages
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "apt")


def fixture(name):
    with open(os.path.join(FIX, name)) as f:
        return f.read()


class Apt:
    """Answers like dpkg-query and apt-get: ``installed`` names, a simulation, and lists that an update fixes."""

    def __init__(self, installed, sim=("sim-dkms.out", "sim-dkms.err"), after_update=None):
        self.installed, self.sim, self.after_update, self.calls = set(installed), sim, after_update, []

    def __call__(self, argv, **kw):
        self.calls.append(argv)
        if argv[0] == "dpkg-query":
            return 0, "".join("%s\tinstalled\n" % n for n in argv[4:] if n in self.installed), ""
        if argv[1] == "update":
            self.sim = self.after_update or self.sim
            return 0, "", ""
        out, err = fixture(self.sim[0]), fixture(self.sim[1])
        if argv[1] == "-s":
            return (100 if err.startswith("E:") else 0), out, err
        self.installed.update(argv[argv.index("Dpkg::Options::=--force-confold") + 1:])
        return 0, "", ""


def run(apt, names, check_mode=False, tmp_path=None):
    rel = tmp_path / "osrelease"
    rel.write_text("6.8.12-9-pve\n")
    with mock.patch.object(basic.AnsibleModule, "run_command", lambda self, argv, **kw: apt(argv, **kw)), \
            mock.patch.object(basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: "/usr/bin/" + name), \
            mock.patch.object(deb_packages, "OSRELEASE", str(rel)), \
            mock.patch.object(basic.AnsibleModule, "warn", lambda self, msg: None):
        run_module(deb_packages, {"name": names}, check_mode=check_mode)


def test_all_installed_is_a_no_op(tmp_path):
    apt = Apt(["dkms", "proxmox-headers-6.8.12-9-pve"])
    with pytest.raises(AnsibleExitJson) as e:
        run(apt, ["dkms", "proxmox-headers-{kernel}"], tmp_path=tmp_path)
    assert e.value.result["changed"] is False and e.value.result["missing"] == []
    assert [c[0] for c in apt.calls] == ["dpkg-query"]


@pytest.mark.parametrize("check_mode", [False, True])
def test_missing_packages_installed_with_apt_plan_reported(tmp_path, check_mode):
    apt = Apt(["bash"])
    with pytest.raises(AnsibleExitJson) as e:
        run(apt, ["bash", "dkms"], check_mode=check_mode, tmp_path=tmp_path)
    res = e.value.result
    assert res["changed"] is True and res["missing"] == ["dkms"]
    assert "dkms" in [p["name"] for p in res["would_install"]] and "dkms " in res["diff"]["after"]
    installs = [c for c in apt.calls if c[1] == "install"]
    assert installs == ([] if check_mode else [installs[0]]) and ("dkms" in apt.installed) is not check_mode


def test_unknown_package_refreshes_lists_once_then_installs(tmp_path):
    apt = Apt([], sim=("sim-noheaders.out", "sim-noheaders.err"), after_update=("sim-dkms.out", "sim-dkms.err"))
    with pytest.raises(AnsibleExitJson):
        run(apt, ["dkms"], tmp_path=tmp_path)
    assert [c[1] for c in apt.calls[1:]] == ["-s", "update", "-s", "install"]


def test_unavailable_after_refresh_fails_before_installing_with_the_repository(tmp_path):
    apt = Apt([], sim=("sim-noheaders.out", "sim-noheaders.err"))
    with pytest.raises(AnsibleFailJson) as e:
        run(apt, ["dkms", "proxmox-headers-{kernel}", "proxmox-default-headers"], tmp_path=tmp_path)
    res = e.value.result
    assert res["phase"] == "packages_unavailable" and "proxmox-headers-6.8.12-9-pve" in res["msg"]
    assert "pve-no-subscription" in res["remedy"] and "Remedy:" in res["msg"]
    assert not [c for c in apt.calls if c[1] == "install"]


def test_check_mode_never_refreshes_lists(tmp_path):
    apt = Apt([], sim=("sim-noheaders.out", "sim-noheaders.err"))
    with mock.patch.object(deb_packages.glob, "glob", lambda p: ["/var/lib/apt/lists/x_Packages"]):
        with pytest.raises(AnsibleFailJson) as e:
            run(apt, ["proxmox-default-headers"], check_mode=True, tmp_path=tmp_path)
    assert "check mode does not refresh" in e.value.result["msg"]
    assert [c[1] for c in apt.calls[1:]] == ["-s"]


def test_no_names_queries_nothing(tmp_path):
    apt = Apt([])
    with pytest.raises(AnsibleExitJson) as e:
        run(apt, [], tmp_path=tmp_path)
    assert e.value.result["changed"] is False and apt.calls == []
