# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Proxmox VE API sessions through proxmoxer, and container power with task waits.

* Works with the proxmoxer that a Proxmox VE 8 host has from Debian 12 (python3-proxmoxer 1.2.0-2) and with 2.x;
  the differences, with their places in 1.2.0's source, are handled where noted ("1.2.0 <file>:<line>" below
  means /usr/lib/python3/dist-packages/proxmoxer/<file> of that package, which is PyPI's 1.2.0 byte for byte).
* Every backend gets an explicit ``timeout`` (proxmoxer's default is 5 s, too short for a
  busy node or ``pvesh``), and every HTTPS request really has it (``_harden_https``).
* HTTPS verifies the certificate by default (``ca_path`` for a private CA);
  ``ssh_paramiko`` checks the host key against ``known_hosts`` (proxmoxer itself would
  accept any key with AutoAddPolicy).
* ``local`` and ``ssh_paramiko`` run ``pvesh`` through our own small session (``CliSession``) on every
  proxmoxer version: 1.2.0 has no ``local`` backend and misreads pvesh's output (see CliSession).
* Tasks are waited on by UPID with our own deadline (``wait_task``), not proxmoxer's
  ``Tasks.blocking_status`` (which returns ``None`` on timeout, and which 1.x does not have).
* ``devN`` keys may only be changed by ``root@pam``; an API token is a different user to
  PVE (``root@pam!name``) and is refused before anything is sent (``set_devn``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import PhasedError
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import MODE_DEFAULT, atomic_write, read_text

PROXMOXER_IMPORT_ERROR = None
try:
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import ProxmoxResource, ResourceException
    HAS_PROXMOXER = True
except ImportError as _e:  # pragma: no cover - depends on the target
    HAS_PROXMOXER = False
    PROXMOXER_IMPORT_ERROR = _e
    ProxmoxAPI = ProxmoxResource = None

    class ResourceException(Exception):  # type: ignore[no-redef]
        status_code = None
        status_message = None
        content = None
        errors = None

# What a Proxmox VE host installs (Debian 12 bookworm: python3-proxmoxer 1.2.0-2, python3-requests 2.28.1).
APT_FIX = "apt-get install python3-proxmoxer python3-requests"
DEVN_TOKEN_REFUSED = (
    "devN can only be changed by root@pam; an API token ({who}) is refused by PVE "
    "(pve-container check_ct_modify_config_perm: 'configuring device passthrough is only allowed for root@pam'). "
    "Use backend=ssh_paramiko/local, a root@pam password (api_password), or method=lxc_raw")


def _env(name):
    # imported here: the compatibility scenarios load this file under a target's bare Python, without ansible
    from ansible.module_utils.common.parameters import env_fallback  # pylint: disable=import-outside-toplevel
    return (env_fallback, [name])


def api_argument_spec():
    """Connection options shared by modules that talk to PVE.

    An option not given falls back to the environment variable community.proxmox reads for it (its
    plugins/module_utils/proxmox.py, proxmox_auth_argument_spec: api_host PROXMOX_HOST, api_user PROXMOX_USER,
    api_token_id PROXMOX_TOKEN_ID, api_token_secret PROXMOX_TOKEN_SECRET, ...), so one environment serves both."""
    return dict(
        api_backend=dict(type="str", default="https", choices=["https", "ssh_paramiko", "local"]),
        api_host=dict(type="str", fallback=_env("PROXMOX_HOST")),
        api_port=dict(type="int", default=8006, fallback=_env("PROXMOX_PORT")),
        api_user=dict(type="str", default="root@pam", fallback=_env("PROXMOX_USER")),
        api_token_id=dict(type="str", no_log=False, fallback=_env("PROXMOX_TOKEN_ID")),
        api_token_secret=dict(type="str", no_log=True, fallback=_env("PROXMOX_TOKEN_SECRET")),
        api_password=dict(type="str", no_log=True, fallback=_env("PROXMOX_PASSWORD")),
        validate_certs=dict(type="bool", default=True, fallback=_env("PROXMOX_VALIDATE_CERTS")),
        ca_path=dict(type="path", fallback=_env("PROXMOX_CA_PATH")),
        ca_content=dict(type="str"),
        api_timeout=dict(type="int", default=30, fallback=_env("PROXMOX_API_TIMEOUT")),
        ssh_user=dict(type="str", default="root"),
        ssh_port=dict(type="int", default=22),
        ssh_private_key_file=dict(type="path"),
        ssh_known_hosts=dict(type="path"),
        ssh_host_key_checking=dict(type="bool", default=True),
    )


class ProxmoxApiError(PhasedError):
    """An API failure with a message naming the cause and the fix (phase pve_api_error)."""

    PHASE = "pve_api_error"


class ProxmoxTaskError(ProxmoxApiError):
    def __init__(self, msg, status=None):
        super(ProxmoxTaskError, self).__init__(msg)
        self.status = status


class ProxmoxTaskTimeout(ProxmoxTaskError):
    pass


class Session(object):
    """A ProxmoxAPI plus what we know about who it authenticates as."""

    def __init__(self, api, backend, user, token_id=None, timeout=30, host=None):
        self.api = api
        self.backend = backend
        self.user = user
        self.token_id = token_id
        self.timeout = timeout
        self.host = host

    @property
    def is_token(self):
        return self.backend == "https" and bool(self.token_id)

    @property
    def authuser(self):
        """The user PVE checks permissions for."""
        if self.backend in ("ssh_paramiko", "local"):
            return "root@pam"  # pvesh on the node: setup_default_cli_env
        if self.is_token:
            return "%s!%s" % (self.user, self.token_id)
        return self.user


def split_token_id(user, token_id):
    """``ansible`` or ``root@pam!ansible`` -> (user, token name)."""
    if token_id and "!" in token_id:
        tuser, tname = token_id.split("!", 1)
        return tuser, tname
    return user, token_id


def proxmoxer_problem(backend="https", token=False):
    """None when this Python can reach PVE through ``backend``, else the cause and the fix, for the module to say.

    Checked before connecting because proxmoxer's backends call sys.exit(1) when requests or paramiko is
    missing (1.2.0 backends/https.py:26 and ssh_paramiko.py:14; 2.3.0 https.py:32 and ssh_paramiko.py:25), which
    ends the module with no result at all."""
    where = "on the target (%s, Python %d.%d)" % (sys.executable, sys.version_info[0], sys.version_info[1])
    if not HAS_PROXMOXER:
        return ("the proxmoxer Python library is missing or unusable %s: %s. Install it with `%s` (Debian 12's "
                "proxmoxer 1.2.0 is supported, as is 2.x)" % (where, PROXMOXER_IMPORT_ERROR, APT_FIX))
    if backend == "https":
        try:
            import requests  # noqa: F401  pylint: disable=unused-import
        except ImportError as e:
            return "python3-requests is missing %s (%s); proxmoxer's https backend needs it: `%s`" % (where, e, APT_FIX)
        from proxmoxer.backends import https as https_backend
        if token and not hasattr(https_backend, "ProxmoxHTTPApiTokenAuth"):  # API tokens came with proxmoxer 1.1
            return ("the proxmoxer %s is too old for API tokens: install 1.2.0 or later (`%s`), or use api_password"
                    % (where, APT_FIX))
    elif backend == "ssh_paramiko":
        try:
            import paramiko  # noqa: F401  pylint: disable=unused-import
        except ImportError as e:
            return ("python3-paramiko is missing %s (%s); api_backend=ssh_paramiko needs it: `apt-get install "
                    "python3-paramiko`, or use api_backend=local on the node" % (where, e))
    return None


def install_ca(params, check_mode, tmpdir):
    """Put ``ca_content`` (the node's CA, PEM) at ``ca_path`` (its directory 0755, the file 0644) when it differs, before
    any API call: one step of the module instead of a directory and a copy task of their own on every run.

    Returns dict(changed, path, diff): ``path`` is the file the API calls verify against. In check mode a CA that would
    change is not written; a copy in ``tmpdir`` is used instead, so that --check still proves the CA against the API.
    Without ``ca_content``, ``ca_path`` is used as it is."""
    content, path = params.get("ca_content"), params.get("ca_path")
    if not content:
        return dict(changed=False, path=path, diff=None)
    if not path:
        raise ProxmoxApiError("ca_content is set but ca_path is not: ca_path names where the CA is put on the node")
    before = read_text(path)
    if before == content and (os.stat(path).st_mode & 0o7777) == 0o644:
        return dict(changed=False, path=path, diff=None)
    diff = dict(before=before or "", after=content, before_header=path, after_header=path)
    if check_mode:
        path = os.path.join(tmpdir, os.path.basename(path))
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        atomic_write(path, content.encode("utf-8"), mode=MODE_DEFAULT, default_mode=0o644)
        os.chmod(path, 0o644)  # the mode the copy task set: also on a file that had the same content
    except OSError as e:
        raise ProxmoxApiError("cannot put the CA at %s: %s; nothing else was changed" % (path, e),
                              remedy="Check that the directory is writable by the task's user (become root).")
    return dict(changed=True, path=path, diff=diff)


def connect(params, api_factory=None, cli_runner=None):
    """Build a Session from module params (see api_argument_spec).

    Tests replace ProxmoxAPI (https) with ``api_factory`` and the pvesh runner (local, ssh_paramiko) with
    ``cli_runner``, a callable argv -> (stdout, stderr, exit status)."""
    backend = params.get("api_backend") or "https"
    timeout = int(params.get("api_timeout") or 30)
    host = params.get("api_host")
    if api_factory is None and cli_runner is None:
        problem = proxmoxer_problem(backend, token=bool(params.get("api_token_id")))
        if problem:
            raise ProxmoxApiError(problem, phase="library_missing")
    try:
        if backend != "local" and not host:
            raise ProxmoxApiError("api_host is required for api_backend=%s (the node's address)" % backend)
        if backend == "https":
            return _connect_https(params, api_factory or ProxmoxAPI, host, timeout)
        run = cli_runner
        if run is None and backend == "local":
            run = _local_runner(timeout)
        elif run is None:
            run = _ssh_runner(_ssh_client(params, host, timeout), timeout)
        api = ProxmoxResource(base_url="", session=CliSession(run), serializer=CliSerializer())
        return Session(api, backend, "root@pam", timeout=timeout, host=host if backend != "local" else None)
    except ProxmoxApiError:
        raise
    except Exception as e:
        raise ProxmoxApiError(describe_error(e, "connecting to the PVE API (%s backend%s)" % (
            backend, ", %s" % host if host else "")))


def _connect_https(params, factory, host, timeout):
    verify = True
    if not params.get("validate_certs", True):
        verify = False
    elif params.get("ca_path"):
        verify = params["ca_path"]  # a CA bundle path: requests' verify=, in 1.2.0 (https.py:250) and 2.x
    user = params.get("api_user") or "root@pam"
    tuser, tname = split_token_id(user, params.get("api_token_id"))
    kwargs = dict(backend="https", port=params.get("api_port") or 8006, verify_ssl=verify, timeout=timeout)
    if tname:
        if not params.get("api_token_secret"):
            raise ProxmoxApiError("api_token_id is set but api_token_secret is not")
        kwargs.update(user=tuser, token_name=tname, token_value=params["api_token_secret"])
    elif params.get("api_password"):
        kwargs.update(user=user, password=params["api_password"])
    else:
        raise ProxmoxApiError("no credentials for api_backend=https: set api_token_id + api_token_secret, or api_password "
                              "(or use api_backend=ssh_paramiko/local)")
    try:
        api = factory(host, **kwargs)
    except ValueError:
        if host.count(":") > 1:  # 1.2.0 backends/https.py:222: host, port = host.split(':')
            raise ProxmoxApiError("api_host %s is an IPv6 address, which this proxmoxer cannot parse (1.x splits the "
                                  "host at ':'): use the node's name, or proxmoxer 2.x" % host)
        raise
    _harden_https(api, timeout)
    return Session(api, "https", tuser if tname else user, token_id=tname, timeout=timeout, host=host)


def _harden_https(api, timeout):
    """Give every request the timeout and keep PVE's per-parameter errors, on any proxmoxer.

    1.2.0 sends API calls with no timeout at all: core.py:100 passes none, https.py:163 defaults it to None and
    get_session (https.py:248) sets none, so a stalled pveproxy hangs the module (2.3.0 https.py:206-207 takes
    the backend's). 1.2.0 also reads an error's "errors" from the serializer's ``data`` (core.py:110 with
    https.py:155), which PVE sets to null, so "dev1: invalid format" is lost (2.x has loads_errors)."""
    store = getattr(api, "_store", None)
    if not isinstance(store, dict) or "session" not in store:  # a test double
        return
    send = store["session"].request

    def request(method, url, *args, **kwargs):
        if not args and kwargs.get("timeout") is None:
            kwargs["timeout"] = timeout
        return send(method, url, *args, **kwargs)
    store["session"].request = request
    if not hasattr(store["serializer"], "loads_errors"):
        store["serializer"] = _ErrorsSerializer(store["serializer"])


class _ErrorsSerializer(object):
    """1.x's JsonSerializer, except that an error response gives ``{"errors": <the body's errors>}``, which is
    what 1.2.0 core.py:110 looks up."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def loads(self, response):
        if getattr(response, "status_code", 200) < 400:
            return self._inner.loads(response)
        try:
            body = json.loads(response.content.decode("utf-8"))
        except (AttributeError, UnicodeDecodeError, ValueError):
            return {}
        return {"errors": body.get("errors")} if isinstance(body, dict) else {}


# --------------------------------------------------------------------------- pvesh (local, ssh_paramiko)


class CliResponse(object):
    """What proxmoxer's core reads from a response. Without ``reason`` an error's content is ``text``
    (1.2.0 core.py:112-118, 2.3.0 core.py:157-165)."""

    headers = {"content-type": "application/json"}

    def __init__(self, status_code, content, exit_code):
        self.status_code = status_code
        self.content = self.text = content
        self.exit_code = exit_code


class CliSession(object):
    """``pvesh get|create|set|delete <path> -<key> <value>... --output-format json`` through ``run(argv)``.

    Ours on every proxmoxer version: 1.2.0 has no local backend (core.py:37 lists https, openssh, ssh_paramiko;
    core.py:142 needs a host), and its ssh session joins ``-key 'value'`` into a shell string without escaping
    (base_ssh.py:49-52) and takes any stderr for a failure (base_ssh.py:56-60), while pvesh writes warnings and
    a failed task's error there and exits 0. The exit status decides here; an error's HTTP code is the
    ``NNN message`` line pvesh prints (PVE::Exception), else 500."""

    VERBS = {"get": "get", "post": "create", "put": "set", "delete": "delete"}

    def __init__(self, run):
        self.run = run

    def request(self, method, url, data=None, params=None, headers=None):
        argv = ["pvesh", self.VERBS[method.lower()], url.strip()]
        for key, value in list((data or {}).items()) + list((params or {}).items()):
            if value is not None:
                argv += ["-" + key, _cli_value(value)]
        out, err, rc = self.run(argv + ["--output-format", "json"])
        if rc == 0:
            return CliResponse(200, out, rc)
        m = re.search(r"^(\d\d\d) [A-Za-z]", err, re.M)
        return CliResponse(int(m.group(1)) if m else 500, (err or out).strip(), rc)


def _cli_value(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


class CliSerializer(object):
    """The last JSON document on pvesh's stdout: a worker runs in the foreground under pvesh and its log comes
    first (PVE bug 4333), which 1.2.0's parse of the whole output (base_ssh.py:73-75) turns into
    ``{"errors": ...}`` instead of the UPID. No output (``pvesh set``) is None, as HTTPS's ``data: null``."""

    def loads(self, response):
        lines = (response.content or "").strip().splitlines()
        for i in range(len(lines)):
            try:
                return json.loads("\n".join(lines[i:]))
            except ValueError:
                continue
        return {"errors": response.content} if lines else None


def _local_runner(timeout):
    def run(argv):
        # No AnsibleModule here (connect() also serves the lab's tests), and run_command has no timeout.
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,  # pylint: disable=ansible-bad-function
                           check=False)
        return p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"), p.returncode
    return run


