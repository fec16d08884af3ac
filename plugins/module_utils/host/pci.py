# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCI devices through sysfs: inventory, GPU selection and the runtime driver operations.

Every function takes ``sysfs_root`` (default ``/sys``) so that unit tests run it on a
temporary tree. Reads follow the kernel's layout (Documentation/ABI/testing/sysfs-bus-pci):

- ``<sysfs_root>/bus/pci/devices/<bdf>`` (a symlink into ``devices/pci<dom>:<bus>/...``)
  with ``vendor``, ``device``, ``subsystem_vendor``, ``subsystem_device``, ``class``,
  ``driver_override`` and the symlinks ``driver`` and ``iommu_group``;
- ``<sysfs_root>/bus/pci/drivers/<name>/{bind,unbind,new_id,remove_id}``;
- ``<sysfs_root>/bus/pci/drivers_probe``.

Writes go through :func:`sysfs_write` (one ``write(2)``, no create, no truncate), and a
kernel error becomes a :class:`PciError` that carries the errno and a message naming the
cause and the fix. Every write operation returns whether it changed (or, with
``check_mode=True``, would change) something, and writes nothing in check mode.
"""

from __future__ import annotations

import errno
import os
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import read_text

VFIO_DRIVER = "vfio-pci"
NVIDIA_VENDOR = "10de"
NOUVEAU_DRIVER = "nouveau"
# nouveau's PCI table (drivers/gpu/drm/nouveau/nouveau_drm.c:1339-1351, v6.12): any device of
# NVIDIA (10de) or NVIDIA_SGS (12d2) whose base class is display (0x03).
NOUVEAU_VENDORS = ("10de", "12d2")

# vendor:device -> name, for the devices this collection handles by name; the rest are
# reported as "vendor:device" (pci.ids is not on every host and not needed).
DEVICE_NAMES = {
    "10de:2230": "NVIDIA RTX A6000",
    "10de:1aef": "GA102 High Definition Audio Controller",
}
DEVICE_CHIPS = {
    "10de:2230": "GA102GL",
    "10de:1aef": "GA102",
}

# PCI class (base class + subclass, 4 hex digits) -> name, from the PCI code and ID assignment spec.
CLASS_NAMES = {
    "0100": "SCSI storage controller",
    "0106": "SATA controller",
    "0108": "Non-Volatile memory controller",
    "0200": "Ethernet controller",
    "0300": "VGA compatible controller",
    "0302": "3D controller",
    "0380": "Display controller",
    "0403": "Audio device",
    "0600": "Host bridge",
    "0601": "ISA bridge",
    "0604": "PCI bridge",
    "0c03": "USB controller",
    "0c05": "SMBus",
}

_BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


class PciError(Exception):
    """A sysfs operation failed. ``errno`` is the kernel's error number (or None)."""

    def __init__(self, msg, errno_=None, op=None, bdf=None, path=None):
        super(PciError, self).__init__(msg)
        self.msg = msg
        self.errno = errno_
        self.op = op
        self.bdf = bdf
        self.path = path

    def to_dict(self):
        return {
            "msg": self.msg,
            "errno": self.errno,
            "errno_name": errno.errorcode.get(self.errno) if self.errno is not None else None,
            "op": self.op,
            "bdf": self.bdf,
            "path": self.path,
        }


# --------------------------------------------------------------------------- helpers


def normalize_bdf(bdf):
    """Return ``dddd:bb:dd.f`` in lower case; accepts ``bb:dd.f`` and NVML's 8-digit domain.

    Raises ValueError for anything else.
    """
    m = _BDF_RE.match(str(bdf).strip())
    if not m:
        raise ValueError("not a PCI address (domain:bus:device.function, for example 0000:17:00.0): %r" % (bdf,))
    domain = int(m.group(1) or "0", 16)
    return "%04x:%s:%s.%s" % (domain, m.group(2).lower(), m.group(3).lower(), m.group(4))


