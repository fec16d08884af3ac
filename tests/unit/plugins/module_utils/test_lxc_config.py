# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import difflib
import os
import threading
import time

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import lxc_config as lc

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "lxc")
GPU_DEVICES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def fixture(name):
    with open(os.path.join(FIX, name), "rb") as f:
        return f.read()


@pytest.fixture
def proc_devices(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "devices").write_bytes(fixture("proc_devices"))
    return lc.read_proc_devices(str(tmp_path))


def devices(proc_devices, paths=None):
    paths = GPU_DEVICES if paths is None else paths
    return lc.normalize_devices(paths, require_nodes=False, proc_devices=proc_devices)


def changed_lines(before, after):
    """(removed, added) lines between two texts."""
    removed, added = [], []
    for d in difflib.ndiff(before.splitlines(), after.splitlines()):
        if d.startswith("- "):
            removed.append(d[2:])
        elif d.startswith("+ "):
            added.append(d[2:])
    return removed, added


def is_owned_line(line):
    return (line.startswith("dev") and ": /dev/nvidia" in line) or (
        line.startswith("lxc.mount.entry") and "/dev/nvidia" in line.split(None, 2)[1 if ":" in line.split()[0] else 2]) or (
        line.startswith("lxc.cgroup2.devices.allow") and any(" %d:" % m in line for m in (195, 508, 509, 510)))


# ------------------------------------------------------------------ grammar


@pytest.mark.parametrize("name", ["129.conf", "130.conf", "131.conf", "140.conf", "published_guide.conf"])
def test_roundtrip_is_byte_identical(name):
    raw = fixture(name)
    assert lc.ConfigFile.parse(raw).to_bytes() == raw


@pytest.mark.parametrize("raw", ["", "\n", "a: 1", "a: 1\n\n\n", "#x\n\n[snap]\nb: 2", "\r\nbad line\n[pve:pending]\n",
                                 "lxc.init_cmd = /sbin/init\n", "caf\u00e9: x\n"])
def test_roundtrip_edge_cases(raw):
    assert lc.ConfigFile.parse(raw).render() == raw


def test_sections_and_kinds():
    conf = lc.ConfigFile.parse(fixture("129.conf"))
    assert [s.name for s in conf.sections] == ["", "pve:pending", "pre-sglang", "fresh"]
    assert conf.pending.get("delete") == "swap"
    assert conf.pending.get("memory") == "196608"
    assert conf.main.get("parent") == "pre-sglang"
    assert [s.get("snaptime") for s in conf.snapshots] == ["1746197412", "1740000000"]
    assert len(conf.main.lxc("lxc.idmap")) == 6
    assert conf.snapshots[0].lxc(lc.ALLOW_KEY)  # raw lines of a snapshot stay in the snapshot
    assert conf.unknown_lines() == []
    assert [ln.kind for ln in conf.main.lines[:4]] == ["comment", "comment", "comment", "key"]


def test_lxc_equals_separator_and_no_final_newline():
    conf = lc.ConfigFile.parse(fixture("130.conf"))
    entries = conf.main.lxc(lc.MOUNT_KEY)
    assert "/dev/nvidiactl dev/nvidiactl none bind,optional,create=file" in [e.value for e in entries]
    assert not conf.render().endswith("\n")


def test_set_key_sorted_insert_and_in_place_replace():
    raw = "#d\narch: amd64\nhostname: x\nlxc.idmap: u 0 100000 65536\n\n[snap]\nhostname: y\n"
    conf = lc.ConfigFile.parse(raw)
    assert conf.set_key("dev0", "/dev/nvidia0")
    assert conf.set_key("zz", "1")
    assert conf.set_key("hostname", "z")
    assert not conf.set_key("arch", "amd64")
    assert conf.render() == ("#d\narch: amd64\ndev0: /dev/nvidia0\nhostname: z\nzz: 1\nlxc.idmap: u 0 100000 65536\n"
                             "\n[snap]\nhostname: y\n")


