"""The PVE API handlers, shared by pveproxy (HTTPS), pvesh, pct and qm.

``call(method, path, params, user, cli=False)`` -> ``(data, attrs)``; raises PVEError.
``user`` is the authenticated user (``root@pam``, ``root@pam!ansible``...); ``cli`` selects
PVE's CLI behaviour for workers (synchronous, output teed to stdout).
Paths are relative to ``/api2/json`` (``/nodes/kpro5/lxc/129/config``).

Each handler declares its ``permissions`` as the real one does (pve-manager 8.4.1, git 2a5fa54a; pve-container 5.2.6,
git a0a7cec; qemu-server 8.3.12, git a411016f; pve-access-control 8.2.2, git 25dd375): ``ALL`` (``user => 'all'``),
``perm(path, privs)`` (``check => ['perm', ...]``), or none (root@pam only). ``call`` checks them before the handler runs,
as pve-manager PVE/HTTPServer.pm:158-159 does (after merging the URI's parameters, before the parameters are verified),
with :mod:`pve.access` (user.cfg's ACLs, privilege separation, propagate). Handlers that list guests, tasks or
mappings leave out what the caller may not see, as theirs do.
"""

import os
import re

import pve
from pve import PVEError, param_exc, perm_exc
from pve import access, ctconf, guests, tasks

ROUTES = []
ALL = {"user": "all"}


def perm(path, privs, any_=False):
    """``check => ['perm', path, privs(, any => 1)]``."""
    return {"check": ("perm", path, list(privs), {"any": 1} if any_ else {})}


def route(method, pattern, noauth=False, perms=None):
    rx = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern) + "/?$")

    def deco(func):
        ROUTES.append((method, rx, func, noauth, perms))
        return func
    return deco


def find(method, path):
    """(func, uri params, noauth, permissions) or None."""
    path = "/" + path.strip("/")
    for m, rx, func, noauth, perms in ROUTES:
        if m != method:
            continue
        mm = rx.match(path)
        if mm:
            return func, mm.groupdict(), noauth, perms
    return None


def path_exists(path):
    path = "/" + path.strip("/")
    return any(rx.match(path) for _m, rx, _f, _n, _p in ROUTES)


class Ctx(object):
    def __init__(self, user, cli=False, out=None):
        self.user = user
        self.cli = cli
        self.out = out
        self.attrs = {}
        self._usercfg = None

    @property
    def is_token(self):
        return "!" in (self.user or "")

    @property
    def usercfg(self):
        if self._usercfg is None:
            self._usercfg = access.load()
        return self._usercfg

    def can(self, path, privs, any_=False):
        """``$rpcenv->check(..., 1)``: whether the caller has ``privs`` on ``path`` (all of them, or any)."""
        return access.check(self.usercfg, self.user, path, privs, any_, noerr=True)


def call(method, path, params=None, user="root@pam", cli=False, out=None):
    found = find(method, path)
    if not found:
        raise PVEError("Method '%s /%s' not implemented" % (method, path.strip("/")), 501)
    func, uri, noauth, perms = found
    params = dict(params or {})
    ctx = Ctx(user, cli, out)
    for k, v in uri.items():
        params[k] = v
    if not noauth:
        access.check_api2_permissions(ctx.usercfg, perms, user, params)
    data = func(ctx, params)
    return data, ctx.attrs


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

@route("GET", "/version", perms=ALL)  # pve-manager PVE/API2.pm:88
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


# ---- access: permissions, roles, tokens, ACLs (pve-access-control 8.2.2, git 25dd375) -----------------------------

USERID_OR_TOKEN = re.compile(r"^%s@%s(?:!%s)?$" % (access.USER_RE, access.REALM_RE, access.REALM_RE))


