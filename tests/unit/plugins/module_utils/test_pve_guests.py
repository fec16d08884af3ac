# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import shutil
import stat

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pve_guests as pg

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "pve")
GPU0 = ["0000:17:00.0", "0000:17:00.1"]
GPU1 = ["0000:65:00.0", "0000:65:00.1"]


def etc_tree(tmp_path, vms=("105", "110", "120", "130")):
    qs = tmp_path / "etc" / "pve" / "qemu-server"
    qs.mkdir(parents=True)
    (tmp_path / "etc" / "pve" / "mapping").mkdir()
    shutil.copy(os.path.join(FIX, "pci.cfg"), str(tmp_path / "etc" / "pve" / "mapping" / "pci.cfg"))
    for v in vms:
        shutil.copy(os.path.join(FIX, v + ".conf"), str(qs / (v + ".conf")))
    return str(tmp_path / "etc")


def test_parse_hostpci_forms():
    assert pg.parse_hostpci("0000:17:00")["host"] == ["0000:17:00"]
    assert pg.parse_hostpci("17:00.0,pcie=1")["host"] == ["0000:17:00.0"]
    assert pg.parse_hostpci("host=0000:17:00.0;0000:65:00.0,x-vga=1") == {
        "host": ["0000:17:00.0", "0000:65:00.0"], "mapping": None, "options": {"x-vga": "1"}}
    assert pg.parse_hostpci("mapping=a6000,pcie=1") == {"host": [], "mapping": "a6000", "options": {"pcie": "1"}}


def test_pciid_covers_slot_and_function():
    assert pg.pciid_covers("17:00", "0000:17:00.1")
    assert pg.pciid_covers("0000:17:00.0", "0000:17:00.0")
    assert not pg.pciid_covers("17:00.0", "0000:17:00.1")
    assert not pg.pciid_covers("0001:17:00", "0000:17:00.0")


def test_parse_vm_config_ignores_snapshots():
    with open(os.path.join(FIX, "105.conf")) as f:
        cfg = pg.parse_vm_config(f.read())
    assert cfg["main"]["hostpci0"] == "0000:17:00,pcie=1,x-vga=1"
    assert cfg["main"]["memory"] == "32768"  # the snapshot's 16384 is not current
    assert cfg["snapshots"] == ["before-driver"]


def test_read_pci_mappings_filters_node():
    path = os.path.join(FIX, "pci.cfg")
    assert pg.read_pci_mappings(path, "kpro5") == {"a6000": ["0000:17:00.0"], "usbctl": ["0000:05:00.0"]}
    assert pg.read_pci_mappings(path, None)["a6000"] == ["0000:17:00.0", "0000:b3:00.0"]
    assert pg.read_pci_mappings(path + ".missing") == {}


def test_find_references(tmp_path):
    etc = etc_tree(tmp_path)
    mappings = pg.read_pci_mappings(os.path.join(etc, "pve", "mapping", "pci.cfg"), "kpro5")
    refs = pg.find_references(etc, GPU0 + GPU1, mappings)
    by = dict((r["vmid"], r) for r in refs)
    assert sorted(by) == [105, 110, 120]  # 130 passes only the USB controller
    assert by[105]["name"] == "win-gaming" and by[105]["onboot"] is True
    assert [(x["key"], x["bdfs"]) for x in by[105]["references"]] == [("hostpci0", GPU0)]  # not the snapshot's 65:00
    assert by[110]["references"][0]["via"] == "mapping:a6000" and by[110]["references"][0]["bdfs"] == ["0000:17:00.0"]
    assert by[120]["references"][0]["section"] == "PENDING" and by[120]["references"][0]["bdfs"] == GPU1


def _proc(tmp_path, pid, args, state="S"):
    d = tmp_path / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
    (d / "stat").write_text("%d (kvm) %s 1 2 3\n" % (pid, state))


def test_pidfile_running(tmp_path):
    run = tmp_path / "run" / "qemu-server"
    run.mkdir(parents=True)
    proc = str(tmp_path / "proc")
    (run / "105.pid").write_text("4242\n")
    assert not pg.pidfile_running(105, str(tmp_path / "run"), proc)  # stale pidfile, no process
    _proc(tmp_path, 4242, ["/usr/bin/kvm", "-id", "105", "-pidfile", "/var/run/qemu-server/105.pid"])
    assert pg.pidfile_running(105, str(tmp_path / "run"), proc)
    (run / "110.pid").write_text("4243\n")
    _proc(tmp_path, 4243, ["/usr/bin/bash"])  # pid reused by something else
    assert not pg.pidfile_running(110, str(tmp_path / "run"), proc)
    (run / "120.pid").write_text("4244\n")
    _proc(tmp_path, 4244, ["/usr/bin/kvm", "-pidfile", "/var/run/qemu-server/120.pid"], state="Z")
    assert not pg.pidfile_running(120, str(tmp_path / "run"), proc)
    assert not pg.pidfile_running(999, str(tmp_path / "run"), proc)


