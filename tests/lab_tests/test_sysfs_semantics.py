"""The node's /sys behaves like the kernel's PCI core (drivers/pci/pci-driver.c, drivers/base/bus.c).

Writes go through the FUSE sysfs from the controller (``labctl root`` path, same mount
namespace as the node via /proc/PID/root), so each refused write is checked by errno.
The node is reset to its boot state (``labctl reboot``) around each test.
"""

import errno
import os

import pytest

GPUS = ["0000:17:00.0", "0000:65:00.0"]
AUDIO = ["0000:17:00.1", "0000:65:00.1"]
USB = "0000:04:00.0"


@pytest.fixture
def node(lab):
    """The node freshly booted (guests as they were); its whole state is put back afterwards."""
    import labstate
    root = lab.root
    saved = labstate.load(root)
    files = {rel: open(os.path.join(root, rel)).read() for rel in ("etc/modprobe.d/vfio.conf", "etc/kernel/cmdline")}
    with labstate.modify(root) as st:
        labstate.boot(st, root)
        st["guests"] = saved.get("guests", {})
    yield lab
    for rel, text in files.items():
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    with labstate.locked(root):
        labstate.save(saved, root)


def sysp(lab, rel):
    return os.path.join(lab.root, "sys", rel)


def write(lab, rel, text):
    """Write like ``echo text > /sys/rel`` (open O_WRONLY|O_TRUNC, one write); returns None or the errno."""
    try:
        fd = os.open(sysp(lab, rel), os.O_WRONLY | os.O_TRUNC)
    except OSError as e:
        return ("open", e.errno)
    try:
        os.write(fd, text.encode())
    except OSError as e:
        return ("write", e.errno)
    finally:
        os.close(fd)
    return None


def driver(lab, bdf):
    p = sysp(lab, "bus/pci/devices/%s/driver" % bdf)
    return os.path.basename(os.readlink(p)) if os.path.islink(p) else None


def read(lab, rel):
    with open(sysp(lab, rel)) as f:
        return f.read()


def test_boot_state(node):
    for bdf in GPUS + AUDIO + [USB]:
        assert driver(node, bdf) == "vfio-pci"
    assert driver(node, "0000:00:17.0") == "ahci"
    assert driver(node, "0000:03:00.0") == "igb"
    assert read(node, "bus/pci/devices/0000:17:00.0/vendor") == "0x10de\n"
    assert read(node, "bus/pci/devices/0000:17:00.0/device") == "0x2230\n"
    assert read(node, "bus/pci/devices/0000:17:00.0/class") == "0x030000\n"
    assert read(node, "bus/pci/devices/0000:17:00.0/driver_override") == "(null)\n"
    assert os.readlink(sysp(node, "bus/pci/devices/0000:17:00.0")) == "../../../devices/pci0000:16/0000:16:00.0/0000:17:00.0"
    assert sorted(os.listdir(sysp(node, "kernel/iommu_groups/27/devices"))) == ["0000:17:00.0", "0000:17:00.1"]
    assert os.path.basename(os.readlink(sysp(node, "bus/pci/devices/0000:65:00.1/iommu_group"))) == "75"
    assert not os.path.exists(sysp(node, "bus/pci/drivers/nvidia"))
    assert not os.path.exists(sysp(node, "module/nvidia"))
    assert os.path.isdir(sysp(node, "module/vfio_pci"))
    assert os.path.exists(sysp(node, "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"))
    lsmod = node.exec("lsmod").stdout
    for m in ("vfio", "vfio_pci", "vfio_iommu_type1", "ahci", "igb", "snd_hda_intel"):
        assert "\n%s " % m in lsmod
    assert "nouveau" not in lsmod and "nvidia" not in lsmod
    cmdline = node.exec("cat", "/proc/cmdline").stdout
    assert "vfio-pci.ids=10de:2230,10de:1aef,1b21:1242" in cmdline
    assert node.exec("uname", "-r").stdout.strip() == "6.8.12-9-pve"
    assert node.exec("cat", "/proc/sys/kernel/osrelease").stdout.strip() == "6.8.12-9-pve"


