# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Proxmox VMs that reference host PCI devices: find them, tell whether they run, detach them.

Sources: qemu-server 9.2.6 (src/PVE/QemuServer.pm parse_vm_config; src/PVE/QemuServer/PCI.pm $hostpci_fmt,
parse_hostpci, $PCIID_RESERVATION_FILE; src/PVE/QemuServer/Helpers.pm vm_running_locally), pve-guest-common 6.0.2
(src/PVE/Mapping/PCI.pm), pve-common 9.2.1 (src/PVE/SysFSTools.pm lspci, src/PVE/File.pm file_set_contents):

- ``/etc/pve/qemu-server/<vmid>.conf`` (the local node's VMs): ``key: value`` lines; ``#`` lines
  are the description; ``[name]`` starts a snapshot section, ``[PENDING]`` the pending changes
  (applied at the next start, so they count), ``[special:...]`` internal sections. Only the
  main and the PENDING sections describe what the VM uses; snapshot sections are ignored (and
  kept as they are).
- ``hostpci<N>: [host=]<id>[;<id>...][,opt=...]`` or ``hostpci<N>: mapping=<name>[,opt=...]``;
  an id is ``[domain:]bus:dev[.func]``, no function meaning every function of the slot.
- ``/etc/pve/mapping/pci.cfg`` (a PVE SectionConfig without a type): a line with the mapping
  id alone starts a section; indented ``map node=<node>,path=<id>[;<id>],id=<vendor:device>,...``
  lines (one per node), and ``description`` / ``mdev`` / ``live-migration-capable`` lines.
- Running: PVE's ``vm_running_locally``: ``/var/run/qemu-server/<vmid>.pid`` names a live
  process whose command line has ``-pidfile .../<vmid>.pid``. Also
  ``/run/qemu-server/pci-id-reservations``: ``<pciid> <vmid> time:<expiry>`` from the reservation
  while a start binds the devices, then ``<pciid> <vmid> pid:<pid>`` once the VM process runs.

Writes under /etc/pve (pmxcfs): ``<file>.tmp.<pid>`` created with O_EXCL, then rename; no
chmod/chown (pmxcfs refuses most modes); backups go outside /etc/pve, where pmxcfs would
otherwise replicate them and PVE could read them as configs.
"""

from __future__ import annotations

import errno
import os
import re
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import fileio
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pve_config
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import PhasedError

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.pmxcfs import (
    MODE_DEFAULT, MODE_PRESERVE, FlockLock, atomic_write as pmxcfs_atomic_write)

_HOSTPCI_KEY_RE = re.compile(r"^hostpci\d+$")
_PCIID_RE = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?$")

PENDING = "PENDING"


class GuestError(PhasedError):
    """A guest's state cannot be read or changed (phase host_config_unreadable)."""

    PHASE = "host_config_unreadable"


# --------------------------------------------------------------------------- parsing


def _section_name(section):
    return "main" if section.kind == "main" else section.name


def parse_vm_config(text):
    """``{"main": {key: value}, "pending": {key: value}, "snapshots": [names], "lines": {key: (section, lineno)}}``.

    ``lines`` maps ``(section, key)`` to the 0-based line index (section ``main`` or ``PENDING``).
    Parsed by pve_config's lossless parser (VM dialect).
    """
    conf = pve_config.ConfigFile.parse(text, pve_config.VM)
    out = {"main": {}, "pending": {}, "snapshots": [s.name for s in conf.snapshots], "lines": {}}
    idx = 0
    for section in conf.sections:
        for ln in section.lines:
            if section.kind in ("main", "pending") and ln.kind == "key":
                out[section.kind][ln.key] = ln.value
                out["lines"][(_section_name(section), ln.key)] = idx
            idx += 1
    return out


def normalize_pciid(value):
    """``17:00`` -> ``0000:17:00`` (a whole slot), ``17:00.1`` -> ``0000:17:00.1``; None when not an id."""
    m = _PCIID_RE.match(value.strip())
    if not m:
        return None
    out = "%s:%s:%s" % ((m.group(1) or "0000").lower(), m.group(2).lower(), m.group(3).lower())
    if m.group(4) is not None:
        out += "." + m.group(4)
    return out


def parse_hostpci(value):
    """``0000:17:00;0000:65:00.0,pcie=1`` -> ``{"host": ["0000:17:00", "0000:65:00.0"], "mapping": None, "options": {...}}``."""
    host = []
    mapping = None
    options = {}
    for i, part in enumerate(value.split(",")):
        part = part.strip()
        if not part:
            continue
        key, eq, val = part.partition("=")
        if not eq:
            if i == 0:
                key, val = "host", part
            else:
                options[part] = None
                continue
        if key == "host":
            host = [p for p in (normalize_pciid(x) for x in val.split(";")) if p]
        elif key == "mapping":
            mapping = val
        else:
            options[key] = val
    return {"host": host, "mapping": mapping, "options": options}


def pciid_covers(pciid, bdf):
    """Whether a hostpci id (slot or function) includes the function ``bdf`` (``0000:17:00.1``)."""
    pciid = normalize_pciid(pciid)
    if pciid is None:
        return False
    if "." in pciid:
        return pciid == bdf
    return bdf.rsplit(".", 1)[0] == pciid


def read_pci_mappings(path, node=None):
    """``{mapping id: [pci ids]}`` from ``/etc/pve/mapping/pci.cfg``, for ``node`` (all nodes when None).

    A missing file is no mappings.
    """
    try:
        with open(path) as f:
            text = f.read()
    except (IOError, OSError) as e:
        if e.errno == errno.ENOENT:
            return {}
        raise
    out = {}
    current = None
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if not raw[0].isspace():
            current = raw.strip()
            out.setdefault(current, [])
            continue
        if current is None:
            continue
        key, _sep, value = raw.strip().partition(" ")
        if key != "map":
            continue
        props = {}
        for part in value.strip().split(","):
            k, eq, v = part.partition("=")
            if eq:
                props[k.strip()] = v.strip()
        if node is not None and props.get("node") not in (None, node):
            continue
        out[current].extend(p for p in (normalize_pciid(x) for x in props.get("path", "").split(";")) if p)
    return out


def qemu_config_dir(etc_root="/etc"):
    return os.path.join(etc_root, "pve", "qemu-server")


def list_vm_configs(etc_root="/etc"):
    """``[(vmid, path)]`` of the local node's VM configs, sorted by vmid."""
    d = qemu_config_dir(etc_root)
    try:
        names = os.listdir(d)
    except (IOError, OSError):
        return []
    out = []
    for n in names:
        m = re.match(r"^(\d+)\.conf$", n)
        if m:
            out.append((int(m.group(1)), os.path.join(d, n)))
    return sorted(out)


def find_references(etc_root, bdfs, mappings=None):
    """VMs whose current config (main or PENDING section) references any of ``bdfs``.

    ``mappings`` is :func:`read_pci_mappings`'s result. Returns a list of dicts: ``vmid``,
    ``name``, ``onboot`` (bool), ``path``, ``references`` (``[{"key", "section", "value",
    "bdfs", "via"}]``, via ``host`` or ``mapping:<id>``).
    """
    bdfs = sorted(set(bdfs))
    mappings = mappings or {}
    out = []
    for vmid, path in list_vm_configs(etc_root):
        try:
            with open(path) as f:
                cfg = parse_vm_config(f.read())
        except (IOError, OSError):
            continue
        refs = []
        for section, values in (("main", cfg["main"]), (PENDING, cfg["pending"])):
            for key in sorted(values):
                if not _HOSTPCI_KEY_RE.match(key):
                    continue
                parsed = parse_hostpci(values[key])
                ids = list(parsed["host"])
                via = "host"
                if parsed["mapping"] is not None:
                    via = "mapping:%s" % parsed["mapping"]
                    ids = mappings.get(parsed["mapping"], [])
                hit = [b for b in bdfs if any(pciid_covers(i, b) for i in ids)]
                if hit:
                    refs.append({"key": key, "section": section, "value": values[key], "bdfs": hit, "via": via})
        if refs:
            out.append({
                "vmid": vmid,
                "name": cfg["main"].get("name"),
                "onboot": cfg["main"].get("onboot", "0").strip() == "1",
                "path": path,
                "references": refs,
            })
    return out


# --------------------------------------------------------------------------- running?


def _cmdline_args(pid, proc_root):
    try:
        with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as f:
            data = f.read()
    except (IOError, OSError):
        return None
    return [a.decode("utf-8", "replace") for a in data.split(b"\0") if a]


def _alive(pid, proc_root):
    try:
        with open(os.path.join(proc_root, str(pid), "stat")) as f:
            stat = f.read()
    except (IOError, OSError):
        return os.path.isdir(os.path.join(proc_root, str(pid)))
    # "pid (comm) S ..." : state after the last ")"
    state = stat.rsplit(")", 1)[-1].split()
    return not state or state[0] not in ("Z", "X")


def pidfile_running(vmid, run_root="/run", proc_root="/proc"):
    """PVE's check: the pidfile names a live process started with ``-pidfile .../<vmid>.pid``."""
    pidfile = os.path.join(run_root, "qemu-server", "%d.pid" % int(vmid))
    try:
        with open(pidfile) as f:
            line = f.read().strip()
    except (IOError, OSError):
        return False
    if not line.isdigit():
        return False
    pid = int(line)
    if not _alive(pid, proc_root):
        return False
    args = _cmdline_args(pid, proc_root)
    if args is None:
        return True  # alive, cmdline unreadable: assume it is the VM (the safe answer)
    for i, a in enumerate(args):
        if a == "-pidfile" and i + 1 < len(args):
            return os.path.basename(args[i + 1]) == "%d.pid" % int(vmid)
    return False


def pci_reservations(run_root="/run", proc_root="/proc"):
    """``{pci id: vmid}`` of live reservations in ``/run/qemu-server/pci-id-reservations``."""
    path = os.path.join(run_root, "qemu-server", "pci-id-reservations")
    try:
        with open(path) as f:
            text = f.read()
    except (IOError, OSError):
        return {}
    out = {}
    now = time.time()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[1].isdigit():
            continue
        pciid = normalize_pciid(parts[0])
        kind, _sep, val = parts[2].partition(":")
        live = False
        if kind == "pid" and val.isdigit():
            live = _alive(int(val), proc_root)
        elif kind == "time" and val.isdigit():
            live = int(val) > now
        if pciid and live:
            out[pciid] = int(parts[1])
    return out


def make_qm_status_checker(run_command, qm="qm"):
    """A running check through ``qm status <vmid>`` (``run_command`` is AnsibleModule.run_command)."""
    def check(vmid):
        rc, out, err = run_command([qm, "status", str(vmid)])
        if rc != 0:
            raise GuestError("qm status %s failed (rc=%s): %s" % (vmid, rc, (err or out).strip()))
        return bool(re.search(r"^status:\s*running\s*$", out, re.M))
    return check


# --------------------------------------------------------------------------- detaching


def detach_text(text, remove_keys=(), set_onboot_zero=False):
    """Remove the ``(section, key)`` lines in ``remove_keys`` (section ``main`` or ``PENDING``) and
    set ``onboot: 0`` in the main section when asked and it is ``1``. Other bytes stay as they are.

    Returns (new text, changes); changes are strings.
    """
    remove = set(remove_keys)
    conf = pve_config.ConfigFile.parse(text, pve_config.VM)
    changes = []
    for section in conf.sections:
        name = _section_name(section)
        keep = []
        for ln in section.lines:
            body = ln.raw.rstrip("\r\n")
            if ln.kind == "key" and section.kind in ("main", "pending") and (name, ln.key) in remove:
                changes.append("removed %s%s" % (body, "" if name == "main" else " (from [%s])" % name))
                continue
            if ln.kind == "key" and set_onboot_zero and name == "main" and ln.key == "onboot" and ln.value.strip() == "1":
                changes.append("onboot: 1 -> onboot: 0")
                ln.raw = "onboot: 0" + ln.raw[len(body):]
            keep.append(ln)
        section.lines = keep
    return conf.render(), changes


def backup_file(path, backup_dir, now=None):
    """Copy ``path`` to ``<backup_dir>/<path without leading />.<YYYYmmddTHHMMSS>``; returns the backup path."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(now))
    with open(path, "rb") as src:
        data = src.read()
    return fileio.backup(data, os.path.join(backup_dir, os.path.abspath(path).lstrip("/") + "." + stamp))


def atomic_write(path, data, preserve_mode=True):
    """Write ``data`` (bytes) to ``path`` through ``<path>.tmp.<pid>`` + rename (see module_utils/host/pmxcfs.py).

    ``preserve_mode`` copies the old file's mode (and owner, when allowed) onto the new one (regular
    filesystems); pass False under /etc/pve, where pmxcfs fixes the mode itself and refuses most chmods.
    """
    pmxcfs_atomic_write(path, data, max_size=None, mode=MODE_PRESERVE if preserve_mode else MODE_DEFAULT,
                        error=GuestError)


class ConfigLock(FlockLock):
    """PVE's per-VM config lock: flock on ``<lock_dir>/lock-<vmid>.conf`` (``/run/lock/qemu-server``).

    Raises GuestError when the lock is still held after ``timeout`` seconds. Where the lock directory's
    parent does not exist (no /run/lock at all: a test root) nothing is locked."""

    def __init__(self, vmid, lock_dir="/run/lock/qemu-server", timeout=10):
        super(ConfigLock, self).__init__(
            os.path.join(lock_dir, "lock-%d.conf" % int(vmid)), timeout=timeout, error=GuestError,
            hint="another qm/API operation holds the config of VM %s; retry when it is done" % int(vmid))
        self.lock_dir = lock_dir

    def acquire(self):
        if not os.path.isdir(os.path.dirname(self.lock_dir)):
            return self  # no /run/lock at all (a test root): nothing to lock against
        return super(ConfigLock, self).acquire()
