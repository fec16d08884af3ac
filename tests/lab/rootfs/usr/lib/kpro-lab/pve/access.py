"""Users, API tokens, roles and ACLs as pve-access-control keeps and checks them.

The source is libpve-access-control 8.2.2, the version Proxmox VE 8.4 ships (github.com/proxmox/pve-access-control,
commit 25dd375); "AccessControl.pm:N" below is src/PVE/AccessControl.pm line N there, "RPCEnvironment.pm:N"
src/PVE/RPCEnvironment.pm.

- ``/etc/pve/user.cfg`` read as ``parse_user_config`` (AccessControl.pm:1371-1614) reads it and written as
  ``write_user_config`` (:1616-1720) writes it: ``user:``, ``token:``, ``group:``, ``role:``, ``acl:`` lines;
  ``pool:`` lines are kept as written, but pool ACLs are not applied (the lab has no pools);
- the built-in roles made from ``$privgroups`` by ``create_roles`` (:1036-1183);
- ``roles`` (:1748-1856: ACLs down the path, propagate, tokens before users before groups, NoAccess) and
  ``permissions`` (RPCEnvironment.pm:135-175 with ``compile_acl_path`` :19-117): root@pam has every privilege, a token
  without privilege separation has its user's, a privilege-separated token the intersection of its own ACLs' and its
  user's (root@pam's tokens: their own ACLs only, :104);
- ``check``/``check_any`` (RPCEnvironment.pm:282-317) with PVE's 403 text, ``Permission check failed (<path>, <priv>)``,
  and ``check_api2_permissions``/``exec_api2_perm_check`` (:450-557) for the API's ``permissions`` declarations.
"""

import os
import re

import pve
from pve import PVEError, perm_exc
from pve.ctconf import decode_text, encode_text

USERCFG_REL = "user.cfg"

# AccessControl.pm:1036-1142 ($privgroups): per category, the privileges only root has, an admin's, a user's, an
# auditor's.
PRIVGROUPS = {
    "VM": {"root": [], "admin": ["VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network",
                                 "VM.Config.HWType", "VM.Config.Options", "VM.Allocate", "VM.Clone", "VM.Migrate",
                                 "VM.Monitor", "VM.Snapshot", "VM.Snapshot.Rollback"],
           "user": ["VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.Backup", "VM.PowerMgmt"],
           "audit": ["VM.Audit"]},
    "Sys": {"root": ["Sys.PowerMgmt", "Sys.Modify", "Sys.Incoming", "Sys.AccessNetwork"],
            "admin": ["Sys.Console", "Sys.Syslog"], "user": [], "audit": ["Sys.Audit"]},
    "Datastore": {"root": [], "admin": ["Datastore.Allocate", "Datastore.AllocateTemplate"],
                  "user": ["Datastore.AllocateSpace"], "audit": ["Datastore.Audit"]},
    "SDN": {"root": [], "admin": ["SDN.Allocate", "SDN.Audit"], "user": ["SDN.Use"], "audit": ["SDN.Audit"]},
    "User": {"root": ["Realm.Allocate"], "admin": ["User.Modify", "Group.Allocate", "Realm.AllocateUser"],
             "user": [], "audit": []},
    "Pool": {"root": [], "admin": ["Pool.Allocate"], "user": ["Pool.Audit"], "audit": ["Pool.Audit"]},
    "Mapping": {"root": [], "admin": ["Mapping.Modify"], "user": ["Mapping.Use"], "audit": ["Mapping.Audit"]},
}

# Proxmox VE 9 (libpve-access-control 9.0.4, git 3e9da0c, src/PVE/AccessControl.pm:1050-1157): VM.Monitor is gone;
# VM.GuestAgent.* and VM.Replicate are new. The rest of the model is the same.
PRIVGROUPS_PVE9 = dict(PRIVGROUPS, VM={
    "root": [], "admin": ["VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.HWType",
                          "VM.Config.Options", "VM.Allocate", "VM.Clone", "VM.GuestAgent.Unrestricted", "VM.Migrate",
                          "VM.Replicate", "VM.Snapshot", "VM.Snapshot.Rollback"],
    "user": ["VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.Backup", "VM.GuestAgent.FileRead",
             "VM.GuestAgent.FileSystemMgmt", "VM.GuestAgent.FileWrite", "VM.PowerMgmt"],
    "audit": ["VM.Audit", "VM.GuestAgent.Audit"]})

