# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pci
from ansible_collections.kpro.gpu_serving.tests.unit.plugins import fake_sysfs

GPU0, AUD0, GPU1, AUD1 = "0000:17:00.0", "0000:17:00.1", "0000:73:00.0", "0000:73:00.1"
USB, NIC = "0000:03:00.0", "0000:01:00.0"
NV_DRIVERS = dict(fake_sysfs.DRIVER_IDS, nvidia=[("10de", "2230")])
PVE_DYNIDS = {"vfio-pci": [("10de", "2230"), ("10de", "1aef"), ("1b21", "1242")]}


@pytest.fixture
def sysfs(tmp_path):
    return fake_sysfs.build(tmp_path)


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """kpro5 after a VM start: GPUs + audio + USB on vfio-pci with Proxmox's dynamic ids; nvidia loaded."""
    root = fake_sysfs.build(tmp_path, drivers=NV_DRIVERS)
    k = fake_sysfs.FakeKernel(root, dynids=PVE_DYNIDS, static=NV_DRIVERS)
    monkeypatch.setattr(pci, "sysfs_write", k)
    return k


# ------------------------------------------------------------------ reading


def test_tree_uses_kernel_symlinks(sysfs):
    link = os.readlink(os.path.join(sysfs, "bus/pci/devices", GPU0))
    assert link == "../../../devices/pci0000:16/0000:16:02.0/0000:17:00.0"
    assert os.readlink(os.path.join(sysfs, "bus/pci/devices", GPU0, "driver")) == "../../../../bus/pci/drivers/vfio-pci"


def test_list_devices_reads_ids_driver_and_group(sysfs):
    devs = pci.list_devices(sysfs)
    assert [d["bdf"] for d in devs] == sorted(fake_sysfs.KPRO5)
    gpu = next(d for d in devs if d["bdf"] == GPU0)
    assert gpu == {
        "bdf": GPU0, "slot": "0000:17:00", "function": 0, "vendor": "10de", "device": "2230", "id": "10de:2230",
        "class": "0x030000", "class_name": "VGA compatible controller", "subsystem_vendor": "10de",
        "subsystem_device": "1459", "subsystem_id": "10de:1459", "name": "NVIDIA RTX A6000", "chip": "GA102GL",
        "driver": "vfio-pci", "driver_override": None, "iommu_group": 27, "iommu_group_members": [GPU0, AUD0],
        "is_bridge": False, "sysfs_path": os.path.join(sysfs, "devices/pci0000:16/0000:16:02.0/0000:17:00.0"),
    }
    audio = next(d for d in devs if d["bdf"] == AUD1)
    assert audio["name"] == "GA102 High Definition Audio Controller"
    assert audio["iommu_group"] == 75 and audio["iommu_group_members"] == [GPU1, AUD1]
    usb = next(d for d in devs if d["bdf"] == USB)
    assert usb["id"] == "1b21:1242" and usb["name"] == "1b21:1242" and usb["driver"] == "vfio-pci"
    assert usb["class_name"] == "USB controller"
    nic = next(d for d in devs if d["bdf"] == NIC)
    assert nic["driver"] == "igb" and nic["iommu_group"] == 12
    host = next(d for d in devs if d["bdf"] == "0000:00:00.0")
    assert host["driver"] is None and host["is_bridge"]
    port = next(d for d in devs if d["bdf"] == "0000:16:02.0")
    assert port["is_bridge"] and port["driver"] == "pcieport"


def test_driver_override_and_no_iommu(tmp_path):
    devices = {GPU0: fake_sysfs.KPRO5[GPU0][:6] + (None, None)}
    root = fake_sysfs.build(tmp_path, devices=devices)
    with open(os.path.join(root, "bus/pci/devices", GPU0, "driver_override"), "w") as f:
        f.write("nvidia\n")
    (dev,) = pci.list_devices(root)
    assert dev["driver"] is None and dev["driver_override"] == "nvidia"
    assert dev["iommu_group"] is None and dev["iommu_group_members"] == []


def test_list_devices_missing_tree(tmp_path):
    assert pci.list_devices(str(tmp_path)) == []


