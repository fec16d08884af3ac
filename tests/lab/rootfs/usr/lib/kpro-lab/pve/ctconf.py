"""CT config files as pve-container reads and writes them (src/PVE/LXC/Config.pm).

``parse(raw, vmid)`` mirrors ``parse_pct_config`` (non-strict: problems are warnings on
stderr, as on a real node), ``render(conf)`` mirrors ``write_pct_config``: the description
(``#`` lines, URL-encoded with PVE's ``encode_text``) at the top of each section, the other
keys sorted, ``lxc.environment.runtime`` lines, then the ``lxc.*`` lines in their original
order; then ``[pve:pending]``, then the snapshots sorted by name. So every write through
the API or ``pct set`` moves comments and reorders keys exactly like PVE does.

``update(...)`` mirrors ``update_pct_config`` + ``vmconfig_apply_pending`` /
``vmconfig_hotplug_pending`` (pve-container 5.x, PVE 8: on a running CT only the "fastplug"
options and the cgroup limits apply at once; everything else - devN included - stays in
``[pve:pending]`` until the next start).
"""

import contextlib
import fcntl
import hashlib
import os
import re
import stat
import sys
from urllib.parse import quote, unquote

import pve
from pve import PVEError, param_exc

MAX_DEVICES = 256
MAX_MOUNT_POINTS = 256
MAX_NETS = 32

# $confdesc (type per key); parent/snaptime exist in files but not in the PUT schema
_TYPES = {
    "lock": "string", "onboot": "boolean", "startup": "string", "template": "boolean", "arch": "string",
    "ostype": "string", "console": "boolean", "tty": "integer", "cores": "integer", "cpulimit": "number",
    "cpuunits": "integer", "memory": "integer", "swap": "integer", "hostname": "string", "description": "string",
    "searchdomain": "string", "nameserver": "string", "timezone": "string", "rootfs": "string", "parent": "string",
    "snaptime": "integer", "cmode": "string", "entrypoint": "string", "protection": "boolean",
    "unprivileged": "boolean", "features": "string", "env": "string", "hookscript": "string", "tags": "string",
    "debug": "boolean",
}
LOCK_VALUES = ["backup", "create", "destroyed", "disk", "fstrim", "migrate", "mounted", "rollback", "snapshot",
               "snapshot-delete"]
FASTPLUG = {"description", "onboot", "startup", "protection", "hostname", "hookscript", "cores", "tags", "lock"}
# applied to a running CT through cgroups (vmconfig_hotplug_pending)
CGROUP_HOTPLUG = {"memory", "swap", "cpulimit", "cpuunits"}

VALID_LXC_KEYS = {
    "lxc.apparmor.profile", "lxc.apparmor.allow_incomplete", "lxc.apparmor.allow_nesting", "lxc.apparmor.raw",
    "lxc.selinux.context", "lxc.include", "lxc.arch", "lxc.uts.name", "lxc.signal.halt", "lxc.signal.reboot",
    "lxc.signal.stop", "lxc.init.cmd", "lxc.init.cwd", "lxc.init.uid", "lxc.init.gid", "lxc.init.groups",
    "lxc.pty.max", "lxc.console.logfile", "lxc.console.path", "lxc.tty.max", "lxc.devtty.dir", "lxc.hook.autodev",
    "lxc.autodev", "lxc.kmsg", "lxc.mount.fstab", "lxc.mount.entry", "lxc.mount.auto", "lxc.rootfs.mount",
    "lxc.cap.drop", "lxc.cap.keep", "lxc.seccomp.profile", "lxc.seccomp.notify.proxy", "lxc.seccomp.notify.cookie",
    "lxc.idmap", "lxc.hook.pre-start", "lxc.hook.pre-mount", "lxc.hook.mount", "lxc.hook.start", "lxc.hook.stop",
    "lxc.hook.post-stop", "lxc.hook.clone", "lxc.hook.destroy", "lxc.hook.version", "lxc.log.level", "lxc.log.file",
    "lxc.start.auto", "lxc.start.delay", "lxc.start.order", "lxc.group", "lxc.environment",
    "lxc.environment.runtime", "lxc.environment.hooks", "lxc.sysctl.fs.mqueue", "lxc.sysctl.kernel.msgmax",
    "lxc.sysctl.kernel.msgmnb", "lxc.sysctl.kernel.msgmni", "lxc.sysctl.kernel.sem", "lxc.sysctl.kernel.shmall",
    "lxc.sysctl.kernel.shmmax", "lxc.sysctl.kernel.shmmni", "lxc.sysctl.kernel.shm_rmid_forced",
}
INVALID_LXC_KEYS = {
    "lxc.rootfs.path": "lxc.rootfs.path is auto generated from rootfs",
    "lxc.rootfs.options": 'lxc.rootfs.options is not supported, please use mount point options in the "rootfs" key',
}
DEPRECATED_LXC_KEYS = {
    "lxc.aa_profile", "lxc.aa_allow_incomplete", "lxc.console", "lxc.devttydir", "lxc.haltsignal",
    "lxc.rebootsignal", "lxc.stopsignal", "lxc.id_map", "lxc.init_cmd", "lxc.loglevel", "lxc.logfile", "lxc.mount",
    "lxc.network.type", "lxc.network.flags", "lxc.network.link", "lxc.network.mtu", "lxc.network.name",
    "lxc.network.hwaddr", "lxc.network.ipv4", "lxc.network.ipv4.gateway", "lxc.network.ipv6",
    "lxc.network.ipv6.gateway", "lxc.network.script.up", "lxc.network.script.down", "lxc.pts", "lxc.se_context",
    "lxc.seccomp", "lxc.tty", "lxc.utsname",
}
DEV_KEYS = ("path", "mode", "uid", "gid", "deny-write")
NOT_IN_SCHEMA = "property is not defined in schema and the schema does not allow additional properties"