# pve-access-control src/PVE/Auth/Plugin.pm:32-33
REALM_RE = r"[A-Za-z][A-Za-z0-9\.\-_]+"
USER_RE = r"[^\s:/]+"
USERNAME_RE = re.compile(r"^(%s)@(%s)$" % (USER_RE, REALM_RE))
# AccessControl.pm:271-274 ($token_subid_regex is the realm's; $token_full_regex)
TOKEN_RE = re.compile(r"^((%s)@(%s))!(%s)$" % (USER_RE, REALM_RE, REALM_RE))
ROLE_RE = re.compile(r"^[A-Za-z0-9\.\-_]+$")  # verify_rolename, :1307-1318
GROUP_RE = re.compile(r"^[A-Za-z0-9\.\-_]+$")  # Plugin.pm:34 $groupname_regex_chars


def _create_roles(privgroups):
    """create_roles (AccessControl.pm:1153-1183): the valid privileges and the built-in roles."""
    valid = {"Permissions.Modify"}  # :1144-1146, in no group
    roles = {"NoAccess": set()}
    for cat, cd in privgroups.items():
        valid.update(cd["root"] + cd["admin"] + cd["user"] + cd["audit"])
        for priv in cd["admin"] + cd["user"] + cd["audit"]:
            roles.setdefault("PVE%sAdmin" % cat, set()).add(priv)
            roles.setdefault("PVEAdmin", set()).add(priv)
        if cd["user"]:
            for priv in cd["user"] + cd["audit"]:
                roles.setdefault("PVE%sUser" % cat, set()).add(priv)
        for priv in cd["audit"]:
            roles.setdefault("PVEAuditor", set()).add(priv)
    roles["PVEAdmin"].discard("Mapping.Modify")  # :1177-1179
    roles["PVETemplateUser"] = {"VM.Clone", "VM.Audit"}
    roles["Administrator"] = set(valid)  # :1150, $valid_privs itself: every privilege
    return frozenset(valid), {k: frozenset(v) for k, v in roles.items()}


# The node's release decides (pve.PVE_VERSION follows its Debian: 12 is PVE 8, 13 is PVE 9).
VALID_PRIVS, SPECIAL_ROLES = _create_roles(PRIVGROUPS_PVE9 if pve.PVE_VERSION["release"].startswith("9.") else PRIVGROUPS)


def verify_username(name):
    """Plugin.pm verify_username (:106-131): the name, or None."""
    return name if name and 3 <= len(name) <= 64 and USERNAME_RE.match(name) else None


def split_tokenid(tokenid):
    """AccessControl.pm split_tokenid (:278-288): (user, token name), or None."""
    m = TOKEN_RE.match(tokenid or "")
    return (m.group(1), m.group(4)) if m else None


def verify_privname(priv):
    """AccessControl.pm verify_privname (:1341-1351)."""
    if priv not in VALID_PRIVS:
        raise PVEError("invalid privilege '%s'" % priv)
    return priv


def normalize_path(path):
    """AccessControl.pm normalize_path (:1240-1256)."""
    if not path:
        return None
    path = re.sub(r"/+", "/", path)
    path = re.sub(r"/$", "", path) or "/"
    if not path.startswith("/"):
        path = "/" + path
    return path if re.match(r"^[A-Za-z0-9\.\-_/]+$", path) else None


_ACL_PATH = re.compile(r"""^(
    /|/access|/access/groups|/access/groups/[A-Za-z0-9\.\-_]+|/access/realm|/access/realm/[A-Za-z0-9\.\-_]+
    |/nodes|/nodes/[A-Za-z0-9\.\-_]+
    |/pool|/pool/[A-Za-z0-9\.\-_]+(?:/[A-Za-z0-9\.\-_]+){0,2}
    |/sdn|/sdn/controllers|/sdn/controllers/[A-Za-z0-9_\-]+|/sdn/dns|/sdn/dns/[A-Za-z0-9]+|/sdn/ipams
    |/sdn/ipams/[A-Za-z0-9]+|/sdn/zones|/sdn/zones/[A-Za-z0-9\.\-_]+|/sdn/zones/[A-Za-z0-9\.\-_]+/[A-Za-z0-9\.\-_]+
    |/sdn/zones/[A-Za-z0-9\.\-_]+/[A-Za-z0-9\.\-_]+/[1-9][0-9]{0,3}
    |/storage|/storage/[A-Za-z0-9\.\-_]+|/vms|/vms/[1-9][0-9]{2,}
    |/mapping|/mapping/[A-Za-z0-9\.\-_]+|/mapping/[A-Za-z0-9\.\-_]+/[A-Za-z0-9\.\-_]+
)$""", re.X)


