# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vfio_release's main() on a temporary /etc, /proc, /run and a fake sysfs.

Writes to sysfs go to a small fake kernel (monkeypatched ``pci.sysfs_write``) that gives
unbind/bind/driver_override/drivers_probe/new_id/remove_id the kernel's semantics and errno
codes, so the module's runtime part runs for real against the tree.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil

import pytest

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common import warnings as ansible_warnings

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pci
from ansible_collections.kpro.gpu_serving.plugins.modules import vfio_release

from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

HERE = os.path.dirname(__file__)
BOOTFIX = os.path.join(HERE, "..", "..", "fixtures", "bootcfg")
PVEFIX = os.path.join(HERE, "..", "..", "fixtures", "pve")

DEVICES = [
    # bdf, vendor, device, class, driver, iommu group
    ("0000:16:00.0", "8086", "2030", "0x060400", "pcieport", 42),
    ("0000:17:00.0", "10de", "2230", "0x030000", "vfio-pci", 42),
    ("0000:17:00.1", "10de", "1aef", "0x040300", "vfio-pci", 42),
    ("0000:65:00.0", "10de", "2230", "0x030000", "vfio-pci", 40),
    ("0000:65:00.1", "10de", "1aef", "0x040300", "vfio-pci", 40),
    ("0000:05:00.0", "1b21", "1242", "0x0c0330", "vfio-pci", 12),
    ("0000:00:1f.3", "8086", "a348", "0x040300", "snd_hda_intel", 7),
]
# what drivers_probe binds when nothing else decides (the NVIDIA driver is not installed yet)
PROBE_TABLE = {"10de:1aef": "snd_hda_intel", "8086:a348": "snd_hda_intel"}
CMDLINE = "BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro quiet intel_iommu=on iommu=pt\n"


class FakeKernel(object):
    def __init__(self, sysfs):
        self.sysfs = sysfs
        self.pci = os.path.join(sysfs, "bus", "pci")
        # vfio-pci's dynamic ids, in order (Proxmox's new_id at VM start, or the boot's vfio-pci.ids=)
        self.dynamic = {"vfio-pci": ["10de:2230", "10de:1aef", "1b21:1242"]}
        self.static = set()  # something remove_id cannot take out (a wildcard entry, say)
        self.writes = []

    def load_nouveau(self):
        """nouveau loaded (udev, at boot) with its PCI driver registered, as on a host that does not blacklist it."""
        d = os.path.join(self.pci, "drivers", "nouveau")
        os.makedirs(d)
        for attr in ("bind", "unbind", "new_id", "remove_id"):
            open(os.path.join(d, attr), "w").close()
        os.makedirs(os.path.join(self.sysfs, "module", "nouveau"))

    def unload_nouveau(self):
        shutil.rmtree(os.path.join(self.pci, "drivers", "nouveau"))
        shutil.rmtree(os.path.join(self.sysfs, "module", "nouveau"))

    def _nouveau_takes(self, bdf):
        with open(os.path.join(self._dev(bdf), "class")) as f:
            cls = f.read().strip()
        return (os.path.isdir(os.path.join(self.pci, "drivers", "nouveau")) and self._id(bdf).startswith("10de:")
                and cls.startswith("0x03"))

    def _dev(self, bdf):
        return os.path.join(self.pci, "devices", bdf)

    def _driver(self, bdf):
        link = os.path.join(self._dev(bdf), "driver")
        return os.path.basename(os.readlink(link)) if os.path.islink(link) else None

    def _bind(self, bdf, drv):
        os.symlink(os.path.join("..", "..", "drivers", drv), os.path.join(self._dev(bdf), "driver"))

    def _id(self, bdf):
        def r(name):
            with open(os.path.join(self._dev(bdf), name)) as f:
                return f.read().strip()[2:]
        return "%s:%s" % (r("vendor"), r("device"))

    def write(self, path, value):
        value = value.decode() if isinstance(value, bytes) else value
        self.writes.append((os.path.relpath(path, self.sysfs), value))
        rel = os.path.relpath(path, self.pci).split(os.sep)
        if rel[0] == "drivers" and len(rel) == 3:
            drv, op = rel[1], rel[2]
            if op == "unbind":
                if self._driver(value.strip()) != drv:
                    raise OSError(errno.ENODEV, "No such device")
                os.unlink(os.path.join(self._dev(value.strip()), "driver"))
            elif op == "bind":
                self._bind(value.strip(), drv)
            elif op in ("new_id", "remove_id"):
                ident = ":".join(value.split()[:2])
                ids = self.dynamic.setdefault(drv, [])
                if op == "remove_id":  # the first matching entry only, ENODEV when none (pci-driver.c remove_id_store)
                    if ident not in ids:
                        raise OSError(errno.ENODEV, "No such device")
                    ids.remove(ident)
                else:
                    ids.append(ident)
            return
        if rel[0] == "devices" and rel[-1] == "driver_override":
            with open(path, "w") as f:
                f.write(value.strip() or "(null)")
            return
        if rel == ["drivers_probe"]:
            bdf = value.strip()
            if self._driver(bdf):
                return
            override = open(os.path.join(self._dev(bdf), "driver_override")).read().strip()
            ident = self._id(bdf)
            if override != "(null)":
                drv = override if os.path.isdir(os.path.join(self.pci, "drivers", override)) else None
            elif ident in self.dynamic.get("vfio-pci", []) or ident in self.static:
                drv = "vfio-pci"
            elif self._nouveau_takes(bdf):
                drv = "nouveau"
            else:
                drv = PROBE_TABLE.get(ident)
            if drv:
                self._bind(bdf, drv)
            return
        raise OSError(errno.EACCES, "unexpected write %s" % path)