def test_errnos(node):
    g = GPUS[0]
    assert write(node, "bus/pci/drivers/ahci/unbind", g + "\n") == ("write", errno.ENODEV)  # not bound to ahci
    assert write(node, "bus/pci/drivers/vfio-pci/bind", g + "\n") == ("write", errno.EBUSY)  # already bound
    assert write(node, "bus/pci/drivers/ahci/bind", "0000:00:17.0\n") == ("write", errno.EBUSY)
    assert write(node, "bus/pci/drivers/vfio-pci/bind", "0000:99:00.0\n") == ("write", errno.ENODEV)  # no such device
    assert write(node, "bus/pci/drivers/vfio-pci/unbind", g + "\n") is None
    assert write(node, "bus/pci/drivers/ahci/bind", g + "\n") == ("write", errno.ENODEV)  # id table does not match
    assert write(node, "bus/pci/drivers/vfio-pci/new_id", "10de:2230\n") == ("write", errno.EINVAL)
    assert write(node, "bus/pci/drivers/vfio-pci/new_id", "10de\n") == ("write", errno.EINVAL)
    assert write(node, "bus/pci/drivers/vfio-pci/new_id", "10de 2230\n") == ("write", errno.EEXIST)  # ids= made it a dynid
    assert write(node, "bus/pci/drivers/vfio-pci/remove_id", "8086 1533\n") == ("write", errno.ENODEV)
    assert write(node, "bus/pci/drivers/vfio-pci/remove_id", "zz\n") == ("write", errno.EINVAL)
    assert write(node, "bus/pci/drivers_probe", "0000:99:00.0\n") == ("write", errno.ENODEV)
    assert write(node, "bus/pci/devices/%s/vendor" % g, "0x1234\n") == ("open", errno.EACCES)  # read-only attribute
    assert write(node, "bus/pci/drivers/vfio-pci/bind_nonexistent", "x") == ("open", errno.ENOENT)
    with pytest.raises(OSError) as e:
        os.open(sysp(node, "bus/pci/devices/%s/newfile" % g), os.O_WRONLY | os.O_CREAT, 0o644)
    assert e.value.errno == errno.EACCES  # sysfs has no create
    with pytest.raises(OSError) as e:
        os.open(sysp(node, "bus/pci/drivers/vfio-pci/bind"), os.O_RDONLY)
    assert e.value.errno == errno.EACCES  # write-only attribute
    with pytest.raises(OSError) as e:
        os.unlink(sysp(node, "bus/pci/devices/%s/driver_override" % g))
    assert e.value.errno == errno.EPERM
    # bind with driver_override naming the driver works even without an id match
    assert write(node, "bus/pci/devices/%s/driver_override" % g, "vfio-pci\n") is None
    assert write(node, "bus/pci/drivers/vfio-pci/bind", g + "\n") is None
    assert driver(node, g) == "vfio-pci"
    # and driver_override restricts matching to exactly that driver
    assert write(node, "bus/pci/drivers/vfio-pci/unbind", g + "\n") is None
    assert write(node, "bus/pci/devices/%s/driver_override" % g, "nvidia\n") is None
    assert write(node, "bus/pci/drivers/vfio-pci/bind", g + "\n") == ("write", errno.ENODEV)
    assert write(node, "bus/pci/devices/%s/driver_override" % g, "\n") is None
    assert read(node, "bus/pci/devices/%s/driver_override" % g) == "(null)\n"