@pytest.mark.parametrize("raw,norm", [
    ("0000:17:00.0", GPU0), ("17:00.1", AUD0), ("00000000:17:00.0", GPU0), ("0000:AB:1F.7", "0000:ab:1f.7"),
])
def test_normalize_bdf(raw, norm):
    assert pci.normalize_bdf(raw) == norm


@pytest.mark.parametrize("bad", ["17:00", "0000:17:00.8", "zz:00.0", ""])
def test_normalize_bdf_rejects(bad):
    with pytest.raises(ValueError):
        pci.normalize_bdf(bad)


def test_parse_id():
    assert pci.parse_id("10de:2230") == ("10de", "2230")
    assert pci.parse_id("0x10DE:0x2230") == ("10de", "2230")
    assert pci.parse_id("10de 1aef") == ("10de", "1aef")
    with pytest.raises(ValueError):
        pci.parse_id("10de")
    with pytest.raises(ValueError):
        pci.parse_id("10de:xyz1")


# ------------------------------------------------------------------ selection


def test_select_default_is_nvidia_display_plus_slot_and_group(sysfs):
    sel = pci.select_gpus(pci.list_devices(sysfs))
    assert [(d["bdf"], d["selected_by"]) for d in sel] == [
        (GPU0, "id"), (AUD0, "slot"), (GPU1, "id"), (AUD1, "slot")]
    assert all(d["driver"] == "vfio-pci" for d in sel)


def test_select_by_ids_does_not_take_other_vfio_devices(sysfs):
    devs = pci.list_devices(sysfs)
    sel = pci.select_gpus(devs, ids=["10de:2230"])
    assert [d["bdf"] for d in sel] == [GPU0, AUD0, GPU1, AUD1]
    assert USB not in [d["bdf"] for d in sel]
    assert [d["bdf"] for d in pci.select_gpus(devs, ids=["1b21:1242"])] == [USB]
    assert pci.select_gpus(devs, ids=["10de:9999"]) == []


def test_select_pulls_iommu_group_but_not_bridges(tmp_path):
    devices = dict(fake_sysfs.KPRO5)
    # A board without ACS: the root port and a third-party function share the GPU's group.
    devices["0000:16:02.0"] = devices["0000:16:02.0"][:6] + (27, "pcieport")
    devices["0000:18:00.0"] = ("pci0000:16/0000:16:02.0", "1912", "0014", "1912", "0014", "0x0c0330", 27, "vfio-pci")
    root = fake_sysfs.build(tmp_path, devices=devices)
    devs = pci.list_devices(root)
    sel = pci.select_gpus(devs, ids=["10de:2230"])
    by = dict((d["bdf"], d["selected_by"]) for d in sel)
    assert by == {GPU0: "id", AUD0: "slot", "0000:18:00.0": "iommu_group", GPU1: "id", AUD1: "slot"}
    assert "0000:16:02.0" not in by
    no_group = pci.select_gpus(devs, ids=["10de:2230"], include_group=False)
    assert "0000:18:00.0" not in [d["bdf"] for d in no_group]


def test_select_does_not_modify_input(sysfs):
    devs = pci.list_devices(sysfs)
    pci.select_gpus(devs)
    assert all("selected_by" not in d for d in devs)


def test_vfio_group_holders(tmp_path):
    proc = tmp_path / "proc"
    for pid, target in ((101, "/dev/vfio/27"), (102, "/dev/null"), (103, "/dev/vfio/75")):
        (proc / str(pid) / "fd").mkdir(parents=True)
        os.symlink(target, str(proc / str(pid) / "fd" / "7"))
    (proc / "self").mkdir()
    assert pci.vfio_group_holders(27, proc_root=str(proc)) == [101]
    assert pci.vfio_group_holders(75, proc_root=str(proc)) == [103]
    assert pci.vfio_group_holders(14, proc_root=str(proc)) == []
    assert pci.vfio_group_holders(None, proc_root=str(proc)) == []


# ------------------------------------------------------------------ writing: plain file tree


def test_sysfs_write_does_not_create(tmp_path):
    with pytest.raises(OSError) as e:
        pci.sysfs_write(str(tmp_path / "nope"), "x")
    assert e.value.errno == errno.ENOENT
    target = tmp_path / "attr"
    target.write_text("")
    pci.sysfs_write(str(target), "0000:17:00.0")
    assert target.read_text() == "0000:17:00.0"


