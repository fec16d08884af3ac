"""pvesh, pct, qm and pveum front ends over :mod:`pve.api`, acting as root@pam (setup_default_cli_env).

Exit codes and streams follow PVE's CLI: a ``die`` prints its message (``<code> <msg>`` plus
``<param>: <error>`` lines for PVE::Exception) on stderr and exits 255; workers run
synchronously with their output on stdout; ``pct start|stop|...`` exit 255 when the task
failed (``$upid_exit``), ``pvesh create .../status/start`` prints the UPID (JSON string
with ``--output-format json``) and exits 0 even then (the error is on stderr).
"""

import json
import os
import re
import sys

import pve
from pve import PVEError, api, ctconf, guests, tasks

CLI_USER = "root@pam"
BOOLEAN_OPTS = {"skiplock", "debug", "forceStop", "current", "overrule-shutdown", "keep-env", "quiet", "noborder",
                "noheader", "human-readable", "verbose", "force", "purge"}


class Usage(Exception):
    pass


def parse_options(args, booleans=BOOLEAN_OPTS):
    """Getopt::Long as PVE uses it: ``-k v``, ``--k v``, ``--k=v``; booleans may omit the value;
    ``--`` ends options. -> (positional args, {name: value or [values]}, args after ``--``)."""
    pos, opts, rest = [], {}, []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest = args[i + 1:]
            break
        m = re.match(r"^--?([A-Za-z][\w.\-]*)(?:=(.*))?$", a, re.S)
        if m:
            name, value = m.group(1), m.group(2)
            if value is None:
                nxt = args[i + 1] if i + 1 < len(args) else None
                if name in booleans and (nxt is None or not re.match(r"^(0|1|on|off|yes|no|true|false)$", nxt, re.I)):
                    value = "1"
                elif nxt is None:
                    raise Usage("Option %s requires an argument" % name)
                else:
                    value = nxt
                    i += 1
            if name in opts:
                prev = opts[name]
                opts[name] = (prev if isinstance(prev, list) else [prev]) + [value]
            else:
                opts[name] = value
        else:
            pos.append(a)
        i += 1
    return pos, opts, rest


def _die(e, usage=None):
    if isinstance(e, PVEError):
        text = e.cli_text()
    else:
        text = str(e).rstrip("\n") + "\n"
    if usage:
        text += usage + "\n"
    sys.stderr.write(text)
    sys.stderr.flush()
    return 255


def _unknown_option(e, usage):
    """Getopt rejects options the schema does not know before the handler runs."""
    if isinstance(e, PVEError) and e.code == 400 and e.errors and \
            all(v == ctconf.NOT_IN_SCHEMA for v in e.errors.values()):
        text = "".join("Unknown option: %s\n" % k for k in sorted(e.errors))
        sys.stderr.write(text + "400 unable to parse option\n" + usage + "\n")
        return True
    return False


