"""The node's /sys (PCI, modules, IOMMU groups, EFI) and /proc overlay files, as FUSE.

Run by labctl inside the node's mount namespace (controller venv python, mfusepy):

    fakesys.py NODE_ROOT MOUNTPOINT

The mountpoint shows two trees: ``sys/`` (bind-mounted on the node's /sys) and ``proc/``
(``devices``, ``modules``, ``cmdline``, ``sys/kernel/osrelease``, ``driver/``: bound over
the node's procfs). Everything is computed from the lab state
(``NODE_ROOT/var/lib/kpro-lab/state.json``); writes to sysfs attributes go through the
transitions in labstate (shared with modprobe and the NVIDIA fakes), with the kernel's
errnos: a write to a read-only attribute fails at open with EACCES (kernfs_fop_open), a
refused store fails the write(2) with the store's errno, creating a file EACCES, a
missing path ENOENT, unlink/mkdir EPERM.
"""

import errno
import os
import stat
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "rootfs", "usr", "lib", "kpro-lab"))

import labstate  # noqa: E402

try:
    import mfusepy as fuse
except ImportError:  # pragma: no cover
    fuse = None

EFI_GUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
RO, RW, WO = 0o444, 0o644, 0o200
DMI = {"bios_vendor": "American Megatrends Inc.", "bios_version": "3.8a", "bios_date": "10/12/2023",
       "sys_vendor": "Supermicro", "product_name": "SYS-7049GP-TRT", "product_version": "0123456789",
       "board_vendor": "Supermicro", "board_name": "X11DPG-QT", "board_version": "1.10",
       "chassis_vendor": "Supermicro", "chassis_type": "17", "product_serial": "S41234567890", "product_uuid": "00000000-0000-0000-0000-ac1f6b0a0c50"}


class File:
    __slots__ = ("mode", "read", "store")

    def __init__(self, mode, read=None, store=None):
        self.mode, self.read, self.store = mode, read, store


class Link:
    __slots__ = ("target",)

    def __init__(self, target):
        self.target = target


def _txt(s):
    return lambda: s


