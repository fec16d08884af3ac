"""The PVE API handlers, shared by pveproxy (HTTPS), pvesh, pct and qm.

``call(method, path, params, user, cli=False)`` -> ``(data, attrs)``; raises PVEError.
``user`` is the authenticated user (``root@pam``, ``root@pam!ansible``...); ``cli`` selects
PVE's CLI behaviour for workers (synchronous, output teed to stdout).
Paths are relative to ``/api2/json`` (``/nodes/kpro5/lxc/129/config``).
"""

import os
import re

import pve
from pve import PVEError, param_exc, perm_exc
from pve import ctconf, guests, tasks

ROUTES = []


def route(method, pattern, noauth=False):
    rx = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern) + "/?$")

    def deco(func):
        ROUTES.append((method, rx, func, noauth))
        return func
    return deco


def find(method, path):
    """(func, uri params, noauth) or None."""
    path = "/" + path.strip("/")
    for m, rx, func, noauth in ROUTES:
        if m != method:
            continue
        mm = rx.match(path)
        if mm:
            return func, mm.groupdict(), noauth
    return None


def path_exists(path):
    path = "/" + path.strip("/")
    return any(rx.match(path) for _m, rx, _f, _n in ROUTES)


class Ctx(object):
    def __init__(self, user, cli=False, out=None):
        self.user = user
        self.cli = cli
        self.out = out
        self.attrs = {}

    @property
    def is_token(self):
        return "!" in (self.user or "")


def call(method, path, params=None, user="root@pam", cli=False, out=None):
    found = find(method, path)
    if not found:
        raise PVEError("Method '%s /%s' not implemented" % (method, path.strip("/")), 501)
    func, uri, _noauth = found
    params = dict(params or {})
    ctx = Ctx(user, cli, out)
    for k, v in uri.items():
        params[k] = v
    _check_privsep(ctx, path)
    data = func(ctx, params)
    return data, ctx.attrs


def _check_privsep(ctx, path):
    """A privilege-separated token without ACLs may do nothing (the lab has no ACLs)."""
    from pve import auth
    if ctx.is_token and auth.token_privsep(ctx.user) and path.strip("/") not in ("version", "access/ticket"):
        m = re.match(r"^/?nodes/[^/]+/(lxc|qemu)/(\d+)", path)
        raise perm_exc("/vms/%s, VM.Audit" % m.group(2) if m else "/, Sys.Audit")


# ---- parameter helpers ---------------------------------------------------------------------

def _node(params):
    node = params.get("node")
    if node == "localhost":  # the local node, as pvesh and the API's proxyto resolve it (pve-guests.service uses it)
        node = params["node"] = pve.nodename()
    if node != pve.nodename():
        if not re.match(r"^[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?$", node or ""):
            raise param_exc({"node": "invalid format - value does not look like a valid node name"})
        raise PVEError("hostname lookup '%s' failed - failed to get address info for: %s: Name or service not known"
                       % (node, node), 500)
    return node


def _vmid(params):
    v = str(params.get("vmid"))
    if not re.fullmatch(r"\d+", v):
        raise param_exc({"vmid": "type check ('integer') failed - got '%s'" % v})
    if int(v) < 100:
        raise param_exc({"vmid": "value must have a minimum value of 100"})
    if int(v) > 999999999:
        raise param_exc({"vmid": "value must have a maximum value of 999999999"})
    return int(v)


def _bool(params, key, default=0):
    v = params.get(key)
    if v is None or v == "":
        return default
    v = str(v)
    if v in ("1",) or v.lower() in ("on", "yes", "true"):
        return 1
    if v in ("0",) or v.lower() in ("off", "no", "false"):
        return 0
    raise param_exc({key: "type check ('boolean') failed - got '%s'" % v})


