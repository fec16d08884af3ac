# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Proxmox VE API sessions through proxmoxer, and container power with task waits.

* Every backend gets an explicit ``timeout`` (proxmoxer's default is 5 s, too short for a
  busy node or ``pvesh``).
* HTTPS verifies the certificate by default (``ca_path`` for a private CA);
  ``ssh_paramiko`` checks the host key against ``known_hosts`` (proxmoxer itself would
  accept any key with AutoAddPolicy).
* Tasks are waited on by UPID with our own deadline (``wait_task``), not proxmoxer's
  ``Tasks.blocking_status`` (which returns ``None`` on timeout).
* ``devN`` keys may only be changed by ``root@pam``; an API token is a different user to
  PVE (``root@pam!name``) and is refused before anything is sent (``set_devn``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time

PROXMOXER_IMPORT_ERROR = None
try:
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import ResourceException
    HAS_PROXMOXER = True
except ImportError as _e:  # pragma: no cover - depends on the target
    HAS_PROXMOXER = False
    PROXMOXER_IMPORT_ERROR = _e
    ProxmoxAPI = None

    class ResourceException(Exception):  # type: ignore[no-redef]
        status_code = None
        status_message = None
        content = None
        errors = None


DEVN_TOKEN_REFUSED = (
    "devN can only be changed by root@pam; an API token ({who}) is refused by PVE "
    "(pve-container check_ct_modify_config_perm: 'configuring device passthrough is only allowed for root@pam'). "
    "Use backend=ssh_paramiko/local, a root@pam password (api_password), or method=lxc_raw")


def api_argument_spec():
    """Connection options shared by modules that talk to PVE."""
    return dict(
        api_backend=dict(type="str", default="https", choices=["https", "ssh_paramiko", "local"]),
        api_host=dict(type="str"),
        api_port=dict(type="int", default=8006),
        api_user=dict(type="str", default="root@pam"),
        api_token_id=dict(type="str"),
        api_token_secret=dict(type="str", no_log=True),
        api_password=dict(type="str", no_log=True),
        validate_certs=dict(type="bool", default=True),
        ca_path=dict(type="path"),
        api_timeout=dict(type="int", default=30),
        ssh_user=dict(type="str", default="root"),
        ssh_port=dict(type="int", default=22),
        ssh_private_key_file=dict(type="path"),
        ssh_known_hosts=dict(type="path"),
        ssh_host_key_checking=dict(type="bool", default=True),
    )


class ProxmoxApiError(Exception):
    """An API failure with a message naming the cause and the fix."""


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


def _check_known_hosts(params):
    known = params.get("ssh_known_hosts") or os.path.expanduser("~/.ssh/known_hosts")
    return known


@contextlib.contextmanager
def _strict_host_keys(known_hosts):
    """proxmoxer's ssh_paramiko session uses AutoAddPolicy; connect with known_hosts and RejectPolicy instead."""
    from proxmoxer.backends import ssh_paramiko as spmod
    import paramiko

    base = spmod.SshParamikoSession

    class StrictSession(base):
        def _connect(self):
            client = paramiko.SSHClient()
            if not os.path.exists(known_hosts):
                raise ProxmoxApiError(
                    "ssh host key checking is on but %s does not exist: add the node's key (ssh-keyscan -H <host> >> %s, "
                    "after checking its fingerprint) or set ssh_known_hosts" % (known_hosts, known_hosts))
            client.load_host_keys(known_hosts)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            key_filename = os.path.expanduser(self.private_key_file) if self.private_key_file else None
            try:
                client.connect(self.host, username=self.user, allow_agent=(not self.password), look_for_keys=True,
                               key_filename=key_filename, password=self.password, timeout=self.timeout, port=self.port)
            except paramiko.SSHException as e:
                if "not found in known_hosts" in str(e):
                    raise ProxmoxApiError(
                        "the ssh host key of %s is not in %s: add it (ssh-keyscan after checking the fingerprint) "
                        "or point ssh_known_hosts at the right file" % (self.host, known_hosts))
                raise
            return client

    spmod.SshParamikoSession = StrictSession
    try:
        yield
    finally:
        spmod.SshParamikoSession = base


def connect(params, api_factory=None):
    """Build a Session from module params (see api_argument_spec). ``api_factory`` replaces ProxmoxAPI in tests."""
    factory = api_factory or ProxmoxAPI
    if factory is None:
        raise ProxmoxApiError("the proxmoxer Python library is missing on the target: pip install proxmoxer")
    backend = params.get("api_backend") or "https"
    timeout = int(params.get("api_timeout") or 30)
    user = params.get("api_user") or "root@pam"
    host = params.get("api_host")
    try:
        if backend == "local":
            api = factory(backend="local", timeout=timeout)
            return Session(api, backend, "root@pam", timeout=timeout)
        if not host:
            raise ProxmoxApiError("api_host is required for api_backend=%s (the node's address)" % backend)
        if backend == "ssh_paramiko":
            kwargs = dict(backend="ssh_paramiko", user=params.get("ssh_user") or "root", port=params.get("ssh_port") or 22,
                          timeout=timeout)
            if params.get("ssh_private_key_file"):
                kwargs["private_key_file"] = params["ssh_private_key_file"]
            if params.get("api_password"):
                kwargs["password"] = params["api_password"]
            if params.get("ssh_host_key_checking", True) and api_factory is None:
                with _strict_host_keys(_check_known_hosts(params)):
                    api = factory(host, **kwargs)
            else:
                api = factory(host, **kwargs)
            return Session(api, backend, "root@pam", timeout=timeout, host=host)
        # https
        verify = True
        if not params.get("validate_certs", True):
            verify = False
        elif params.get("ca_path"):
            verify = params["ca_path"]
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
        api = factory(host, **kwargs)
        return Session(api, backend, tuser if tname else user, token_id=tname, timeout=timeout, host=host)
    except ProxmoxApiError:
        raise
    except Exception as e:
        raise ProxmoxApiError(describe_error(e, "connecting to the PVE API (%s backend%s)" % (
            backend, ", %s" % host if host else "")))


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
    elif "certificate verify failed" in low or "sslerror" in name.lower() or "ssl" in low and "verify" in low:
        hint = "the node's certificate is not trusted: set ca_path to its CA (/etc/pve/pve-root-ca.pem) or validate_certs=false"
    elif "timed out" in low or "timeout" in name.lower():
        hint = "no answer in time: raise api_timeout, or check that the node is reachable"
    elif "authentication" in low or name == "AuthenticationError":
        hint = "check the credentials"
    elif "connection refused" in low or "max retries" in low or "name or service not known" in low:
        hint = "check api_host/api_port and that pveproxy runs on the node"
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


def ct(session, node, vmid):
    return session.api.nodes(node).lxc(int(vmid))


def ct_status(session, node, vmid):
    return _call("reading the status of CT %s" % vmid, ct(session, node, vmid).status.current.get)


def _power(session, node, vmid, action, task_timeout, **data):
    res = ct(session, node, vmid).status
    upid = _call("%s CT %s" % (action, vmid), getattr(res, action).post, **data)
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