def make_sysfs(root):
    sysfs = os.path.join(root, "sys")
    for drv in ("vfio-pci", "snd_hda_intel", "pcieport", "xhci_hcd"):
        d = os.path.join(sysfs, "bus", "pci", "drivers", drv)
        os.makedirs(d)
        for attr in ("bind", "unbind", "new_id", "remove_id"):
            open(os.path.join(d, attr), "w").close()
    open(os.path.join(sysfs, "bus", "pci", "drivers_probe"), "w").close()
    groups = {}
    for bdf, _v, _d, _c, _drv, g in DEVICES:
        groups.setdefault(g, []).append(bdf)
    for g, members in groups.items():
        gd = os.path.join(sysfs, "kernel", "iommu_groups", str(g), "devices")
        os.makedirs(gd)
        for m in members:
            os.symlink(os.path.join("..", "..", "..", "..", "bus", "pci", "devices", m), os.path.join(gd, m))
    for bdf, vendor, device, cls, drv, g in DEVICES:
        d = os.path.join(sysfs, "bus", "pci", "devices", bdf)
        os.makedirs(d)
        for name, value in (("vendor", "0x" + vendor), ("device", "0x" + device), ("class", cls),
                            ("subsystem_vendor", "0x10de"), ("subsystem_device", "0x1459"), ("driver_override", "(null)")):
            with open(os.path.join(d, name), "w") as f:
                f.write(value + "\n")
        if cls.startswith("0x0604"):
            os.makedirs(os.path.join(d, "pci_bus"))
        os.symlink(os.path.join("..", "..", "drivers", drv), os.path.join(d, "driver"))
        os.symlink(os.path.join("..", "..", "..", "kernel", "iommu_groups", str(g)), os.path.join(d, "iommu_group"))
    return sysfs