def _int(params, key, default=None, minimum=None):
    v = params.get(key)
    if v is None or v == "":
        return default
    if not re.fullmatch(r"-?\d+", str(v)):
        raise param_exc({key: "type check ('integer') failed - got '%s'" % v})
    v = int(v)
    if minimum is not None and v < minimum:
        raise param_exc({key: "value must have a minimum value of %d" % minimum})
    return v


def _only(params, allowed):
    extra = {k: ctconf.NOT_IN_SCHEMA for k in params if k not in allowed}
    if extra:
        raise param_exc(extra)


def _ct_exists(vmid):
    if ctconf.read_raw(vmid) is None:
        raise PVEError("Configuration file '%s' does not exist" % pve.cfs_path(vmid))


# ---- version, access, cluster ----------------------------------------------------------------

@route("GET", "/version")
def get_version(ctx, params):
    return dict(pve.PVE_VERSION)


@route("POST", "/access/ticket", noauth=True)
def create_ticket(ctx, params):
    from pve import auth
    username = auth.normalize_user(params.get("username"), params.get("realm"))
    if not username:
        raise param_exc({"username": "property is missing and it is not optional"})
    if params.get("password") is None:
        raise param_exc({"password": "property is missing and it is not optional"})
    return auth.ticket_response(username, params.get("password"))


@route("GET", "/access/ticket", noauth=True)
def get_ticket(ctx, params):
    return None


@route("GET", "/nodes")
def list_nodes(ctx, params):
    node = pve.nodename()
    cpus = os.cpu_count() or 1
    return [{"node": node, "status": "online", "type": "node", "id": "node/%s" % node, "level": "", "cpu": 0.01,
             "maxcpu": cpus, "mem": 8 * 1024 ** 3, "maxmem": 256 * 1024 ** 3, "disk": 20 * 1024 ** 3,
             "maxdisk": 100 * 1024 ** 3, "uptime": 3600, "ssl_fingerprint": _ssl_fingerprint()}]


def _ssl_fingerprint():
    import hashlib
    import ssl
    try:
        with open(pve.pve_dir("local/pve-ssl.pem")) as f:
            der = ssl.PEM_cert_to_DER_cert(f.read())
    except (OSError, ValueError):
        return ""
    h = hashlib.sha256(der).hexdigest().upper()
    return ":".join(h[i:i + 2] for i in range(0, len(h), 2))


@route("GET", "/nodes/{node}")
def node_index(ctx, params):
    _node(params)
    return [{"name": n} for n in ("lxc", "qemu", "status", "tasks", "hardware", "version")]


@route("GET", "/nodes/{node}/version")
def node_version(ctx, params):
    _node(params)
    return dict(pve.PVE_VERSION)


@route("GET", "/nodes/{node}/status")
def node_status(ctx, params):
    _node(params)
    import labstate
    try:
        kernel = labstate.load().get("kernel") or {}
    except (OSError, ValueError):
        kernel = {}
    release = kernel.get("release") or os.uname().release
    return {"kversion": "Linux %s #1 SMP PREEMPT_DYNAMIC PMX" % release, "pveversion": "pve-manager/%s/%s" % (
        pve.PVE_VERSION["version"], pve.PVE_VERSION["repoid"]), "uptime": 3600,
        "current-kernel": {"release": release, "sysname": "Linux", "machine": "x86_64"},
        "cpuinfo": {"cpus": os.cpu_count() or 1, "model": "lab CPU", "sockets": 1},
        "memory": {"total": 256 * 1024 ** 3, "used": 8 * 1024 ** 3, "free": 248 * 1024 ** 3},
        "boot-info": {"mode": "efi", "secureboot": 1 if kernel.get("secure_boot") else 0}}