def _ssh_runner(client, timeout):
    def run(argv):
        chan = client.get_transport().open_session()
        chan.settimeout(timeout)
        chan.exec_command(" ".join(shlex.quote(a) for a in argv))
        out = chan.makefile("rb", -1).read()
        err = chan.makefile_stderr("rb", -1).read()
        return out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), chan.recv_exit_status()
    return run


def _ssh_client(params, host, timeout):
    """paramiko to the node, checking its key against known_hosts unless ssh_host_key_checking is off.

    Not proxmoxer's session: its class and attributes differ by version (1.2.0 ssh_paramiko.py:17
    ProxmoxParamikoSession with .username, 2.3.0 ssh_paramiko.py:28 SshParamikoSession with .user) and both
    accept any host key (AutoAddPolicy, 1.2.0 ssh_paramiko.py:38, 2.3.0 ssh_paramiko.py:41)."""
    import paramiko
    client = paramiko.SSHClient()
    known = params.get("ssh_known_hosts") or os.path.expanduser("~/.ssh/known_hosts")
    if params.get("ssh_host_key_checking", True):
        if not os.path.exists(known):
            raise ProxmoxApiError(
                "ssh host key checking is on but %s does not exist: add the node's key (ssh-keyscan -H <host> >> %s, "
                "after checking its fingerprint) or set ssh_known_hosts" % (known, known))
        client.load_host_keys(known)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    key, password = params.get("ssh_private_key_file"), params.get("api_password")
    try:
        client.connect(host, port=int(params.get("ssh_port") or 22), username=params.get("ssh_user") or "root",
                       password=password, key_filename=os.path.expanduser(key) if key else None,
                       allow_agent=not password, look_for_keys=True, timeout=timeout)
    except paramiko.BadHostKeyException as e:
        raise ProxmoxApiError("the ssh host key of %s does not match the one in %s (%s): check the node's fingerprint"
                              % (host, known, e))
    except paramiko.SSHException as e:
        if "not found in known_hosts" in str(e):
            raise ProxmoxApiError(
                "the ssh host key of %s is not in %s: add it (ssh-keyscan after checking the fingerprint) "
                "or point ssh_known_hosts at the right file" % (host, known))
        raise
    return client


