# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Proxmox VE container config (``/etc/pve/lxc/<vmid>.conf``): parse, edit, write.

The grammar is PVE's own (``pve-container src/PVE/LXC/Config.pm::parse_pct_config``):

* everything before the first ``[...]`` header is the live (main) section;
* ``[pve:pending]`` (case-insensitive) is the pending section, ``[<name>]`` a snapshot;
* ``#`` lines are the description, ``lxc.<key>`` lines take ``:`` or ``=``, every other
  line is ``key: value``; blank lines are ignored.

The parser keeps every line's exact bytes, so ``ConfigFile.parse(raw).render() == raw``
for any input. Edits replace, insert or drop whole lines in one section and touch
nothing else. New normal keys are inserted at their sorted place among the section's
keys and ``lxc.*`` lines after the section's ``lxc.*`` lines, which is where PVE's own
writer (``write_pct_config``: description, sorted keys, ``lxc.*`` in order) puts them,
so a later ``pct set`` rewrite does not move them again.

The GPU passthrough part (`plan_passthrough`) decides which lines the collection owns:
``devN`` entries whose path is under ``/dev/nvidia``, ``lxc.mount.entry`` lines whose
source is under ``/dev/nvidia`` and ``lxc.cgroup2.devices.allow`` lines for the NVIDIA
majors (195, the dynamic ``nvidia-uvm``/``nvidia-caps`` majors of this host, and
unregistered majors left over from an earlier boot when NVIDIA mount entries exist).
Everything else in the file is left byte for byte.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import re
import stat

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.pmxcfs import (
    MAX_FILE_SIZE, MODE_INHERIT, FlockLock, atomic_write as pmxcfs_atomic_write)
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import fileio
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.device_nodes import made_at_boot
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.pve_config import ConfigFile, Line, Section  # the CT parser
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import PhasedError

MAX_CONFIG_SIZE = MAX_FILE_SIZE  # pmxcfs MEMDB_MAX_FILE_SIZE
NVIDIA_MAJOR = 195
PVE_CONFIG_DIR = "/etc/pve/lxc"
DEFAULT_LOCK_DIR = "/run/lock/lxc"
DEFAULT_BACKUP_DIR = "/var/backups/kpro-gpu-serving/lxc"

_DEV_KEY_RE = re.compile(r"^dev(\d+)$")
_ALLOW_RE = re.compile(r"^([abc])\s+(\d+|\*):(\d+|\*)\s+([rwm]+)$")
MAX_DEVICES = 256

ALLOW_KEY = "lxc.cgroup2.devices.allow"
MOUNT_KEY = "lxc.mount.entry"
DEV_DEFAULTS = {"mode": "0660", "uid": "0", "gid": "0", "deny-write": "0"}


class LxcConfigError(PhasedError):
    """An error with a message for the operator (cause and fix); phase ct_config_refused unless it names another."""

    PHASE = "ct_config_refused"


# --------------------------------------------------------------------------- devN property strings


def parse_dev_value(value):
    """Parse a ``devN`` property string (``[[path=]<path>][,gid=..][,mode=..][,uid=..][,deny-write=..]``)."""
    res = {}
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            k, v = part.split("=", 1)
            res[k.strip()] = v.strip()
        else:
            res["path"] = part
    return res


def format_dev_value(path, gid=None, uid=None, mode=None, deny_write=None):
    """PVE's print_property_string order: the default key (path) first, then the others sorted."""
    parts = [path]
    opts = {}
    if deny_write:
        opts["deny-write"] = "1"
    if gid is not None:
        opts["gid"] = str(gid)
    if mode is not None:
        opts["mode"] = str(mode)
    if uid is not None:
        opts["uid"] = str(uid)
    for k in sorted(opts):
        parts.append("%s=%s" % (k, opts[k]))
    return ",".join(parts)


def dev_equivalent(a, b):
    """True if two devN values mean the same thing to PVE (defaults filled in)."""
    pa, pb = parse_dev_value(a), parse_dev_value(b)
    for k, v in DEV_DEFAULTS.items():
        pa.setdefault(k, v)
        pb.setdefault(k, v)
    for p in (pa, pb):
        if p.get("deny-write") in ("true", "yes", "on"):
            p["deny-write"] = "1"
        if p.get("deny-write") in ("false", "no", "off"):
            p["deny-write"] = "0"
    return pa == pb