@route("GET", "/cluster/resources")
def cluster_resources(ctx, params):
    node = pve.nodename()
    res = []
    kind = params.get("type")
    if kind not in (None, "", "vm", "node", "storage", "sdn"):
        raise param_exc({"type": "value '%s' does not have a value in the enumeration 'vm, storage, node, sdn'" % kind})
    if kind in (None, "", "vm"):
        for vmid in guests.list_vmids("qemu-server"):
            d = guests.vm_vmstatus(vmid)
            d.update({"id": "qemu/%d" % vmid, "type": "qemu", "node": node, "template": d.get("template", 0)})
            res.append(d)
        for vmid in guests.list_vmids("lxc"):
            d = guests.ct_vmstatus(vmid)
            d.update({"id": "lxc/%d" % vmid, "type": "lxc", "node": node, "template": d.get("template", 0)})
            res.append(d)
    if kind in (None, "", "node"):
        for n in list_nodes(ctx, {}):
            res.append(n)
    return res


def _mapping_cfg():
    """/etc/pve/mapping/pci.cfg (SectionConfig: ``pci: <id>`` then tab-indented ``key value``)."""
    import hashlib
    try:
        with open(pve.pve_dir("mapping/pci.cfg"), "rb") as f:
            raw = f.read()
    except OSError:
        raw = b""
    digest = hashlib.sha1(raw).hexdigest()
    ids = {}
    cur = None
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"^(\S+):\s*(\S+)\s*$", line)
        if m and not line[0].isspace():
            cur = ids.setdefault(m.group(2), {"type": m.group(1)})
            continue
        if cur is None:
            continue
        m = re.match(r"^\s+(\S+)(?:\s+(.*?))?\s*$", line)
        if m:
            key, value = m.group(1), m.group(2) or ""
            if key == "map":
                cur.setdefault("map", []).append(value)
            elif key == "description":
                cur["description"] = ctconf.decode_text(value)
            else:
                cur[key] = value
    return ids, digest


@route("GET", "/cluster/mapping")
def mapping_index(ctx, params):
    return [{"name": "dir"}, {"name": "pci"}, {"name": "usb"}]


@route("GET", "/cluster/mapping/pci")
def mapping_pci(ctx, params):
    ids, digest = _mapping_cfg()
    res = []
    for mid in sorted(ids):
        entry = dict(ids[mid])
        entry["id"] = mid
        entry["digest"] = digest
        entry.setdefault("map", [])
        res.append(entry)
    return res


@route("GET", "/cluster/mapping/pci/{id}")
def mapping_pci_get(ctx, params):
    ids, digest = _mapping_cfg()
    if params["id"] not in ids:
        raise PVEError("PCI mapping '%s' not found" % params["id"])
    entry = dict(ids[params["id"]])
    entry["digest"] = digest
    return entry


@route("GET", "/nodes/{node}/hardware/pci")
def hardware_pci(ctx, params):
    _node(params)
    import labstate
    try:
        devices = (labstate.load().get("pci") or {}).get("devices") or {}
    except (OSError, ValueError):
        devices = {}
    res = []
    for bdf in sorted(devices):
        d = devices[bdf]
        res.append({"id": bdf, "class": d.get("class"), "vendor": d.get("vendor"), "device": d.get("device"),
                    "subsystem_vendor": d.get("subsystem_vendor"), "subsystem_device": d.get("subsystem_device"),
                    "iommugroup": d.get("iommu_group", -1), "mdev": 0})
    return res


# ---- tasks ----------------------------------------------------------------------------------

@route("GET", "/nodes/{node}/tasks")
def list_tasks(ctx, params):
    _node(params)
    limit = _int(params, "limit", 50, 0)
    res = tasks.list_tasks(limit)
    ctx.attrs["total"] = len(res)
    return res


@route("GET", "/nodes/{node}/tasks/{upid}")
def task_index(ctx, params):
    _node(params)
    tasks.task_status(params["upid"])
    return [{"name": "log"}, {"name": "status"}]


@route("GET", "/nodes/{node}/tasks/{upid}/status")
def task_status(ctx, params):
    _node(params)
    return tasks.task_status(params["upid"])


@route("GET", "/nodes/{node}/tasks/{upid}/log")
def task_log(ctx, params):
    _node(params)
    total, lines = tasks.task_log(params["upid"], _int(params, "start", 0, 0), _int(params, "limit", 50, 0))
    ctx.attrs["total"] = total
    return lines