def slot_of(bdf):
    """``0000:17:00.1`` -> ``0000:17:00`` (the physical slot all functions share)."""
    return normalize_bdf(bdf).rsplit(".", 1)[0]


def _bdf_sort_key(bdf):
    # Fixed-width lower-case hex sorts like the numbers it spells.
    return bdf


def _pci_dir(sysfs_root):
    return os.path.join(sysfs_root, "bus", "pci")


def device_path(bdf, sysfs_root="/sys"):
    return os.path.join(_pci_dir(sysfs_root), "devices", normalize_bdf(bdf))


def driver_dir(driver, sysfs_root="/sys"):
    return os.path.join(_pci_dir(sysfs_root), "drivers", driver)


def _read(path):
    return read_text(path, strip=True)


def _hex4(value):
    """``0x10de`` -> ``10de``; None stays None."""
    if value is None:
        return None
    value = value.strip().lower()
    if value.startswith("0x"):
        value = value[2:]
    return value.zfill(4)


def _link_name(path):
    """basename of a symlink's target, or None when there is no link."""
    try:
        return os.path.basename(os.readlink(path).rstrip("/"))
    except (IOError, OSError):
        return None


def class_name(pci_class):
    """``0x030000`` -> ``VGA compatible controller`` (None when unknown)."""
    if not pci_class:
        return None
    c = pci_class.lower()
    if c.startswith("0x"):
        c = c[2:]
    return CLASS_NAMES.get(c[:4])


def is_display_class(pci_class):
    c = (pci_class or "").lower()
    if c.startswith("0x"):
        c = c[2:]
    return c.startswith("03")


# The functions a GPU id may name: VGA (0300) or 3D (0302) controllers of NVIDIA, the two classes NVIDIA's GPUs have
# (the PCI code and ID assignment spec); the other functions of their slot (HDMI audio) and group come along unnamed.
GPU_CLASSES = ("0300", "0302")


def _class4(pci_class):
    c = (pci_class or "").lower()
    return (c[2:] if c.startswith("0x") else c)[:4]


def _functions_text(funcs):
    return ", ".join("%s at %s (%s, class %s)" % (d["id"], d["bdf"], d.get("class_name") or "unknown class", _class4(d["class"]))
                     for d in funcs)


def gpu_id_problems(ids, devices):
    """Why each of ``ids`` (normalized ``vendor:device``) cannot name a GPU on the host whose functions are
    ``devices`` (:func:`list_devices`): not NVIDIA's (vendor 10de), on no function of the host, or on a function
    that is not a display/3D controller. [] when all of them name GPUs."""
    gpus = [d for d in devices if d["vendor"] == NVIDIA_VENDOR and _class4(d["class"]) in GPU_CLASSES]
    out = []
    for i in ids:
        funcs = [d for d in devices if d["id"] == i]
        if not i.startswith(NVIDIA_VENDOR + ":"):
            why = "vendor %s is not NVIDIA's (10de)%s" % (i.split(":")[0], ("; it is " + _functions_text(funcs)) if funcs else "")
        elif not funcs:
            why = "no PCI function of this host has this id (an unknown NVIDIA id)"
        elif any(_class4(d["class"]) not in GPU_CLASSES for d in funcs):
            why = "it is %s, not a display/3D controller (class 0300/0302)" % _functions_text(funcs)
        else:
            continue
        out.append("%s: %s" % (i, why))
    if out:
        out.append("the host's NVIDIA GPUs: %s" % (_functions_text(gpus) or "none"))
    return out


def nouveau_matches(dev):
    """Whether nouveau's PCI table matches ``dev`` (a :func:`read_device` dict): a probe would give it to nouveau."""
    return dev.get("vendor") in NOUVEAU_VENDORS and is_display_class(dev.get("class"))


def is_bridge_class(pci_class):
    c = (pci_class or "").lower()
    if c.startswith("0x"):
        c = c[2:]
    return c.startswith("0604") or c.startswith("0600")