@pytest.fixture
def host(tmp_path, monkeypatch):
    root = str(tmp_path)
    sysfs = make_sysfs(root)
    etc = os.path.join(root, "etc")
    for rel, name in (("default/grub", "grub.default"), ("modprobe.d/vfio.conf", "modprobe_vfio.conf"),
                      ("modprobe.d/blacklist.conf", "modprobe_blacklist.conf"), ("modules", "modules")):
        os.makedirs(os.path.dirname(os.path.join(etc, rel)), exist_ok=True)
        shutil.copy(os.path.join(BOOTFIX, name), os.path.join(etc, rel))
    qs = os.path.join(etc, "pve", "qemu-server")
    os.makedirs(qs)
    os.makedirs(os.path.join(etc, "pve", "mapping"))
    shutil.copy(os.path.join(PVEFIX, "pci.cfg"), os.path.join(etc, "pve", "mapping", "pci.cfg"))
    for v in ("105", "110", "130"):
        shutil.copy(os.path.join(PVEFIX, v + ".conf"), os.path.join(qs, v + ".conf"))
    proc = os.path.join(root, "proc")
    os.makedirs(proc)
    with open(os.path.join(proc, "cmdline"), "w") as f:
        f.write(CMDLINE)
    os.makedirs(os.path.join(root, "run", "qemu-server"))
    os.makedirs(os.path.join(root, "dev", "vfio"))
    log = os.path.join(root, "commands.log")
    tool = os.path.join(root, "tool.sh")
    with open(tool, "w") as f:
        f.write('#!/bin/sh\necho "$0 $*" >> %s\n[ -e %s/fail ] && exit 3\nexit 0\n' % (log, root))
    os.chmod(tool, 0o755)
    kernel = FakeKernel(sysfs)
    monkeypatch.setattr(pci, "sysfs_write", kernel.write)
    args = {"sysfs_root": sysfs, "etc_root": etc, "proc_root": proc, "run_root": os.path.join(root, "run"),
            "dev_root": os.path.join(root, "dev"), "backup_dir": os.path.join(root, "backups"), "node": "kpro5",
            "update_initramfs_cmd": [tool, "initramfs"], "boot_refresh_cmd": [tool, "boot"]}

    class Host(object):
        pass
    h = Host()
    h.root, h.etc, h.sysfs, h.proc, h.args, h.kernel, h.log = root, etc, sysfs, proc, args, kernel, log
    return h


def commands(h):
    return open(h.log).read().split("\n")[:-1] if os.path.exists(h.log) else []


def tree_hash(root):
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for n in sorted(dirnames + filenames):
            p = os.path.join(dirpath, n)
            h.update(p.encode())
            if os.path.islink(p):
                h.update(b"L" + os.readlink(p).encode())
            elif os.path.isfile(p):
                h.update(b"F%o" % os.stat(p).st_mode + open(p, "rb").read())
    return h.hexdigest()


def run(args, check_mode=False, diff=False):
    a = dict(args)
    if diff:
        a["_ansible_diff"] = True
    ansible_warnings._global_warnings.clear()
    # Record module.warn() directly: once a controller plugin has been imported in this
    # process (the connection tests do), warnings go to the Display, not the global list.
    seen = []
    orig_warn = AnsibleModule.warn
    result = None
    try:
        AnsibleModule.warn = lambda self, msg, *args, **kw: (seen.append(msg), orig_warn(self, msg, *args, **kw))
        run_module(vfio_release, a, check_mode=check_mode)
    except (AnsibleExitJson, AnsibleFailJson) as e:
        result = e.result
    finally:
        AnsibleModule.warn = orig_warn
    result["warnings"] = seen
    return result


def start_vm(h, vmid, pid):
    d = os.path.join(h.proc, str(pid))
    os.makedirs(d)
    with open(os.path.join(d, "cmdline"), "wb") as f:
        f.write(b"\0".join([b"/usr/bin/kvm", b"-id", str(vmid).encode(), b"-pidfile",
                            ("/var/run/qemu-server/%d.pid" % vmid).encode()]) + b"\0")
    with open(os.path.join(d, "stat"), "w") as f:
        f.write("%d (kvm) S 1\n" % pid)
    with open(os.path.join(h.root, "run", "qemu-server", "%d.pid" % vmid), "w") as f:
        f.write("%d\n" % pid)