def test_unbind_writes_bdf_to_driver_unbind(sysfs):
    assert pci.unbind(GPU0, sysfs) is True
    with open(os.path.join(sysfs, "bus/pci/drivers/vfio-pci/unbind")) as f:
        assert f.read() == GPU0


def test_check_mode_writes_nothing(sysfs, monkeypatch):
    calls = []
    monkeypatch.setattr(pci, "sysfs_write", lambda p, v: calls.append((p, v)))
    assert pci.unbind(GPU0, sysfs, check_mode=True) is True
    assert pci.set_driver_override(GPU0, "nvidia", sysfs, check_mode=True) is True
    assert pci.new_id("vfio-pci", "10de", "2230", sysfs, check_mode=True) is True
    assert pci.remove_id("vfio-pci", "10de", "2230", sysfs, check_mode=True) is True
    assert pci.release_from_vfio(GPU0, sysfs, check_mode=True) is True
    assert calls == []


def test_noops_return_false(sysfs, monkeypatch):
    monkeypatch.setattr(pci, "sysfs_write", lambda p, v: pytest.fail("no write expected: %s" % p))
    assert pci.unbind("0000:00:00.0", sysfs) is False  # no driver
    assert pci.unbind(NIC, sysfs, driver="vfio-pci") is False  # bound to igb, not vfio-pci
    assert pci.bind("igb", NIC, sysfs) is False
    assert pci.set_driver_override(GPU0, None, sysfs) is False  # already (null)
    assert pci.drivers_probe(GPU0, sysfs) is False  # bound: the kernel would do nothing
    assert pci.remove_id("nvidia", "10de", "2230", sysfs) is False  # driver not loaded
    assert pci.release_from_vfio(NIC, sysfs) is False


def test_unknown_device(sysfs):
    with pytest.raises(pci.PciError) as e:
        pci.unbind("0000:99:00.0", sysfs)
    assert e.value.errno == errno.ENODEV and "no PCI device 0000:99:00.0" in str(e.value)


def test_bind_refuses_bound_device_and_missing_driver(sysfs):
    with pytest.raises(pci.PciError) as e:
        pci.bind("nvidia", GPU0, sysfs)
    assert e.value.errno == errno.EBUSY and "bound to vfio-pci" in e.value.msg
    with pytest.raises(pci.PciError) as e:
        pci.bind("nvidia", "0000:00:00.0", sysfs)
    assert e.value.errno == errno.ENOENT and "modprobe" in e.value.msg


# ------------------------------------------------------------------ writing: errno mapping


@pytest.mark.parametrize("func,args,target,code,expect", [
    (pci.unbind, (GPU0,), "bus/pci/drivers/vfio-pci/unbind", errno.ENODEV, "not bound to vfio-pci"),
    (pci.unbind, (GPU0,), "bus/pci/drivers/vfio-pci/unbind", errno.EACCES, "become: true"),
    (pci.unbind, (GPU0,), "bus/pci/drivers/vfio-pci/unbind", errno.EROFS, "read-only"),
    (pci.bind, ("snd_hda_intel", "0000:00:00.0"), "bus/pci/drivers/snd_hda_intel/bind", errno.ENODEV, "did not accept"),
    (pci.set_driver_override, (GPU0, "x" * 300), "bus/pci/devices/%s/driver_override" % GPU0, errno.EINVAL, "too long"),
    (pci.new_id, ("vfio-pci", "10de", "2230"), "bus/pci/drivers/vfio-pci/new_id", errno.EINVAL, "rejected"),
    (pci.remove_id, ("vfio-pci", "10de", "2230"), "bus/pci/drivers/vfio-pci/remove_id", errno.EACCES, "become"),
])
def test_errno_mapping(sysfs, monkeypatch, func, args, target, code, expect):
    def failing(path, value):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(pci, "sysfs_write", failing)
    with pytest.raises(pci.PciError) as e:
        func(*args, sysfs_root=sysfs)
    assert e.value.errno == code
    assert expect in e.value.msg
    assert errno.errorcode[code] in e.value.msg
    assert e.value.path.endswith(target)
    assert e.value.to_dict()["errno_name"] == errno.errorcode[code]