def key_type(key):
    """The schema type of a CT option, or None when PVE does not know it."""
    if key in _TYPES:
        return _TYPES[key]
    m = re.match(r"^(net|mp|unused|dev)(\d+)$", key)
    if m:
        limit = {"net": MAX_NETS, "mp": MAX_MOUNT_POINTS, "unused": MAX_MOUNT_POINTS, "dev": MAX_DEVICES}[m.group(1)]
        if int(m.group(2)) < limit and str(int(m.group(2))) == m.group(2):
            return "string"
    return None


def option_exists(key):
    return key_type(key) is not None


def api_property(key):
    """Whether ``key`` may be passed to PUT .../config (json_config_properties)."""
    return option_exists(key) and key not in ("parent", "snaptime")


# ---- PVE::Tools::encode_text / decode_text ---------------------------------------------

_SAFE = "".join(chr(c) for c in list(range(0x20, 0x25)) + list(range(0x26, 0x3a)) + list(range(0x3b, 0x7f)))


def encode_text(text):
    """URI-escape control, hi-bit, ':' and '%' (uppercase hex), like URI::Escape with PVE's class."""
    return quote(text.encode("utf-8"), safe=_SAFE)


def decode_text(data):
    return unquote(data, encoding="utf-8", errors="replace")


def _perl_split_lines(text):
    """Perl ``split(/\\n/, $text)``: trailing empty fields dropped, inner ones kept."""
    parts = text.split("\n")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _warn(msg):
    sys.stderr.write(msg if msg.endswith("\n") else msg + "\n")


def check_type(key, value):
    """PVE::LXC::Config->check_type: normalised value or PVEError."""
    t = key_type(key)
    if t is None:
        raise PVEError("unknown setting '%s'" % key)
    if value is None:
        raise PVEError("got undefined value")
    value = str(value)
    if re.search(r"[\n\r]", value):
        raise PVEError("property contains a line feed")
    if t == "boolean":
        if value == "1" or re.match(r"^(on|yes|true)$", value, re.I):
            return 1
        if value == "0" or re.match(r"^(off|no|false)$", value, re.I):
            return 0
        raise PVEError("type check ('boolean') failed - got '%s'" % value)
    if t == "integer":
        if re.match(r"^(-?\d+)$", value):
            return int(value)
        raise PVEError("type check ('integer') failed - got '%s'" % value)
    if t == "number":
        if re.match(r"^[+-]?(\d+\.\d+|\d+\.?|\.\d+)([eE][+-]?\d+)?$", value):
            num = float(value)
            return int(num) if num == int(num) else num
        raise PVEError("type check ('number') failed - got '%s'" % value)
    return value


