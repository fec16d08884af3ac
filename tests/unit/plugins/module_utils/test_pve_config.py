# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pve_config: one lossless parser for CT and VM configs."""

from __future__ import annotations

import glob
import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pve_config as pc

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures")
CT_FILES = sorted(glob.glob(os.path.join(FIX, "lxc", "*.conf")))
VM_FILES = sorted(glob.glob(os.path.join(FIX, "pve", "*.conf")))


@pytest.mark.parametrize("path,dialect", [(p, pc.CT) for p in CT_FILES] + [(p, pc.VM) for p in VM_FILES])
def test_every_fixture_renders_back_byte_for_byte(path, dialect):
    with open(path, "rb") as f:
        raw = f.read()
    assert pc.ConfigFile.parse(raw, dialect).to_bytes() == raw


def test_vm_dialect_pending_and_special_sections():
    text = "hostpci0: 0000:17:00,pcie=1\r\nonboot: 1\n[PENDING]\nhostpci1: mapping=a6000\n[special:cloudinit]\nname: x\n[snap1]\nhostpci0: 01:00\n"
    conf = pc.ConfigFile.parse(text, pc.VM)
    assert [(s.kind, s.name) for s in conf.sections] == [("main", ""), ("pending", "PENDING"), ("special", "special:cloudinit"),
                                                         ("snapshot", "snap1")]
    assert conf.main.get("hostpci0") == "0000:17:00,pcie=1" and conf.pending.get("hostpci1") == "mapping=a6000"
    assert [s.name for s in conf.snapshots] == ["snap1"] and conf.render() == text


def test_ct_dialect_keeps_its_pending_name_and_lxc_lines():
    text = "arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\n[pve:pending]\ndev0: /dev/nvidia0\n"
    conf = pc.ConfigFile.parse(text)
    assert conf.pending.name == "pve:pending" and [ln.key for ln in conf.main.lxc()] == ["lxc.cgroup2.devices.allow"]
    # "[PENDING]" is a snapshot name to a CT, "[pve:pending]" a header a VM config never has
    assert pc.ConfigFile.parse("[PENDING]\n").snapshots[0].name == "PENDING"