def _print_result(data, fmt):
    if data is None:
        return
    if fmt == "json":
        sys.stdout.write(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    elif fmt in ("json-pretty", "yaml"):
        sys.stdout.write(json.dumps(data, sort_keys=True, indent=3) + "\n")
    else:
        if isinstance(data, dict):
            for k in sorted(data):
                v = data[k]
                sys.stdout.write("%s: %s\n" % (k, json.dumps(v) if isinstance(v, (dict, list)) else v))
        elif isinstance(data, list):
            for item in data:
                sys.stdout.write((json.dumps(item, sort_keys=True) if isinstance(item, (dict, list)) else str(item)) + "\n")
        else:
            sys.stdout.write("%s\n" % data)
    sys.stdout.flush()


# ---- pvesh -----------------------------------------------------------------------------------

PVESH_METHODS = {"get": "GET", "set": "PUT", "create": "POST", "delete": "DELETE"}
STD_OPTS = ("output-format", "noborder", "noheader", "human-readable", "quiet")


def pvesh(argv):
    nooutput = False
    while argv and argv[0] in ("--noproxy", "--nooutput"):
        nooutput = nooutput or argv[0] == "--nooutput"
        argv = argv[1:]
    if not argv or argv[0] in ("help", "--help"):
        sys.stderr.write("USAGE: pvesh <COMMAND> [ARGS] [OPTIONS]\n       pvesh create|delete|get|ls|set|usage <api_path> [OPTIONS]\n")
        return 0 if argv else 255
    cmd = argv[0]
    if cmd not in PVESH_METHODS and cmd not in ("ls", "usage"):
        sys.stderr.write("unknown command 'pvesh %s'\n" % cmd)
        return 255
    try:
        pos, opts, _rest = parse_options(argv[1:])
    except Usage as e:
        sys.stderr.write("%s\n400 unable to parse option\n" % e)
        return 255
    if not pos:
        sys.stderr.write("400 not enough arguments\npvesh %s <api_path> [OPTIONS]\n" % cmd)
        return 255
    path = "/" + pos[0].strip("/")
    fmt = opts.pop("output-format", "text")
    quiet = opts.pop("quiet", None)
    for k in ("noborder", "noheader", "human-readable"):
        opts.pop(k, None)
    if cmd in ("ls", "usage"):
        if not api.path_exists(path):
            sys.stderr.write("no such resource '%s'\n" % path)
            return 255
        sys.stderr.write("pvesh %s: not implemented in the lab\n" % cmd)
        return 255
    method = PVESH_METHODS[cmd]
    if not api.find(method, path):
        if api.path_exists(path):
            sys.stderr.write("no '%s' handler for '%s'\n" % (cmd, path))
        else:
            sys.stderr.write("no '%s' handler for '%s'\n" % (cmd, path))
        return 255
    try:
        data, _attrs = api.call(method, path, opts, user=CLI_USER, cli=True, out=sys.stdout)
    except PVEError as e:
        if _unknown_option(e, "pvesh %s %s [OPTIONS]" % (cmd, path)):
            return 255
        return _die(e)
    if not (nooutput or (quiet and quiet != "0")):
        if isinstance(data, str) and fmt == "text":
            sys.stdout.write(data + "\n")
        else:
            _print_result(data, fmt)
    return 0


# ---- pct -------------------------------------------------------------------------------------

PCT_USAGE = {
    "set": "pct set <vmid> [OPTIONS]", "start": "pct start <vmid> [OPTIONS]", "stop": "pct stop <vmid> [OPTIONS]",
    "shutdown": "pct shutdown <vmid> [OPTIONS]", "reboot": "pct reboot <vmid> [OPTIONS]",
    "config": "pct config <vmid> [OPTIONS]", "status": "pct status <vmid> [OPTIONS]", "list": "pct list",
    "exec": "pct exec <vmid> [<extra-args>] [OPTIONS]", "unlock": "pct unlock <vmid>", "pending": "pct pending <vmid>",
    "destroy": "pct destroy <vmid> [OPTIONS]", "create": "pct create <vmid> <ostemplate> [OPTIONS]",
}


def _node_path(vmid, rest=""):
    return "/nodes/%s/lxc/%s%s" % (pve.nodename(), vmid, rest)


def _need_vmid(cmd, pos):
    if not pos:
        raise Usage("400 not enough arguments\n%s" % PCT_USAGE.get(cmd, "pct %s <vmid>" % cmd))
    return pos[0]


def pct(argv):
    if not argv or argv[0] in ("help", "--help"):
        sys.stderr.write("USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n" + "".join("       %s\n" % u for u in sorted(PCT_USAGE.values())))
        return 0 if argv else 255
    cmd, args = argv[0], argv[1:]
    if cmd not in PCT_USAGE and cmd not in ("push", "pull", "enter", "console"):
        sys.stderr.write("unknown command 'pct %s'\n" % cmd)
        return 255
    try:
        if cmd == "exec":
            return _pct_exec(args)
        pos, opts, _rest = parse_options(args)
        if cmd == "list":
            data, _a = api.call("GET", "/nodes/%s/lxc" % pve.nodename(), {}, user=CLI_USER, cli=True)
            if data:
                fmt = "%-10s %-10s %-12s %-20s\n"
                sys.stdout.write(fmt % ("VMID", "Status", "Lock", "Name"))
                for d in sorted(data, key=lambda d: d["vmid"]):
                    sys.stdout.write(fmt % (d["vmid"], d["status"], d.get("lock") or "", d["name"]))
            return 0
        vmid = _need_vmid(cmd, pos)
        if cmd == "status":
            d, _a = api.call("GET", _node_path(vmid, "/status/current"), {"vmid": vmid}, user=CLI_USER, cli=True)
            if opts.get("verbose") not in (None, "0"):
                for k in sorted(d):
                    sys.stdout.write("%s: %s\n" % (k, json.dumps(d[k]) if isinstance(d[k], (dict, list)) else d[k]))
            else:
                sys.stdout.write("status: %s\n" % d["status"])
            return 0
        if cmd == "config":
            params = {k: v for k, v in opts.items() if k in ("current", "snapshot")}
            conf, _a = api.call("GET", _node_path(vmid, "/config"), params, user=CLI_USER, cli=True)
            for k in sorted(conf):
                if k in ("digest", "lxc"):
                    continue
                v = conf[k]
                if k == "description":
                    v = ctconf.encode_text(v)
                sys.stdout.write("%s: %s\n" % (k, v))
            for k, v in conf.get("lxc") or []:
                sys.stdout.write("%s: %s\n" % (k, v))
            return 0
        if cmd == "pending":
            items, _a = api.call("GET", _node_path(vmid, "/pending"), {}, user=CLI_USER, cli=True)
            for it in items:
                k = it["key"]
                if "delete" in it:
                    sys.stdout.write("del %s: %s\n" % (k, it.get("value", "")))
                elif "pending" in it:
                    if "value" in it:
                        sys.stdout.write("cur %s: %s\n" % (k, it["value"]))
                    sys.stdout.write("new %s: %s\n" % (k, it["pending"]))
                else:
                    sys.stdout.write("cur %s: %s\n" % (k, it.get("value", "")))
            return 0
        if cmd == "set":
            try:
                api.call("PUT", _node_path(vmid, "/config"), opts, user=CLI_USER, cli=True)
            except PVEError as e:
                if _unknown_option(e, PCT_USAGE["set"]):
                    return 255
                raise
            return 0
        if cmd == "unlock":
            guests.ct_unlock(int(vmid))
            return 0
        # destroy/create: the API's destroy_vm/create_vm bodies run in the CLI (no vzdestroy/vzcreate task log)
        if cmd == "destroy":
            guests.ct_destroy(int(vmid))
            return 0
        if cmd == "create":
            if len(pos) < 2:
                raise Usage("400 not enough arguments\n%s" % PCT_USAGE["create"])
            guests.ct_create(int(vmid), pos[1], opts)
            return 0
        if cmd in ("start", "stop", "shutdown", "reboot"):
            try:
                upid, _a = api.call("POST", _node_path(vmid, "/status/" + cmd), opts, user=CLI_USER, cli=True,
                                    out=sys.stdout)
            except PVEError as e:
                if _unknown_option(e, PCT_USAGE[cmd]):
                    return 255
                raise
            return 255 if tasks.status_is_error(tasks.read_status(upid)) else 0
        if cmd in ("push", "pull"):
            return _pct_push_pull(cmd, pos, opts)
        sys.stderr.write("pct %s: not available in the lab\n" % cmd)
        return 255
    except Usage as e:
        sys.stderr.write(str(e) + "\n")
        return 255
    except PVEError as e:
        return _die(e)


def _pct_push_pull(cmd, pos, opts):
    if len(pos) < 3:
        raise Usage("400 not enough arguments\npct %s <vmid> <%s> <destination> [OPTIONS]" % (cmd, "file" if cmd == "push" else "path"))
    vmid, src, dst = pos[0], pos[1], pos[2]
    if ctconf.read_raw(vmid) is None:
        raise PVEError("Configuration file '%s' does not exist" % pve.cfs_path(vmid))
    if not guests.check_running(vmid):
        raise PVEError("container '%s' not running!" % vmid)
    rt = guests._runtime()
    if rt is None or not hasattr(rt, cmd):
        raise PVEError("pct %s: no container runtime in this lab root" % cmd)
    if cmd == "push":
        kw = {k: opts[k] for k in ("perms", "user", "group") if opts.get(k) is not None}
        rt.push(vmid, src, dst, **kw)
    else:
        rt.pull(vmid, src, dst)
    return 0


def _pct_exec(args):
    keep_env = False
    while args and args[0] in ("--keep-env", "-keep-env"):
        keep_env = True
        args = args[1:]
    if not args:
        raise Usage("400 not enough arguments\n" + PCT_USAGE["exec"])
    vmid, rest = args[0], args[1:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    if ctconf.read_raw(vmid) is None:
        raise PVEError("Configuration file '%s' does not exist" % pve.cfs_path(vmid))
    if not rest:
        raise PVEError("missing command")
    argv = guests.exec_argv(vmid, rest)
    if argv is None:
        # TODO(container runtime issue): pve/ct_runtime.py provides exec_argv (nsenter into the CT).
        sys.stderr.write("kpro-lab: pct exec placeholder: CT %s has no runtime yet, running on the node: %s\n"
                         % (vmid, " ".join(rest)))
        argv = list(rest)
    sys.stdout.flush()
    env = None if keep_env else {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                 "TERM": os.environ.get("TERM", "dumb"), "HOME": "/root", "LANG": "C.UTF-8"}
    try:
        if env is None:
            os.execvp(argv[0], argv)
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        sys.stderr.write("lxc-attach: %s: %s\n" % (argv[0], e.strerror))
        return 255


# ---- pveum (the subset the README's token setup uses) ------------------------------------------------------------
# pve-access-control 8.2.2 src/PVE/CLI/pveum.pm $cmddef: each command is an API method with these positional
# arguments; the rest are options. Output as pve-common 8.3.1 src/PVE/CLIFormatter.pm prints it.

PVEUM = {
    ("role", "add"): ("POST", "/access/roles", ("roleid",), {}),
    ("user", "token", "add"): ("POST", "/access/users/{userid}/token/{tokenid}", ("userid", "tokenid"), {}),
    ("user", "token", "permissions"): ("GET", "/access/permissions", ("userid", "tokenid"), {}),
    ("user", "token", "remove"): ("DELETE", "/access/users/{userid}/token/{tokenid}", ("userid", "tokenid"), {}),
    ("user", "token", "delete"): ("DELETE", "/access/users/{userid}/token/{tokenid}", ("userid", "tokenid"), {}),
    ("user", "permissions"): ("GET", "/access/permissions", ("userid",), {}),
    ("acl", "modify"): ("PUT", "/access/acl", ("path",), {"delete": "0"}),
    ("acl", "delete"): ("PUT", "/access/acl", ("path",), {"delete": "1"}),
}
PVEUM_BOOLEANS = {"privsep", "propagate", "delete", "noborder", "noheader", "human-readable", "quiet"}


def pveum(argv):
    words = tuple(argv[:3])
    cmd = next((k for k in sorted(PVEUM, key=len, reverse=True) if words[:len(k)] == k), None)
    if cmd is None:
        sys.stderr.write("pveum %s: not available in the lab (role add, user token add|remove|permissions, user "
                         "permissions, acl modify|delete)\n" % " ".join(argv[:3]))
        return 255
    method, path, positional, fixed = PVEUM[cmd]
    usage = "pveum %s %s [OPTIONS]" % (" ".join(cmd), " ".join("<%s>" % a for a in positional))
    try:
        pos, opts, _rest = parse_options(argv[len(cmd):], PVEUM_BOOLEANS)
    except Usage as e:
        sys.stderr.write("%s\n400 unable to parse option\n%s\n" % (e, usage))
        return 255
    if len(pos) < len(positional):
        sys.stderr.write("400 not enough arguments\n%s\n" % usage)
        return 255
    fmt = opts.pop("output-format", "text")
    params = dict(zip(positional, pos), **opts)
    params.update(fixed)
    if cmd == ("user", "token", "permissions"):  # pveum.pm token_permissions: userid!tokenid
        params["userid"] = "%s!%s" % (params["userid"], params.pop("tokenid"))
    for key in [k for k in params if k in ("noborder", "noheader", "human-readable", "quiet")]:
        params.pop(key)
    try:
        data, _a = api.call(method, path.format(**params), params, user=CLI_USER, cli=True)
    except PVEError as e:
        if _unknown_option(e, usage):
            return 255
        return _die(e)
    if cmd[-1] == "permissions":
        _print_perm_result(data, fmt, opts)
    elif data is not None:
        _print_object(data, fmt, opts)
    return 0


def _terminal_utf8():
    """CLIFormatter query_terminal_options (:35-51): UTF-8 borders when the locale's codeset is UTF-8."""
    import locale
    try:
        locale.setlocale(locale.LC_CTYPE, "")
    except locale.Error:
        return False
    return locale.nl_langinfo(locale.CODESET) == "UTF-8"


def _text(value):
    """CLIFormatter data_to_text (:54-84): references as canonical JSON."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "" if value is None else str(value)


def _rule(width, left, fill, cross, right):
    return left + cross.join(fill * (w + 2) for w in width) + right


def print_text_table(rows, props, titles, opts):
    """CLIFormatter print_text_table (:99-307) for string columns, sorted by the first."""
    utf8, border = _terminal_utf8(), opts.get("noborder") in (None, "0")
    rows = sorted(rows, key=lambda r: r[props[0]])
    cells = [[_text(r[p]).split("\n") for p in props] for r in rows]
    width = [max([len(titles[i])] + [len(line) for row in cells for line in row[i]]) for i in range(len(props))]
    if not border:
        fmt = " ".join("%%-%ds" % w for w in width[:-1]) + (" %s" if len(props) > 1 else "%s")
        t = m = h = None
    elif utf8:
        fmt = "│ " + " │ ".join("%%-%ds" % w for w in width) + " │"
        t, h, m, b_ = [_rule(width, *chars) for chars in ("┌─┬┐", "╞═╪╡", "├─┼┤", "└─┴┘")]
    else:
        fmt = "| " + " | ".join("%%-%ds" % w for w in width) + " |"
        m = "+" + "+".join("-" * (w + 2) for w in width) + "+"
        t = b_ = m
        h = "+" + "+".join("=" * (w + 2) for w in width) + "+"
    out = [t] if border else []
    header = opts.get("noheader") in (None, "0")
    if header:
        out.append(fmt % tuple(titles))
    for i, row in enumerate(cells):
        if border and (i or header):
            out.append(h if i == 0 and header else m)
        for j in range(max(len(c) for c in row)):
            out.append(fmt % tuple(c[j] if j < len(c) else "" for c in row))
    if border:
        out.append(b_)
    sys.stdout.write("".join(line + "\n" for line in out))


def _print_object(data, fmt, opts):
    """CLIFormatter print_api_result (:364-447): an object as a key/value table, or JSON."""
    if fmt != "text":
        return _print_result(data, fmt)
    print_text_table([{"key": k, "value": v} for k, v in data.items()], ["key", "value"], ["key", "value"], opts)


def _print_perm_result(data, fmt, opts):
    """pveum.pm $print_perm_result: one row per path, its privileges one a line, '(*)' when propagated."""
    if fmt != "text":
        return _print_result(data, fmt)
    rows = [{"path": p, "permissions": "\n".join(priv + (" (*)" if data[p][priv] else "") for priv in sorted(data[p]))}
            for p in sorted(data)]
    print_text_table(rows, ["path", "permissions"], ["ACL path", "Permissions"], opts)
    sys.stdout.write("Permissions marked with '(*)' have the 'propagate' flag set.\n")


# ---- qm (read-only) ------------------------------------------------------------------------------

def qm(argv):
    if not argv or argv[0] in ("help", "--help"):
        sys.stderr.write("USAGE: qm <COMMAND> [ARGS] [OPTIONS]\n       qm list\n       qm config <vmid>\n       qm status <vmid>\n")
        return 0 if argv else 255
    cmd = argv[0]
    try:
        pos, opts, _rest = parse_options(argv[1:])
        node = pve.nodename()
        if cmd == "list":
            data, _a = api.call("GET", "/nodes/%s/qemu" % node, {}, user=CLI_USER, cli=True)
            if data:
                head = ("VMID", "NAME", "STATUS", "MEM(MB)", "BOOTDISK(GB)", "PID")
                sys.stdout.write("%10s %-20s %-10s %-10s %12s %-10s\n" % head)
                for d in sorted(data, key=lambda d: d["vmid"]):
                    sys.stdout.write("%10s %-20s %-10s %-10s %12.2f %-10s\n" % (
                        d["vmid"], d["name"], d["status"], d["maxmem"] // (1024 * 1024), d["maxdisk"] / 1024.0 ** 3,
                        d.get("pid") or 0))
            return 0
        if cmd in ("config", "status"):
            if not pos:
                raise Usage("400 not enough arguments\nqm %s <vmid> [OPTIONS]" % cmd)
            if cmd == "status":
                d, _a = api.call("GET", "/nodes/%s/qemu/%s/status/current" % (node, pos[0]), {}, user=CLI_USER, cli=True)
                sys.stdout.write("status: %s\n" % d["status"])
                return 0
            params = {k: v for k, v in opts.items() if k in ("current", "snapshot")}
            conf, _a = api.call("GET", "/nodes/%s/qemu/%s/config" % (node, pos[0]), params, user=CLI_USER, cli=True)
            for k in sorted(conf):
                if k == "digest":
                    continue
                v = conf[k]
                if k == "description":
                    v = ctconf.encode_text(v)
                sys.stdout.write("%s: %s\n" % (k, v))
            return 0
        sys.stderr.write("qm %s: not available in the lab (read-only VMs: list, config, status)\n" % cmd)
        return 255
    except Usage as e:
        sys.stderr.write(str(e) + "\n")
        return 255
    except PVEError as e:
        return _die(e)