def parse_id(value):
    """``10de:2230`` / ``0x10de:0x2230`` / ``10DE 2230`` -> ``("10de", "2230")``; ValueError otherwise."""
    text = str(value).strip().lower().replace(" ", ":")
    parts = text.split(":")
    if len(parts) != 2:
        raise ValueError("not a PCI vendor:device id (for example 10de:2230): %r" % (value,))
    out = []
    for p in parts:
        if p.startswith("0x"):
            p = p[2:]
        if not re.match(r"^[0-9a-f]{1,4}$", p):
            raise ValueError("not a PCI vendor:device id (for example 10de:2230): %r" % (value,))
        out.append(p.zfill(4))
    return out[0], out[1]


def _driver_override(path):
    value = _read(os.path.join(path, "driver_override"))
    if value in (None, "", "(null)"):
        return None
    return value


# --------------------------------------------------------------------------- reading


def read_device(bdf, sysfs_root="/sys"):
    """One device's dict (see :func:`list_devices`), or None when it does not exist."""
    bdf = normalize_bdf(bdf)
    path = device_path(bdf, sysfs_root)
    if not os.path.isdir(path):
        return None
    vendor = _hex4(_read(os.path.join(path, "vendor")))
    device = _hex4(_read(os.path.join(path, "device")))
    sub_vendor = _hex4(_read(os.path.join(path, "subsystem_vendor")))
    sub_device = _hex4(_read(os.path.join(path, "subsystem_device")))
    pci_class = _read(os.path.join(path, "class"))
    pci_id = "%s:%s" % (vendor, device)
    group_link = os.path.join(path, "iommu_group")
    group_name = _link_name(group_link)
    iommu_group = None
    members = []
    if group_name is not None:
        try:
            iommu_group = int(group_name)
        except ValueError:
            iommu_group = None
        try:
            members = sorted((normalize_bdf(m) for m in os.listdir(os.path.join(group_link, "devices"))), key=_bdf_sort_key)
        except (IOError, OSError, ValueError):
            members = []
    try:
        real_path = os.path.realpath(path)
    except (IOError, OSError):
        real_path = path
    return {
        "bdf": bdf,
        "slot": slot_of(bdf),
        "function": int(bdf.rsplit(".", 1)[1]),
        "vendor": vendor,
        "device": device,
        "id": pci_id,
        "class": pci_class,
        "class_name": class_name(pci_class),
        "subsystem_vendor": sub_vendor,
        "subsystem_device": sub_device,
        "subsystem_id": "%s:%s" % (sub_vendor, sub_device) if sub_vendor and sub_device else None,
        "name": DEVICE_NAMES.get(pci_id, pci_id),
        "chip": DEVICE_CHIPS.get(pci_id),
        "driver": _link_name(os.path.join(path, "driver")),
        "driver_override": _driver_override(path),
        "iommu_group": iommu_group,
        "iommu_group_members": members,
        "is_bridge": is_bridge_class(pci_class) or os.path.isdir(os.path.join(path, "pci_bus")),
        "sysfs_path": real_path,
    }


def list_devices(sysfs_root="/sys"):
    """Every PCI function under ``<sysfs_root>/bus/pci/devices``, sorted by address.

    Each is a dict: ``bdf``, ``slot``, ``function``, ``vendor`` (``10de``), ``device``
    (``2230``), ``id`` (``10de:2230``), ``class`` (``0x030000``), ``class_name``,
    ``subsystem_vendor``, ``subsystem_device``, ``subsystem_id``, ``name``, ``chip``,
    ``driver`` (bound driver or None), ``driver_override`` (None when ``(null)``),
    ``iommu_group`` (int or None), ``iommu_group_members`` (addresses), ``is_bridge``,
    ``sysfs_path``.
    """
    base = os.path.join(_pci_dir(sysfs_root), "devices")
    try:
        names = os.listdir(base)
    except (IOError, OSError):
        return []
    out = []
    for name in names:
        try:
            bdf = normalize_bdf(name)
        except ValueError:
            continue
        dev = read_device(bdf, sysfs_root)
        if dev is not None:
            out.append(dev)
    out.sort(key=lambda d: _bdf_sort_key(d["bdf"]))
    return out