def check_path(path):
    """AccessControl.pm check_path (:1258-1290): the paths an ACL may be set on."""
    return bool(_ACL_PATH.match(path or ""))


def _fields(line):
    """Perl's split(/:/, $line) with each field trimmed (trailing empty fields dropped)."""
    parts = [p.strip() for p in line.split(":")]
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def split_list(text):
    """PVE::Tools::split_list: items separated by commas, semicolons or whitespace."""
    return [x for x in re.split(r"[;,\s]+", text or "") if x]


class UserConfig(object):
    """The parsed user.cfg (parse_user_config, AccessControl.pm:1371-1614)."""

    def __init__(self, text=""):
        self.users, self.groups, self.pools = {}, {}, []
        self.roles = dict(SPECIAL_ROLES)
        self.acl = {}  # normalized path -> {"users"|"groups"|"tokens": {member: {role: propagate}}}
        for line in (text or "").splitlines():
            line = line.strip()
            if line:
                self._line(line)
        self.users.setdefault("root@pam", {"enable": 1, "expire": 0, "tokens": {}})  # userconfig_force_defaults

    def _line(self, line):
        data = _fields(line)
        kind, data = data[0], data[1:] + [""] * 8
        if kind == "user" and verify_username(data[0]) and re.match(r"^\d*$", data[2]):
            self.users[data[0]] = {"enable": 1 if data[1] not in ("", "0") else 0, "expire": int(data[2] or 0),
                                   "firstname": decode_text(data[3]), "lastname": decode_text(data[4]),
                                   "email": data[5], "comment": decode_text(data[6]), "keys": data[7], "tokens": {}}
        elif kind == "group" and GROUP_RE.match(data[0]):
            # :1430-1456: every valid user name is a member, known or not
            self.groups[data[0]] = {"users": set(u for u in split_list(data[1]) if verify_username(u)),
                                    "comment": decode_text(data[2])}
        elif kind == "role" and ROLE_RE.match(data[0]):
            self.roles[data[0]] = frozenset(p for p in split_list(data[1]) if p in VALID_PRIVS)
        elif kind == "acl":
            self._acl_line(data)
        elif kind == "pool":
            self.pools.append(line)
        elif kind == "token":
            tok = split_tokenid(data[0])
            if tok and tok[0] in self.users and re.match(r"^\d*$", data[1]):
                self.users[tok[0]]["tokens"][tok[1]] = {"expire": int(data[1] or 0), "privsep": 0 if data[2] in (
                    "", "0") else 1, "comment": decode_text(data[3])}

    def _acl_line(self, data):
        """:1477-1524: each role of the list for each user, @group or token of the list; unknown ones are ignored."""
        path = normalize_path(data[1])
        if not path:
            return
        propagate = 0 if data[0] in ("", "0") else 1
        for role in split_list(data[3]):
            if role not in self.roles:
                continue
            for ug in split_list(data[2]):
                if ug.startswith("@") and GROUP_RE.match(ug[1:]):
                    kind, member = "groups", ug[1:]
                elif verify_username(ug):
                    kind, member = "users", ug
                elif split_tokenid(ug) and self.token(ug) is not None:
                    kind, member = "tokens", ug
                else:
                    continue
                self.acl.setdefault(path, {}).setdefault(kind, {}).setdefault(member, {})[role] = propagate

    def token(self, tokenid):
        """The token's settings (privsep, expire, comment), or None when user.cfg has no such token."""
        tok = split_tokenid(tokenid)
        return (self.users.get(tok[0]) or {}).get("tokens", {}).get(tok[1]) if tok else None

    def render(self):
        """write_user_config (AccessControl.pm:1616-1720), byte for byte."""
        out = []
        for user in sorted(self.users):
            d = self.users[user]
            out.append("user:%s:%d:%d:%s:%s:%s:%s:%s:\n" % (
                user, 1 if d.get("enable") else 0, int(d.get("expire") or 0), encode_text(d.get("firstname") or ""),
                encode_text(d.get("lastname") or ""), d.get("email") or "", encode_text(d.get("comment") or ""),
                d.get("keys") or ""))
            for name in sorted(d.get("tokens") or {}):
                t = d["tokens"][name]
                out.append("token:%s!%s:%d:%d:%s:\n" % (user, name, int(t.get("expire") or 0),
                                                        1 if t.get("privsep") else 0, encode_text(t.get("comment") or "")))
        out.append("\n")
        for group in sorted(self.groups):
            g = self.groups[group]
            out.append("group:%s:%s:%s:\n" % (group, ",".join(sorted(g["users"])), encode_text(g.get("comment") or "")))
        out.append("\n")
        out.extend(line + "\n" for line in sorted(self.pools))
        out.append("\n")
        for role in sorted(r for r in self.roles if r not in SPECIAL_ROLES):
            out.append("role:%s:%s:\n" % (role, ",".join(sorted(self.roles[role]))))
        out.append("\n")
        for path in sorted(self.acl, key=_tree_order):
            out.extend(self._acl_lines(path))
        return "".join(out)

    def _acl_lines(self, path):
        """One path's lines: members grouped by their role lists, propagate 0 first (:1675-1717)."""
        lists = {0: {}, 1: {}}
        node = self.acl[path]
        for kind, prefix in (("groups", "@"), ("users", ""), ("tokens", "")):
            for member, roles in (node.get(kind) or {}).items():
                if kind == "users" and member == "root@pam":
                    continue  # "no need to save 'root@pam', it is always 'Administrator'"
                for prop in (0, 1):
                    rl = ",".join(sorted(r for r, p in roles.items() if p == prop))
                    if rl:
                        lists[prop].setdefault(rl, set()).add(prefix + member)
        return ["acl:%d:%s:%s:%s:\n" % (prop, path, ",".join(sorted(lists[prop][rl])), rl)
                for prop in (0, 1) for rl in sorted(lists[prop])]


