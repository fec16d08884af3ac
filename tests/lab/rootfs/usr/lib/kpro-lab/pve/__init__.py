"""The lab's simulated Proxmox VE management plane (standard library only).

One implementation, three front ends: the HTTPS API server (``services.d/pveproxy``,
:mod:`pve.httpd`), ``pvesh`` and ``pct``/``qm`` (:mod:`pve.cli`) all call the handlers in
:mod:`pve.api`, which raise :class:`PVEError` the way PVE raises ``PVE::Exception`` (HTTP
code, message, per-parameter ``errors``) or a plain ``die`` (code 500).

Modules:
- :mod:`pve.ctconf`  parse/write CT configs exactly as pve-container's
  ``parse_pct_config``/``write_pct_config`` (description folding, sorted keys, ``lxc.*`` at
  the end of their section, ``[pve:pending]`` and snapshot sections), pending/hotplug rules;
- :mod:`pve.tasks`   UPIDs and task logs under ``/var/log/pve/tasks`` (forked workers, real
  pid/pstart so "running" means what it means on PVE);
- :mod:`pve.guests`  guest state (labstate ``guests`` section), ``ct_start``/``ct_stop`` and
  the container runtime hook (``pve/ct_runtime.py``, optional);
- :mod:`pve.auth`    root@pam password, API tokens, tickets and CSRF tokens;
- :mod:`pve.access`  user.cfg's users, tokens, roles and ACLs, and the permission checks of every
  handler (pve-access-control's model; ``pveum`` in :mod:`pve.cli`).

All paths are relative to the node root: ``$KPRO_LAB_ROOT`` or ``/`` (as labstate).
"""

import os
import socket

DEFAULT_NODE = "kpro5"
# The node's Debian release decides its Proxmox VE (labctl.py up --release pve9 is a Debian 13 root). repoid: the
# pve-manager commit "bump version to <version>" (github.com/proxmox/pve-manager 2a5fa54a8503f96d, f4d3f125ffae50e9).
PVE_VERSIONS = {"12": {"version": "8.4.1", "release": "8.4", "repoid": "2a5fa54a8503f96d", "console": "xtermjs"},
                "13": {"version": "9.1.1", "release": "9.1", "repoid": "f4d3f125ffae50e9", "console": "xtermjs"}}


def _debian_major():
    try:
        with open(os.path.join(os.environ.get("KPRO_LAB_ROOT") or "/", "etc/debian_version")) as f:
            return f.read().strip().split(".")[0]
    except OSError:
        return "12"


PVE_VERSION = PVE_VERSIONS.get(_debian_major(), PVE_VERSIONS["12"])


class PVEError(Exception):
    """A PVE exception: ``code`` (HTTP status), ``msg`` (ends with a newline), ``errors`` (param -> text)."""

    def __init__(self, msg, code=500, errors=None):
        if not msg.endswith("\n"):
            msg += "\n"
        super(PVEError, self).__init__(msg)
        self.msg = msg
        self.code = code
        self.errors = errors or {}
        # plain ``die`` in PVE code has no code: the CLI prints the bare message
        self.plain = code == 500 and not errors

    def cli_text(self):
        """What PVE's CLI prints on stderr (PVE::Exception::stringify)."""
        text = self.msg if self.plain else "%d %s" % (self.code, self.msg)
        for k, v in sorted(self.errors.items()):
            text += "%s: %s\n" % (k, v)
        return text


def param_exc(errors):
    return PVEError("Parameter verification failed.", 400, errors)


def perm_exc(what=None):
    return PVEError("Permission check failed" + (" (%s)" % what if what else ""), 403)


def root():
    return os.environ.get("KPRO_LAB_ROOT", "/")


def path(rel):
    return os.path.join(root(), rel.lstrip("/"))


def nodename():
    """The node's name: $KPRO_LAB_NODE, the /etc/pve/local link, the node's /etc/hostname, else kpro5."""
    name = os.environ.get("KPRO_LAB_NODE")
    if name:
        return name
    try:  # /etc/pve/local -> nodes/<nodename>, as pmxcfs makes it
        target = os.readlink(path("etc/pve/local")).rstrip("/")
        if target.startswith("nodes/") and target.count("/") == 1:
            return target.split("/")[1]
    except OSError:
        pass
    try:
        with open(path("etc/hostname")) as f:
            name = f.read().strip().split(".")[0]
            if name and name != "localhost":
                return name
    except OSError:
        pass
    if root() == "/":
        host = socket.gethostname().split(".")[0]
        if host == DEFAULT_NODE:
            return host
    return DEFAULT_NODE


def pve_dir(rel=""):
    return path(os.path.join("etc/pve", rel))


def guest_dir(kind="lxc"):
    """Directory of the guest configs (``lxc`` or ``qemu-server``): /etc/pve/<kind> (a symlink into
    nodes/<node>/ on PVE) when present, else /etc/pve/nodes/<node>/<kind>."""
    short = pve_dir(kind)
    if os.path.isdir(short):
        return short
    return pve_dir(os.path.join("nodes", nodename(), kind))


def cfs_path(vmid, kind="lxc"):
    return "nodes/%s/%s/%s.conf" % (nodename(), kind, vmid)
