# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vfio_runtime.release() against the fake kernel of tests/unit/plugins/fake_sysfs.py."""

from __future__ import annotations

import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pci
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import vfio_runtime
from ansible_collections.kpro.gpu_serving.tests.unit.plugins import fake_sysfs

GPU0, AUD0, GPU1, AUD1 = "0000:17:00.0", "0000:17:00.1", "0000:73:00.0", "0000:73:00.1"
T4 = "0000:b3:00.0"  # another NVIDIA GPU, not selected, that nouveau drives (the console, say)
MANAGED = ["10de:1aef", "10de:2230"]
CMDLINE = "BOOT_IMAGE=/boot/vmlinuz-6.8.12-9-pve ro quiet intel_iommu=on vfio-pci.ids=10de:2230,10de:1aef,1b21:1242"


def _kernel(tmp_path, monkeypatch, t4_on_nouveau=False):
    devices = dict(fake_sysfs.KPRO5)
    drivers = dict(fake_sysfs.DRIVER_IDS, nouveau=[("10de", "2230"), ("10de", "1eb8")])
    if t4_on_nouveau:
        devices[T4] = ("pci0000:b2/0000:b2:00.0", "10de", "1eb8", "10de", "12a2", "0x030200", 90, "nouveau")
    root = fake_sysfs.build(tmp_path, devices=devices, drivers=drivers)
    os.makedirs(os.path.join(root, "module", "nouveau"))
    # the boot's vfio-pci.ids=: dynamic ids (vfio_pci_fill_ids), as removable as Proxmox's new_id
    k = fake_sysfs.FakeKernel(root, dynids={"vfio-pci": [("10de", "2230"), ("10de", "1aef"), ("1b21", "1242")]},
                              static=drivers)
    monkeypatch.setattr(pci, "sysfs_write", k)
    selected = pci.select_gpus(pci.list_devices(root), ids=["10de:2230"])
    return k, selected


def test_nouveau_driving_another_gpu_stays_and_gets_none_of_ours(tmp_path, monkeypatch):
    k, selected = _kernel(tmp_path, monkeypatch, t4_on_nouveau=True)
    unloads = []
    rep = vfio_runtime.release(selected, MANAGED, k.sysfs, False, CMDLINE, True, unloads.append)
    assert unloads == []  # never unloaded under a device it drives
    assert rep["nouveau"]["not_probed"] == [GPU0, GPU1] and rep["nouveau"]["unloaded"] is False
    assert [pci.current_driver(b, k.sysfs) for b in (GPU0, AUD0, GPU1, AUD1, T4)] == [None, "snd_hda_intel", None,
                                                                                      "snd_hda_intel", "nouveau"]
    assert any(T4 in w for w in rep["warnings"])
    assert len(rep["reasons"]) == 1 and "nouveau is loaded and could not be unloaded (it drives %s)" % T4 in rep["reasons"][0]


def test_boot_ids_are_removed_and_the_gpus_probed_once_nouveau_is_gone(tmp_path, monkeypatch):
    k, selected = _kernel(tmp_path, monkeypatch)

    def unload(name):
        os.rmdir(os.path.join(k.sysfs, "module", name))
        for entry in os.listdir(os.path.join(k.pci, "drivers", name)):
            os.unlink(os.path.join(k.pci, "drivers", name, entry))
        os.rmdir(os.path.join(k.pci, "drivers", name))
        return True, ""
    rep = vfio_runtime.release(selected, MANAGED, k.sysfs, False, CMDLINE, True, unload)
    assert rep["nouveau"] == {"loaded": True, "unbound": [], "unloaded": True, "not_probed": []}
    assert rep["removed_dynamic_ids"] == MANAGED and k.dynids["vfio-pci"] == [("1b21", "1242")]
    assert vfio_runtime.verdict(selected, k.sysfs, rep, False) == {GPU0: None, AUD0: "snd_hda_intel", GPU1: None,
                                                                   AUD1: "snd_hda_intel"}
    assert rep["reasons"] == [] and rep["runtime_errors"] == [] and rep["changed"] is True


def test_warns_only_when_an_unloaded_vfio_pci_would_bring_boot_ids_back(tmp_path, monkeypatch):
    k, selected = _kernel(tmp_path, monkeypatch)
    rep = vfio_runtime.release(selected, MANAGED, k.sysfs, False, CMDLINE, False)
    assert not any("vfio-pci is not loaded" in w for w in rep["warnings"])
    # after rmmod vfio-pci: a later modprobe (a VM start) would add the command line's ids again and bind unbound GPUs
    for d in selected:
        d["driver"] = None
    rep = vfio_runtime.release(selected, MANAGED, str(tmp_path / "no-vfio"), False, CMDLINE, False)
    assert [w for w in rep["warnings"] if "vfio-pci is not loaded and /proc/cmdline has vfio-pci.ids=10de:1aef,10de:2230" in w]
    assert rep["reasons"] == []