def test_insert_into_file_without_final_newline():
    conf = lc.ConfigFile.parse("arch: amd64")
    conf.set_key("dev0", "/dev/nvidia0")
    conf.add_lxc(lc.MOUNT_KEY, "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file")
    assert conf.render() == "arch: amd64\ndev0: /dev/nvidia0\nlxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"


def test_dev_value_format_and_equivalence():
    assert lc.format_dev_value("/dev/nvidia0", gid=44, uid=0, mode="0666") == "/dev/nvidia0,gid=44,mode=0666,uid=0"
    assert lc.format_dev_value("/dev/nvidia0", mode="0666") == "/dev/nvidia0,mode=0666"
    assert lc.dev_equivalent("path=/dev/nvidia0,mode=0666,uid=0", "/dev/nvidia0,mode=0666")
    assert lc.dev_equivalent("/dev/nvidia0", "/dev/nvidia0,mode=0660,gid=0")
    assert not lc.dev_equivalent("/dev/nvidia0", "/dev/nvidia0,mode=0666")


def test_read_proc_devices(proc_devices):
    assert proc_devices["nvidia"] == 195
    assert proc_devices["nvidia-uvm"] == 509
    assert proc_devices["nvidia-caps"] == 510
    assert "device-mapper" not in proc_devices  # block devices are not character majors


# ------------------------------------------------------------------ passthrough plans


@pytest.mark.parametrize("name", ["129.conf", "130.conf", "131.conf"])
@pytest.mark.parametrize("method", ["devN", "lxc_raw"])
def test_apply_changes_only_owned_lines_and_is_idempotent(name, method, proc_devices):
    raw = fixture(name).decode()
    conf = lc.ConfigFile.parse(raw)
    plan = lc.plan_passthrough(conf, devices(proc_devices), method, proc_devices)
    after = conf.render()
    assert plan.changed and after != raw
    removed, added = changed_lines(raw, after)
    assert all(is_owned_line(x) for x in removed + added), (removed, added)
    # everything after the main section is byte-identical
    tail = raw[raw.index("\n[") if "\n[" in raw else len(raw):]
    assert after.endswith(tail) or name == "131.conf"
    again = lc.ConfigFile.parse(after)
    plan2 = lc.plan_passthrough(again, devices(proc_devices), method, proc_devices)
    assert not plan2.changed and again.render() == after


def test_published_mount_entries_with_dump_pass_fields_or_other_option_order_are_kept(proc_devices):
    raw = fixture("published_guide.conf").decode()
    conf = lc.ConfigFile.parse(raw)
    plan = lc.plan_passthrough(conf, devices(proc_devices), "lxc_raw", proc_devices)
    # every wanted device is already there in an equivalent line: nothing is rewritten
    assert not plan.changed and conf.render() == raw
    # a device not wanted any more is still removed, a missing one added in the canonical form
    plan = lc.plan_passthrough(conf, devices(proc_devices, ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]), "lxc_raw",
                               proc_devices)
    removed, added = changed_lines(raw, conf.render())
    assert plan.changed and added == [] and sorted(removed) == sorted([
        "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,create=file,optional 0 0",
        "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file 0 0"])
    assert "lxc.mount.entry: /usr/bin/nvidia-smi usr/bin/nvidia-smi none bind,optional,create=file 0 0" in conf.render()


def test_devn_129_canonical_lines(proc_devices):
    conf = lc.ConfigFile.parse(fixture("129.conf"))
    lc.plan_passthrough(conf, devices(proc_devices), "devN", proc_devices)
    main = conf.render().split("\n[", maxsplit=1)[0]
    assert ("cores: 32\ndev0: /dev/nvidia0,mode=0666\ndev1: /dev/nvidia1,mode=0666\ndev2: /dev/nvidiactl,mode=0666\n"
            "dev3: /dev/nvidia-uvm,mode=0666\ndev4: /dev/nvidia-uvm-tools,mode=0666\nfeatures: ") in main
    # the snapshot's raw lines were not touched (they belong to the snapshot)
    assert "[pre-sglang]" in conf.render() and "lxc.cgroup2.devices.allow: c 508:* rwm" in conf.render()