class Tree:
    """Builds the node for a path from one state snapshot."""

    def __init__(self, root):
        self.root = root
        self._st = None
        self._key = None
        self.lock = threading.RLock()

    # --- state ---------------------------------------------------------------------
    def state(self):
        path = labstate.state_path(self.root)
        try:
            s = os.stat(path)
            key = (s.st_mtime_ns, s.st_size, s.st_ino)
        except OSError:
            key = None
        if key != self._key or self._st is None:
            try:
                self._st = labstate.load(self.root)
            except (OSError, ValueError):
                self._st = self._st or labstate.initial_state()
            self._key = key
        return self._st

    def store(self, func, *args):
        with self.lock:
            with labstate.modify(self.root) as st:
                func(st, *args)
            self._key = None

    # --- helpers -------------------------------------------------------------------
    def devices(self):
        return self.state()["pci"]["devices"]

    @staticmethod
    def devdir(dev, bdf):
        return "devices/%s/%s" % (dev["path"], bdf)

    @staticmethod
    def up(rel_dir):
        """From /sys/<rel_dir> back to /sys."""
        return "../" * len(rel_dir.split("/"))

    def drivers(self):
        st = self.state()
        out = {name: d for name, d in st["pci"]["drivers"].items()}
        for name in labstate.BUILTIN_DRIVERS:
            out.setdefault(name, {"module": None})
        return out

    # --- lookup --------------------------------------------------------------------
    def lookup(self, path):
        """Return a dict (directory: name -> node), a File, a Link, or None."""
        parts = [p for p in path.split("/") if p]
        node = self.top()
        for i, name in enumerate(parts):
            if not isinstance(node, dict):
                return None
            child = node.get(name)
            if callable(child):
                child = child()
            if child is None:
                return None
            node = child
        return node

    def top(self):
        return {"sys": self.sys_root, "proc": self.proc_root}

    # --- /proc -----------------------------------------------------------------------
    def proc_root(self):
        st = self.state()
        d = {"devices": File(RO, lambda: labstate.proc_devices(self.state())),
             "modules": File(RO, lambda: labstate.proc_modules(self.state())),
             "cmdline": File(RO, lambda: labstate.proc_cmdline(self.state())),
             "sys": {"kernel": {"osrelease": File(RW & ~0o022, lambda: self.state()["kernel"]["release"] + "\n")}},
             "driver": {}}
        ver = labstate.proc_nvidia_version(st)
        if ver is not None:
            gpus = {}
            for bdf, dev in sorted(st["pci"]["devices"].items()):
                if dev.get("driver") == "nvidia":
                    gpus[bdf] = {"information": File(RO, _txt(self.gpu_information(bdf, dev)))}
            d["driver"]["nvidia"] = {"version": File(RO, _txt(ver)), "gpus": gpus, "params": File(RO, _txt("ResmanDebugLevel: 4294967295\n")),
                                     "registry": File(RO, _txt("Binary: \"\"\n"))}
        return d

    def gpu_information(self, bdf, dev):
        st = self.state()
        name = "NVIDIA RTX A6000"
        uuid = "GPU-????????-????-????-????-????????????"
        for g in st.get("gpus") or []:
            if g.get("bdf", "").lower().endswith(bdf[5:].lower()):
                name, uuid = g.get("name", name), g.get("uuid", uuid)
        minor = sorted(b for b, d in st["pci"]["devices"].items() if d.get("driver") == "nvidia").index(bdf)
        return ("Model: \t\t %s\nIRQ:   \t\t 0\nGPU UUID: \t %s\nVideo BIOS: \t 94.02.5c.00.01\nBus Type: \t PCIe\n"
                "DMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\n"
                "GPU Excluded:\t No\n" % (name, uuid, bdf, minor))

    # --- /sys --------------------------------------------------------------------------
    def sys_root(self):
        d = {"bus": {"pci": self.bus_pci}, "devices": self.sys_devices, "kernel": self.sys_kernel,
             "module": self.sys_module, "class": self.sys_class, "dev": {"char": {}, "block": {}}, "fs": {"cgroup": {}},
             "block": {}, "power": {"state": File(RW, _txt("freeze mem disk\n"), lambda st, t: None)},
             "hypervisor": {}}
        if self.state()["kernel"].get("efi", True):
            d["firmware"] = self.sys_firmware
        else:
            d["firmware"] = {"acpi": {}, "dmi": {}}
        return d

    def sys_firmware(self):
        sb = b"\x06\x00\x00\x00" + (b"\x01" if self.state()["kernel"].get("secure_boot") else b"\x00")
        setup = b"\x06\x00\x00\x00\x00"
        return {"acpi": {}, "dmi": {}, "efi": {"efivars": {"SecureBoot-" + EFI_GUID: File(RO, _txt(sb)),
                                                           "SetupMode-" + EFI_GUID: File(RO, _txt(setup))},
                                               "fw_platform_size": File(RO, _txt("64\n")),
                                               "runtime": File(RO, _txt("0x000000006e0c0018\n"))}}

    def bus_pci(self):
        devs = self.devices()
        return {
            "devices": {bdf: Link("../../../" + self.devdir(dev, bdf)) for bdf, dev in devs.items()},
            "drivers": {name: (lambda n=name: self.driver_dir(n)) for name in self.drivers()},
            "drivers_probe": File(WO, None, lambda st, t: labstate.pci_probe(st, t)),
            "drivers_autoprobe": File(RW, _txt("1\n"), lambda st, t: None),
            "rescan": File(WO, None, lambda st, t: None),
            "resource_alignment": File(RW, _txt("\n"), lambda st, t: None),
            "uevent": File(WO, None, lambda st, t: None),
            "slots": {},
        }

    def driver_dir(self, name):
        drv = self.drivers().get(name)
        if drv is None:
            return None
        d = {"bind": File(WO, None, lambda st, t: labstate.pci_bind(st, name, t)),
             "unbind": File(WO, None, lambda st, t: labstate.pci_unbind(st, name, t)),
             "uevent": File(WO, None, lambda st, t: None)}
        if drv.get("module"):
            d["new_id"] = File(WO, None, lambda st, t: labstate.pci_new_id(st, name, t))
            d["remove_id"] = File(WO, None, lambda st, t: labstate.pci_remove_id(st, name, t))
            d["module"] = Link("../../../../module/" + drv["module"])
        for bdf, dev in self.devices().items():
            if dev.get("driver") == name:
                d[bdf] = Link("../../../../" + self.devdir(dev, bdf))
        return d

    def sys_devices(self):
        tree = {"system": {"cpu": {"online": File(RO, _txt("0-%d\n" % (os.cpu_count() - 1)))}},
                "virtual": {"dmi": {"id": {k: File(0o400 if k.endswith(("serial", "uuid")) else RO, _txt(v + "\n"))
                                           for k, v in DMI.items()}}}}
        devs = self.devices()
        for bdf in sorted(devs, key=lambda b: devs[b]["path"].count("/")):
            dev = devs[bdf]
            node = tree
            for part in dev["path"].split("/"):
                node = node.setdefault(part, {})
                if callable(node):  # below another simulated device: device_dir() lists it
                    break
            else:
                node[bdf] = (lambda b=bdf: self.device_dir(b))
        return tree

    def device_dir(self, bdf):
        st = self.state()
        dev = st["pci"]["devices"].get(bdf)
        if dev is None:
            return None
        rel = self.devdir(dev, bdf)
        up = self.up(rel)
        cls = int(dev["class"], 16)
        modalias = "pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X" % (
            int(dev["vendor"], 16), int(dev["device"], 16), int(dev["subsystem_vendor"], 16), int(dev["subsystem_device"], 16),
            cls >> 16, (cls >> 8) & 0xff, cls & 0xff)

        def uevent():
            d = self.state()["pci"]["devices"][bdf]
            lines = (["DRIVER=%s" % d["driver"]] if d.get("driver") else []) + [
                "PCI_CLASS=%X" % cls, "PCI_ID=%s:%s" % (d["vendor"].upper(), d["device"].upper()),
                "PCI_SUBSYS_ID=%s:%s" % (d["subsystem_vendor"].upper(), d["subsystem_device"].upper()),
                "PCI_SLOT_NAME=%s" % bdf, "MODALIAS=%s" % modalias]
            return "\n".join(lines) + "\n"

        def override():
            v = self.state()["pci"]["devices"][bdf].get("driver_override")
            return "%s\n" % (v if v else "(null)")

        d = {"vendor": File(RO, _txt("0x%s\n" % dev["vendor"])), "device": File(RO, _txt("0x%s\n" % dev["device"])),
             "subsystem_vendor": File(RO, _txt("0x%s\n" % dev["subsystem_vendor"])),
             "subsystem_device": File(RO, _txt("0x%s\n" % dev["subsystem_device"])),
             "class": File(RO, _txt("0x%s\n" % dev["class"])), "revision": File(RO, _txt("0x%s\n" % dev.get("revision", "00"))),
             "modalias": File(RO, _txt(modalias + "\n")), "uevent": File(RW, uevent, lambda st, t: None),
             "driver_override": File(RW, override, lambda st, t: labstate.pci_set_override(st, bdf, t)),
             "enable": File(RW, _txt("1\n" if dev.get("driver") else "0\n"), self._enable_store),
             "numa_node": File(RW, _txt("%d\n" % dev.get("numa_node", 0)), self._numa_store),
             "irq": File(RO, _txt("%d\n" % (16 + sorted(st["pci"]["devices"]).index(bdf)))),
             "local_cpulist": File(RO, _txt("0-%d\n" % (os.cpu_count() - 1))),
             "d3cold_allowed": File(RW, _txt("1\n"), lambda st, t: None),
             "reset": File(WO, None, lambda st, t: None),
             "remove": File(WO, None, lambda st, t: (_ for _ in ()).throw(labstate.KernelError(errno.EPERM, "not simulated"))),
             "rescan": File(WO, None, lambda st, t: None),
             "subsystem": Link(up + "bus/pci"),
             "power": {"control": File(RW, _txt("on\n"), lambda st, t: None), "runtime_status": File(RO, _txt("active\n"))}}
        if cls >> 8 == 0x0300:
            d["boot_vga"] = File(RO, _txt("0\n"))
        if dev.get("iommu_group") is not None:
            d["iommu_group"] = Link(up + "kernel/iommu_groups/%d" % dev["iommu_group"])
            d["iommu"] = Link(up + "devices/virtual/iommu/dmar%d" % (0 if dev["path"].startswith("pci0000:00") else 1))
        if dev.get("driver"):
            d["driver"] = Link(up + "bus/pci/drivers/" + dev["driver"])
        if cls >> 8 == 0x0604:  # a bridge: its secondary bus
            d["pci_bus"] = {}
        for child, cdev in st["pci"]["devices"].items():
            if cdev["path"] == dev["path"] + "/" + bdf:
                d[child] = (lambda b=child: self.device_dir(b))
        return d

    @staticmethod
    def _enable_store(st, text):
        if text.strip() not in ("0", "1"):
            raise labstate.KernelError(errno.EINVAL)

    @staticmethod
    def _numa_store(st, text):
        try:
            int(text.strip())
        except ValueError:
            raise labstate.KernelError(errno.EINVAL)

    def sys_kernel(self):
        groups = {}
        for bdf, dev in self.devices().items():
            g = dev.get("iommu_group")
            if g is None:
                continue
            grp = groups.setdefault(str(g), {"devices": {}, "type": File(RW, _txt("identity\n"), lambda st, t: None),
                                             "reserved_regions": File(RO, _txt("0x00000000fee00000 0x00000000feefffff msi\n"))})
            grp["devices"][bdf] = Link("../../../../" + self.devdir(dev, bdf))
        thp = File(RW, _txt("always [madvise] never\n"), lambda st, t: None)
        return {"iommu_groups": groups, "mm": {"transparent_hugepage": {"enabled": thp}}, "security": {}, "debug": {}, "config": {}}

    def sys_module(self):
        st = self.state()
        mods = {}
        for mod in st["modules"]["loaded"]:
            mods[mod] = (lambda m=mod: self.module_dir(m))
        return mods

    def module_dir(self, mod):
        st = self.state()
        if mod not in st["modules"]["loaded"]:
            return None
        info = labstate.MODULES.get(mod, {})
        d = {"initstate": File(RO, _txt("live\n")), "refcnt": File(RO, _txt("%d\n" % labstate.module_refcnt(st, mod))),
             "coresize": File(RO, _txt("%d\n" % info.get("size", 16384))), "initsize": File(RO, _txt("0\n")),
             "taint": File(RO, _txt("OE\n" if info.get("out_of_tree") else "\n")),
             "uevent": File(WO, None, lambda st, t: None),
             "holders": {h: Link("../../" + h) for h in labstate.module_holders(st, mod)},
             "notes": {}, "sections": {}}
        params = st["modules"].get("params", {}).get(mod, {})
        visible = {k: v for k, v in params.items() if not (mod == "vfio_pci" and k == "ids")}  # ids: perm 0
        if mod == "vfio_pci":
            visible.setdefault("disable_vga", "N")
            visible["disable_vga"] = "Y" if visible["disable_vga"] in ("1", "Y", "y") else "N"
            for k in ("disable_idle_d3", "enable_sriov", "disable_denylist", "nointxmask"):
                visible.setdefault(k, "N")
        if visible:
            d["parameters"] = {k: File(RO, _txt("%s\n" % v)) for k, v in visible.items()}
        if info.get("pci"):
            d["drivers"] = {"pci:" + info["pci"]: Link("../../../bus/pci/drivers/" + info["pci"])}
        if info.get("out_of_tree"):
            built = ((st.get("nvidia") or {}).get("kernel_modules") or {}).get(st["kernel"]["release"]) or {}
            inst = (st.get("nvidia") or {}).get("installed") or {}
            d["version"] = File(RO, _txt("%s\n" % (built.get("version") or inst.get("version") or "580.126.09")))
            d["srcversion"] = File(RO, _txt("8C1B6E0C7A1F3D2E4B5A697\n"))
        return d

    def sys_class(self):
        st = self.state()
        pci_bus = {}
        for bdf, dev in st["pci"]["devices"].items():
            if int(dev["class"], 16) >> 8 == 0x0604:
                pci_bus[bdf[:8].replace("0000:", "0000:", 1)] = Link("../../" + self.devdir(dev, bdf) + "/pci_bus")
        vfio = {}
        groups = sorted({str(d["iommu_group"]) for d in st["pci"]["devices"].values() if d.get("driver") == "vfio-pci"})
        for g in groups:
            vfio[g] = {}
        return {"pci_bus": pci_bus, "net": {}, "drm": {}, "vfio": vfio, "dmi": {"id": Link("../../devices/virtual/dmi/id")}}