def failing_write(code):
    def write(path, value):
        raise OSError(code, os.strerror(code))
    return write


def test_drivers_probe_errors(sysfs, monkeypatch):
    for code, expect in ((errno.EINVAL, "probe failed"), (errno.ENODEV, "no such PCI device")):
        monkeypatch.setattr(pci, "sysfs_write", failing_write(code))
        with pytest.raises(pci.PciError) as e:
            pci.drivers_probe("0000:00:00.0", sysfs)
        assert e.value.errno == code and expect in e.value.msg


def test_remove_id_enodev_is_not_an_error(sysfs, monkeypatch):
    monkeypatch.setattr(pci, "sysfs_write", failing_write(errno.ENODEV))
    assert pci.remove_id("vfio-pci", "10de", "2230", sysfs) is False


def test_new_id_eexist_is_not_an_error(sysfs, monkeypatch):
    monkeypatch.setattr(pci, "sysfs_write", failing_write(errno.EEXIST))
    assert pci.new_id("vfio-pci", "10de", "2230", sysfs) is False


def test_new_id_driver_not_loaded(sysfs):
    with pytest.raises(pci.PciError) as e:
        pci.new_id("nvidia", "10de", "2230", sysfs)
    assert e.value.errno == errno.ENOENT and "modprobe" in e.value.msg


# ------------------------------------------------------------------ writing: against a fake kernel


def test_remove_id_values_and_idempotence(kernel):
    assert pci.remove_id("vfio-pci", "10de", "2230", kernel.sysfs) is True
    assert ("bus/pci/drivers/vfio-pci/remove_id", "10de 2230\n") in kernel.writes
    assert pci.remove_id("vfio-pci", "10de", "2230", kernel.sysfs) is False  # ENODEV now


def test_set_and_clear_driver_override(kernel):
    assert pci.set_driver_override(GPU0, "nvidia", kernel.sysfs) is True
    assert pci.get_driver_override(GPU0, kernel.sysfs) == "nvidia"
    assert pci.set_driver_override(GPU0, "nvidia", kernel.sysfs) is False
    assert pci.set_driver_override(GPU0, None, kernel.sysfs) is True
    assert kernel.writes[-1] == ("bus/pci/devices/%s/driver_override" % GPU0, "\n")
    assert pci.get_driver_override(GPU0, kernel.sysfs) is None


def test_release_without_remove_id_is_reclaimed_by_vfio(kernel):
    with pytest.raises(pci.PciError) as e:
        pci.release_from_vfio(GPU0, kernel.sysfs)
    assert "claimed by vfio-pci again" in e.value.msg and "remove_id" in e.value.msg


def test_release_sequence_gpu_to_nvidia_and_audio_to_hda(kernel):
    for ident in (("10de", "2230"), ("10de", "1aef")):
        pci.remove_id("vfio-pci", ident[0], ident[1], kernel.sysfs)
    with open(os.path.join(kernel.sysfs, "bus/pci/devices", GPU0, "driver_override"), "w") as f:
        f.write("vfio-pci\n")  # as `driver_override`-based passthrough leaves it
    del kernel.writes[:]
    actions = []
    assert pci.release_from_vfio(GPU0, kernel.sysfs, actions=actions) is True
    assert kernel.writes == [
        ("bus/pci/devices/%s/driver_override" % GPU0, "\n"),
        ("bus/pci/drivers/vfio-pci/unbind", GPU0),
        ("bus/pci/drivers_probe", GPU0),
    ]
    assert actions[-1] == "%s: drivers_probe -> nvidia" % GPU0
    assert pci.current_driver(GPU0, kernel.sysfs) == "nvidia"
    assert pci.release_from_vfio(AUD0, kernel.sysfs) is True
    assert pci.current_driver(AUD0, kernel.sysfs) == "snd_hda_intel"
    # second run: nothing to do, nothing written
    del kernel.writes[:]
    assert pci.release_from_vfio(GPU0, kernel.sysfs) is False
    assert pci.release_from_vfio(AUD0, kernel.sysfs) is False
    assert kernel.writes == []
    # the USB controller another VM uses is untouched
    assert pci.current_driver(USB, kernel.sysfs) == "vfio-pci"


