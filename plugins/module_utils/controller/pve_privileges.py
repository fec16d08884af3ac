# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Proxmox VE privileges the run uses through its API token, declared once, and the preflight's reading of the
token's effective privileges.

Every call the run makes with the token, and what PVE checks for it (pve-manager 8.4.1, pve-container 5.2.6,
pve-access-control 8.2.2; PVE 9 checks the same):

* ``GET /version``: any valid token (``user => 'all'``, pve-manager PVE/API2.pm:88), so it proves the token exists,
  not what it may do.
* ``GET /access/permissions?path=P``: any token, about itself (pve-access-control src/PVE/API2/AccessControl.pm:498-517).
  It answers the token's effective privileges on P: a privilege-separated token has those of its own ACLs, and no more
  than its user has (root@pam's tokens: their ACLs only); a token without separation has its user's
  (src/PVE/RPCEnvironment.pm:135-175, :98-110).
* ``GET /nodes/N/lxc/V/status/current``: ``VM.Audit`` on ``/vms/V`` (pve-container src/PVE/API2/LXC/Status.pm:83),
  the lxc_gpu stage's first read (proxmox_api.check_access). ``GET /cluster/resources`` (only when no node is set)
  lists only the guests with ``VM.Audit`` (pve-manager PVE/API2/Cluster.pm:480).
* ``POST .../status/shutdown`` and ``.../status/start``: ``VM.PowerMgmt`` on ``/vms/V`` (Status.pm:304, :125).
* ``GET /nodes/N/tasks/UPID/status`` (and ``/log``): nothing for the token's own tasks (pve-manager
  PVE/API2/Tasks.pm:28-37, :505-510).

devN changes (``PUT .../config``) are root@pam's alone, so the run makes them with ``pct set`` over SSH, never with the
token (proxmox_api.DEVN_TOKEN_REFUSED).
"""

from __future__ import annotations

# (ACL path, privilege, what the run does with it): the one table the preflight and the README's role follow.
REQUIRED = (
    ("/vms/{vmid}", "VM.Audit", "to read CT {vmid}'s status"),
    ("/vms/{vmid}", "VM.PowerMgmt", "to shut down and start CT {vmid}"),
)
ROLE = "KproGpuServing"  # the role the README's pveum commands create
# A token with Permissions.Modify on / can grant itself anything: full rights, whatever its ACLs say.
FULL_RIGHTS_PATH, FULL_RIGHTS_PRIV = "/", "Permissions.Modify"


def role_privileges():
    return sorted(set(priv for _path, priv, _why in REQUIRED))


def paths(vmids):
    """The paths the preflight asks about, in order: each container's, then / (full rights)."""
    out = []
    for vmid in vmids:
        for path, _priv, _why in REQUIRED:
            path = path.format(vmid=str(vmid).strip())
            if path not in out:
                out.append(path)
    return out + [FULL_RIGHTS_PATH]


def terms(vmids):
    """The pve_api lookup's terms: the token's own permissions on each path."""
    return ["access/permissions?path=%s" % path for path in paths(vmids)]


def acl_command(path, tokenid):
    """The pveum command that gives the token the role on ``path`` (its user too, unless root@pam: a separated
    token gets no more than its user has)."""
    user = tokenid.split("!", 1)[0]
    users = "" if user == "root@pam" else " --users %s" % user
    return "pveum acl modify %s --tokens '%s'%s --roles %s" % (path, tokenid, users, ROLE)


def _granted(answer, path):
    """The privileges an answer of GET /access/permissions?path=<path> grants, or None when it is no answer."""
    if not isinstance(answer, dict) or answer.get("status") != 200:
        return None
    data = (answer.get("json") or {}).get("data")
    return set((data or {}).get(path) or {}) if isinstance(data, dict) else None


def check(answers, vmids, tokenid):
    """``answers``: the lookup's results for ``terms(vmids)``, in order. Returns dict(problems, full_rights): one line per
    missing privilege (privilege, path, fix) or failed read, and a note when the token has full rights."""
    wanted = paths(vmids)
    if len(answers) != len(wanted):
        raise ValueError("%d answers for %d paths" % (len(answers), len(wanted)))
    granted = dict(zip(wanted, [_granted(a, p) for a, p in zip(answers, wanted)]))
    problems = []
    for path, answer in zip(wanted, answers):
        if granted[path] is None:
            problems.append("GET /access/permissions?path=%s as token %s failed: HTTP %s %s" % (
                path, tokenid, answer.get("status", -1) if isinstance(answer, dict) else -1,
                answer.get("msg", "") if isinstance(answer, dict) else answer))
    for vmid in vmids:
        for path, priv, why in REQUIRED:
            path = path.format(vmid=str(vmid).strip())
            if granted[path] is not None and priv not in granted[path]:
                problems.append("The API token %s lacks %s on %s (%s). Fix on the node: %s (with the role %s: pveum "
                                "role add %s --privs '%s'; README \"The API token's privileges\")" % (
                                    tokenid, priv, path, why.format(vmid=vmid), acl_command(path, tokenid), ROLE, ROLE,
                                    " ".join(role_privileges())))
    return dict(problems=problems, full_rights=full_rights_note(granted.get(FULL_RIGHTS_PATH), tokenid, vmids))


def full_rights_note(granted_root, tokenid, vmids):
    """'' unless the token has full rights; then what it is, and what is enough."""
    if not granted_root or FULL_RIGHTS_PRIV not in granted_root:
        return ""
    what = ("a root@pam token without privilege separation (--privsep 0) has every right root@pam has, on the whole "
            "cluster" if tokenid.startswith("root@pam!") else
            "its user has full rights and the token is not privilege-separated, or it has Administrator on /")
    return ("The API token %s has every privilege (%s on %s): %s. The run works with it, but needs only %s on %s: a "
            "privilege-separated token with the role %s (README \"The API token's privileges\")." % (
                tokenid, FULL_RIGHTS_PRIV, FULL_RIGHTS_PATH, what, " and ".join(role_privileges()),
                ", ".join("/vms/%s" % v for v in vmids) or "its containers", ROLE))
