# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A kpro5-like sysfs tree on disk, laid out with the kernel's symlinks, and a fake kernel for writes.

    /sys/bus/pci/devices/0000:17:00.0 -> ../../../devices/pci0000:16/0000:16:02.0/0000:17:00.0
    .../0000:17:00.0/driver           -> ../../../../bus/pci/drivers/vfio-pci
    .../0000:17:00.0/iommu_group      -> ../../../../kernel/iommu_groups/27
    /sys/kernel/iommu_groups/27/devices/0000:17:00.0 -> ../../../../devices/pci0000:16/0000:16:02.0/0000:17:00.0

Regular files cannot return kernel errnos, so :class:`FakeKernel` replaces
``pci.sysfs_write`` in tests and applies the PCI core's semantics to the tree
(unbind / bind / driver_override / drivers_probe / new_id / remove_id, with their errnos).
"""

from __future__ import annotations

import errno
import os

# bdf: (parent path under devices/, vendor, device, subsystem vendor, subsystem device, class, group, driver)
KPRO5 = {
    "0000:00:00.0": ("pci0000:00", "8086", "09a2", "8086", "0000", "0x060000", 0, None),
    "0000:16:02.0": ("pci0000:16", "8086", "347a", "8086", "0000", "0x060400", 26, "pcieport"),
    "0000:17:00.0": ("pci0000:16/0000:16:02.0", "10de", "2230", "10de", "1459", "0x030000", 27, "vfio-pci"),
    "0000:17:00.1": ("pci0000:16/0000:16:02.0", "10de", "1aef", "10de", "1459", "0x040300", 27, "vfio-pci"),
    "0000:72:02.0": ("pci0000:72", "8086", "347a", "8086", "0000", "0x060400", 74, "pcieport"),
    "0000:73:00.0": ("pci0000:72/0000:72:02.0", "10de", "2230", "10de", "1459", "0x030000", 75, "vfio-pci"),
    "0000:73:00.1": ("pci0000:72/0000:72:02.0", "10de", "1aef", "10de", "1459", "0x040300", 75, "vfio-pci"),
    "0000:03:00.0": ("pci0000:00/0000:00:1c.0", "1b21", "1242", "1043", "8675", "0x0c0330", 14, "vfio-pci"),
    "0000:01:00.0": ("pci0000:00/0000:00:1b.0", "8086", "1521", "15d9", "1521", "0x020000", 12, "igb"),
}

# Static id tables of the loaded drivers (what the module's MODULE_DEVICE_TABLE matches).
DRIVER_IDS = {
    "vfio-pci": [],
    "pcieport": [],
    "igb": [("8086", "1521")],
    "snd_hda_intel": [("10de", "1aef")],
}


def _write(path, text):
    d = os.path.dirname(path)
    if not os.path.isdir(d):
        os.makedirs(d)
    with open(path, "w") as f:
        f.write(text)


def _link(target, link):
    d = os.path.dirname(link)
    if not os.path.isdir(d):
        os.makedirs(d)
    os.symlink(os.path.relpath(target, d), link)


def build(root, devices=None, drivers=None):
    """Create the tree under ``root`` (a str path); returns the sysfs root."""
    devices = KPRO5 if devices is None else devices
    drivers = DRIVER_IDS if drivers is None else drivers
    sysfs = os.path.join(str(root), "sys")
    pci = os.path.join(sysfs, "bus", "pci")
    os.makedirs(os.path.join(pci, "devices"))
    os.makedirs(os.path.join(pci, "drivers"))
    _write(os.path.join(pci, "drivers_probe"), "")
    _write(os.path.join(pci, "rescan"), "")
    for name in drivers:
        for attr in ("bind", "unbind", "new_id", "remove_id", "uevent"):
            _write(os.path.join(pci, "drivers", name, attr), "")
    for bdf, (parent, ven, dev, sven, sdev, cls, group, driver) in sorted(devices.items()):
        real = os.path.join(sysfs, "devices", parent, bdf)
        attrs = {"vendor": "0x%s\n" % ven, "device": "0x%s\n" % dev, "subsystem_vendor": "0x%s\n" % sven,
                 "subsystem_device": "0x%s\n" % sdev, "class": "%s\n" % cls, "driver_override": "(null)\n",
                 "numa_node": "0\n", "enable": "1\n", "remove": "", "reset": ""}
        for attr, text in attrs.items():
            _write(os.path.join(real, attr), text)
        if cls.startswith("0x0604"):
            os.makedirs(os.path.join(real, "pci_bus", "0000:%s" % bdf[5:7]))
        _link(real, os.path.join(pci, "devices", bdf))
        if group is not None:
            gdir = os.path.join(sysfs, "kernel", "iommu_groups", str(group))
            _link(gdir, os.path.join(real, "iommu_group"))
            _link(real, os.path.join(gdir, "devices", bdf))
        if driver is not None:
            ddir = os.path.join(pci, "drivers", driver)
            for attr in ("bind", "unbind", "new_id", "remove_id"):
                if not os.path.exists(os.path.join(ddir, attr)):
                    _write(os.path.join(ddir, attr), "")
            _link(ddir, os.path.join(real, "driver"))
            _link(real, os.path.join(ddir, bdf))
    return sysfs


class FakeKernel(object):
    """Stands in for ``pci.sysfs_write``: applies a write to the tree the way the PCI core would.

    ``dynids`` starts as Proxmox leaves it after a VM start (``new_id`` of the GPU and
    audio ids on vfio-pci). ``writes`` records every (path relative to sysfs, value).
    """

    def __init__(self, sysfs, dynids=None, static=None, fail=None):
        self.sysfs = sysfs
        self.pci = os.path.join(sysfs, "bus", "pci")
        self.static = dict((k, list(v)) for k, v in (static or DRIVER_IDS).items())
        self.dynids = dict((k, list(v)) for k, v in (dynids or {}).items())
        self.fail = dict(fail or {})  # relative path -> errno, to inject errors
        self.writes = []

    # tree helpers
    def dev(self, bdf):
        return os.path.join(self.pci, "devices", bdf)

    def driver_of(self, bdf):
        try:
            return os.path.basename(os.readlink(os.path.join(self.dev(bdf), "driver")))
        except OSError:
            return None

    def _ids(self, bdf):
        def rd(a):
            with open(os.path.join(self.dev(bdf), a)) as f:
                return f.read().strip()[2:]
        return rd("vendor"), rd("device")

    def _override(self, bdf):
        with open(os.path.join(self.dev(bdf), "driver_override")) as f:
            v = f.read().strip()
        return None if v == "(null)" else v

    def _loaded(self, driver):
        return os.path.isdir(os.path.join(self.pci, "drivers", driver))

    def _attach(self, bdf, driver):
        real = os.path.realpath(self.dev(bdf))
        ddir = os.path.join(self.pci, "drivers", driver)
        _link(ddir, os.path.join(real, "driver"))
        _link(real, os.path.join(ddir, bdf))

    def _detach(self, bdf):
        driver = self.driver_of(bdf)
        real = os.path.realpath(self.dev(bdf))
        os.unlink(os.path.join(real, "driver"))
        os.unlink(os.path.join(self.pci, "drivers", driver, bdf))

    def _matches(self, bdf, driver):
        override = self._override(bdf)
        if override is not None:
            return override == driver
        ids = self._ids(bdf)
        return ids in [tuple(i) for i in self.static.get(driver, [])] + [tuple(i) for i in self.dynids.get(driver, [])]

    def _probe(self, bdf):
        if self.driver_of(bdf) is not None:
            return
        override = self._override(bdf)
        # The PCI core tries drivers in registration order: vfio-pci (initramfs) before nvidia.
        loaded = os.listdir(os.path.join(self.pci, "drivers"))
        order = [d for d in self.static if d in loaded] + sorted(d for d in loaded if d not in self.static)
        candidates = [override] if override else order
        for driver in candidates:
            if driver and self._loaded(driver) and self._matches(bdf, driver):
                self._attach(bdf, driver)
                return

    def __call__(self, path, value):
        rel = os.path.relpath(path, self.sysfs)
        value = value.decode() if isinstance(value, bytes) else value
        self.writes.append((rel, value))
        if rel in self.fail:
            raise OSError(self.fail[rel], os.strerror(self.fail[rel]))
        if not os.path.exists(path):
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        parts = rel.split(os.sep)
        text = value.strip()
        if rel == os.path.join("bus", "pci", "drivers_probe"):
            if not os.path.exists(self.dev(text)):
                raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
            self._probe(text)
        elif parts[:3] == ["bus", "pci", "drivers"] and len(parts) == 5:
            driver, attr = parts[3], parts[4]
            if attr == "unbind":
                if self.driver_of(text) != driver:
                    raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
                self._detach(text)
            elif attr == "bind":
                if not os.path.exists(self.dev(text)):
                    raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
                if self.driver_of(text) is not None:
                    raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
                if not self._matches(text, driver):
                    raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
                self._attach(text, driver)
            elif attr in ("new_id", "remove_id"):
                ident = tuple(text.split()[:2])
                have = [tuple(i) for i in self.static.get(driver, [])] + [tuple(i) for i in self.dynids.get(driver, [])]
                if attr == "new_id":
                    if ident in have:
                        raise OSError(errno.EEXIST, os.strerror(errno.EEXIST))
                    self.dynids.setdefault(driver, []).append(ident)
                    for bdf in os.listdir(os.path.join(self.pci, "devices")):
                        if self.driver_of(bdf) is None and self._ids(bdf) == ident and self._override(bdf) in (None, driver):
                            self._attach(bdf, driver)
                else:
                    dyn = [tuple(i) for i in self.dynids.get(driver, [])]
                    if ident not in dyn:
                        raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
                    dyn.remove(ident)
                    self.dynids[driver] = dyn
        elif parts[-1] == "driver_override":
            with open(path, "w") as f:
                f.write((text or "(null)") + "\n")
        else:
            with open(path, "w") as f:
                f.write(value)