def select_gpus(devices, ids=None, include_group=True):
    """The GPU functions to hand over, and everything that has to move with them.

    Seeds are every NVIDIA (vendor 10de) display-class (0x03xxxx) function, or, when
    ``ids`` (``["10de:2230", ...]``) is given, the functions with those vendor:device ids.
    Added to them: the other functions of the same slot (the HDMI audio ``.1``) and, with
    ``include_group``, every non-bridge function of their IOMMU groups (Proxmox binds the
    whole group to vfio-pci; bridges and root ports stay with their port driver).

    Returns copies of the device dicts sorted by address, each with ``selected_by``:
    ``id`` (a seed), ``slot`` or ``iommu_group``.
    """
    wanted = None
    if ids:
        wanted = set("%s:%s" % parse_id(i) for i in ids)
    by_bdf = dict((d["bdf"], d) for d in devices)
    selected = {}

    def seed(d):
        if wanted is not None:
            return d["id"] in wanted
        return d["vendor"] == NVIDIA_VENDOR and is_display_class(d["class"])

    seeds = [d for d in devices if seed(d)]
    for d in seeds:
        selected[d["bdf"]] = "id"
    slots = set(d["slot"] for d in seeds)
    for d in devices:
        if d["slot"] in slots and d["bdf"] not in selected:
            selected[d["bdf"]] = "slot"
    if include_group:
        changed = True
        while changed:  # groups of added functions can pull in more (rare, but closed under both rules)
            changed = False
            for bdf in list(selected):
                dev = by_bdf.get(bdf)
                for member in (dev["iommu_group_members"] if dev else []):
                    m = by_bdf.get(member)
                    if member in selected or m is None or m.get("is_bridge"):
                        continue
                    selected[member] = "iommu_group"
                    changed = True
                    for other in devices:
                        if other["slot"] == m["slot"] and other["bdf"] not in selected and not other.get("is_bridge"):
                            selected[other["bdf"]] = "slot"
    out = []
    for bdf in sorted(selected, key=_bdf_sort_key):
        d = dict(by_bdf[bdf])
        d["selected_by"] = selected[bdf]
        out.append(d)
    return out


def vfio_group_holders(group, proc_root="/proc", dev_root="/dev"):
    """PIDs that hold ``/dev/vfio/<group>`` open (a running VM, for example).

    Unbinding vfio-pci from a device whose group is open blocks in the kernel
    (``vfio-pci <bdf>: Relaying device request to user``), so callers check this first.
    Processes whose ``fd`` directory cannot be read are skipped.
    """
    if group is None:
        return []
    target = os.path.join(dev_root, "vfio", str(group))
    pids = []
    try:
        entries = os.listdir(proc_root)
    except (IOError, OSError):
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        fd_dir = os.path.join(proc_root, entry, "fd")
        try:
            fds = os.listdir(fd_dir)
        except (IOError, OSError):
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) == target:
                    pids.append(int(entry))
                    break
            except (IOError, OSError):
                continue
    return sorted(pids)


# --------------------------------------------------------------------------- writing


def sysfs_write(path, value):
    """Write ``value`` to a sysfs attribute with a single write(2).

    No O_CREAT / O_TRUNC: a missing attribute is an error (ENOENT), as on sysfs. The
    kernel reports the store's error from write(2); it is raised as OSError.
    """
    data = value.encode("ascii") if not isinstance(value, bytes) else value
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


_GENERIC = {
    errno.EACCES: "permission denied: run as root (become: true)",
    errno.EPERM: "operation not permitted: run as root (become: true) on the host, not in a container",
    errno.EROFS: "sysfs is read-only here (a container?): run this on the Proxmox host",
    errno.ENOENT: "the sysfs attribute does not exist",
}