def test_devn_gid_uid_options(proc_devices):
    conf = lc.ConfigFile.parse(fixture("129.conf"))
    lc.plan_passthrough(conf, devices(proc_devices, ["/dev/nvidia0"]), "devN", proc_devices, dev_gid=44, dev_uid=0)
    assert "dev0: /dev/nvidia0,gid=44,mode=0666,uid=0\n" in conf.render()


def test_raw_stale_major_updated_in_place_and_old_gpu_removed(proc_devices):
    raw = fixture("130.conf").decode()
    conf = lc.ConfigFile.parse(raw)
    lc.plan_passthrough(conf, devices(proc_devices), "lxc_raw", proc_devices)
    removed, added = changed_lines(raw, conf.render())
    assert sorted(removed) == ["lxc.cgroup2.devices.allow: c 508:* rwm",
                               "lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file"]
    assert added == ["lxc.cgroup2.devices.allow: c 509:* rwm"]
    lines = conf.render().splitlines()
    assert lines.index("lxc.cgroup2.devices.allow: c 509:* rwm") == lines.index("lxc.cgroup2.devices.allow: c 195:* rwm") + 1
    # unrelated raw lines (dri, tun) and the snapshot's old major stay
    for keep in ("lxc.cgroup2.devices.allow: c 226:* rwm", "lxc.cgroup2.devices.allow: c 10:200 rwm",
                 "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir",
                 "lxc.cgroup2.devices.allow: c 507:* rwm"):
        assert keep in lines


def test_registered_foreign_major_is_not_owned(proc_devices):
    raw = ("arch: amd64\nlxc.cgroup2.devices.allow: c 226:* rwm\nlxc.cgroup2.devices.allow: c 250:* rwm\n"
           "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n")
    conf = lc.ConfigFile.parse(raw)
    lc.plan_passthrough(conf, devices(proc_devices, ["/dev/nvidia0"]), "lxc_raw", proc_devices)
    out = conf.render()
    assert "c 226:* rwm" in out and "c 250:* rwm" in out  # drm and pps belong to others
    assert "c 195:* rwm" in out


def test_unregistered_major_without_nvidia_mounts_is_not_owned(proc_devices):
    raw = "arch: amd64\nlxc.cgroup2.devices.allow: c 500:* rwm\n"
    conf = lc.ConfigFile.parse(raw)
    lc.plan_passthrough(conf, [], "devN", proc_devices)
    assert conf.render() == raw


def test_devn_stale_gpu_reused_and_pending_respected(proc_devices):
    raw = fixture("131.conf").decode()
    conf = lc.ConfigFile.parse(raw)
    plan = lc.plan_passthrough(conf, devices(proc_devices), "devN", proc_devices)
    # dev2 (/dev/nvidia3, gone) becomes /dev/nvidia1; dev4 pending already holds nvidia-uvm; dev0 (dri) untouched
    assert plan.devn_set == {"dev2": "/dev/nvidia1,mode=0666", "dev5": "/dev/nvidia-uvm-tools,mode=0666"}
    assert plan.devn_delete == []
    out = conf.render()
    assert "dev0: /dev/dri/renderD128,gid=104\n" in out
    assert out.endswith("[pve:pending]\ndev4: /dev/nvidia-uvm,mode=0666\n")


def test_method_switch_removes_other_methods_lines(proc_devices):
    conf = lc.ConfigFile.parse(fixture("130.conf"))
    lc.plan_passthrough(conf, devices(proc_devices), "devN", proc_devices)
    main = conf.render().split("\n[", maxsplit=1)[0]
    assert "/dev/nvidia" not in "".join(ln for ln in main.splitlines(True) if ln.startswith("lxc."))
    assert "c 195:* rwm" not in main
    conf = lc.ConfigFile.parse(fixture("130.conf"))
    lc.plan_passthrough(conf, devices(proc_devices), "devN", proc_devices, remove_other_method=False)
    assert "lxc.cgroup2.devices.allow: c 508:* rwm" in conf.render().split("\n[", maxsplit=1)[0]