def test_release_keeps_foreign_override_and_can_skip_probe(kernel):
    pci.remove_id("vfio-pci", "10de", "2230", kernel.sysfs)
    pci.set_driver_override(GPU1, "nvidia", kernel.sysfs)
    assert pci.release_from_vfio(GPU1, kernel.sysfs, probe=False) is True
    assert pci.current_driver(GPU1, kernel.sysfs) is None
    assert pci.get_driver_override(GPU1, kernel.sysfs) == "nvidia"
    assert pci.drivers_probe(GPU1, kernel.sysfs) is True
    assert pci.current_driver(GPU1, kernel.sysfs) == "nvidia"


def test_bind_and_unbind_through_kernel(kernel):
    assert pci.unbind(NIC, kernel.sysfs) is True
    assert pci.current_driver(NIC, kernel.sysfs) is None
    assert pci.bind("igb", NIC, kernel.sysfs) is True
    assert pci.current_driver(NIC, kernel.sysfs) == "igb"
    pci.unbind(AUD1, kernel.sysfs)
    with pytest.raises(pci.PciError) as e:
        pci.bind("igb", AUD1, kernel.sysfs)
    assert e.value.errno == errno.ENODEV and "driver_override" in e.value.msg


def test_new_id_binds_unbound_matching_devices(kernel):
    pci.remove_id("vfio-pci", "10de", "2230", kernel.sysfs)
    pci.set_driver_override(GPU0, "pci-stub", kernel.sysfs)  # keep GPU0 out of the way
    pci.unbind(GPU0, kernel.sysfs)
    pci.unbind(GPU1, kernel.sysfs)
    assert pci.new_id("vfio-pci", "10de", "2230", kernel.sysfs) is True
    assert pci.current_driver(GPU1, kernel.sysfs) == "vfio-pci"
    assert pci.current_driver(GPU0, kernel.sysfs) is None
    assert pci.new_id("vfio-pci", "10de", "2230", kernel.sysfs) is False  # EEXIST


def test_remove_id_all_takes_out_every_entry_of_an_id(kernel):
    # vfio-pci.ids=10de:2230,10de:2230 (or one entry per subsystem id): remove_id drops the first match only
    kernel.dynids["vfio-pci"].append(("10de", "2230"))
    assert pci.remove_id_all("vfio-pci", "10de", "2230", kernel.sysfs) == 2
    assert ("10de", "2230") not in kernel.dynids["vfio-pci"]
    assert pci.remove_id_all("vfio-pci", "10de", "2230", kernel.sysfs) == 0  # ENODEV at once
    pci.remove_id_all("vfio-pci", "10de", "1aef", kernel.sysfs)
    pci.release_from_vfio(GPU0, kernel.sysfs)
    assert pci.current_driver(GPU0, kernel.sysfs) == "nvidia"


def test_remove_id_all_check_mode_writes_nothing(kernel):
    assert pci.remove_id_all("vfio-pci", "10de", "2230", kernel.sysfs, check_mode=True) == 1
    assert kernel.writes == []
    assert pci.remove_id_all("nouveau", "10de", "2230", kernel.sysfs, check_mode=True) == 0  # not loaded


def test_nouveau_matches_nvidia_display_functions_only():
    assert pci.nouveau_matches({"vendor": "10de", "class": "0x030000"})
    assert pci.nouveau_matches({"vendor": "10de", "class": "0x030200"})  # 3D controller (A100 and friends)
    assert pci.nouveau_matches({"vendor": "12d2", "class": "0x030000"})  # NVIDIA_SGS
    assert not pci.nouveau_matches({"vendor": "10de", "class": "0x040300"})  # the HDMI audio function
    assert not pci.nouveau_matches({"vendor": "8086", "class": "0x030000"})


def test_driver_and_module_loaded(sysfs):
    assert pci.driver_loaded("vfio-pci", sysfs) and not pci.driver_loaded("nouveau", sysfs)
    assert not pci.module_loaded("vfio-pci", sysfs)
    os.makedirs(os.path.join(sysfs, "module", "vfio_pci"))
    assert pci.module_loaded("vfio-pci", sysfs) and pci.module_loaded("vfio_pci", sysfs)