# --------------------------------------------------------------------------- devices on this host


def read_proc_devices(proc_root="/"):
    """{name: major} for the character devices in /proc/devices (first major of each name)."""
    path = os.path.join(proc_root, "proc/devices")
    res = {}
    try:
        with open(path) as f:
            text = f.read()
    except (IOError, OSError) as e:
        raise LxcConfigError("cannot read %s (%s): the majors of nvidia-uvm/nvidia-caps come from there" % (path, e))
    section = None
    for line in text.splitlines():
        if line.strip() == "Character devices:":
            section = "c"
            continue
        if line.strip() == "Block devices:":
            section = "b"
            continue
        m = re.match(r"^\s*(\d+)\s+(\S+)\s*$", line)
        if m and section == "c":
            res.setdefault(m.group(2), int(m.group(1)))
    return res


def char_majors(proc_devices):
    """{major: name} for all registered character majors."""
    res = {}
    for name, major in proc_devices.items():
        res.setdefault(major, name)
    return res


def _host_path(dev_root, path):
    return os.path.join(dev_root, path.lstrip("/"))


def stat_device(path, dev_root="/"):
    """{path, major, minor} for a character device node, or raise naming the cause and fix."""
    hp = _host_path(dev_root, path)
    try:
        st = os.stat(hp)
    except OSError:
        raise LxcConfigError("Device %s does not exist%s. %s" % (
            path, "" if dev_root in ("", "/") else " (looked at %s)" % hp, node_fix(path)), phase="device_missing")
    if not stat.S_ISCHR(st.st_mode):
        raise LxcConfigError("%s is not a character device (looked at %s). %s" % (path, hp, node_fix(path)), phase="device_missing")
    return {"path": path, "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev)}


def node_fix(path):
    if path.startswith("/dev/nvidia-uvm"):
        return ("Load nvidia-uvm and create the nodes: `nvidia-modprobe -u -c=0` (at boot: the nvidia-uvm-init / "
                "nvidia-device-nodes oneshot unit installed by kpro.gpu_serving.nvidia_driver, ordered before pve-guests.service).")
    if path.startswith("/dev/nvidia-caps"):
        return "Create the capability nodes with `nvidia-modprobe -f /proc/driver/nvidia/capabilities/...` (MIG only), or leave them out."
    if path == "/dev/nvidia-modeset":
        return "Create it with `nvidia-modprobe -m`, or leave it out of the device list."
    if path.startswith("/dev/nvidia"):
        return ("Is the NVIDIA driver loaded on the host (`nvidia-smi`)? Create the nodes with "
                "`nvidia-modprobe -c 0 -c 1 -c 255` (kpro.gpu_serving.nvidia_driver installs a boot unit for this).")
    return "Check the path."


def _gpu_index(name):
    m = re.match(r"^nvidia(\d+)$", name)
    return int(m.group(1)) if m else None


def discover_devices(dev_root="/", gpus="all"):
    """The NVIDIA nodes to pass: GPUs (all or the given indices), nvidiactl, nvidia-uvm(-tools), and
    nvidia-modeset when present. Raises naming a missing required node. A /dev/nvidia-caps/* node is passed only if
    the boot makes it (none is: PVE would refuse to start the container after a reboot; device_nodes, caps_left_out)."""
    devdir = _host_path(dev_root, "/dev")
    try:
        names = sorted(os.listdir(devdir))
    except OSError as e:
        raise LxcConfigError("cannot list %s (%s)" % (devdir, e))
    found = sorted((_gpu_index(n), n) for n in names if _gpu_index(n) is not None)
    if gpus in (None, "all", ["all"]):
        if not found:
            raise LxcConfigError("no GPU device node /dev/nvidia<N> on this host. %s" % node_fix("/dev/nvidia0"), phase="device_missing")
        selected = [n for _idx, n in found]
    else:
        have = dict(found)
        selected = []
        for idx in gpus:
            idx = int(idx)
            if idx not in have:
                raise LxcConfigError("GPU %d was requested (gpus) but /dev/nvidia%d does not exist (present: %s). %s" % (
                    idx, idx, ", ".join("/dev/" + n for _idx, n in found) or "none", node_fix("/dev/nvidia%d" % idx)),
                    phase="device_missing")
            selected.append(have[idx])
    paths = ["/dev/" + n for n in selected] + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    devices = [stat_device(p, dev_root) for p in paths]
    if os.path.exists(_host_path(dev_root, "/dev/nvidia-modeset")):
        devices.append(stat_device("/dev/nvidia-modeset", dev_root))
    return devices + [stat_device(p, dev_root) for p in _present_caps(dev_root) if made_at_boot(p)]


def _present_caps(dev_root):
    capsdir = _host_path(dev_root, "/dev/nvidia-caps")
    return ["/dev/nvidia-caps/" + n for n in sorted(os.listdir(capsdir))] if os.path.isdir(capsdir) else []


def caps_left_out(dev_root="/"):
    """The /dev/nvidia-caps/* nodes present now that discover_devices leaves out (the boot does not remake them)."""
    return [p for p in _present_caps(dev_root) if not made_at_boot(p)]


def normalize_devices(items, dev_root="/", require_nodes=True, proc_devices=None):
    """Turn the `devices` option (paths or {path, major, minor} dicts) into device dicts.

    Paths are stat'ed under ``dev_root`` when ``require_nodes``; otherwise a path that is not
    there gets its major from the name (195 for nvidia*, /proc/devices for nvidia-uvm/-caps).
    """
    out = []
    seen = set()
    for item in items:
        if isinstance(item, dict):
            path = item.get("path")
            dev = {"path": path, "major": item.get("major"), "minor": item.get("minor")}
        else:
            path = item
            dev = None
        if not path or not path.startswith("/dev/") or re.search(r"/\.\.?(/|$)", path):
            raise LxcConfigError("%r is not a valid device path: it must be an absolute path under /dev/ "
                                 "(PVE's verify_lxc_dev_string)" % (path,))
        if path in seen:
            continue
        seen.add(path)
        if dev is None:
            if require_nodes or os.path.exists(_host_path(dev_root, path)):
                dev = stat_device(path, dev_root)
            else:
                dev = {"path": path, "major": None, "minor": None}
        if dev["major"] is None:
            dev["major"] = major_for_path(path, proc_devices)
        out.append(dev)
    return out


def major_for_path(path, proc_devices):
    if path.startswith("/dev/nvidia-uvm"):
        return (proc_devices or {}).get("nvidia-uvm")
    if path.startswith("/dev/nvidia-caps"):
        return (proc_devices or {}).get("nvidia-caps")
    if re.match(r"^/dev/nvidia(\d+|ctl|-modeset)$", path):
        return NVIDIA_MAJOR
    return None


def device_sort_key(path):
    gi = _gpu_index(os.path.basename(path)) if path.startswith("/dev/nvidia") else None
    if gi is not None and "/" not in path[5:]:
        return (0, gi, path)
    order = {"/dev/nvidiactl": 1, "/dev/nvidia-uvm": 2, "/dev/nvidia-uvm-tools": 3, "/dev/nvidia-modeset": 4}
    return (order.get(path, 5), 0, path)


# --------------------------------------------------------------------------- ownership


def is_owned_path(path):
    return bool(path) and path.startswith("/dev/nvidia")


def owned_dev_lines(section):
    """[(index_n, line, parsed)] of devN lines whose path is under /dev/nvidia."""
    res = []
    for ln in section.lines:
        if ln.kind != "key":
            continue
        m = _DEV_KEY_RE.match(ln.key)
        if not m:
            continue
        parsed = parse_dev_value(ln.value)
        if is_owned_path(parsed.get("path")):
            res.append((int(m.group(1)), ln, parsed))
    return res


def mount_source(value):
    fields = value.split()
    return fields[0] if fields else ""


def owned_mount_lines(section):
    return [ln for ln in section.lxc(MOUNT_KEY) if is_owned_path(mount_source(ln.value))]


def owned_allow_lines(section, nvidia_majors, all_majors):
    """Allow lines for an NVIDIA major; an unregistered major is owned (left over from an earlier
    boot's dynamic nvidia-uvm/nvidia-caps major) only when the section has NVIDIA mount entries."""
    has_nv_mounts = bool(owned_mount_lines(section))
    res = []
    for ln in section.lxc(ALLOW_KEY):
        m = _ALLOW_RE.match(" ".join(ln.value.split()))
        if not m or m.group(1) != "c" or m.group(2) == "*":
            continue
        major = int(m.group(2))
        if major in nvidia_majors:
            res.append(ln)
        elif has_nv_mounts and major not in all_majors and major >= 234:
            # 234-254 and 384-511 are the kernel's dynamic char major ranges
            res.append(ln)
    return res


# --------------------------------------------------------------------------- planning


def render_devn(devices, gid=None, uid=None, mode="0666"):
    """[(path, value)] in device order."""
    ordered = sorted(devices, key=lambda d: device_sort_key(d["path"]))
    return [(d["path"], format_dev_value(d["path"], gid=gid, uid=uid, mode=mode)) for d in ordered]


def render_raw(devices):
    """[(key, value)] for lxc_raw: allow lines (one per major), then mount entries."""
    ordered = sorted(devices, key=lambda d: device_sort_key(d["path"]))
    majors = []
    for d in ordered:
        if d.get("major") is None:
            raise LxcConfigError("the major of %s is unknown: is the module loaded (see /proc/devices)? %s" % (
                d["path"], node_fix(d["path"])), phase="device_missing")
        if d["major"] not in majors:
            majors.append(d["major"])
    lines = [(ALLOW_KEY, "c %d:* rwm" % m) for m in majors]
    for d in ordered:
        p = d["path"]
        lines.append((MOUNT_KEY, "%s %s none bind,optional,create=file" % (p, p.lstrip("/"))))
    return lines


def _norm(value):
    return " ".join(value.split())


def _mount_canon(value):
    """A mount entry's fields with its options as a sorted set and trailing dump/pass fields of 0 dropped: the
    entry is fstab-like (lxc.container.conf(5)), so "... bind,optional,create=file 0 0" (as published guides
    often write it) says what "... bind,optional,create=file" says."""
    f = value.split()
    f = f[:4] if len(f) == 6 and f[4:] == ["0", "0"] else f
    return f[:3] + [",".join(sorted(f[3].split(",")))] + f[4:] if len(f) >= 4 else f


def _same_entry(key, have, want):
    """Whether a present line already says what ``want`` says (then it is kept as it is, not rewritten)."""
    return _mount_canon(have) == _mount_canon(want) if key == MOUNT_KEY else _norm(have) == want


class Plan(object):
    """The edits for one config: ``devn_set`` {key: value}, ``devn_delete`` [key], and the new raw text."""

    def __init__(self):
        self.devn_set = {}
        self.devn_delete = []
        self.raw_changed = False
        self.warnings = []
        self.devices = []
        self.majors = {}

    @property
    def changed(self):
        return bool(self.devn_set or self.devn_delete or self.raw_changed)


def plan_passthrough(conf, devices, method, proc_devices, dev_gid=None, dev_uid=None, dev_mode="0666",
                     remove_other_method=True, handle_devn=True, handle_raw=True):
    """Edit ``conf`` (a ConfigFile, main section only) so that it passes ``devices``.

    devN changes are applied to ``conf`` and also listed in the returned Plan (so a caller can make
    them through ``pct set``/the API instead); raw lxc lines are applied to ``conf`` only.
    """
    plan = Plan()
    plan.devices = devices
    plan.majors = dict((n, m) for n, m in proc_devices.items() if n.startswith("nvidia"))
    if handle_devn and (method == "devN" or remove_other_method):
        want_devn = render_devn(devices, dev_gid, dev_uid, dev_mode) if method == "devN" else []
        _plan_devn(conf, want_devn, plan)
        _apply_devn(conf, plan)
    if handle_raw and (method == "lxc_raw" or remove_other_method):
        before = conf.render()
        want_raw = render_raw(devices) if method == "lxc_raw" else []
        _plan_raw(conf, want_raw, _nvidia_majors(proc_devices, devices), char_majors(proc_devices))
        plan.raw_changed = conf.render() != before
    for d in devices:
        if d["path"].startswith("/dev/nvidia-uvm") and method == "lxc_raw" and "nvidia-uvm" not in proc_devices:
            plan.warnings.append("nvidia-uvm is not in /proc/devices; the allow line uses the major given for %s" % d["path"])
            break
    return plan


def _nvidia_majors(proc_devices, devices):
    majors = set([NVIDIA_MAJOR])
    majors.update(m for n, m in proc_devices.items() if n.startswith("nvidia"))
    majors.update(d["major"] for d in devices if d.get("major") is not None and is_owned_path(d["path"]))
    return majors


def _devn_in_use(conf):
    """({path: [(n, line)]} of the owned devN entries the CT gets at its next start, the devN indices in use)."""
    by_path = {}
    for n, ln, parsed in sorted(owned_dev_lines(effective_conf(conf).main), key=lambda t: t[0]):
        by_path.setdefault(parsed["path"], []).append((n, ln))
    used = set()
    for sec in [conf.main] + ([conf.pending] if conf.pending is not None else []):
        for ln in sec.lines:
            m = _DEV_KEY_RE.match(ln.key or "") if ln.kind == "key" else None
            if m:
                used.add(int(m.group(1)))
    return by_path, used


def _plan_devn(conf, want_devn, plan):
    """Fill plan.devn_set/devn_delete: keep an entry per wanted path, reuse stale ones in place, else a free index."""
    by_path, used = _devn_in_use(conf)
    wanted_paths = set(p for p, _value in want_devn)
    keep, stale = {}, []
    for path in sorted(by_path, key=device_sort_key):
        entries = by_path[path]
        if path in wanted_paths:
            keep[path] = entries[0]
            stale.extend(entries[1:])
        else:
            stale.extend(entries)
    stale.sort(key=lambda t: t[0])
    for path, value in want_devn:
        if path in keep:
            n, ln = keep[path]
            if not dev_equivalent(ln.value, value):
                plan.devn_set["dev%d" % n] = value
        elif stale:  # a stale owned entry (a GPU no longer passed) is updated in place
            n, ln = stale.pop(0)
            plan.devn_set["dev%d" % n] = value
        else:
            n = 0
            while n in used:
                n += 1
            if n >= MAX_DEVICES:
                raise LxcConfigError("no free devN index (PVE allows dev0..dev%d)" % (MAX_DEVICES - 1))
            used.add(n)
            plan.devn_set["dev%d" % n] = value
    plan.devn_delete = ["dev%d" % n for n, _line in stale]


def _apply_devn(conf, plan):
    """Make the planned devN edits in ``conf``; a key also in [pve:pending] is edited there too (with a warning)."""
    pending = conf.pending
    pending_keys = set(ln.key for ln in pending.lines if ln.kind == "key") if pending is not None else set()
    for key in plan.devn_delete:
        conf.delete_key(key)
        if key in pending_keys:
            conf.delete_key(key, pending)
            plan.warnings.append("removed %s from [pve:pending] (a pending NVIDIA device no longer wanted)" % key)
    for key in sorted(plan.devn_set, key=lambda k: int(k[3:])):
        if key in pending_keys:
            conf.set_key(key, plan.devn_set[key], pending)
            plan.warnings.append("updated %s in [pve:pending] (it would override the main section at the next start)" % key)
        else:
            conf.set_key(key, plan.devn_set[key])


def _plan_raw(conf, want_raw, nvidia_majors, all_majors):
    """Make the owned raw lxc lines of the main section exactly ``want_raw``; stale lines are updated in place."""
    owned = ((ALLOW_KEY, owned_allow_lines(conf.main, nvidia_majors, all_majors)), (MOUNT_KEY, owned_mount_lines(conf.main)))
    for key, owned_lines in owned:
        missing = [v for k, v in want_raw if k == key]
        unmatched = []
        for ln in owned_lines:
            same = [v for v in missing if _same_entry(key, ln.value, v)]
            if same:
                missing.remove(same[0])
            else:
                unmatched.append(ln)
        while unmatched and missing:
            conf.replace_line(unmatched.pop(0), key, missing.pop(0))
        conf.remove_lines(unmatched)
        for v in missing:
            conf.add_lxc(key, v)


def effective_conf(conf):
    """A main-only copy of ``conf`` with ``[pve:pending]`` applied (what the CT gets at its next start).

    Used to compare with what ``pct set`` would do: on a running CT a changed devN stays pending."""
    eff = ConfigFile([Section("", "main", [Line(ln.raw, ln.kind, ln.key, ln.value) for ln in conf.main.lines])])
    pending = conf.pending
    if pending is None:
        return eff
    for ln in pending.lines:
        if ln.kind == "key":
            eff.set_key(ln.key, ln.value)
        elif ln.kind == "delete":
            for key in re.split(r"[,;\s]+", ln.value):
                if key:
                    eff.delete_key(key)
    return eff


# --------------------------------------------------------------------------- files and locks


def config_path(config_dir, vmid):
    return os.path.join(config_dir, "%d.conf" % int(vmid))


def read_config(config_dir, vmid):
    path = config_path(config_dir, vmid)
    try:
        with open(path, "rb") as f:
            return f.read()
    except (IOError, OSError) as e:
        if e.errno == errno.ENOENT:
            raise LxcConfigError(
                "CT %s does not exist here: %s not found. Check the vmid (`pct list`) and that the container lives on this "
                "node (/etc/pve/lxc only shows this node's guests; use the node that owns it)." % (vmid, path))
        raise LxcConfigError("cannot read %s: %s" % (path, e))


def config_lock(conf):
    return conf.main.get("lock")


def lock_path(lock_dir, vmid):
    return os.path.join(lock_dir, "pve-config-%d.lock" % int(vmid))


def config_lock_held(vmid, lock_dir=DEFAULT_LOCK_DIR):
    """True when another process holds PVE's config flock (a backup, a pct set); creates nothing."""
    try:
        fd = os.open(lock_path(lock_dir, vmid), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as e:
        return e.errno in (errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)  # closing drops our shared lock


def node_drift(devices, ct_root, stat_fn=os.stat):
    """Passed nodes whose major:minor inside a running CT (seen at ``ct_root``, /proc/<init pid>/root) is not the
    host's: a module reload gives nvidia-uvm a new dynamic major, the CT keeps the node made at its start."""
    drift = []
    for dev in devices:
        if dev.get("major") is None or dev.get("minor") is None:
            continue
        want = "%d:%d" % (dev["major"], dev["minor"])
        try:
            st = stat_fn(os.path.join(ct_root, dev["path"].lstrip("/")))
            got = "%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev)) if stat.S_ISCHR(st.st_mode) else "not a node"
        except OSError as e:
            if e.errno != errno.ENOENT:
                continue  # unknown, not a reason to restart
            got = "missing"
        if got != want:
            drift.append({"path": dev["path"], "host": want, "container": got})
    return drift


class ConfigLock(FlockLock):
    """PVE's local config lock: flock on /run/lock/lxc/pve-config-<vmid>.lock (Config.pm::config_file_lock).

    Raises LxcConfigError when the lock is still held after ``timeout`` seconds."""

    def __init__(self, vmid, lock_dir=DEFAULT_LOCK_DIR, timeout=10):
        super(ConfigLock, self).__init__(
            lock_path(lock_dir, vmid), timeout=timeout, error=LxcConfigError,
            hint="another PVE operation holds the CT config lock; retry when it has finished")
        self.lock_dir = lock_dir


def atomic_write(path, data):
    """Write like PVE::File::file_set_contents: ``<path>.tmp.<pid>`` (O_EXCL), then rename. No chmod/chown
    (pmxcfs refuses them); the new file is created with the old file's permission bits. Over 1 MiB is
    refused with LxcConfigError (see module_utils/host/pmxcfs.py)."""
    pmxcfs_atomic_write(path, data, max_size=MAX_CONFIG_SIZE, mode=MODE_INHERIT, error=LxcConfigError)


def write_backup(backup_dir, vmid, data, now=None):
    """Copy of the old config outside /etc/pve: <backup_dir>/<vmid>.conf.<UTC timestamp>."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    try:
        os.makedirs(backup_dir, 0o700)
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise LxcConfigError("cannot create the backup directory %s: %s" % (backup_dir, e))
    return fileio.write_new(os.path.join(backup_dir, "%d.conf.%s" % (int(vmid), now.strftime("%Y%m%dT%H%M%S.%fZ"))), data)


def is_pve_config_dir(config_dir):
    real = os.path.realpath(config_dir)
    return real == os.path.realpath(PVE_CONFIG_DIR) or real.startswith("/etc/pve/")