def test_effective_conf_applies_pending():
    conf = lc.ConfigFile.parse("dev0: /dev/nvidia0\ndev1: /dev/nvidia1\n\n[pve:pending]\ndelete: dev1\ndev2: /dev/nvidiactl\n")
    eff = lc.effective_conf(conf)
    assert eff.main.get("dev0") == "/dev/nvidia0"
    assert eff.main.get("dev1") is None
    assert eff.main.get("dev2") == "/dev/nvidiactl"


def test_render_raw_needs_majors():
    with pytest.raises(lc.LxcConfigError, match="major of /dev/nvidia-uvm is unknown"):
        lc.render_raw([{"path": "/dev/nvidia-uvm", "major": None, "minor": None}])


# ------------------------------------------------------------------ devices


def make_devroot(tmp_path, names):
    """Fake /dev with regular files standing in for nodes (stat_device is patched for them)."""
    d = tmp_path / "root" / "dev"
    (d / "nvidia-caps").mkdir(parents=True)
    for n in names:
        (d / n).write_text("")
    return str(tmp_path / "root")


@pytest.fixture
def fake_chr(monkeypatch):
    majors = {"nvidia-uvm": 509, "nvidia-uvm-tools": 509, "nvidia-cap1": 510}

    def fake_stat(path, dev_root="/"):
        hp = lc._host_path(dev_root, path)
        if not os.path.exists(hp):
            raise lc.LxcConfigError("Device %s does not exist. %s" % (path, lc.node_fix(path)))
        base = os.path.basename(path)
        return {"path": path, "major": majors.get(base, 195), "minor": 0}
    monkeypatch.setattr(lc, "stat_device", fake_stat)


def test_discover_all_and_selected(tmp_path, fake_chr):
    root = make_devroot(tmp_path, ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset",
                                   "nvidia-caps/nvidia-cap1"])
    paths = [d["path"] for d in lc.discover_devices(root)]
    # the caps node is left out: no boot makes it, and PVE refuses a CT start without a devN node (device_nodes)
    assert paths == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                     "/dev/nvidia-modeset"]
    assert lc.caps_left_out(root) == ["/dev/nvidia-caps/nvidia-cap1"]
    assert [d["path"] for d in lc.discover_devices(root, [1])][:2] == ["/dev/nvidia1", "/dev/nvidiactl"]
    with pytest.raises(lc.LxcConfigError, match="GPU 3 was requested"):
        lc.discover_devices(root, [3])


def test_discover_missing_uvm_names_fix(tmp_path, fake_chr):
    root = make_devroot(tmp_path, ["nvidia0", "nvidiactl"])
    with pytest.raises(lc.LxcConfigError) as e:
        lc.discover_devices(root)
    assert "/dev/nvidia-uvm does not exist" in str(e.value)
    assert "nvidia-modprobe -u -c=0" in str(e.value)


def test_stat_device_real_char_device():
    dev = lc.stat_device("/dev/null")
    assert (dev["major"], dev["minor"]) == (1, 3)
    with pytest.raises(lc.LxcConfigError, match="not a character device"):
        lc.stat_device("/dev/shm")


def test_normalize_devices_validation(proc_devices):
    with pytest.raises(lc.LxcConfigError, match="not a valid device path"):
        lc.normalize_devices(["/tmp/x"], require_nodes=False)
    with pytest.raises(lc.LxcConfigError, match="not a valid device path"):
        lc.normalize_devices(["/dev/../etc/passwd"], require_nodes=False)
    devs = lc.normalize_devices([{"path": "/dev/nvidia-uvm", "major": 511, "minor": 0}, "/dev/nvidia-caps/nvidia-cap1"],
                                require_nodes=False, proc_devices=proc_devices)
    assert [d["major"] for d in devs] == [511, 510]


# ------------------------------------------------------------------ files


