# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stage 1 (vfio_release) on the lab node, through the real ansible CLI and SSH (issue 11).

- A host booted with ``vfio-pci.ids=`` on its command line: the kernel made those ids dynamic ids
  (drivers/vfio/pci/vfio_pci.c:236, v6.12), so the release happens now and no reboot is required.
- A host that does not blacklist nouveau (seeded with KPGS_LAB_NOUVEAU=1): udev loaded nouveau at
  boot next to vfio-pci; after the release the GPUs are not on nouveau, nouveau is blacklisted
  persistently (initramfs included) and still off after a reboot.
- A stopped container 129 is UNREACHABLE, "container 129 is not running".
Each test starts from a freshly seeded node (`labctl reset`).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO, labctl
from test_gpu_facts import ansible_module

GPUS, AUDIO = ["0000:17:00.0", "0000:65:00.0"], ["0000:17:00.1", "0000:65:00.1"]
USB = "0000:04:00.0"  # 1b21:1242 stays on vfio-pci for VM 110
NOUVEAU_CONF = "etc/modprobe.d/kpro-gpu-serving-nouveau.conf"


def drivers(state, bdfs):
    return [state["pci"]["devices"][b]["driver"] for b in bdfs]


@pytest.fixture
def node(lab):
    labctl("reset")
    yield lab


@pytest.fixture
def stock_nouveau_node(lab):
    """kpro5 as seeded, but without "blacklist nouveau" (seed.py reads KPGS_LAB_NOUVEAU at labctl's seeding)."""
    os.environ["KPGS_LAB_NOUVEAU"] = "1"
    try:
        labctl("reset")
    finally:
        del os.environ["KPGS_LAB_NOUVEAU"]
    yield lab
    labctl("reset")  # the next tests expect the node as normally seeded


def test_boot_cmdline_ids_are_released_now_without_reboot(node):
    st = node.state()
    assert "vfio-pci.ids=10de:2230,10de:1aef,1b21:1242" in st["kernel"]["cmdline"]
    assert drivers(st, GPUS + AUDIO) == ["vfio-pci"] * 4
    assert not os.path.exists(os.path.join(node.root, "sys/module/vfio_pci/parameters/ids"))  # permission 0
    rc, r = ansible_module("kpro5", "kpro.gpu_serving.vfio_release")
    assert rc == 0, r
    assert r["reboot_required"] is False, r["reboot_reasons"]
    assert r["boot_vfio_ids"] == ["10de:1aef", "10de:2230"]
    assert sorted(r["removed_dynamic_ids"]) == ["10de:1aef", "10de:2230"]
    assert r["bound_after"] == {GPUS[0]: None, AUDIO[0]: "snd_hda_intel", GPUS[1]: None, AUDIO[1]: "snd_hda_intel"}
    st = node.state()
    assert drivers(st, GPUS + AUDIO + [USB]) == [None, None, "snd_hda_intel", "snd_hda_intel", "vfio-pci"]
    assert [e[:2] for e in st["pci"]["drivers"]["vfio-pci"]["dynids"]] == [["1b21", "1242"]]
    assert "vfio-pci.ids=10de:2230,10de:1aef,1b21:1242" in st["kernel"]["cmdline"]  # the running kernel is the same
    rc, again = ansible_module("kpro5", "kpro.gpu_serving.vfio_release")
    assert rc == 0 and again["changed"] is False and again["reboot_required"] is False, again


def test_stock_host_nouveau_never_gets_the_gpus_and_is_blacklisted(stock_nouveau_node):
    node = stock_nouveau_node
    st = node.state()
    assert "nouveau" in st["modules"]["loaded"] and "nouveau" in st["pci"]["drivers"]  # udev, at boot
    assert drivers(st, GPUS) == ["vfio-pci", "vfio-pci"]
    rc, r = ansible_module("kpro5", "kpro.gpu_serving.vfio_release")
    assert rc == 0, r
    st = node.state()
    assert drivers(st, GPUS) == [None, None], r["runtime_actions"]
    assert "nouveau" not in st["modules"]["loaded"], r["runtime_actions"]
    conf = os.path.join(node.root, NOUVEAU_CONF)
    assert os.path.exists(conf) and "blacklist nouveau" in open(conf).read()
    initrd = st["boot"]["initramfs"][st["kernel"]["release"]]["files"]
    assert "blacklist nouveau" in initrd.get("/" + NOUVEAU_CONF, "")
    assert r["nouveau"]["blacklist"] == "/" + NOUVEAU_CONF and r["nouveau"]["unloaded"] is True
    assert r["reboot_required"] is False, r["reboot_reasons"]
    labctl("reboot")
    st = node.state()
    assert "nouveau" not in st["modules"]["loaded"] and drivers(st, GPUS) == [None, None]


def test_stopped_container_is_unreachable_because_not_running(node):
    r = node.ssh("pct status 129", check=False)
    if "running" not in r.stdout:
        pytest.skip("container 129 is not running in the lab (pct status: %s)" % (r.stdout + r.stderr).strip())
    node.ssh("pct stop 129")
    try:
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible"), "ct129", "-m", "ansible.builtin.ping"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 4, proc.stdout + proc.stderr  # 4: a host was unreachable
        assert "UNREACHABLE" in proc.stdout and "container 129 is not running" in proc.stdout, proc.stdout
    finally:
        node.ssh("pct start 129", check=False)