def _tree_order(path):
    """iterate_acl_tree (AccessControl.pm:945-957): a node, then its children by name."""
    return [] if path == "/" else path.strip("/").split("/")


def load():
    try:
        with open(pve.pve_dir(USERCFG_REL)) as f:
            return UserConfig(f.read())
    except OSError:
        return UserConfig("")


def save(cfg):
    path = pve.pve_dir(USERCFG_REL)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(cfg.render())
    os.chmod(tmp, 0o640)
    os.rename(tmp, path)


def _path_steps(path):
    """Perl's split("/", $path) as roles() walks it (:1778-1781): '/' is [''], trailing empties dropped."""
    if path == "/":
        return [""]
    parts = path.split("/")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _applying(ri, final):
    """The roles of one ACL entry that apply here: all at the checked path, else the propagated ones."""
    return {role: prop for role, prop in (ri or {}).items() if final or prop}


def roles(cfg, user, path):
    """AccessControl.pm roles (:1748-1856): role -> propagate flag of ``user`` on ``path``."""
    if user == "root@pam":
        return {"Administrator": 1}
    tok = split_tokenid(user)
    if tok:
        info = cfg.token(user)
        if info is None:
            return {}
        if not info["privsep"]:
            return roles(cfg, tok[0], path)
    result, cur = {}, ""
    steps = _path_steps(path)
    for i, p in enumerate(steps):
        final = i == len(steps) - 1
        if p:
            cur += "/" + p
        node = cfg.acl.get(cur or "/") or {}
        new = _applying((node.get("tokens") or {}).get(user), final)
        new = new or _applying((node.get("users") or {}).get(user), final)  # a user's own ACLs win over its groups'
        if not new:
            for group, ri in (node.get("groups") or {}).items():
                if user in (cfg.groups.get(group) or {}).get("users", ()):
                    new.update(_applying(ri, final))
        if new:
            result = new  # a deeper ACL replaces what the path above gave
    if "NoAccess" in result:
        return {"NoAccess": result["NoAccess"]}
    return result