def _message(op, bdf, driver, err, path):
    """A message naming the cause and the fix for a failed sysfs write."""
    code = err.errno
    name = errno.errorcode.get(code, str(code))
    what = {
        "unbind": "unbinding %s from %s" % (bdf, driver),
        "bind": "binding %s to %s" % (bdf, driver),
        "driver_override": "setting driver_override of %s to %r" % (bdf, driver),
        "drivers_probe": "probing drivers for %s" % bdf,
        "new_id": "adding id %s to %s/new_id" % (bdf, driver),
        "remove_id": "removing id %s from %s/remove_id" % (bdf, driver),
    }.get(op, op)
    cause = None
    if op == "unbind" and code == errno.ENODEV:
        cause = "the device is not bound to %s (it changed under us?); re-read the device and retry" % driver
    elif op == "bind" and code == errno.ENODEV:
        cause = ("%s did not accept the device: its id is not in the driver's table or dynamic ids, or the probe "
                 "failed (see dmesg); set driver_override to %s and use drivers_probe" % (driver, driver))
    elif op == "bind" and code == errno.EBUSY:
        cause = "the device is already bound to a driver: unbind it first"
    elif op == "bind" and code == errno.ENOENT:
        cause = "driver %s is not loaded (no %s): modprobe it first" % (driver, os.path.dirname(path))
    elif op == "drivers_probe" and code == errno.ENODEV:
        cause = "no such PCI device"
    elif op == "drivers_probe" and code == errno.EINVAL:
        cause = "a driver matched but its probe failed (see dmesg)"
    elif op == "new_id" and code == errno.EINVAL:
        cause = "the id was rejected (malformed, or driver_data not in the driver's table)"
    elif op == "new_id" and code == errno.ENOENT:
        cause = "driver %s is not loaded: modprobe it first" % driver
    elif op == "driver_override" and code == errno.EINVAL:
        cause = "the driver name is too long or invalid"
    elif op == "driver_override" and code == errno.ENOENT:
        cause = "the device does not exist or the kernel has no driver_override (kernel < 3.16)"
    elif code == errno.EINTR:
        cause = "interrupted (a vfio user may still hold the device: check /dev/vfio/<group> with fuser)"
    if cause is None:
        cause = _GENERIC.get(code, os.strerror(code) if code else str(err))
    return "%s failed (%s, %s): %s" % (what, name, path, cause)


def _do_write(op, path, value, bdf, driver):
    try:
        sysfs_write(path, value)
    except (IOError, OSError) as e:
        raise PciError(_message(op, bdf, driver, e, path), e.errno, op=op, bdf=bdf, path=path)


def _require_device(bdf, sysfs_root, op):
    bdf = normalize_bdf(bdf)
    path = device_path(bdf, sysfs_root)
    if not os.path.isdir(path):
        raise PciError("%s: no PCI device %s (not in %s)" % (op, bdf, os.path.dirname(path)), errno.ENODEV,
                       op=op, bdf=bdf, path=path)
    return bdf, path


def current_driver(bdf, sysfs_root="/sys"):
    return _link_name(os.path.join(device_path(bdf, sysfs_root), "driver"))


def unbind(bdf, sysfs_root="/sys", check_mode=False, driver=None):
    """Unbind ``bdf`` from its driver (only from ``driver`` when given).

    Returns False when the device is unbound already (or bound to another driver than
    ``driver``), True when it was (or, in check mode, would be) unbound.
    """
    bdf, _path = _require_device(bdf, sysfs_root, "unbind")
    bound = current_driver(bdf, sysfs_root)
    if bound is None or (driver is not None and bound != driver):
        return False
    if check_mode:
        return True
    _do_write("unbind", os.path.join(driver_dir(bound, sysfs_root), "unbind"), bdf, bdf, bound)
    return True