def test_release_full_run_then_idempotent(host):
    r = run(host.args)
    assert not r.get("failed"), r.get("msg")
    assert r["changed"] is True
    assert [d["bdf"] for d in r["selected"]] == ["0000:17:00.0", "0000:17:00.1", "0000:65:00.0", "0000:65:00.1"]
    assert r["managed_ids"] == ["10de:1aef", "10de:2230"]
    # persistent bindings: only our ids went, everything else byte for byte
    assert open(os.path.join(host.etc, "default", "grub")).read() == open(os.path.join(BOOTFIX, "grub.default.expected")).read()
    assert open(os.path.join(host.etc, "modprobe.d", "vfio.conf")).read() == \
        open(os.path.join(BOOTFIX, "modprobe_vfio.conf.expected")).read()
    assert open(os.path.join(host.etc, "modules")).read() == open(os.path.join(BOOTFIX, "modules")).read()
    assert r["remaining_vfio_ids"] == ["1b21:1242"] and r["keep_vfio_modules"] is True
    # one initramfs regeneration, one boot refresh
    assert [c.split(" ", 1)[1] for c in commands(host)] == ["initramfs", "boot"]
    assert len(r["files"]) == 3 and all(f["backup"] and os.path.exists(f["backup"]) for f in r["files"])
    # stopped VMs reported, not touched
    assert sorted(v["vmid"] for v in r["stopped_vms_referencing"]) == [105, 110]
    assert r["detached"] == []
    assert open(os.path.join(host.etc, "pve", "qemu-server", "105.conf")).read() == open(os.path.join(PVEFIX, "105.conf")).read()
    assert any("VM 105 (win-gaming) is stopped" in w for w in r["warnings"])
    # runtime: dynamic ids gone, GPUs unbound, the audio function went to snd_hda_intel, the USB controller untouched
    assert sorted(r["removed_dynamic_ids"]) == ["10de:1aef", "10de:2230"]
    assert host.kernel.dynamic["vfio-pci"] == ["1b21:1242"]
    assert r["unbound"] == ["0000:17:00.0", "0000:17:00.1", "0000:65:00.0", "0000:65:00.1"]
    assert r["bound_after"] == {"0000:17:00.0": None, "0000:17:00.1": "snd_hda_intel",
                                "0000:65:00.0": None, "0000:65:00.1": "snd_hda_intel"}
    assert pci.current_driver("0000:05:00.0", host.sysfs) == "vfio-pci"
    assert r["reboot_required"] is False and r["reboot_reasons"] == [] and r["runtime_errors"] == []

    before = tree_hash(host.root)
    r2 = run(host.args)
    assert r2["changed"] is False, r2
    assert r2["files"] == [] and r2["commands"] == [] and r2["unbound"] == [] and r2["reboot_required"] is False
    assert len(commands(host)) == 2
    assert tree_hash(host.root) == before


@pytest.mark.parametrize("how", ["pidfile", "mapping", "reservation", "vfio_holder"])
def test_refuses_while_a_vm_runs_and_changes_nothing(host, how):
    if how == "pidfile":
        start_vm(host, 105, 4242)
        expected = ("VM 105 (win-gaming) is running with hostpci0 = 0000:17:00,pcie=1,x-vga=1 (NVIDIA RTX A6000); "
                    "stop it or remove the device first")
    elif how == "mapping":
        start_vm(host, 110, 4243)
        expected = "VM 110 (llm-old) is running with hostpci0 = mapping=a6000,pcie=1 (NVIDIA RTX A6000)"
    elif how == "reservation":
        start_vm(host, 999, 4244)
        os.unlink(os.path.join(host.root, "run", "qemu-server", "999.pid"))
        with open(os.path.join(host.root, "run", "qemu-server", "pci-id-reservations"), "w") as f:
            f.write("0000:65:00.0 999 pid:4244\n")
        expected = "VM 999 holds a PCI reservation for 0000:65:00.0 (NVIDIA RTX A6000)"
    else:
        d = os.path.join(host.proc, "5555", "fd")
        os.makedirs(d)
        os.symlink(os.path.join(host.args["dev_root"], "vfio", "40"), os.path.join(d, "17"))
        expected = "vfio/40 (IOMMU group 40: 0000:65:00.0, 0000:65:00.1) is held open by PID 5555"
    before = tree_hash(host.root)
    r = run(host.args)
    assert r.get("failed") is True
    assert expected in r["msg"], r["msg"]
    assert "nothing was changed" in r["msg"]
    assert tree_hash(host.root) == before
    assert host.kernel.writes == [] and commands(host) == []