@route("GET", "/access/permissions", perms=ALL)  # src/PVE/API2/AccessControl.pm:463-522
def access_permissions(ctx, params):
    """Another user's or token's privileges need Sys.Audit on /access (:502-507); ``path`` dumps only that path, not
    normalized (:510-516); without it every path of get_effective_permissions (RPCEnvironment.pm:236-280)."""
    _only(params, ("userid", "path"))
    userid = params.get("userid")
    if userid is not None and not USERID_OR_TOKEN.match(userid):
        raise param_exc({"userid": "value does not match the regex pattern"})
    userid = ctx.user if userid is None else userid
    tok = access.split_tokenid(userid)
    if userid != ctx.user and not (tok and tok[0] == ctx.user):
        access.check(ctx.usercfg, ctx.user, "/access", ["Sys.Audit"])
    if params.get("path"):
        return {params["path"]: access.permissions(ctx.usercfg, userid, params["path"])}
    paths = {"/", "/access", "/access/groups", "/nodes", "/pool", "/sdn", "/storage", "/vms"} | set(ctx.usercfg.acl)
    res = {p: access.permissions(ctx.usercfg, userid, p) for p in paths}
    return {p: privs for p, privs in res.items() if privs}


def _user_cfg_change(ctx, change):
    """lock_user_config + cfs_write_file('user.cfg'): read, change, write."""
    cfg = access.load()
    result = change(cfg)
    access.save(cfg)
    ctx._usercfg = None
    return result


@route("POST", "/access/roles", perms=perm("/access", ["Sys.Modify"]))  # src/PVE/API2/Role.pm:67-107
def role_create(ctx, params):
    _only(params, ("roleid", "privs"))
    role = params.get("roleid")
    if not role:
        raise param_exc({"roleid": "property is missing and it is not optional"})
    if not access.ROLE_RE.match(role):
        raise param_exc({"roleid": "invalid format - role name '%s' contains invalid characters" % role})
    for priv in access.split_list(params.get("privs")):  # format pve-priv-list
        if priv not in access.VALID_PRIVS:
            raise param_exc({"privs": "invalid format - invalid privilege '%s'" % priv})
    if role.upper().startswith("PVE"):
        raise param_exc({"roleid": "cannot use role ID starting with the (case-insensitive) 'PVE' namespace"})

    def change(cfg):
        if role in cfg.roles:
            raise PVEError("role '%s' already exists" % role)
        cfg.roles[role] = frozenset(access.split_list(params.get("privs")))
    return _user_cfg_change(ctx, change)


@route("POST", "/access/users/{userid}/token/{tokenid}", perms={"check": (  # src/PVE/API2/User.pm:692-768
    "or", ("userid-param", "self"), ("userid-group", ["User.Modify"]))})
def token_generate(ctx, params):
    from pve import auth
    _only(params, ("userid", "tokenid", "expire", "privsep", "comment"))
    userid, name = params["userid"], params["tokenid"]
    if not re.match(r"^%s$" % access.REALM_RE, name):
        raise param_exc({"tokenid": "invalid format - invalid token ID '%s'" % name})
    privsep = _bool(params, "privsep", 1)  # 'token-privsep' default 1 (:68-73)
    expire = _int(params, "expire", None, 0)

    def change(cfg):
        if not access.verify_username(userid) or userid not in cfg.users:
            raise PVEError("no such user ('%s')" % userid)  # AccessControl.pm check_user_exist :651-662
        if name in cfg.users[userid]["tokens"]:
            raise param_exc({"tokenid": "Token already exists."})
        info = {"privsep": privsep}
        if expire is not None:
            info["expire"] = expire
        if params.get("comment"):
            info["comment"] = params["comment"]
        value = auth.add_token("%s!%s" % (userid, name))  # PVE::TokenConfig::generate_token
        cfg.users[userid]["tokens"][name] = info
        # the answer shows privsep as it was given (a CLI's "1" stays a string), 1 when it was not (:753)
        shown = dict(info, privsep=params["privsep"]) if params.get("privsep") is not None else info
        return {"info": shown, "value": value, "full-tokenid": "%s!%s" % (userid, name)}
    return _user_cfg_change(ctx, change)


@route("DELETE", "/access/users/{userid}/token/{tokenid}", perms={"check": (  # src/PVE/API2/User.pm:823-865
    "or", ("userid-param", "self"), ("userid-group", ["User.Modify"]))})