def describe_error(exc, what="calling the PVE API"):
    """A message for an exception from proxmoxer/requests/paramiko, with the likely fix."""
    text = str(exc)
    name = type(exc).__name__
    low = text.lower()
    hint = ""
    if isinstance(exc, ResourceException) or name == "ResourceException":
        code = getattr(exc, "status_code", None)
        body = "%s %s" % (getattr(exc, "content", "") or "", getattr(exc, "errors", "") or "")
        text = "HTTP %s %s: %s" % (code, getattr(exc, "status_message", ""), body.strip() or text)
        low = text.lower()
        if "root@pam" in low:
            hint = "this change is reserved for root@pam; use backend=ssh_paramiko/local or a root@pam password"
        elif code == 401:
            hint = "check api_user/api_token_id/api_token_secret or api_password"
        elif code == 403 or "permission check failed" in low:
            hint = "the user/token lacks the privilege named above (VM.PowerMgmt, VM.Config.*, VM.Audit) on /vms/<vmid>"
        elif "does not exist" in low and "/dev/" in low:
            hint = "create the device node on the host first (nvidia-modprobe, see kpro.gpu_serving.nvidia_driver)"
        elif "locked" in low:
            hint = "the CT is locked by another operation (backup, snapshot, migrate); wait for it or `pct unlock <vmid>` if stale"
        elif "does not exist" in low:
            hint = "check vmid and node"
    elif "ca certificate bundle" in low or "no such file" in low and "ca" in low and "cert" in low:
        hint = "ca_path names no readable CA file: point it at the node's CA (/etc/pve/pve-root-ca.pem, copied here)"
    elif "certificate verify failed" in low or "sslerror" in name.lower() or "ssl" in low and "verify" in low:
        hint = "the node's certificate is not trusted: set ca_path to its CA (/etc/pve/pve-root-ca.pem) or validate_certs=false"
    elif "timed out" in low or "timeout" in name.lower():
        hint = "no answer in time: raise api_timeout, or check that the node is reachable"
    elif "authentication" in low or name == "AuthenticationError":
        hint = "check the credentials"
    elif "connection refused" in low or "max retries" in low or "name or service not known" in low:
        hint = "check api_host/api_port and that pveproxy runs on the node"
    elif "no such file or directory" in low and "pvesh" in low:
        hint = "api_backend=local runs pvesh, which only a PVE node has: run the module there, or use api_backend=https"
    msg = "%s failed: %s" % (what, text)
    if hint:
        msg += " (%s)" % hint
    return msg