def is_valid_lxc_conf_key(vmid, key):
    """1 (valid), 0 (unknown) or an error message, with PVE's warnings."""
    if key.startswith("lxc.limit."):
        _warn("vm %s - %s: lxc.limit.* was renamed to lxc.prlimit.*" % (vmid, key))
        return 1
    if key in DEPRECATED_LXC_KEYS:
        _warn("vm %s - %s is deprecated and was renamed" % (vmid, key))
        return 1
    if key in VALID_LXC_KEYS:
        return 1
    if key in INVALID_LXC_KEYS:
        return INVALID_LXC_KEYS[key]
    if key.startswith("lxc.cgroup."):
        _warn("vm %s - %s is deprecated, this will be a hard error in the future!" % (vmid, key))
        return 1
    if key.startswith(("lxc.cgroup2.", "lxc.prlimit.", "lxc.net.")):
        return 1
    return 0


def parse(raw, vmid, strict=False):
    """parse_pct_config: {'digest', 'snapshots': {name: conf}, 'pending': conf, key: value, 'lxc': [[k, v]]}."""
    if isinstance(raw, bytes):
        raw_bytes, raw = raw, raw.decode("utf-8", errors="surrogateescape")
    else:
        raw_bytes = raw.encode("utf-8", errors="surrogateescape")
    res = {"digest": hashlib.sha1(raw_bytes).hexdigest(), "snapshots": {}, "pending": {}}

    def handle_error(msg):
        if strict:
            raise PVEError(msg)
        _warn(msg)

    conf = res
    descr = ""
    section = ""
    for line in raw.split("\n"):
        if re.fullmatch(r"\s*", line):
            continue
        if re.fullmatch(r"\[pve:pending\]\s*", line, re.I):
            section = "pending"
            if descr:
                conf["description"] = descr
            descr = ""
            conf = res["pending"] = {}
            continue
        m = re.fullmatch(r"\[([a-z][a-z0-9_\-]+)\]\s*", line, re.I)
        if m:
            section = m.group(1)
            if descr:
                conf["description"] = descr
            descr = ""
            conf = res["snapshots"][section] = {}
            continue
        if line.startswith("#"):
            descr += decode_text(line[1:]) + "\n"
            continue
        m = re.fullmatch(r"(lxc\.[a-z0-9_\-\.]+)(:|\s*=)\s*(.*?)\s*", line)
        if m:
            key, value = m.group(1), m.group(3)
            validity = is_valid_lxc_conf_key(vmid, key)
            if key == "lxc.environment.runtime":
                conf["env"] = value if conf.get("env") is None else conf["env"] + "\0" + value
            elif validity == 1:
                conf.setdefault("lxc", []).append([key, value])
            elif validity:
                handle_error("vm %s - %s: %s\n" % (vmid, key, validity))
            else:
                handle_error("vm %s - unable to parse config: %s\n" % (vmid, line))
            continue
        m = re.fullmatch(r"(description):\s*(.*\S)\s*", line)
        if m:
            descr += decode_text(m.group(2))
            continue
        m = re.search(r"snapstate:\s*(prepare|delete)\s*$", line)
        if m:
            conf["snapstate"] = m.group(1)
            continue
        m = re.fullmatch(r"delete:\s*(.*\S)\s*", line)
        if m:
            if section == "pending":
                conf["delete"] = m.group(1)
            else:
                handle_error("vm %s - property 'delete' is only allowed in [pve:pending]\n" % vmid)
            continue
        m = re.fullmatch(r"([a-z][a-z_]*\d*):\s*(.+?)\s*", line)
        if m:
            key, value = m.group(1), m.group(2)
            try:
                value = check_type(key, value)
            except PVEError as e:
                handle_error("vm %s - unable to parse value of '%s' - %s" % (vmid, key, e.msg))
            conf[key] = value
            continue
        handle_error("vm %s - unable to parse config: %s\n" % (vmid, line))
    if descr:
        conf["description"] = descr
    res.pop("snapstate", None)
    return res