def test_check_mode_changes_nothing_and_tells_the_truth(host):
    before = tree_hash(host.root)
    r = run(host.args, check_mode=True, diff=True)
    assert r["changed"] is True and r["would_change"] is True
    assert tree_hash(host.root) == before and host.kernel.writes == [] and commands(host) == []
    assert sorted(os.path.relpath(f["path"], host.etc) for f in r["files"]) == \
        ["default/grub", "modprobe.d/blacklist.conf", "modprobe.d/vfio.conf"]
    assert r["commands"] == [host.args["update_initramfs_cmd"], host.args["boot_refresh_cmd"]]
    assert r["unbound"] == ["0000:17:00.0", "0000:17:00.1", "0000:65:00.0", "0000:65:00.1"]
    diff = dict((d["before_header"], d) for d in r["diff"])
    grub = diff[os.path.join(host.etc, "default", "grub")]
    assert grub["after"] == open(os.path.join(BOOTFIX, "grub.default.expected")).read()
    # after a real run, check mode reports nothing to do
    assert run(host.args)["would_change"] is False  # a run: nothing left to change
    r = run(host.args, check_mode=True, diff=True)
    assert r["changed"] is False and "diff" not in r and r["would_change"] is False


def test_detach_stopped_vms_with_backup(host):
    r = run(dict(host.args, detach_stopped_vms="both"), diff=True)
    assert not r.get("failed"), r.get("msg")
    c105 = open(os.path.join(host.etc, "pve", "qemu-server", "105.conf")).read()
    orig = open(os.path.join(PVEFIX, "105.conf")).read()
    assert c105 == orig.replace("hostpci0: 0000:17:00,pcie=1,x-vga=1\n", "").replace("onboot: 1\nostype", "onboot: 0\nostype")
    c110 = open(os.path.join(host.etc, "pve", "qemu-server", "110.conf")).read()
    assert "hostpci0" not in c110 and "onboot: 0" in c110
    by = dict((d["vmid"], d) for d in r["detached"])
    assert sorted(by) == [105, 110]
    assert open(by[105]["backup"]).read() == orig
    assert not by[105]["backup"].startswith(os.path.join(host.etc, "pve"))
    assert sorted(os.listdir(os.path.join(host.etc, "pve", "qemu-server"))) == ["105.conf", "110.conf", "130.conf"]
    r2 = run(dict(host.args, detach_stopped_vms="both"))
    assert r2["changed"] is False and r2["stopped_vms_referencing"] == []


def test_boot_cmdline_ids_are_dynamic_ids_released_without_reboot(host):
    # vfio-pci.ids= on the running command line: vfio_pci_fill_ids() made them dynamic ids (FakeKernel.dynamic), and
    # there is no /sys/module/vfio_pci/parameters/ids (permission 0). remove_id takes them out: no reboot needed.
    with open(os.path.join(host.proc, "cmdline"), "w") as f:
        f.write(CMDLINE.strip() + " vfio-pci.ids=10de:2230,10de:1aef,1b21:1242\n")
    r = run(host.args)
    assert not r.get("failed"), r.get("msg")
    assert r["reboot_required"] is False and r["reboot_reasons"] == [], r["reboot_reasons"]
    assert sorted(r["removed_dynamic_ids"]) == ["10de:1aef", "10de:2230"] and host.kernel.dynamic["vfio-pci"] == ["1b21:1242"]
    assert r["bound_after"] == {"0000:17:00.0": None, "0000:17:00.1": "snd_hda_intel",
                                "0000:65:00.0": None, "0000:65:00.1": "snd_hda_intel"}
    assert len([w for w in host.kernel.writes if w[0] == "bus/pci/drivers_probe"]) == 4
    assert r["boot_vfio_ids"] == ["10de:1aef", "10de:2230"]