def token_remove(ctx, params):
    """The token leaves token.cfg and user.cfg; ACL entries naming it are written back as they were (PVE deletes
    none, :852-862) and dropped when user.cfg is next read (AccessControl.pm:1511-1517)."""
    from pve import auth
    _only(params, ("userid", "tokenid"))
    userid, name = params["userid"], params["tokenid"]

    def change(cfg):
        if not access.verify_username(userid) or userid not in cfg.users:
            raise PVEError("no such user ('%s')" % userid)
        if name not in cfg.users[userid]["tokens"]:
            raise PVEError("no such token '%s' for user '%s'" % (name, userid))
        auth.remove_token("%s!%s" % (userid, name))  # PVE::TokenConfig::delete_token
        del cfg.users[userid]["tokens"][name]
    return _user_cfg_change(ctx, change)


@route("PUT", "/access/acl", perms={"check": ("perm-modify", "{path}")})  # src/PVE/API2/ACL.pm:95-230
def acl_update(ctx, params):
    _only(params, ("path", "roles", "users", "groups", "tokens", "propagate", "delete"))
    for key in ("path", "roles"):
        if not params.get(key):
            raise param_exc({key: "property is missing and it is not optional"})
    if not (params.get("users") or params.get("groups") or params.get("tokens")):
        raise param_exc({k: "either 'users', 'groups' or 'tokens' is required." for k in ("users", "groups", "tokens")})
    delete = _bool(params, "delete")
    path = access.normalize_path(params["path"])
    if not path or (not delete and not access.check_path(path)):
        raise param_exc({"path": "invalid ACL path '%s'" % params["path"]})
    propagate = _bool(params, "propagate", 1)

    def change(cfg):
        mine = access.permissions(cfg, ctx.user, path)
        node = cfg.acl.setdefault(path, {})
        for role in access.split_list(params["roles"]):
            if role not in cfg.roles:
                raise PVEError("role '%s' does not exist" % role)
            _acl_role_allowed(mine, cfg.roles[role], role, propagate, delete)
            members = [("groups", g) for g in access.split_list(params.get("groups"))]
            members += [("users", u) for u in access.split_list(params.get("users"))]
            members += [("tokens", t) for t in access.split_list(params.get("tokens"))]
            for kind, member in members:
                _acl_member_exists(cfg, kind, member)
                entry = node.setdefault(kind, {}).setdefault(member, {})
                if delete:
                    entry.pop(role, None)
                else:
                    entry[role] = propagate
    return _user_cfg_change(ctx, change)


def _acl_role_allowed(mine, privs, role, propagate, delete):
    """ACL.pm:169-186: without Permissions.Modify only a (propagated) subset of the caller's own privileges."""
    if "Permissions.Modify" in mine:
        return
    verb = "remove" if delete else "add"
    for priv in privs:
        if priv not in mine:
            raise param_exc({"role": "Cannot %s role '%s' - requires 'Permissions.Modify' or superset of privileges."
                                     % (verb, role)})
        if propagate and mine[priv] != propagate and not delete:
            raise param_exc({"role": "Cannot %s role '%s' with propagation - requires 'Permissions.Modify' or "
                                     "propagated superset of privileges." % (verb, role)})
    if role == "NoAccess":
        raise param_exc({"role": "Cannot %s role '%s' - requires 'Permissions.Modify'" % (verb, role)})


def _acl_member_exists(cfg, kind, member):
    """ACL.pm:189-222."""
    if kind == "groups" and member not in cfg.groups:
        raise PVEError("group '%s' does not exist" % member)
    if kind == "users" and member not in cfg.users:
        raise PVEError("user '%s' does not exist" % member)
    if kind == "tokens":
        tok = access.split_tokenid(member)
        if not tok:
            raise PVEError("'%s' is not a valid token ID - not able to split into user and token parts" % member)
        if tok[0] not in cfg.users:
            raise PVEError("no such user ('%s')" % tok[0])
        if cfg.token(member) is None:
            raise PVEError("no such token '%s' for user '%s'" % (tok[1], tok[0]))


