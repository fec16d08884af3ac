"""The live (main) section of a PVE CT config, as much of it as the runtime needs.

Grammar (pve-container ``Config.pm::parse_pct_config``): ``key: value`` lines; raw LXC keys
``lxc.x.y: value`` or ``lxc.x.y = value``; ``#`` lines are the description; the first
``[section]`` header ends the live config (``[pve:pending]``, snapshots). Changes made while a
container runs take effect at its next start, as with LXC: the runtime reads this once.
"""

import os
import re

_RAW_RE = re.compile(r"^(lxc\.[a-z0-9_\-\.]+)(:|\s*=)\s*(.*?)\s*$")
_KEY_RE = re.compile(r"^([a-z][a-z_]*\d*):\s*(.*?)\s*$")
_DEV_RE = re.compile(r"^dev(\d+)$")


def config_path(vmid, root="/"):
    """/etc/pve/lxc/<vmid>.conf (a symlink into nodes/<node>/lxc on PVE), else the first
    /etc/pve/nodes/*/lxc/<vmid>.conf."""
    short = os.path.join(root, "etc/pve/lxc/%s.conf" % vmid)
    if os.path.exists(short):
        return short
    nodes = os.path.join(root, "etc/pve/nodes")
    if os.path.isdir(nodes):
        for node in sorted(os.listdir(nodes)):
            p = os.path.join(nodes, node, "lxc/%s.conf" % vmid)
            if os.path.exists(p):
                return p
    return short


def parse(text):
    """-> {"keys": {key: value}, "lxc": [(key, value), ...] in file order}."""
    keys, raw = {}, []
    for line in text.splitlines():
        if line.startswith("["):
            break
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _RAW_RE.match(line)
        if m:
            raw.append((m.group(1), m.group(3)))
            continue
        m = _KEY_RE.match(line)
        if m:
            keys[m.group(1)] = m.group(2)
    return {"keys": keys, "lxc": raw}


def load(vmid, root="/"):
    path = config_path(vmid, root)
    try:
        with open(path) as f:
            return parse(f.read())
    except FileNotFoundError:
        raise LookupError("Configuration file 'nodes/%s/lxc/%s.conf' does not exist" % ("kpro5", vmid))


def hostname(cfg, vmid):
    return cfg["keys"].get("hostname") or "CT%s" % vmid


def devices(cfg):
    """devN entries in index order: [{"index", "path", "mode", "uid", "gid", "deny_write"}].

    Schema: ``dev[n]: [[path=]<Path>][,deny-write=<1|0>][,gid=<int>][,mode=<0ooo>][,uid=<int>]``;
    PVE's defaults: mode 0660, uid 0, gid 0."""
    out = []
    for key, value in cfg["keys"].items():
        m = _DEV_RE.match(key)
        if not m:
            continue
        dev = {"index": int(m.group(1)), "path": None, "mode": 0o660, "uid": 0, "gid": 0, "deny_write": False}
        for i, part in enumerate(value.split(",")):
            part = part.strip()
            if "=" in part:
                k, v = part.split("=", 1)
            elif i == 0:
                k, v = "path", part
            else:
                continue
            if k == "path":
                dev["path"] = v
            elif k == "mode":
                dev["mode"] = int(v, 8)
            elif k in ("uid", "gid"):
                dev[k] = int(v)
            elif k == "deny-write":
                dev["deny_write"] = v in ("1", "true", "yes")
        out.append(dev)
    return sorted(out, key=lambda d: d["index"])


def _unescape(field):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_entries(cfg):
    """``lxc.mount.entry`` in file order, fstab format: [{"source", "target", "fstype", "options": [..]}]."""
    out = []
    for key, value in cfg["lxc"]:
        if key != "lxc.mount.entry":
            continue
        fields = value.split()
        if len(fields) < 4:
            fields += ["defaults"] * (4 - len(fields))
        out.append({"source": _unescape(fields[0]), "target": _unescape(fields[1]), "fstype": fields[2],
                    "options": [o for o in fields[3].split(",") if o], "line": value})
    return out


def cgroup_allow(cfg):
    """``lxc.cgroup2.devices.allow`` values (recorded, not enforced by the lab)."""
    return [v for k, v in cfg["lxc"] if k in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")]


def mount_points(cfg):
    """``mpN`` entries in index order: [{"key", "volume", "mp", "ro"}]. The volume is the first field or volume=; an
    absolute path is a bind mount (pve-container src/PVE/LXC/Config.pm:1897 classify_mountpoint). The prestart hook
    mounts them in this order (src/lxc-pve-prestart-hook:151 foreach_volume over Config.pm:1979 valid_volume_keys)."""
    out = []
    for key, value in cfg["keys"].items():
        if not re.match(r"^mp\d+$", key):
            continue
        ent = {"key": key, "volume": None, "mp": None, "ro": False}
        for i, part in enumerate(value.split(",")):
            k, sep, v = part.partition("=")
            if not sep and i == 0:
                k, v = "volume", part
            if k in ("volume", "mp"):
                ent[k] = v.strip()
            elif k == "ro":
                ent["ro"] = v.strip() in ("1", "true", "yes", "on")
        out.append(ent)
    return sorted(out, key=lambda e: int(e["key"][2:]))