def bind(driver, bdf, sysfs_root="/sys", check_mode=False):
    """Bind ``bdf`` to ``driver``. False when already bound to it.

    Raises PciError(EBUSY) when it is bound to another driver (unbind first) and
    PciError(ENOENT) when the driver is not loaded.
    """
    bdf, _path = _require_device(bdf, sysfs_root, "bind")
    bound = current_driver(bdf, sysfs_root)
    if bound == driver:
        return False
    if bound is not None:
        raise PciError("binding %s to %s: the device is bound to %s; unbind it first" % (bdf, driver, bound),
                       errno.EBUSY, op="bind", bdf=bdf)
    ddir = driver_dir(driver, sysfs_root)
    if not os.path.isdir(ddir):
        raise PciError("binding %s to %s: driver %s is not loaded (no %s): modprobe it first" % (bdf, driver, driver, ddir),
                       errno.ENOENT, op="bind", bdf=bdf, path=ddir)
    if check_mode:
        return True
    _do_write("bind", os.path.join(ddir, "bind"), bdf, bdf, driver)
    return True


def get_driver_override(bdf, sysfs_root="/sys"):
    return _driver_override(device_path(bdf, sysfs_root))


def set_driver_override(bdf, driver, sysfs_root="/sys", check_mode=False):
    """Set (``driver`` a name) or clear (``driver`` None or "") ``driver_override``.

    The kernel does not unbind or probe on this write; see :func:`release_from_vfio`.
    Returns False when it already has that value.
    """
    bdf, path = _require_device(bdf, sysfs_root, "driver_override")
    want = driver or None
    if get_driver_override(bdf, sysfs_root) == want:
        return False
    if check_mode:
        return True
    _do_write("driver_override", os.path.join(path, "driver_override"), (want or "") + "\n", bdf, want)
    return True


def drivers_probe(bdf, sysfs_root="/sys", check_mode=False):
    """Ask the kernel to find a driver for ``bdf`` (``/sys/bus/pci/drivers_probe``).

    A bound device is left as it is (False). Returns whether a driver got bound; in check
    mode, whether the device is unbound (a probe would be attempted).
    """
    bdf, _path = _require_device(bdf, sysfs_root, "drivers_probe")
    before = current_driver(bdf, sysfs_root)
    if before is not None:
        return False
    if check_mode:
        return True
    _do_write("drivers_probe", os.path.join(_pci_dir(sysfs_root), "drivers_probe"), bdf, bdf, None)
    return current_driver(bdf, sysfs_root) is not None


def new_id(driver, vendor, device, sysfs_root="/sys", check_mode=False):
    """Add ``vendor device`` to ``driver``'s dynamic ids (this also binds matching unbound devices).

    False when the driver already matches that id (EEXIST). The dynamic id list is not
    readable, so check mode returns True.
    """
    vendor, device = parse_id("%s:%s" % (vendor, device))
    ddir = driver_dir(driver, sysfs_root)
    ident = "%s:%s" % (vendor, device)
    if not os.path.isdir(ddir):
        raise PciError("adding id %s to %s: driver %s is not loaded (no %s): modprobe it first" % (ident, driver, driver, ddir),
                       errno.ENOENT, op="new_id", path=ddir)
    if check_mode:
        return True
    try:
        _do_write("new_id", os.path.join(ddir, "new_id"), "%s %s\n" % (vendor, device), ident, driver)
    except PciError as e:
        if e.errno == errno.EEXIST:
            return False
        raise
    return True


def remove_id(driver, vendor, device, sysfs_root="/sys", check_mode=False):
    """Remove ``vendor device`` from ``driver``'s dynamic ids (what Proxmox's ``new_id`` added).

    False when the id is not there (the kernel answers ENODEV) or the driver is not loaded.
    The dynamic id list is not readable, so check mode returns True when the driver is loaded.
    Static ids (the module's table, ``ids=`` options) cannot be removed this way.
    """
    vendor, device = parse_id("%s:%s" % (vendor, device))
    ddir = driver_dir(driver, sysfs_root)
    if not os.path.isdir(ddir):
        return False
    if check_mode:
        return True
    try:
        _do_write("remove_id", os.path.join(ddir, "remove_id"), "%s %s\n" % (vendor, device), "%s:%s" % (vendor, device), driver)
    except PciError as e:
        if e.errno == errno.ENODEV:
            return False
        raise
    return True