@route("GET", "/nodes", perms=ALL)  # pve-manager PVE/API2/Nodes.pm:2605 (every node listed)
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


@route("GET", "/nodes/{node}", perms=ALL)  # Nodes.pm:244
def node_index(ctx, params):
    _node(params)
    return [{"name": n} for n in ("lxc", "qemu", "status", "tasks", "hardware", "version")]


@route("GET", "/nodes/{node}/version", perms=ALL)  # Nodes.pm:315
def node_version(ctx, params):
    _node(params)
    return dict(pve.PVE_VERSION)


@route("GET", "/nodes/{node}/status", perms=perm("/nodes/{node}", ["Sys.Audit"]))  # Nodes.pm:388
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


@route("GET", "/cluster/resources", perms=ALL)  # pve-manager PVE/API2/Cluster.pm:224
def cluster_resources(ctx, params):
    node = pve.nodename()
    res = []
    kind = params.get("type")
    if kind not in (None, "", "vm", "node", "storage", "sdn"):
        raise param_exc({"type": "value '%s' does not have a value in the enumeration 'vm, storage, node, sdn'" % kind})
    if kind in (None, "", "vm"):
        for vmid in _audited(ctx, guests.list_vmids("qemu-server")):  # Cluster.pm:480
            d = guests.vm_vmstatus(vmid)
            d.update({"id": "qemu/%d" % vmid, "type": "qemu", "node": node, "template": d.get("template", 0)})
            res.append(d)
        for vmid in _audited(ctx, guests.list_vmids("lxc")):
            d = guests.ct_vmstatus(vmid)
            d.update({"id": "lxc/%d" % vmid, "type": "lxc", "node": node, "template": d.get("template", 0)})
            res.append(d)
    if kind in (None, "", "node"):
        for n in list_nodes(ctx, {}):
            res.append(n)
    return res


def _audited(ctx, vmids):
    """The guests the caller has VM.Audit on (``next if !$rpcenv->check($authuser, "/vms/$vmid", ['VM.Audit'], 1)``)."""
    return [vmid for vmid in vmids if ctx.can("/vms/%d" % vmid, ["VM.Audit"])]


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


@route("GET", "/cluster/mapping", perms=ALL)  # pve-manager PVE/API2/Cluster/Mapping.pm:32-34
def mapping_index(ctx, params):
    return [{"name": "dir"}, {"name": "pci"}, {"name": "usb"}]


@route("GET", "/cluster/mapping/pci", perms=ALL)  # pve-manager PVE/API2/Cluster/Mapping/PCI.pm:24-28
def mapping_pci(ctx, params):
    ids, digest = _mapping_cfg()
    res = []
    for mid in sorted(ids):
        if not ctx.can("/mapping/pci/%s" % mid, ["Mapping.Modify", "Mapping.Use", "Mapping.Audit"], any_=True):
            continue  # Mapping/PCI.pm:97-101
        entry = dict(ids[mid])
        entry["id"] = mid
        entry["digest"] = digest
        entry.setdefault("map", [])
        res.append(entry)
    return res


@route("GET", "/cluster/mapping/pci/{id}", perms={"check": (  # Mapping/PCI.pm:143-146
    "or", ("perm", "/mapping/pci/{id}", ["Mapping.Use"]), ("perm", "/mapping/pci/{id}", ["Mapping.Modify"]),
    ("perm", "/mapping/pci/{id}", ["Mapping.Audit"]))})
def mapping_pci_get(ctx, params):
    ids, digest = _mapping_cfg()
    if params["id"] not in ids:
        raise PVEError("PCI mapping '%s' not found" % params["id"])
    entry = dict(ids[params["id"]])
    entry["digest"] = digest
    return entry


@route("GET", "/nodes/{node}/hardware/pci", perms=perm("/", ["Sys.Audit", "Sys.Modify"], any_=True))  # pve-manager PVE/API2/Hardware/PCI.pm:22-24
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