def test_atomic_write_keeps_mode_and_leaves_no_tmp(tmp_path):
    p = tmp_path / "129.conf"
    p.write_text("a: 1\n")
    os.chmod(str(p), 0o640)
    lc.atomic_write(str(p), b"a: 2\n")
    assert p.read_bytes() == b"a: 2\n"
    assert oct(os.stat(str(p)).st_mode & 0o777) == oct(0o640)
    assert os.listdir(str(tmp_path)) == ["129.conf"]


def test_atomic_write_refuses_over_1mib(tmp_path):
    p = tmp_path / "129.conf"
    p.write_text("a: 1\n")
    with pytest.raises(lc.LxcConfigError, match="1 MiB"):
        lc.atomic_write(str(p), b"x" * (1024 * 1024 + 1))
    assert p.read_text() == "a: 1\n"


def test_atomic_write_does_not_chmod(tmp_path, monkeypatch):
    p = tmp_path / "1.conf"
    p.write_text("a\n")

    def no(*a, **k):
        raise AssertionError("chmod/chown called")
    monkeypatch.setattr(os, "chmod", no)
    monkeypatch.setattr(os, "chown", no)
    monkeypatch.setattr(os, "fchmod", no)
    lc.atomic_write(str(p), b"b\n")


def test_backup(tmp_path):
    b1 = lc.write_backup(str(tmp_path / "bk"), 129, b"x")
    b2 = lc.write_backup(str(tmp_path / "bk"), 129, b"y")
    assert b1 != b2 and open(b1, "rb").read() == b"x"
    assert os.path.basename(b1).startswith("129.conf.")


def test_config_lock_times_out_while_held(tmp_path):
    lock_dir = str(tmp_path / "lock")
    held = threading.Event()
    release = threading.Event()

    def holder():
        with lc.ConfigLock(129, lock_dir):
            held.set()
            release.wait(5)
    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    t0 = time.monotonic()
    try:
        with pytest.raises(lc.LxcConfigError, match="got timeout"):
            with lc.ConfigLock(129, lock_dir, timeout=0.3):
                pass
    finally:
        release.set()
        t.join()
    assert time.monotonic() - t0 < 3
    assert os.path.exists(os.path.join(lock_dir, "pve-config-129.lock"))


def test_read_config_unknown_vmid(tmp_path):
    with pytest.raises(lc.LxcConfigError, match="CT 999 does not exist here"):
        lc.read_config(str(tmp_path), 999)


def test_lock_detection():
    assert lc.config_lock(lc.ConfigFile.parse(fixture("140.conf"))) == "backup"
    assert lc.config_lock(lc.ConfigFile.parse(fixture("129.conf"))) is None


def test_node_drift_compares_major_minor():
    import errno as _errno
    import stat as _stat

    class St(object):
        def __init__(self, major, minor, mode=_stat.S_IFCHR):
            self.st_mode, self.st_rdev = mode | 0o666, os.makedev(major, minor)
    nodes = {"/ct/dev/nvidia0": St(195, 0), "/ct/dev/nvidia-uvm": St(509, 0), "/ct/dev/nvidiactl": St(195, 255, _stat.S_IFREG)}

    def fake(path):
        if path in nodes:
            return nodes[path]
        raise OSError(_errno.ENOENT if "tools" in path else _errno.EACCES, "x", path)
    devs = [{"path": "/dev/nvidia0", "major": 195, "minor": 0}, {"path": "/dev/nvidia-uvm", "major": 508, "minor": 0},
            {"path": "/dev/nvidiactl", "major": 195, "minor": 255}, {"path": "/dev/nvidia-uvm-tools", "major": 508, "minor": 1},
            {"path": "/dev/nvidia-caps/x", "major": 507, "minor": 1}, {"path": "/dev/nvidia-modeset", "major": None, "minor": None}]
    assert lc.node_drift(devs, "/ct", stat_fn=fake) == [
        {"path": "/dev/nvidia-uvm", "host": "508:0", "container": "509:0"},
        {"path": "/dev/nvidiactl", "host": "195:255", "container": "not a node"},
        {"path": "/dev/nvidia-uvm-tools", "host": "508:1", "container": "missing"}]
