"""The lab's kernel where stage 1 depends on it: vfio-pci's ids= and nouveau, as a real kernel does them.

- vfio-pci.ids= is a permission-0 parameter (drivers/vfio/pci/vfio_pci.c:33-34, v6.12): no
  /sys/module/vfio_pci/parameters/ids; vfio_pci_fill_ids() adds the ids as dynamic ids (vfio_pci.c:236),
  which remove_id takes out (drivers/pci/pci-driver.c:287-320).
- udev loads every module matching a device's alias, bound or not (systemd rules.d/80-drivers.rules:5):
  without a blacklist, nouveau is loaded next to vfio-pci and takes the A6000s at the next probe.
- nouveau with modeset=0 registers no PCI driver (nouveau_drm.c:1435-1446).
No lab and no root needed: the seed is booted in a temporary root.
"""

import errno
import os
import sys

import pytest

from conftest import LAB, lablib

if LAB not in sys.path:
    sys.path.insert(0, LAB)

labstate = lablib("labstate")
GPUS, AUDIO = ["0000:17:00.0", "0000:65:00.0"], ["0000:17:00.1", "0000:65:00.1"]


def seeded(tmp_path, monkeypatch, nouveau=False, extra=None):
    """A freshly seeded and booted kpro5 root (seed.py), optionally without the nouveau blacklist."""
    if nouveau:
        monkeypatch.setenv("KPGS_LAB_NOUVEAU", "1")
    else:
        monkeypatch.delenv("KPGS_LAB_NOUVEAU", raising=False)
    seed = lablib("seed")
    root = str(tmp_path / "root")
    seed.seed_files(root)
    for rel, text in (extra or {}).items():
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    st = seed.seed_state(root)
    return root, st


def release_gpus(st):
    """What vfio_release does at runtime: remove_id (until ENODEV), unbind, drivers_probe."""
    for ident in ("10de 2230\n", "10de 1aef\n"):
        labstate.pci_remove_id(st, "vfio-pci", ident)
        with pytest.raises(labstate.KernelError) as e:
            labstate.pci_remove_id(st, "vfio-pci", ident)
        assert e.value.errno == errno.ENODEV
    for bdf in GPUS + AUDIO:
        labstate.pci_unbind(st, "vfio-pci", bdf + "\n")
        labstate.pci_probe(st, bdf + "\n")
    return dict((b, labstate.pci_driver_of(st, b)) for b in GPUS + AUDIO)


def test_boot_cmdline_ids_are_dynamic_ids_that_remove_id_takes_out(tmp_path, monkeypatch):
    _root, st = seeded(tmp_path, monkeypatch)
    assert "vfio-pci.ids=10de:2230,10de:1aef,1b21:1242" in st["kernel"]["cmdline"]
    dynids = [e[:2] for e in st["pci"]["drivers"]["vfio-pci"]["dynids"]]
    assert ["10de", "2230"] in dynids and ["10de", "1aef"] in dynids and st["pci"]["drivers"]["vfio-pci"]["ids"] == []
    assert "nouveau" not in st["modules"]["loaded"]  # blacklisted on this host
    assert release_gpus(st) == {GPUS[0]: None, GPUS[1]: None, AUDIO[0]: "snd_hda_intel", AUDIO[1]: "snd_hda_intel"}
    assert labstate.pci_driver_of(st, "0000:04:00.0") == "vfio-pci"  # 1b21:1242 stays


def test_sysfs_has_no_vfio_pci_ids_parameter(tmp_path, monkeypatch):
    root, _st = seeded(tmp_path, monkeypatch)
    fakesys = lablib("fakesys")
    params = fakesys.Tree(root).lookup("sys/module/vfio_pci/parameters")
    assert "ids" not in params and params["disable_vga"].read() == "Y\n"


def test_stock_host_loads_nouveau_at_boot_and_a_probe_gives_it_the_gpus(tmp_path, monkeypatch):
    root, st = seeded(tmp_path, monkeypatch, nouveau=True)
    assert "blacklist nouveau" not in open(os.path.join(root, "etc/modprobe.d/blacklist-gpu.conf")).read()
    assert "nouveau" in st["modules"]["loaded"] and "nouveau" in st["pci"]["drivers"]
    assert [labstate.pci_driver_of(st, b) for b in GPUS] == ["vfio-pci", "vfio-pci"]  # vfio-pci came first
    assert release_gpus(st) == {GPUS[0]: "nouveau", GPUS[1]: "nouveau", AUDIO[0]: "snd_hda_intel",
                                AUDIO[1]: "snd_hda_intel"}
    labstate.modprobe(st, "nouveau", root, remove=True)  # unbinds and unregisters, as rmmod does
    assert "nouveau" not in st["pci"]["drivers"] and labstate.pci_driver_of(st, GPUS[0]) is None


def test_nouveau_with_modeset_0_binds_nothing(tmp_path, monkeypatch):
    _root, st = seeded(tmp_path, monkeypatch, nouveau=True,
                       extra={"etc/modprobe.d/nouveau-off.conf": "options nouveau modeset=0\n"})
    assert "nouveau" in st["modules"]["loaded"] and "nouveau" not in st["pci"]["drivers"]
    assert release_gpus(st)[GPUS[0]] is None