def test_release_sequence_and_new_id_regrab(node):
    """The release sequence (the kernel's Documentation/ABI/testing/sysfs-bus-pci: remove_id, driver_override,
    drivers_probe) with no nvidia driver loaded: GPUs end unbound, audio on snd_hda_intel."""
    for ident in ("10de 2230", "10de 1aef"):
        assert write(node, "bus/pci/drivers/vfio-pci/remove_id", ident + "\n") is None
        assert write(node, "bus/pci/drivers/vfio-pci/remove_id", ident + "\n") == ("write", errno.ENODEV)
    for bdf in GPUS + AUDIO:
        assert write(node, "bus/pci/devices/%s/driver_override" % bdf, "nvidia\n" if bdf in GPUS else "snd_hda_intel\n") is None
        assert write(node, "bus/pci/devices/%s/driver/unbind" % bdf, bdf + "\n") is None
        assert write(node, "bus/pci/drivers_probe", bdf + "\n") is None
    assert [driver(node, b) for b in GPUS] == [None, None]
    assert [driver(node, b) for b in AUDIO] == ["snd_hda_intel", "snd_hda_intel"]
    assert driver(node, USB) == "vfio-pci"  # the unrelated id stays
    # return to standard matching; drivers_probe of a bound device is a no-op success
    for bdf in GPUS:
        assert write(node, "bus/pci/devices/%s/driver_override" % bdf, "\n") is None
        assert write(node, "bus/pci/drivers_probe", bdf + "\n") is None
    assert [driver(node, b) for b in GPUS] == [None, None]  # nothing else claims them (nouveau not loaded)
    # Proxmox's way to grab a GPU: new_id binds every unbound matching device
    assert write(node, "bus/pci/drivers/vfio-pci/new_id", "10de 2230\n") is None
    assert [driver(node, b) for b in GPUS] == ["vfio-pci", "vfio-pci"]
    assert write(node, "bus/pci/drivers/vfio-pci/new_id", "10de 2230\n") == ("write", errno.EEXIST)
    # remove_id then unbind + probe leaves them unbound while no nvidia driver is loaded
    assert write(node, "bus/pci/drivers/vfio-pci/remove_id", "10de 2230\n") is None
    for bdf in GPUS:
        assert write(node, "bus/pci/drivers/vfio-pci/unbind", bdf + "\n") is None
        assert write(node, "bus/pci/drivers_probe", bdf + "\n") is None
        assert driver(node, bdf) is None
    st = node.state()
    assert st["pci"]["devices"][GPUS[0]]["driver"] is None


def test_modprobe_and_kernel_upgrade(node):
    r = node.exec("modprobe", "nvidia", check=False)
    assert r.returncode == 1
    assert "modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.8.12-9-pve" in r.stderr
    r = node.exec("rmmod", "vfio_pci_core", check=False)
    assert r.returncode == 1 and "in use by: vfio_pci" in r.stderr
    assert node.exec("modprobe", "-r", "vfio_pci").returncode == 0
    assert driver(node, GPUS[0]) is None
    assert not os.path.exists(sysp(node, "bus/pci/drivers/vfio-pci"))
    node.exec("modprobe", "vfio-pci")  # options vfio-pci ids= from modprobe.d: grabs the unbound devices again
    assert [driver(node, b) for b in GPUS + [USB]] == ["vfio-pci"] * 3
    node.exec("update-initramfs", "-u", "-k", "all")
    assert "update-initramfs -u -k all" in node.exec("cat", "/var/lib/kpro-lab/calls.log").stdout
    out = node.labctl("kernel-upgrade").stdout
    assert "6.8.12-10-pve" in out
    st = node.state()
    assert st["kernel"]["release"] == "6.8.12-10-pve"
    assert "6.8.12-10-pve" in st["kernel"]["installed"] and "6.8.12-10-pve" not in st["kernel"]["headers"]
    assert node.exec("uname", "-r").stdout.strip() == "6.8.12-10-pve"
    assert [driver(node, b) for b in GPUS + AUDIO + [USB]] == ["vfio-pci"] * 5


def test_boot_honours_initramfs_and_cmdline(node):
    """Removing the ids from modprobe.d and the cmdline only takes effect once the initramfs/ESP are refreshed."""
    root = node.root
    with open(os.path.join(root, "etc/modprobe.d/vfio.conf"), "w") as f:
        f.write("options vfio-pci disable_vga=1\n")
    with open(os.path.join(root, "etc/kernel/cmdline"), "w") as f:
        f.write("root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on iommu=pt vfio-pci.ids=1b21:1242\n")
    node.labctl("reboot")
    assert driver(node, GPUS[0]) == "vfio-pci"  # stale ESP cmdline and initramfs
    node.exec("proxmox-boot-tool", "refresh")
    node.exec("update-initramfs", "-u", "-k", "all")
    node.labctl("reboot")
    assert [driver(node, b) for b in GPUS] == [None, None]
    assert [driver(node, b) for b in AUDIO] == ["snd_hda_intel", "snd_hda_intel"]
    assert driver(node, USB) == "vfio-pci"