# ---- lxc ------------------------------------------------------------------------------------

@route("GET", "/nodes/{node}/lxc")
def lxc_list(ctx, params):
    _node(params)
    return [guests.ct_vmstatus(vmid) for vmid in guests.list_vmids("lxc")]


@route("GET", "/nodes/{node}/lxc/{vmid}")
def lxc_index(ctx, params):
    _node(params)
    vmid = _vmid(params)
    _ct_exists(vmid)
    return [{"subdir": s} for s in ("config", "pending", "status", "vncproxy", "termproxy", "vncwebsocket", "spiceproxy",
                                    "migrate", "clone", "rrd", "rrddata", "firewall", "snapshot", "resize")]


@route("GET", "/nodes/{node}/lxc/{vmid}/config")
def lxc_config(ctx, params):
    _node(params)
    vmid = _vmid(params)
    current = _bool(params, "current")
    snapshot = params.get("snapshot")
    if snapshot and current:
        raise param_exc({"snapshot": "cannot use 'snapshot' parameter with 'current'",
                         "current": "cannot use 'snapshot' parameter with 'current'"})
    if snapshot:
        conf = ctconf.load_config(vmid)
        snap = (conf.get("snapshots") or {}).get(snapshot)
        if snap is None:
            raise PVEError("snapshot '%s' does not exist" % snapshot)
        snap = dict(snap)
        snap["digest"] = conf["digest"]
        return snap
    return ctconf.load_current_config(vmid, current)


@route("GET", "/nodes/{node}/lxc/{vmid}/pending")
def lxc_pending(ctx, params):
    _node(params)
    vmid = _vmid(params)
    conf = ctconf.load_config(vmid)
    pending = conf.get("pending") or {}
    deletes = ctconf.parse_pending_delete(pending.get("delete"))
    res = []
    keys = set(k for k in conf if k not in ("digest", "pending", "snapshots", "lxc")) | set(pending) | set(deletes)
    for key in sorted(keys):
        if key == "delete":
            continue
        item = {"key": key}
        if key in conf:
            item["value"] = conf[key]
        if key in pending:
            item["pending"] = pending[key]
        if key in deletes:
            item["delete"] = 2 if deletes[key]["force"] else 1
        res.append(item)
    return res


@route("PUT", "/nodes/{node}/lxc/{vmid}/config")
def lxc_update(ctx, params):
    _node(params)
    vmid = _vmid(params)
    clean = ctconf.validate_params(params)
    running = guests.check_running(vmid)
    ctconf.update(vmid, clean, ctx.user, running)
    return None


@route("GET", "/nodes/{node}/lxc/{vmid}/status")
def lxc_status_index(ctx, params):
    _node(params)
    vmid = _vmid(params)
    _ct_exists(vmid)
    return [{"subdir": s} for s in ("current", "start", "stop", "shutdown", "reboot", "suspend", "resume")]


@route("GET", "/nodes/{node}/lxc/{vmid}/status/current")
def lxc_status_current(ctx, params):
    _node(params)
    vmid = _vmid(params)
    d = guests.ct_vmstatus(vmid)
    d["ha"] = {"managed": 0}
    return d


def _worker(ctx, dtype, vmid, func):
    return tasks.fork_worker(dtype, vmid, ctx.user, func, sync=ctx.cli, out=ctx.out)


def _skiplock(ctx, params):
    skiplock = _bool(params, "skiplock")
    if skiplock and ctx.user != "root@pam":
        raise param_exc({"skiplock": "Only root may use this option."})
    return skiplock


@route("POST", "/nodes/{node}/lxc/{vmid}/status/start")
def lxc_start(ctx, params):
    _node(params)
    vmid = _vmid(params)
    _only(params, ("node", "vmid", "skiplock", "debug"))
    skiplock = _skiplock(ctx, params)
    _ct_exists(vmid)
    if guests.check_running(vmid):
        raise PVEError("CT %d already running" % vmid)
    return _worker(ctx, "vzstart", vmid, lambda upid, log: guests.ct_start(vmid, log, skiplock=skiplock))