def _stat_dir():
    return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}


class FakeSys(fuse.Operations if fuse else object):
    use_ns = True

    def __init__(self, root):
        self.tree = Tree(root)
        self.t0 = int(time.time() * 1e9)

    def _node(self, path):
        with self.tree.lock:
            node = self.tree.lookup(path)
        if node is None:
            raise fuse.FuseOSError(errno.ENOENT)
        return node

    def getattr(self, path, fh=None):
        node = self._node(path)
        base = {"st_uid": 0, "st_gid": 0, "st_atime": self.t0, "st_mtime": self.t0, "st_ctime": self.t0}
        if isinstance(node, dict):
            base.update(_stat_dir())
        elif isinstance(node, Link):
            base.update({"st_mode": stat.S_IFLNK | 0o777, "st_nlink": 1, "st_size": len(node.target)})
        else:
            base.update({"st_mode": stat.S_IFREG | node.mode, "st_nlink": 1, "st_size": 4096})
        return base

    def readdir(self, path, fh):
        node = self._node(path)
        if not isinstance(node, dict):
            raise fuse.FuseOSError(errno.ENOTDIR)
        return [".", ".."] + sorted(node)

    def readlink(self, path):
        node = self._node(path)
        if not isinstance(node, Link):
            raise fuse.FuseOSError(errno.EINVAL)
        return node.target

    def open(self, path, flags):
        node = self._node(path)
        if isinstance(node, dict):
            raise fuse.FuseOSError(errno.EISDIR)
        acc = flags & os.O_ACCMODE
        if acc in (os.O_WRONLY, os.O_RDWR) and not (node.mode & 0o222 and node.store):
            raise fuse.FuseOSError(errno.EACCES)
        if acc in (os.O_RDONLY, os.O_RDWR) and not (node.mode & 0o444 and node.read):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def read(self, path, size, offset, fh):
        node = self._node(path)
        if not isinstance(node, File) or node.read is None:
            raise fuse.FuseOSError(errno.EIO)
        with self.tree.lock:
            data = node.read()
        if isinstance(data, str):
            data = data.encode()
        return data[offset:offset + size]

    def write(self, path, data, offset, fh):
        node = self._node(path)
        if not isinstance(node, File) or node.store is None:
            raise fuse.FuseOSError(errno.EIO)
        if not data:
            return 0
        text = data.decode("utf-8", "surrogateescape")
        try:
            self.tree.store(node.store, text)
        except OSError as e:
            raise fuse.FuseOSError(e.errno or errno.EIO)
        return len(data)

    def truncate(self, path, length, fh=None):
        node = self._node(path)
        if isinstance(node, dict):
            raise fuse.FuseOSError(errno.EISDIR)
        if not (isinstance(node, File) and node.store):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def create(self, path, mode, fi=None):
        parent = os.path.dirname(path)
        self._node(parent)
        raise fuse.FuseOSError(errno.EACCES)

    def _eperm(self, *a, **k):
        raise fuse.FuseOSError(errno.EPERM)

    mkdir = rmdir = unlink = symlink = rename = link = chmod = chown = _eperm

    def utimens(self, path, times=None):
        self._node(path)
        return 0

    def statfs(self, path):
        return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}


def main(argv):
    if len(argv) != 3:
        print("usage: fakesys.py NODE_ROOT MOUNTPOINT", file=sys.stderr)
        return 2
    root, mnt = argv[1], argv[2]
    os.makedirs(mnt, exist_ok=True)
    fuse.FUSE(FakeSys(root), mnt, foreground=True, nothreads=True, allow_other=True, fsname="kpgs-sysfs",
              subtype="kpgs", direct_io=True, entry_timeout=0, attr_timeout=0, negative_timeout=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