def permissions(cfg, user, path):
    """RPCEnvironment.pm permissions (:135-175) and compile_acl_path (:19-117): privilege -> propagate flag."""
    if user == "root@pam":
        return {priv: 1 for priv in cfg.roles["Administrator"]}
    if path is None:  # :146-150 ("internal error: ACL check called for undefined ACL path!")
        return {}
    tok = split_tokenid(user)
    if tok:
        info = cfg.token(user)
        if info is None:
            return {}
        user_privs = permissions(cfg, tok[0], path)
        if not info["privsep"]:
            return user_privs
    elif not verify_username(user):
        return {}
    privs = {}
    for role, prop in roles(cfg, user, path).items():
        for priv in cfg.roles.get(role, ()):
            privs[priv] = privs.get(priv) or prop
    if tok and tok[0] != "root@pam":  # :101-110: a privilege-separated token gets no more than its user
        privs = {priv: user_privs[priv] and prop for priv, prop in privs.items() if priv in user_privs}
    return privs


def check(cfg, user, path, privs, any_=False, noerr=False):
    """RPCEnvironment.pm check (:282-296) and check_any (:298-317): True, or 403 naming the path and privilege."""
    perm = permissions(cfg, user, path)
    for priv in privs:
        verify_privname(priv)
    if any_:
        if any(priv in perm for priv in privs):
            return True
        if noerr:
            return False
        raise perm_exc("%s, %s" % (path or "", "|".join(privs)))
    for priv in privs:
        if priv not in perm:
            if noerr:
                return False
            raise perm_exc("%s, %s" % (path or "", priv))
    return True


def check_perm_modify(cfg, user, path, noerr=False):
    """RPCEnvironment.pm check_perm_modify (:433-448)."""
    if not path:
        return check(cfg, user, "/access", ["Permissions.Modify"], noerr=noerr)
    privs = ["Permissions.Modify"]
    for prefix, priv in (("/storage/", "Datastore.Allocate"), ("/vms/", "VM.Allocate"), ("/pool/", "Pool.Allocate")):
        if path.startswith(prefix) and len(path) > len(prefix):
            privs.append(priv)
    return check(cfg, user, path, privs, any_=True, noerr=noerr)


def _template(tmpl, params):
    """PVE::Tools::template_replace: {name} -> the parameter's value."""
    return re.sub(r"\{(\w+)\}", lambda m: str(params.get(m.group(1), "")), tmpl)


def exec_perm_check(cfg, spec, user, params, noerr=False):
    """RPCEnvironment.pm exec_api2_perm_check (:450-538), for the tests the lab's handlers declare."""
    test = spec[0]
    if test == "and":
        return all(exec_perm_check(cfg, sub, user, params) for sub in spec[1:])
    if test == "or":
        if any(exec_perm_check(cfg, sub, user, params, True) for sub in spec[1:]):
            return True
        if noerr:
            return False
        raise perm_exc()
    if test == "perm":
        opts = spec[3] if len(spec) > 3 else {}
        return check(cfg, user, normalize_path(_template(spec[1], params)), spec[2], opts.get("any"), noerr)
    if test == "userid-param":  # only the 'self' test: the user named by the userid parameter is the caller
        if user == params.get("userid") and params.get("userid") in cfg.users:
            return True
        if noerr:
            return False
        raise perm_exc()
    if test == "userid-group":  # privileges on every group; the per-group narrowing (:485-520) is not modelled
        return check(cfg, user, "/access/groups", spec[1], True, noerr)
    if test == "perm-modify":
        return check_perm_modify(cfg, user, normalize_path(_template(spec[1], params)), noerr)
    raise PVEError("unknown permission test")


def check_api2_permissions(cfg, perm, user, params):
    """RPCEnvironment.pm check_api2_permissions (:540-557): what a handler's ``permissions`` allows ``user``."""
    if not user:
        raise perm_exc("user != null")
    if user == "root@pam":
        return True
    if perm is None:
        raise perm_exc("user != root@pam")
    if perm.get("user") == "all":
        return True
    if perm.get("check"):
        return exec_perm_check(cfg, perm["check"], user, params)
    raise perm_exc()