def _fmt(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


_SKIP = {"digest", "description", "pending", "snapshots", "snapname", "env", "lxc"}


def _render_section(conf):
    raw = ""
    for cl in _perl_split_lines(conf.get("description") or ""):
        raw += "#" + encode_text(cl) + "\n"
    for key in sorted(conf):
        if key in _SKIP:
            continue
        value = _fmt(conf[key])
        if "\n" in value:
            raise PVEError("detected invalid newline inside property '%s'" % key)
        raw += "%s: %s\n" % (key, value)
    if conf.get("env"):
        for var in re.split(r"\0+", conf["env"]):
            if var:
                raw += "lxc.environment.runtime: %s\n" % var
    for k, v in conf.get("lxc") or []:
        if k == "lxc.environment.runtime":
            continue
        raw += "%s: %s\n" % (k, v)
    return raw


def render(conf):
    """write_pct_config."""
    conf.pop("snapstate", None)
    raw = _render_section(conf)
    if conf.get("pending"):
        raw += "\n[pve:pending]\n" + _render_section(conf["pending"])
    for name in sorted(conf.get("snapshots") or {}):
        raw += "\n[%s]\n" % name + _render_section(conf["snapshots"][name])
    return raw


# ---- files and locks -------------------------------------------------------------------

def config_file(vmid, kind="lxc"):
    return os.path.join(pve.guest_dir(kind), "%s.conf" % vmid)


def lock_file(vmid):
    return pve.path("run/lock/lxc/pve-config-%s.lock" % vmid)


@contextlib.contextmanager
def lock_config(vmid, timeout=10):
    """PVE::LXC::Config->lock_config: flock on /run/lock/lxc/pve-config-<vmid>.lock."""
    import time
    lf = lock_file(vmid)
    os.makedirs(os.path.dirname(lf), exist_ok=True)
    with open(lf, "a") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise PVEError("can't lock file '%s' - got timeout" % lf)
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_raw(vmid, kind="lxc"):
    try:
        with open(config_file(vmid, kind), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def load_config(vmid, kind="lxc"):
    raw = read_raw(vmid, kind)
    if raw is None:
        raise PVEError("Configuration file '%s' does not exist" % pve.cfs_path(vmid, kind))
    if kind == "lxc":
        return parse(raw, vmid)
    from pve import qemuconf
    return qemuconf.parse(raw, vmid)


def write_config(vmid, conf):
    """PVE::File::file_set_contents on pmxcfs: <file>.tmp.<pid>, O_EXCL, rename; no chmod/chown; 1 MiB cap."""
    data = render(conf).encode("utf-8", errors="surrogateescape")
    if len(data) > 1024 * 1024:
        raise PVEError("unable to write '%s' - File too large" % pve.cfs_path(vmid))
    dest = config_file(vmid)
    tmp = "%s.tmp.%d" % (dest, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.rename(tmp, dest)


def check_lock(conf):
    """PVE::AbstractConfig::check_lock (guest_type 'CT')."""
    if conf.get("lock"):
        raise PVEError("CT is locked (%s)" % conf["lock"])


def load_current_config(vmid, current=False):
    conf = load_config(vmid)
    if not current:
        for opt, value in (conf.get("pending") or {}).items():
            if opt == "delete" or isinstance(value, (list, dict)):
                continue
            conf[opt] = value
        for opt in parse_pending_delete((conf.get("pending") or {}).get("delete")):
            if conf.get(opt):
                del conf[opt]
    conf.pop("snapshots", None)
    conf.pop("pending", None)
    return conf


# ---- pending -------------------------------------------------------------------------------

def split_list(text):
    text = text or ""
    if "\0" in text:
        return [x for x in text.split("\0")]
    text = re.sub(r"[,;]", " ", text).lstrip()
    return [x for x in re.split(r"\s+", text) if x != ""]


def parse_pending_delete(data):
    res = {}
    for entry in split_list(data or ""):
        force = entry.startswith("!")
        res[entry[1:] if force else entry] = {"force": 1 if force else 0}
    return res


def print_pending_delete(hashed):
    return ",".join(("!" + k if hashed[k]["force"] else k) for k in sorted(hashed))


def add_to_pending_delete(conf, key, force=0):
    pending = conf.setdefault("pending", {})
    h = parse_pending_delete(pending.get("delete"))
    h[key] = {"force": force}
    pending["delete"] = print_pending_delete(h)


def remove_from_pending_delete(conf, key):
    pending = conf.setdefault("pending", {})
    h = parse_pending_delete(pending.get("delete"))
    if key not in h:
        return
    del h[key]
    if h:
        pending["delete"] = print_pending_delete(h)
    else:
        pending.pop("delete", None)


def cleanup_pending(conf):
    pending = conf.setdefault("pending", {})
    for opt in list(pending):
        if opt == "delete":
            continue
        if conf.get(opt) is not None and _fmt(pending[opt]) == _fmt(conf[opt]):
            del pending[opt]
    cur = parse_pending_delete(pending.get("delete"))
    keep = {k: v for k, v in cur.items() if conf.get(k) is not None}
    if keep:
        pending["delete"] = print_pending_delete(keep)
    else:
        pending.pop("delete", None)


def apply_pending(conf, selection=None):
    """vmconfig_apply_pending (stopped CT, or at start)."""
    pending = conf.setdefault("pending", {})
    for opt in sorted(parse_pending_delete(pending.get("delete"))):
        if selection is not None and opt not in selection:
            continue
        conf.pop(opt, None)
        remove_from_pending_delete(conf, opt)
    cleanup_pending(conf)
    for opt in sorted(pending):
        if opt == "delete" or (selection is not None and opt not in selection):
            continue
        conf[opt] = pending.pop(opt)
    if not pending:
        conf["pending"] = {}


def hotplug_pending(conf, selection=None):
    """vmconfig_hotplug_pending, PVE 8 (pve-container 5.x): fastplug options and cgroup limits only."""
    pending = conf.setdefault("pending", {})
    for opt in sorted(pending):
        if opt == "delete" or (selection is not None and opt not in selection):
            continue
        if opt in FASTPLUG or opt in CGROUP_HOTPLUG:
            conf[opt] = pending.pop(opt)
    for opt in sorted(parse_pending_delete(pending.get("delete"))):
        if selection is not None and opt not in selection:
            continue
        if opt in FASTPLUG or opt in CGROUP_HOTPLUG:
            conf.pop(opt, None)
            remove_from_pending_delete(conf, opt)


# ---- devN ----------------------------------------------------------------------------------

def parse_device(value):
    """parse_property_string($dev_desc): {'path', 'mode', 'uid', 'gid', 'deny-write'} or PVEError."""
    res = {}
    for part in str(value).split(","):
        if part == "":
            continue
        if "=" in part:
            k, v = part.split("=", 1)
        else:
            k, v = "path", part
            if "path" in res:
                raise PVEError("duplicate key in comma-separated list property: path")
        if k not in DEV_KEYS:
            raise PVEError("invalid format - unknown key '%s'" % k)
        if k == "path" and (re.search(r"/\.\.?(?:/|$)", v) or not v.startswith("/dev/")):
            raise PVEError("invalid format - %s is not a valid device path" % v)
        if k == "mode" and not re.fullmatch(r"0[0-7]{3}", v):
            raise PVEError("invalid format - value does not match the regex pattern")
        if k in ("uid", "gid") and not re.fullmatch(r"\d+", v):
            raise PVEError("invalid format - type check ('integer') failed - got '%s'" % v)
        res[k] = v
    if "path" not in res:
        raise PVEError("Path has to be defined")
    return res


def device_mode_and_rdev(dev_path):
    """PVE::LXC::Tools::get_device_mode_and_rdev on the node's /dev (root-relative): pve-container
    src/PVE/LXC/Tools.pm:157-166, the same text in 5.2.6 (PVE 8) and 6.1.x (PVE 9).

    A regular file whose content starts with ``c M:m``/``b M:m`` counts as a device: the lab's
    marker for nodes it could not mknod (unprivileged unit tests)."""
    real = pve.path(dev_path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise PVEError("Device %s does not exist" % dev_path)
    except OSError:
        raise PVEError("Error accessing device %s" % dev_path)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return st.st_mode, st.st_rdev
    if stat.S_ISREG(st.st_mode) and pve.root() != "/":
        try:
            with open(real) as f:
                m = re.match(r"^([cb]) (\d+):(\d+)", f.read(64))
        except OSError:
            m = None
        if m:
            mode = (stat.S_IFCHR if m.group(1) == "c" else stat.S_IFBLK) | 0o666
            return mode, os.makedev(int(m.group(2)), int(m.group(3)))
    raise PVEError("%s is not a device" % dev_path)


# ---- update (PUT .../config, pct set) --------------------------------------------------------

def validate_params(params):
    """The JSON schema check of PUT .../config: unknown properties and type errors -> 400."""
    errors = {}
    clean = {}
    for key, value in params.items():
        if key in ("delete", "revert", "digest", "node", "vmid"):
            clean[key] = value
            continue
        if not api_property(key):
            errors[key] = NOT_IN_SCHEMA
            continue
        if isinstance(value, list):
            errors[key] = "type check ('string') failed - got ARRAY"
            continue
        try:
            clean[key] = check_type(key, value)
        except PVEError as e:
            errors[key] = e.msg.rstrip("\n")
            continue
        if key == "lock" and clean[key] not in LOCK_VALUES:
            errors[key] = "value '%s' does not have a value in the enumeration '%s'" % (value, ", ".join(LOCK_VALUES))
        elif key.startswith("dev") and key_type(key):
            try:
                parse_device(value)
            except PVEError as e:
                errors[key] = e.msg.rstrip("\n")
    if "digest" in clean and len(str(clean["digest"])) > 40:
        errors["digest"] = "value may only be 40 characters long"
    if errors:
        raise param_exc(errors)
    return clean


def check_modify_perm(authuser, opts):
    """PVE::LXC::check_ct_modify_config_perm, for the options that are root@pam-only."""
    from pve import perm_exc
    if authuser == "root@pam":
        return
    for opt in opts:
        if re.match(r"^dev\d+$", opt):
            raise perm_exc("configuring device passthrough is only allowed for root@pam")
        if opt == "hookscript":
            raise perm_exc("changing the hookscript is only allowed for root@pam")
        # a bind (host path) or device mount point, set not deleted: src/PVE/LXC.pm:1665-1670 (pve-container 6.1.10)
        value = opts.get(opt) if isinstance(opts, dict) else None
        source = str(value).split(",", maxsplit=1)[0].replace("volume=", "") if value is not None else ""
        if re.match(r"^mp\d+$", opt) and source.startswith("/"):
            kind = "device" if source.startswith("/dev/") else "bind"
            raise perm_exc("mount point type %s is only allowed for root@pam" % kind)


def update(vmid, params, authuser, running):
    """update_vm + update_pct_config; returns the warnings printed (list). Writes the file."""
    params = dict(params)
    params.pop("node", None)
    params.pop("vmid", None)
    digest = params.pop("digest", None)
    if not params:
        raise PVEError("no options specified")
    delete = split_list(params.pop("delete", None))
    revert = split_list(params.pop("revert", None))
    warnings = []
    with lock_config(vmid):
        conf = load_config(vmid)
        check_lock(conf)
        if digest and conf["digest"] and digest != conf["digest"]:
            raise PVEError("detected modified configuration - file changed by other user? Try again.")
        check_modify_perm(authuser, delete)
        check_modify_perm(authuser, revert)
        for opt in revert:
            if not option_exists(opt):
                raise param_exc({"revert": "unknown option '%s'" % opt})
            if opt in params:
                raise param_exc({"revert": "you can't use '-%s' and '-revert %s' at the same time" % (opt, opt)})
        for opt in delete:
            if not option_exists(opt):
                raise param_exc({"delete": "unknown option '%s'" % opt})
            if opt in params:
                raise param_exc({"delete": "you can't use '-%s' and -delete %s' at the same time" % (opt, opt)})
            if opt in revert:
                raise param_exc({"delete": "you can't use '-delete %s' and '-revert %s' at the same time" % (opt, opt)})
        check_modify_perm(authuser, params)

        pending = conf.setdefault("pending", {})
        for opt in revert:
            pending.pop(opt, None)
            remove_from_pending_delete(conf, opt)
        modified = set()
        for opt in delete:
            if conf.get(opt) is None and pending.get(opt) is None:
                msg = "cannot delete '%s' - not set in current configuration!\n" % opt
                _warn(msg)
                warnings.append(msg)
                continue
            modified.add(opt)
            if opt in ("memory", "rootfs", "ostype"):
                raise PVEError("unable to delete required option '%s'" % opt)
            if opt == "unprivileged":
                raise PVEError("unable to delete read-only option: '%s'" % opt)
            if re.match(r"^(unused|mp)\d+$", opt) and conf.get("protection"):
                raise PVEError("can't remove CT %s drive '%s' - protection mode enabled" % (vmid, opt))
            add_to_pending_delete(conf, opt)
        for opt in sorted(params):
            modified.add(opt)
            value = params[opt]
            if opt == "unprivileged":
                raise PVEError("unable to modify read-only option: '%s'" % opt)
            if re.match(r"^dev\d+$", opt):
                dev = parse_device(value)
                device_mode_and_rdev(dev["path"])
            if opt == "tags":
                seen = []
                for t in split_list(str(value).replace(";", " ")):
                    if t not in seen:
                        seen.append(t)
                value = ";".join(sorted(seen))
            pending[opt] = value
            remove_from_pending_delete(conf, opt)
        cleanup_pending(conf)
        if running:
            hotplug_pending(conf, modified)
        else:
            apply_pending(conf, modified)
        if not conf.get("pending"):
            conf["pending"] = {}
        write_config(vmid, conf)
    return warnings