def remove_id_all(driver, vendor, device, sysfs_root="/sys", check_mode=False, limit=32):
    """:func:`remove_id` until the kernel answers ENODEV; returns how many entries went.

    remove_id_store deletes only the first matching dynamic id and answers -ENODEV when none matches
    (drivers/pci/pci-driver.c:287-320, v6.12: "retval = -ENODEV" at 295, the "break" at 314), and
    one vendor:device can have several entries (``ids=`` naming it twice, or once per subsystem id:
    vfio_pci_fill_ids adds each without a duplicate check), so one write does not prove it gone;
    ENODEV does. The dynamic id list is not readable: in check mode this is one would-be write (1) or 0.
    """
    n = 0
    while n < limit and remove_id(driver, vendor, device, sysfs_root, check_mode):
        n += 1
        if check_mode:
            break
    return n


def driver_loaded(driver, sysfs_root="/sys"):
    """Whether ``driver`` is registered on the PCI bus (``/sys/bus/pci/drivers/<driver>``)."""
    return os.path.isdir(driver_dir(driver, sysfs_root))


def module_loaded(name, sysfs_root="/sys"):
    """Whether kernel module ``name`` is loaded (``/sys/module/<name>``; ``-`` and ``_`` alike)."""
    return os.path.isdir(os.path.join(sysfs_root, "module", name.replace("-", "_")))


def release_from_vfio(bdf, sysfs_root="/sys", check_mode=False, probe=True, actions=None):
    """Take ``bdf`` off vfio-pci and return it to standard driver matching.

    The kernel's documented sequence (driver_override ABI; Alex Williamson's idiom):
    clear ``driver_override`` when it pins vfio-pci, unbind from vfio-pci, then
    ``drivers_probe`` (when ``probe``) so that the normal driver (nvidia, snd_hda_intel)
    can claim it. An override naming another driver is left alone. A device not on
    vfio-pci is not unbound. Callers remove vfio-pci's dynamic ids first (:func:`remove_id_all`:
    Proxmox's ``new_id`` and the boot's ``ids=`` alike), otherwise the probe hands the device straight back to vfio-pci,
    and make sure no process holds ``/dev/vfio/<group>`` (:func:`vfio_group_holders`),
    otherwise the unbind blocks.

    Returns whether anything changed (would change, in check mode). When ``actions`` is
    a list, a short description of each step taken is appended to it.
    """
    bdf, _path = _require_device(bdf, sysfs_root, "release_from_vfio")
    log = actions if actions is not None else []
    changed = False
    if get_driver_override(bdf, sysfs_root) == VFIO_DRIVER:
        set_driver_override(bdf, None, sysfs_root, check_mode)
        log.append("%s: cleared driver_override (was %s)" % (bdf, VFIO_DRIVER))
        changed = True
    was_vfio = current_driver(bdf, sysfs_root) == VFIO_DRIVER
    if was_vfio:
        unbind(bdf, sysfs_root, check_mode, driver=VFIO_DRIVER)
        log.append("%s: unbound from %s" % (bdf, VFIO_DRIVER))
        changed = True
    if probe and (was_vfio or current_driver(bdf, sysfs_root) is None) and (changed or not check_mode):
        # In check mode an unbind has not happened, so the device still looks bound: report the probe it would do.
        if check_mode:
            log.append("%s: drivers_probe" % bdf)
        else:
            bound = drivers_probe(bdf, sysfs_root, check_mode)
            now = current_driver(bdf, sysfs_root)
            log.append("%s: drivers_probe -> %s" % (bdf, now or "no driver"))
            changed = changed or bound
            if now == VFIO_DRIVER:
                raise PciError("%s was claimed by %s again on drivers_probe: a dynamic id still matches it (one that "
                               "remove_id of its vendor:device does not take out, such as a wildcard in vfio-pci.ids=); "
                               "a reboot with the cleaned boot configuration releases it" % (bdf, VFIO_DRIVER), None,
                               op="release_from_vfio", bdf=bdf)
    return changed