def test_pci_reservations(tmp_path):
    run = tmp_path / "run" / "qemu-server"
    run.mkdir(parents=True)
    _proc(tmp_path, 77, ["/usr/bin/kvm"])
    (run / "pci-id-reservations").write_text("0000:17:00.0 105 pid:77\n0000:65:00.0 120 pid:78\n0000:05:00.0 130 time:1\n")
    assert pg.pci_reservations(str(tmp_path / "run"), str(tmp_path / "proc")) == {"0000:17:00.0": 105}


def test_qm_status_checker():
    calls = []

    def rc(argv):
        calls.append(argv)
        return 0, "status: running\n" if argv[2] == "105" else "status: stopped\n", ""
    check = pg.make_qm_status_checker(rc, "/usr/sbin/qm")
    assert check(105) is True and check(110) is False
    assert calls[0] == ["/usr/sbin/qm", "status", "105"]
    with pytest.raises(pg.GuestError):
        pg.make_qm_status_checker(lambda a: (2, "", "Configuration file 'nodes/x/qemu-server/9.conf' does not exist"))(9)


def test_detach_text_keeps_everything_else():
    with open(os.path.join(FIX, "105.conf")) as f:
        text = f.read()
    new, changes = pg.detach_text(text, [("main", "hostpci0")], set_onboot_zero=True)
    expected = text.replace("hostpci0: 0000:17:00,pcie=1,x-vga=1\n", "", 1).replace("onboot: 1\nostype", "onboot: 0\nostype", 1)
    assert new == expected
    assert "[before-driver]\nhostpci0: 0000:65:00,pcie=1\n" in new and new.count("onboot: 1") == 1  # snapshot untouched
    assert changes == ["removed hostpci0: 0000:17:00,pcie=1,x-vga=1", "onboot: 1 -> onboot: 0"]
    again, changes2 = pg.detach_text(new, [("main", "hostpci0")], set_onboot_zero=True)
    assert again == new and changes2 == []


def test_detach_text_pending_section():
    with open(os.path.join(FIX, "120.conf")) as f:
        text = f.read()
    new, changes = pg.detach_text(text, [("PENDING", "hostpci0")])
    assert new == text.replace("hostpci0: 65:00.0;65:00.1\n", "")
    assert "onboot: 1" in new


def test_backup_and_atomic_write_no_chmod_under_pve(tmp_path, monkeypatch):
    etc = etc_tree(tmp_path, vms=("110",))
    path = os.path.join(etc, "pve", "qemu-server", "110.conf")
    os.chmod(path, 0o640)
    before = open(path, "rb").read()
    backup = pg.backup_file(path, str(tmp_path / "backups"), now=0)
    assert backup.startswith(str(tmp_path / "backups") + os.sep) and "/etc/pve/qemu-server/110.conf." in backup
    assert open(backup, "rb").read() == before
    assert pg.backup_file(path, str(tmp_path / "backups"), now=0) != backup  # same second: a new name

    def no_chmod(*a, **k):
        raise AssertionError("chmod under /etc/pve")
    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(os, "chown", no_chmod)
    pg.atomic_write(path, b"name: x\n", preserve_mode=False)
    assert open(path, "rb").read() == b"name: x\n"
    assert sorted(os.listdir(os.path.dirname(path))) == ["110.conf"]  # no tmp left over


def test_atomic_write_preserves_mode(tmp_path):
    p = tmp_path / "grub"
    p.write_text("a\n")
    os.chmod(str(p), 0o600)
    pg.atomic_write(str(p), b"b\n")
    assert stat.S_IMODE(os.stat(str(p)).st_mode) == 0o600 and p.read_text() == "b\n"


def test_config_lock(tmp_path):
    (tmp_path / "lock").mkdir()
    with pg.ConfigLock(105, str(tmp_path / "lock" / "qemu-server")) as lk:
        assert os.path.exists(lk.path)
        with pytest.raises(pg.GuestError):
            with pg.ConfigLock(105, str(tmp_path / "lock" / "qemu-server"), timeout=0):
                pass