def test_an_id_listed_twice_is_removed_until_enodev(host):
    # vfio-pci.ids=10de:2230,10de:1aef,10de:2230: two entries, and remove_id takes out the first match only
    host.kernel.dynamic["vfio-pci"] = ["10de:2230", "10de:1aef", "10de:2230", "1b21:1242"]
    r = run(host.args)
    assert host.kernel.dynamic["vfio-pci"] == ["1b21:1242"]
    assert r["bound_after"]["0000:17:00.0"] is None and r["bound_after"]["0000:65:00.0"] is None
    assert r["reboot_required"] is False and r["runtime_errors"] == [], r["reboot_reasons"]


def test_reboot_required_when_vfio_pci_takes_a_function_back(host):
    host.kernel.static = {"10de:2230"}  # a match remove_id of 10de 2230 cannot take out
    r = run(host.args)
    assert not r.get("failed"), r.get("msg")
    assert r["reboot_required"] is True
    assert "0000:17:00.0 was claimed by vfio-pci again" in r["reboot_reasons"][0], r["reboot_reasons"]
    assert r["bound_after"]["0000:17:00.1"] == "snd_hda_intel"


def _stock_nouveau(host, monkeypatch, unload_rc=0):
    """The host does not blacklist nouveau (udev loaded it at boot); ``modprobe -r nouveau`` exits ``unload_rc``."""
    path = os.path.join(host.etc, "modprobe.d", "blacklist.conf")
    text = open(path).read()
    with open(path, "w") as f:
        f.write("".join(line for line in text.splitlines(True) if "nouveau" not in line))
    host.kernel.load_nouveau()
    orig = AnsibleModule.run_command

    def run_command(self, args, **kw):
        if list(args[-2:]) != ["-r", "nouveau"]:
            return orig(self, args, **kw)
        with open(host.log, "a") as f:
            f.write("modprobe -r nouveau\n")
        if unload_rc:
            return unload_rc, "", "modprobe: FATAL: Module nouveau is in use.\n"
        host.kernel.unload_nouveau()
        return 0, "", ""
    monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    return host.args


def test_stock_nouveau_is_blacklisted_unloaded_and_never_gets_the_gpus(host, monkeypatch):
    args = _stock_nouveau(host, monkeypatch)
    r = run(args)
    assert not r.get("failed"), r.get("msg")
    assert r["bound_after"] == {"0000:17:00.0": None, "0000:17:00.1": "snd_hda_intel",
                                "0000:65:00.0": None, "0000:65:00.1": "snd_hda_intel"}
    conf = os.path.join(host.etc, "modprobe.d", "kpro-gpu-serving-nouveau.conf")
    assert os.path.exists(conf) and "blacklist nouveau\noptions nouveau modeset=0\n" in open(conf).read()
    assert r["nouveau"] == {"blacklist": conf, "loaded": True, "unbound": [], "unloaded": True, "not_probed": []}
    assert conf in [f["path"] for f in r["files"]] and "modprobe -r nouveau" in commands(host)
    assert r["commands"][0] == host.args["update_initramfs_cmd"]
    assert r["reboot_required"] is False, r["reboot_reasons"]
    r2 = run(args)
    assert r2["changed"] is False and r2["nouveau"]["blacklist"] is None and r2["files"] == []