@route("POST", "/nodes/{node}/lxc/{vmid}/status/stop")
def lxc_stop(ctx, params):
    _node(params)
    vmid = _vmid(params)
    _only(params, ("node", "vmid", "skiplock", "overrule-shutdown"))
    skiplock = _skiplock(ctx, params)
    _ct_exists(vmid)
    if not guests.check_running(vmid):
        raise PVEError("CT %d not running" % vmid)
    return _worker(ctx, "vzstop", vmid, lambda upid, log: guests.ct_stop(vmid, log, skiplock=skiplock))


@route("POST", "/nodes/{node}/lxc/{vmid}/status/shutdown")
def lxc_shutdown(ctx, params):
    _node(params)
    vmid = _vmid(params)
    _only(params, ("node", "vmid", "timeout", "forceStop"))
    timeout = _int(params, "timeout", 60, 0)
    force = _bool(params, "forceStop")
    _ct_exists(vmid)
    if not guests.check_running(vmid):
        raise PVEError("CT %d not running" % vmid)
    return _worker(ctx, "vzshutdown", vmid,
                   lambda upid, log: guests.ct_stop(vmid, log, shutdown=True, timeout=timeout, force=force))


@route("POST", "/nodes/{node}/lxc/{vmid}/status/reboot")
def lxc_reboot(ctx, params):
    _node(params)
    vmid = _vmid(params)
    _only(params, ("node", "vmid", "timeout"))
    timeout = _int(params, "timeout", 60, 0)
    _ct_exists(vmid)
    if not guests.check_running(vmid):
        raise PVEError("VM %d not running" % vmid)
    return _worker(ctx, "vzreboot", vmid, lambda upid, log: guests.ct_reboot(vmid, log, timeout=timeout))


# ---- qemu (read-only) --------------------------------------------------------------------------

@route("POST", "/nodes/{node}/startall")
def node_startall(ctx, params):
    """pve-manager PVE/API2/Nodes.pm startall (pve-guests.service runs it at boot): a ``startall`` task."""
    _node(params)
    _only(params, ("node", "force", "vms"))
    force = _bool(params, "force")
    vms = params.get("vms")
    return tasks.fork_worker("startall", "", ctx.user, lambda upid, log: guests.startall(log, ctx.user, force, vms),
                             sync=ctx.cli, out=ctx.out)


@route("GET", "/nodes/{node}/qemu")
def qemu_list(ctx, params):
    _node(params)
    return [guests.vm_vmstatus(vmid) for vmid in guests.list_vmids("qemu-server")]


@route("GET", "/nodes/{node}/qemu/{vmid}/config")
def qemu_config(ctx, params):
    _node(params)
    vmid = _vmid(params)
    raw = ctconf.read_raw(vmid, "qemu-server")
    if raw is None:
        raise PVEError("Configuration file '%s' does not exist" % pve.cfs_path(vmid, "qemu-server"))
    conf = ctconf.load_config(vmid, "qemu-server")
    if not _bool(params, "current"):
        for k, v in (conf.get("pending") or {}).items():
            if k != "delete":
                conf[k] = v
        for k in ctconf.parse_pending_delete((conf.get("pending") or {}).get("delete")):
            conf.pop(k, None)
    conf.pop("pending", None)
    conf.pop("snapshots", None)
    return conf


@route("GET", "/nodes/{node}/qemu/{vmid}/status/current")
def qemu_status_current(ctx, params):
    _node(params)
    vmid = _vmid(params)
    if ctconf.read_raw(vmid, "qemu-server") is None:
        raise PVEError("Configuration file '%s' does not exist" % pve.cfs_path(vmid, "qemu-server"))
    d = guests.vm_vmstatus(vmid)
    d["ha"] = {"managed": 0}
    return d