@route("GET", "/nodes/{node}/tasks", perms=ALL)  # pve-manager PVE/API2/Tasks.pm:43-46
def list_tasks(ctx, params):
    _node(params)
    limit = _int(params, "limit", 50, 0)
    auditor = ctx.can("/nodes/%s" % params["node"], ["Sys.Audit"])  # Tasks.pm:174-180
    res = [t for t in tasks.list_tasks(limit) if auditor or _task_user(t, ctx.user)]
    ctx.attrs["total"] = len(res)
    return res


def _task_user(task, user):
    """Tasks.pm $check_task_user (:28-37): a token sees its own tasks, its user the user's and its tokens'."""
    owner = task.get("user") or ""
    return user == owner or (user == owner.split("!", 1)[0] and "!" in owner)


def _task_owner_or_auditor(ctx, params):
    """Tasks.pm:386-392, :505-510: another's task needs Sys.Audit on /nodes/<node>."""
    task, _fn = tasks.decode(params["upid"], noerr=True)
    if task and not _task_user(task, ctx.user):
        access.check(ctx.usercfg, ctx.user, "/nodes/%s" % params["node"], ["Sys.Audit"])


@route("GET", "/nodes/{node}/tasks/{upid}", perms=ALL)  # Tasks.pm:255
def task_index(ctx, params):
    _node(params)
    tasks.task_status(params["upid"])
    return [{"name": "log"}, {"name": "status"}]


@route("GET", "/nodes/{node}/tasks/{upid}/status", perms=ALL)  # Tasks.pm:440-443, owner checked below
def task_status(ctx, params):
    _node(params)
    _task_owner_or_auditor(ctx, params)
    return tasks.task_status(params["upid"])


@route("GET", "/nodes/{node}/tasks/{upid}/log", perms=ALL)  # Tasks.pm:325-328, owner checked below
def task_log(ctx, params):
    _node(params)
    _task_owner_or_auditor(ctx, params)
    total, lines = tasks.task_log(params["upid"], _int(params, "start", 0, 0), _int(params, "limit", 50, 0))
    ctx.attrs["total"] = total
    return lines


# ---- lxc ------------------------------------------------------------------------------------

@route("GET", "/nodes/{node}/lxc", perms=ALL)  # pve-container src/PVE/API2/LXC.pm:91-94
def lxc_list(ctx, params):
    _node(params)
    return [guests.ct_vmstatus(vmid) for vmid in _audited(ctx, guests.list_vmids("lxc"))]  # LXC.pm:121


@route("GET", "/nodes/{node}/lxc/{vmid}", perms=ALL)  # LXC.pm:565-567
def lxc_index(ctx, params):
    _node(params)
    vmid = _vmid(params)
    _ct_exists(vmid)
    return [{"subdir": s} for s in ("config", "pending", "status", "vncproxy", "termproxy", "vncwebsocket", "spiceproxy",
                                    "migrate", "clone", "rrd", "rrddata", "firewall", "snapshot", "resize")]


@route("GET", "/nodes/{node}/lxc/{vmid}/config", perms=perm("/vms/{vmid}", ["VM.Audit"]))  # LXC/Config.pm:31
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


@route("GET", "/nodes/{node}/lxc/{vmid}/pending", perms=perm("/vms/{vmid}", ["VM.Audit"]))  # LXC.pm:2487
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


# LXC/Config.pm:86-92 and :102 (any of them; the root@pam-only keys are refused by ctconf.check_modify_perm)
@route("PUT", "/nodes/{node}/lxc/{vmid}/config", perms=perm("/vms/{vmid}", [
    "VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options"], any_=True))
def lxc_update(ctx, params):
    _node(params)
    vmid = _vmid(params)
    clean = ctconf.validate_params(params)
    running = guests.check_running(vmid)
    ctconf.update(vmid, clean, ctx.user, running)
    return None


@route("GET", "/nodes/{node}/lxc/{vmid}/status", perms=ALL)  # pve-container src/PVE/API2/LXC/Status.pm:32-38
def lxc_status_index(ctx, params):
    _node(params)
    vmid = _vmid(params)
    _ct_exists(vmid)
    return [{"subdir": s} for s in ("current", "start", "stop", "shutdown", "reboot", "suspend", "resume")]