def test_nouveau_that_stays_loaded_is_not_given_the_gpus_and_a_reboot_is_required(host, monkeypatch):
    args = _stock_nouveau(host, monkeypatch, unload_rc=1)
    r = run(args)
    assert not r.get("failed"), r.get("msg")
    assert r["bound_after"] == {"0000:17:00.0": None, "0000:17:00.1": "snd_hda_intel",
                                "0000:65:00.0": None, "0000:65:00.1": "snd_hda_intel"}
    assert r["nouveau"]["not_probed"] == ["0000:17:00.0", "0000:65:00.0"] and r["nouveau"]["unloaded"] is False
    assert r["reboot_required"] is True and "nouveau is loaded and could not be unloaded" in r["reboot_reasons"][0]
    assert os.path.exists(os.path.join(host.etc, "modprobe.d", "kpro-gpu-serving-nouveau.conf"))


def test_gpus_already_on_nouveau_are_taken_off_it(host, monkeypatch):
    args = _stock_nouveau(host, monkeypatch)
    for bdf in ("0000:17:00.0", "0000:65:00.0"):
        link = os.path.join(host.sysfs, "bus", "pci", "devices", bdf, "driver")
        os.unlink(link)
        os.symlink(os.path.join("..", "..", "drivers", "nouveau"), link)
    r = run(args)
    assert r["bound_after"]["0000:17:00.0"] is None and r["bound_after"]["0000:65:00.0"] is None
    assert r["nouveau"]["unbound"] == ["0000:17:00.0", "0000:65:00.0"] and r["nouveau"]["unloaded"] is True
    assert ("bus/pci/drivers/nouveau/unbind", "0000:17:00.0") in host.kernel.writes
    assert r["reboot_required"] is False, r["reboot_reasons"]


def test_check_mode_with_stock_nouveau_changes_nothing(host, monkeypatch):
    args = _stock_nouveau(host, monkeypatch)
    before = tree_hash(host.root)
    r = run(args, check_mode=True)
    assert r["changed"] is True and tree_hash(host.root) == before and host.kernel.writes == [] and commands(host) == []
    conf = os.path.join(host.etc, "modprobe.d", "kpro-gpu-serving-nouveau.conf")
    assert conf in [f["path"] for f in r["files"]] and "modprobe -r nouveau" in r["runtime_actions"]
    assert r["nouveau"]["blacklist"] == conf


def test_runtime_unbind_off_requires_reboot(host):
    r = run(dict(host.args, runtime_unbind=False))
    assert r["changed"] is True and r["reboot_required"] is True
    assert "runtime_unbind is false" in r["reboot_reasons"][0]
    assert host.kernel.writes == []


def test_failed_regeneration_is_retried(host):
    open(os.path.join(host.root, "fail"), "w").close()
    r = run(host.args)
    assert r.get("failed") and "re-run to retry" in r["msg"]
    os.unlink(os.path.join(host.root, "fail"))
    r = run(host.args)
    assert not r.get("failed") and r["changed"] is True and r["files"] == []
    assert [c.split(" ", 1)[1] for c in commands(host)] == ["initramfs", "initramfs", "boot"]
    r = run(host.args)
    assert r["changed"] is False and len(commands(host)) == 3


def test_ids_that_name_no_gpu_are_refused_before_anything_changes(host):
    """An NVIDIA id on no function of the host, a NIC's id, the GPU's audio function: bad_input, nothing written."""
    before = tree_hash(host.root)
    for ids, why in ((["10de:ffff"], "10de:ffff: no PCI function of this host has this id"),
                     (["1b21:1242"], "1b21:1242: vendor 1b21 is not NVIDIA's (10de); it is 1b21:1242 at"),
                     (["10de:2230", "10de:1aef"], "10de:1aef: it is 10de:1aef at")):
        r = run(dict(host.args, ids=ids))
        assert r["failed"] and r["phase"] == "bad_input" and why in r["msg"], r["msg"]
        assert "the host's NVIDIA GPUs: 10de:2230 at" in r["msg"] and "10de::0302" in r["remedy"]
    assert "not a display/3D controller (class 0300/0302)" in r["msg"]
    assert tree_hash(host.root) == before and host.kernel.writes == [] and commands(host) == []