def _call(what, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ProxmoxApiError:
        raise
    except Exception as e:
        raise ProxmoxApiError(describe_error(e, what))


# --------------------------------------------------------------------------- tasks

_UPID_RE = re.compile(r"^UPID:([^:]+):")


def upid_node(upid):
    m = _UPID_RE.match(upid or "")
    return m.group(1) if m else None


def task_ok(exitstatus):
    """pve-common UPID.pm status_is_error: OK and 'WARNINGS: N' are success."""
    return exitstatus == "OK" or bool(re.match(r"^WARNINGS: \d+$", exitstatus or ""))


def wait_task(api, node, upid, timeout, poll_interval=1.0, clock=None, sleep=None):
    """Poll /nodes/{node}/tasks/{upid}/status until stopped or ``timeout`` seconds pass (then raise)."""
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    if not upid:
        return {"status": "stopped", "exitstatus": "OK"}
    node = upid_node(upid) or node
    deadline = clock() + float(timeout)
    status = None
    while True:
        status = _call("reading the status of task %s" % upid, api.nodes(node).tasks(upid).status.get)
        if status.get("status") == "stopped":
            break
        now = clock()
        if now >= deadline:
            raise ProxmoxTaskTimeout(
                "task %s still running after %ss (raise the timeout, or look at the task log: pvenode task log %s)" % (
                    upid, timeout, upid), status)
        sleep(min(poll_interval, max(0.0, deadline - now)))
    exitstatus = status.get("exitstatus")
    if not task_ok(exitstatus):
        log = ""
        try:
            lines = api.nodes(node).tasks(upid).log.get(limit=50)
            log = "\n".join(item.get("t", "") for item in lines[-20:])
        except Exception:
            pass
        raise ProxmoxTaskError("task %s failed: %s%s" % (upid, exitstatus, ("\n" + log) if log else ""), status)
    return status


# --------------------------------------------------------------------------- containers


def find_node(session, vmid):
    """The node that holds CT ``vmid`` (the local host for backend=local)."""
    res = _call("listing cluster resources", session.api.cluster.resources.get, type="vm")
    for item in res or []:
        if int(item.get("vmid", -1)) == int(vmid):
            if item.get("type") not in (None, "lxc"):
                raise ProxmoxApiError("guest %s is a %s, not a container" % (vmid, item.get("type")))
            return item.get("node")
    if session.backend == "local":
        return socket.gethostname().split(".")[0]
    raise ProxmoxApiError("CT %s is not known to the cluster (check vmid)" % vmid)


def check_access(params, vmid):
    """Connect and read CT ``vmid``'s status (GET .../status/current needs VM.Audit): the credentials, the CA and
    the vmid are proven before the caller writes anything. Returns (session, node, status)."""
    try:
        session = connect(params)
        node = params.get("node") or find_node(session, vmid)
        return session, node, ct_status(session, node, vmid)
    except ProxmoxApiError as e:
        raise ProxmoxApiError("%s; the API was checked before any change, nothing was written" % e)


def ct(session, node, vmid):
    return session.api.nodes(node).lxc(int(vmid))


def ct_status(session, node, vmid):
    return _call("reading the status of CT %s" % vmid, ct(session, node, vmid).status.current.get)


def _power(session, node, vmid, action, task_timeout, **data):
    res = ct(session, node, vmid).status
    upid = _call("%s CT %s" % (action, vmid), getattr(res, action).post, **data)
    if not upid_node(upid if isinstance(upid, str) else None):
        raise ProxmoxApiError("%s CT %s returned %r instead of a task ID (UPID:<node>:...)" % (action, vmid, upid))
    return wait_task(session.api, node, upid, task_timeout)


def ct_start(session, node, vmid, task_timeout=120):
    return _power(session, node, vmid, "start", task_timeout)


def ct_stop(session, node, vmid, task_timeout=120):
    return _power(session, node, vmid, "stop", task_timeout)


def ct_shutdown(session, node, vmid, task_timeout=180, shutdown_timeout=60, force_stop=True):
    return _power(session, node, vmid, "shutdown", task_timeout, timeout=int(shutdown_timeout),
                  forceStop=1 if force_stop else 0)


def ct_restart(session, node, vmid, task_timeout=180, shutdown_timeout=60):
    """Shutdown (forceStop after ``shutdown_timeout``) then start; a stopped CT is left stopped unless it was running.

    Returns the list of task statuses. A reboot task would not apply pending devN changes on every version;
    a stop/start does."""
    tasks = []
    st = ct_status(session, node, vmid)
    if st.get("status") == "running":
        tasks.append(ct_shutdown(session, node, vmid, task_timeout, shutdown_timeout))
        tasks.append(ct_start(session, node, vmid, task_timeout))
    return tasks


def ct_config(session, node, vmid):
    return _call("reading the config of CT %s" % vmid, ct(session, node, vmid).config.get)


def refuse_token_for_devn(session):
    if session.is_token:
        raise ProxmoxApiError(DEVN_TOKEN_REFUSED.format(who=session.authuser))


def set_devn(session, node, vmid, set_map, delete=None, digest=None):
    """PUT /nodes/{node}/lxc/{vmid}/config with devN values; refused up front for API tokens."""
    refuse_token_for_devn(session)
    data = dict(set_map or {})
    if delete:
        data["delete"] = ",".join(delete)
    if digest:
        data["digest"] = digest
    if not data:
        return None
    return _call("setting %s on CT %s" % (", ".join(sorted(set(list(set_map or {}) + list(delete or [])))), vmid),
                 ct(session, node, vmid).config.put, **data)
