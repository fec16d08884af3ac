# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A bind mount point of a CT (``mpN: <host dir>,mp=<path in the CT>``): the storage that outlives the container.

Why a bind mount of a host directory and not a volume: ``pct destroy`` frees every mount point volume the CT owns
(pve-container src/PVE/LXC.pm destroy_lxc_container, :1023-1040, through delete_mountpoint_volume :1009-1021, which
returns early for anything classify_mountpoint, src/PVE/LXC/Config.pm:1897-1904, does not call a 'volume'); an absolute
path is a 'bind' mount point, never freed. Only root@pam may set one through pct or the API
(src/PVE/LXC.pm:1669 check_ct_modify_config_perm: "mount point type bind is only allowed for root@pam"), so the line
is written to the file under PVE's config lock, like the raw lxc lines (ct_passthrough). At start PVE dies with
"directory '<path>' does not exist" when the host directory is missing (src/PVE/LXC.pm:2300): it is made first.
"""

from __future__ import annotations

import os
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.lxc_config import LxcConfigError, effective_conf

MAX_MOUNT_POINTS = 256  # src/PVE/LXC/Config.pm:37
_MP_KEY_RE = re.compile(r"^mp(\d+)$")
# Host directories that are the system's own: a bind mount there would hand them to the CT (or hide nothing useful).
HOST_REFUSED = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr",
                "/var/lib/lxc")
# Paths the CT's start mounts itself (proc, sysfs, devtmpfs, its /run tmpfs).
CT_REFUSED = ("/dev", "/proc", "/run", "/sys")


def _under(path, tops):
    return [t for t in tops if path == t or path.startswith(t + "/")]


def _bad_path(path):
    """PVE's verify_lxc_mp_string (src/PVE/LXC/Config.pm:982-999) plus: absolute, normalised, not /."""
    if not isinstance(path, str) or not path.startswith("/"):
        return "is not an absolute path"
    if re.search(r"/\.\.?(/|$)", path) or "//" in path or (path != "/" and path.endswith("/")):
        return "is not a normalised path (no '.', '..', '//' or trailing '/'; PVE's verify_lxc_mp_string)"
    if "," in path or "=" in path or re.search(r"\s", path):
        return "holds ',', '=' or white space, which the mpN property string cannot carry"
    return "is / itself" if path == "/" else ""


def check(volume):
    """(host_path, mp) from the ``bind_mount`` option, or None when unset; refuses a bad one with cause and fix."""
    if not volume or not (volume.get("host_path") or volume.get("mp")):
        return None
    host, mp = volume.get("host_path"), volume.get("mp")
    for name, path, refused in (("host_path", host, HOST_REFUSED), ("mp", mp, CT_REFUSED)):
        why = _bad_path(path) or ("is under %s" % _under(path, refused)[0] if _under(path, refused) else "")
        if not why and name == "host_path" and _under(os.path.realpath(path), HOST_REFUSED):
            why = "resolves to %s, under %s" % (os.path.realpath(path), _under(os.path.realpath(path), HOST_REFUSED)[0])
        if why:
            raise LxcConfigError(
                "bind_mount.%s %r %s: set an absolute path %s; nothing was written" % (name, path, why, (
                    "on a Proxmox storage's directory or a dataset of its own (e.g. /var/lib/vz/kpro-models)"
                    if name == "host_path" else "in the container, outside %s (e.g. /srv/models)" % ", ".join(CT_REFUSED))),
                phase="bad_input")
    return host, mp


def parse_value(value):
    """``[volume=]<vol>,mp=<path>[,k=v...]`` -> dict (the volume under 'volume')."""
    out = {}
    for i, part in enumerate(value.split(",")):
        k, sep, v = part.partition("=")
        if sep and k in ("volume", "mp", "acl", "backup", "mountoptions", "quota", "replicate", "ro", "shared", "size"):
            out[k.strip()] = v.strip()
        elif i == 0:
            out["volume"] = part.strip()
    return out


def plan(conf, host, mp):
    """Put ``mpN: <host>,mp=<mp>`` in the main section of ``conf`` (edited in place). Returns the key written, or None
    when the CT already mounts ``host`` at ``mp``. Another source at ``mp`` is refused."""
    used, same = set(), []
    for sec in [conf.main] + ([conf.pending] if conf.pending is not None else []):
        used.update(int(m.group(1)) for m in (_MP_KEY_RE.match(ln.key or "") for ln in sec.lines if ln.kind == "key") if m)
    for ln in effective_conf(conf).main.lines:
        parsed = parse_value(ln.value) if ln.kind == "key" and _MP_KEY_RE.match(ln.key) else {}
        if parsed.get("mp", "").rstrip("/") == mp:
            same.append((ln.key, parsed.get("volume")))
    if [s for s in same if s[1] == host]:
        return None
    if same:
        raise LxcConfigError(
            "%s already mounts %s at %s in the container: remove it (`pct set <vmid> --delete %s`, after moving its data to "
            "%s) or choose another bind_mount.mp; nothing was written" % (same[0][0], same[0][1], mp, same[0][0], host),
            phase="bad_input")
    free = [n for n in range(MAX_MOUNT_POINTS) if n not in used]
    if not free:
        raise LxcConfigError("no free mpN index (PVE allows mp0..mp%d)" % (MAX_MOUNT_POINTS - 1), phase="bad_input")
    key = "mp%d" % free[0]
    conf.set_key(key, "%s,mp=%s" % (host, mp))  # print_ct_mountpoint's order: the volume, then mp
    return key


def root_ids(conf):
    """(uid, gid) on the host of the CT's root: src/PVE/LXC.pm parse_id_maps (:2900-2931): an lxc.idmap line for
    container id 0, else 100000 for an unprivileged CT, else 0."""
    uid = gid = 0
    maps = [ln.value.split() for ln in conf.main.lxc("lxc.idmap")]
    for kind, ct_id, host_id, _count in (m for m in maps if len(m) == 4):
        if ct_id == "0":
            uid, gid = (int(host_id), gid) if kind == "u" else (uid, int(host_id))
    if not maps and str(conf.main.get("unprivileged") or "0") == "1":
        uid = gid = 100000
    return uid, gid


def ensure_host_dir(host, uid, gid, check_mode):
    """Make the host directory (and its parents) when absent, owned by the CT's root; True when it was (or would be)."""
    if os.path.isdir(host):
        return False
    if os.path.lexists(host):
        raise LxcConfigError("bind_mount.host_path %s exists and is not a directory: move it away or choose another "
                             "path; nothing was written" % host, phase="bad_input")
    if not check_mode:
        try:
            os.makedirs(host, 0o755)
            os.chown(host, uid, gid)
        except OSError as e:
            raise LxcConfigError("cannot create %s (%s): create it yourself, owned by %d:%d" % (host, e, uid, gid))
    return True