def test_bad_id_is_a_clear_error(host):
    r = run(dict(host.args, ids=["nvidia"]))
    assert r.get("failed") and "ids:" in r["msg"]


# --- the failure contract (failure.py): each known failure names its phase, with evidence and a remedy where one helps

def test_phase_bad_input_for_ids_that_are_not_pci_ids(host):
    r = run(dict(host.args, ids=["nvidia"]))
    assert r["phase"] == "bad_input" and r["msg"].startswith("bad_input: ids:") and "10de:2230" in r["remedy"]


def test_phase_gpu_in_use_lists_each_refusal_as_evidence(host):
    start_vm(host, 105, 4242)
    r = run(host.args)
    assert r["phase"] == "gpu_in_use" and r["refusals"] == r["evidence"] and "VM 105" in r["evidence"][0]
    assert "Stop the VMs" in r["remedy"] and "Remedy:" in r["msg"]


def test_phase_host_config_unreadable_when_the_pci_mappings_cannot_be_read(host):
    cfg = os.path.join(host.etc, "pve", "mapping", "pci.cfg")
    os.unlink(cfg)
    os.makedirs(cfg)  # a directory where the file should be: EISDIR
    r = run(host.args)
    assert r["phase"] == "host_config_unreadable" and "PCI resource mappings" in r["msg"]


def test_phase_host_write_failed(host, monkeypatch):
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pve_guests

    def refuse(path, data, preserve_mode=True):
        raise OSError(errno.EROFS, "Read-only file system", path)
    monkeypatch.setattr(pve_guests, "atomic_write", refuse)
    r = run(host.args)
    assert r["phase"] == "host_write_failed" and "Read-only file system" in r["msg"]


def test_phase_boot_refresh_failed_keeps_rc_and_output(host):
    open(os.path.join(host.root, "fail"), "w").close()
    r = run(host.args)
    assert r["phase"] == "boot_refresh_failed" and r["rc"] != 0 and "stderr" in r


def _driver_look(host, check_mode=True, mode="host"):
    """nvidia_driver with release_look (the gpu_host stage's one read-only call for both looks) on the fixture host."""
    from ansible_collections.kpro.gpu_serving.plugins.modules import nvidia_driver
    a = dict(version="580.126.09", mode=mode, proc_root=host.proc, release_look=dict(host.args, ids=None))
    try:
        run_module(nvidia_driver, a, check_mode=check_mode)
    except (AnsibleExitJson, AnsibleFailJson) as e:
        return e.result
    raise AssertionError("no exit")


def test_nvidia_driver_release_look_refuses_as_vfio_release_and_changes_nothing(host):
    before = tree_hash(host.root)
    free = _driver_look(host)
    # the release's look ran (what vfio_release --check reports), whatever the driver look then found (no NVML here)
    assert free["release"]["would_change"] is True and free["release"]["changed"] is True, free
    assert free["release"]["managed_ids"] == run(host.args, check_mode=True)["managed_ids"]
    assert tree_hash(host.root) == before
    start_vm(host, 105, 4242)
    before = tree_hash(host.root)
    refused = _driver_look(host)
    assert refused["failed"] is True and "release" not in refused, refused
    assert "VM 105 (win-gaming) is running with hostpci0" in refused["msg"] and refused["phase"] == run(host.args)["phase"]
    other_mode = _driver_look(host, mode="userspace")
    assert other_mode["failed"] is True and other_mode["phase"] == "bad_input" and "mode=host" in other_mode["msg"]
    outside = _driver_look(host, check_mode=False)
    assert outside["failed"] is True and outside["phase"] == "bad_input" and "check mode" in outside["msg"]
    assert tree_hash(host.root) == before and host.kernel.writes == [] and commands(host) == []
