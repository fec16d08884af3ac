# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""lxc_gpu_passthrough against the lab node kpro5, through the real ansible CLI and SSH.

Works on a copy of a realistic CT config in a scratch directory on the node (never the
lab's /etc/pve), so it does not depend on the fake PVE API. Skips when the lab is not up.
"""
from __future__ import annotations

import json
import os

import pytest

from test_gpu_facts import TOP, ansible_module, lab_up  # noqa: F401 pylint: disable=unused-import  (fixture re-used)

FIX = os.path.join(TOP, "tests", "unit", "fixtures", "lxc")
SCRATCH = "/tmp/kpgs-lxc-gpu-passthrough"
DEVICES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def _seed(name):
    rc, r = ansible_module("kpro5", "ansible.builtin.copy", "src=%s dest=%s/%s" % (os.path.join(FIX, name), SCRATCH, name))
    assert rc == 0, r


def _args(vmid, **kw):
    a = dict(vmid=vmid, config_dir=SCRATCH, backup_dir=SCRATCH + "/bk", lock_dir=SCRATCH + "/lock", restart=False)
    a.update(kw)
    return json.dumps(a)


@pytest.fixture
def scratch(lab_up):  # noqa: F811
    rc, r = ansible_module("kpro5", "ansible.builtin.file", "path=%s state=directory" % SCRATCH)
    assert rc == 0, r
    yield SCRATCH
    ansible_module("kpro5", "ansible.builtin.file", "path=%s state=absent" % SCRATCH)


def test_devn_on_copy_changed_then_idempotent(scratch):
    _seed("129.conf")
    rc, r1 = ansible_module("kpro5", "kpro.gpu_serving.lxc_gpu_passthrough",
                            _args(129, method="devN", devices=DEVICES, require_nodes=False, writer="file"))
    assert rc == 0 and r1["changed"], r1
    rc, r2 = ansible_module("kpro5", "kpro.gpu_serving.lxc_gpu_passthrough",
                            _args(129, method="devN", devices=DEVICES, require_nodes=False, writer="file"))
    assert rc == 0 and not r2["changed"], r2


def test_lxc_raw_discovery_uses_node_majors(scratch):
    _seed("130.conf")
    rc, r = ansible_module("kpro5", "kpro.gpu_serving.lxc_gpu_passthrough", _args(130, method="lxc_raw"))
    if rc != 0:
        # driver not loaded in the lab right now: the failure must name the node and the fix
        assert ("does not exist" in r["msg"] or "no GPU device node" in r["msg"]) and "nvidia-modprobe" in r["msg"], r
        return
    uvm = r["majors"].get("nvidia-uvm")
    assert uvm and "lxc.cgroup2.devices.allow: c %d:* rwm" % uvm in r["lxc_lines"], r
    rc, r2 = ansible_module("kpro5", "kpro.gpu_serving.lxc_gpu_passthrough", _args(130, method="lxc_raw"))
    assert rc == 0 and not r2["changed"], r2


def test_locked_ct_is_refused(scratch):
    _seed("140.conf")
    rc, r = ansible_module("kpro5", "kpro.gpu_serving.lxc_gpu_passthrough",
                           _args(140, devices=DEVICES, require_nodes=False, writer="file"))
    assert rc != 0 and "is locked (lock: backup)" in r["msg"], r