@route("GET", "/nodes/{node}/lxc/{vmid}/status/current", perms=perm("/vms/{vmid}", ["VM.Audit"]))  # Status.pm:83
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


@route("POST", "/nodes/{node}/lxc/{vmid}/status/start", perms=perm("/vms/{vmid}", ["VM.PowerMgmt"]))  # Status.pm:125
def lxc_start(ctx, params):
    _node(params)
    vmid = _vmid(params)
    _only(params, ("node", "vmid", "skiplock", "debug"))
    skiplock = _skiplock(ctx, params)
    _ct_exists(vmid)
    if guests.check_running(vmid):
        raise PVEError("CT %d already running" % vmid)
    return _worker(ctx, "vzstart", vmid, lambda upid, log: guests.ct_start(vmid, log, skiplock=skiplock))


@route("POST", "/nodes/{node}/lxc/{vmid}/status/stop", perms=perm("/vms/{vmid}", ["VM.PowerMgmt"]))  # Status.pm:215
def lxc_stop(ctx, params):
    _node(params)
    vmid = _vmid(params)
    _only(params, ("node", "vmid", "skiplock", "overrule-shutdown"))
    skiplock = _skiplock(ctx, params)
    _ct_exists(vmid)
    if not guests.check_running(vmid):
        raise PVEError("CT %d not running" % vmid)
    return _worker(ctx, "vzstop", vmid, lambda upid, log: guests.ct_stop(vmid, log, skiplock=skiplock))


@route("POST", "/nodes/{node}/lxc/{vmid}/status/shutdown", perms=perm("/vms/{vmid}", ["VM.PowerMgmt"]))  # Status.pm:304
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


@route("POST", "/nodes/{node}/lxc/{vmid}/status/reboot", perms=perm("/vms/{vmid}", ["VM.PowerMgmt"]))  # Status.pm:472
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

@route("POST", "/nodes/{node}/startall", perms=ALL)  # Nodes.pm:1922-1926, checked below
def node_startall(ctx, params):
    """pve-manager PVE/API2/Nodes.pm startall (pve-guests.service runs it at boot): a ``startall`` task."""
    _node(params)
    _only(params, ("node", "force", "vms"))
    force = _bool(params, "force")
    vms = params.get("vms")
    if not ctx.can("/", ["VM.PowerMgmt"]):  # Nodes.pm:1955-1961
        if not access.split_list(vms):
            raise perm_exc("/, VM.PowerMgmt")
        for vmid in access.split_list(vms):
            access.check(ctx.usercfg, ctx.user, "/vms/%s" % vmid, ["VM.PowerMgmt"])
    return tasks.fork_worker("startall", "", ctx.user, lambda upid, log: guests.startall(log, ctx.user, force, vms),
                             sync=ctx.cli, out=ctx.out)


@route("GET", "/nodes/{node}/qemu", perms=ALL)  # qemu-server PVE/API2/Qemu.pm:950-952
def qemu_list(ctx, params):
    _node(params)
    return [guests.vm_vmstatus(vmid) for vmid in _audited(ctx, guests.list_vmids("qemu-server"))]  # Qemu.pm:984


@route("GET", "/nodes/{node}/qemu/{vmid}/config", perms=perm("/vms/{vmid}", ["VM.Audit"]))  # Qemu.pm:1588
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


@route("GET", "/nodes/{node}/qemu/{vmid}/status/current", perms=perm("/vms/{vmid}", ["VM.Audit"]))  # Qemu.pm:3043
def qemu_status_current(ctx, params):
    _node(params)
    vmid = _vmid(params)
    if ctconf.read_raw(vmid, "qemu-server") is None:
        raise PVEError("Configuration file '%s' does not exist" % pve.cfs_path(vmid, "qemu-server"))
    d = guests.vm_vmstatus(vmid)
    d["ha"] = {"managed": 0}
    return d
